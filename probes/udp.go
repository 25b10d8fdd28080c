package probes

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// udpSends is how many times a datagram probe sends within its deadline.
const udpSends = probeSends

// dgram is the result of one datagram exchange.
type dgram struct {
	reply    []byte
	accepted bool          // accept() liked the reply
	icmp     *ICMPEvidence // the decisive ICMP error, if any
	errno    unix.Errno
	sent     int
	setupErr error
}

// exchangeUDP sends payload to target:port on a connected UDP socket with
// IP_RECVERR, resending up to udpSends times, until accept likes a reply, a
// decisive ICMP error arrives or ctx's deadline passes. The connected socket
// only hears from target:port; the error queue gives each ICMP error's type,
// code and offender, so refused and rejected are told apart by who sent
// what, never guessed from an errno.
func exchangeUDP(ctx context.Context, src source, port int, payload []byte, accept func([]byte) bool) dgram {
	return exchangeUDPWith(ctx, src, udpExchange{
		port:   port,
		build:  func(netip.AddrPort) ([]byte, error) { return payload, nil },
		accept: accept,
	})
}

// udpExchange is one datagram request: where it goes, how it is built and
// what answers it.
type udpExchange struct {
	port int
	// build makes the datagram once the socket has its local address.
	build  func(local netip.AddrPort) ([]byte, error)
	accept func([]byte) bool
	// anyPort hears replies from any port of the target's address (a TFTP
	// server answers from a fresh port). The socket is then unconnected;
	// IP_RECVERR still queues every ICMP error, so classification is the
	// same.
	anyPort bool
}

// udpSock is the part of a UDP socket an exchange uses, connected or not.
type udpSock struct {
	conn  *net.UDPConn
	write func([]byte) error
	read  func([]byte) (int, error)
}

func dialUDP(ctx context.Context, src source, port int, anyPort bool) (udpSock, error) {
	fam := family(src.target)
	network := "udp4"
	if fam == 6 {
		network = "udp6"
	}
	ctl := func(_, _ string, c syscall.RawConn) error {
		var serr error
		if err := c.Control(func(fd uintptr) { serr = setRecvErr(fd, fam) }); err != nil {
			return err
		}
		return serr
	}
	dst := netip.AddrPortFrom(src.target, uint16(port))
	if !anyPort {
		d := net.Dialer{Control: ctl}
		if src.local.IsValid() {
			d.LocalAddr = net.UDPAddrFromAddrPort(netip.AddrPortFrom(src.local, uint16(src.port)))
		} else if src.port != 0 {
			d.LocalAddr = &net.UDPAddr{Port: src.port}
		}
		c, err := d.DialContext(ctx, network, dst.String())
		if err != nil {
			return udpSock{}, err
		}
		conn := c.(*net.UDPConn)
		return udpSock{conn: conn,
			write: func(b []byte) error { _, err := conn.Write(b); return err },
			read:  conn.Read,
		}, nil
	}
	lc := net.ListenConfig{Control: ctl}
	laddr := ":0"
	if src.local.IsValid() {
		laddr = netip.AddrPortFrom(src.local, 0).String()
	}
	pc, err := lc.ListenPacket(ctx, network, laddr)
	if err != nil {
		return udpSock{}, err
	}
	conn := pc.(*net.UDPConn)
	want := src.target.WithZone("").Unmap()
	return udpSock{conn: conn,
		write: func(b []byte) error { _, err := conn.WriteToUDPAddrPort(b, dst); return err },
		read: func(b []byte) (int, error) {
			for {
				n, from, err := conn.ReadFromUDPAddrPort(b)
				if err != nil || from.Addr().WithZone("").Unmap() == want {
					return n, err
				}
				// Someone else's datagram: not an answer, keep reading
				// until the read deadline.
			}
		},
	}, nil
}

// exchangeUDPWith runs one exchange; see exchangeUDP.
func exchangeUDPWith(ctx context.Context, src source, x udpExchange) dgram {
	var r dgram
	s, err := dialUDP(ctx, src, x.port, x.anyPort)
	if err != nil {
		r.setupErr = err
		return r
	}
	conn := s.conn
	defer conn.Close()
	payload, err := x.build(conn.LocalAddr().(*net.UDPAddr).AddrPort())
	if err != nil {
		r.setupErr = err
		return r
	}
	rc, err := conn.SyscallConn()
	if err != nil {
		r.setupErr = err
		return r
	}
	resend := newResender(ctx)
	local := localAddrs()
	buf := make([]byte, 2048)
	_, err = resend.run(conn.SetReadDeadline, func(int) (bool, error) {
		if err := s.write(payload); err != nil {
			if r.takeError(rc, err, src.target, local) {
				return false, err // decided: r holds the verdict
			}
			return false, nil // an advisory (EMSGSIZE): not sent, tried again an interval later
		}
		return true, nil
	}, func(wake time.Time) (bool, error) {
		_ = conn.SetReadDeadline(wake)
		n, err := s.read(buf)
		if err == nil {
			r.reply = append([]byte(nil), buf[:n]...)
			r.accepted = x.accept(r.reply)
			return true, nil
		}
		if isTimeout(err) {
			return false, nil
		}
		return r.takeError(rc, err, src.target, local), nil
	})
	r.sent = resend.sent
	if errors.Is(err, errCancelled) {
		r.setupErr = ctx.Err()
	}
	return r
}

// takeError reads the error queue after a socket error and reports whether
// the exchange is decided.
func (r *dgram) takeError(rc syscall.RawConn, err error, target netip.Addr, local map[netip.Addr]bool) bool {
	e, ok := errnoOf(err)
	if !ok {
		r.setupErr = err
		return true
	}
	r.errno = e
	decided := false
	for range 8 {
		fam, typ, code, offender, _, isICMP, more := readErrQueue(rc)
		if !more {
			break
		}
		if !isICMP {
			continue
		}
		ev := newICMPEvidence(fam, typ, code, offender, target, local)
		if _, _, decisive := classifyICMP(ev); decisive {
			r.icmp = ev
			decided = true
			break
		}
	}
	if decided {
		return true
	}
	// An errno with no ICMP behind it is our own stack's verdict (no route,
	// no neighbour, local firewall): final too, except for advisories.
	return e != unix.EMSGSIZE
}

// readErrQueue pops one message from the socket's error queue without
// blocking.
func readErrQueue(rc syscall.RawConn) (fam, typ, code int, offender netip.Addr, errno unix.Errno, isICMP, ok bool) {
	buf := make([]byte, 2048)
	oob := make([]byte, 512)
	_ = rc.Control(func(fd uintptr) {
		_, oobn, _, _, err := unix.Recvmsg(int(fd), buf, oob, unix.MSG_ERRQUEUE|unix.MSG_DONTWAIT)
		if err != nil {
			return
		}
		ok = true
		fam, typ, code, offender, errno, isICMP = parseRecvErr(oob[:oobn])
	})
	return
}

// probeUDP sends a request to target:port: the nonce line, or for a
// well-known port a minimal valid request of its protocol (udpproto.go has
// the table), and records which in evidence.request.
//
//   - a reply with the nonce, or with the request's own proof (a DNS reply
//     to our question, an NTP reply to our timestamp, ...): reached;
//   - a reply from target:port without either: refused (the datagram
//     arrived; something else answered);
//   - an ICMP error: classifyICMP (port-unreachable from the target is
//     refused, from anyone else rejected; admin-prohibited is rejected);
//   - nothing after udpSends sends: silent.
func probeUDP(ctx context.Context, spec ProbeSpec, obs Observation) Observation {
	src, err := resolveSource(&spec)
	if err != nil {
		return fail(obs, fmt.Sprintf("udp probe %s: %v", obs.Target, err))
	}
	fillSource(&obs, src)
	name := udpRequestFor(&spec)
	obs.Evidence.Request = name
	req, err := newUDPRequest(name, spec.Nonce, netip.AddrPortFrom(spec.Target, uint16(spec.Port)))
	if err != nil {
		return fail(obs, fmt.Sprintf("udp probe %s: %s request: %v", obs.Target, name, err))
	}
	why := ""
	r := exchangeUDPWith(ctx, src, udpExchange{port: spec.Port, build: req.build, anyPort: req.anyPort,
		accept: func(b []byte) bool {
			w, ok := req.proof(b)
			if ok {
				why = w
			}
			return ok
		}})
	unaccepted := "a reply from the target's address without the nonce: the datagram arrived, something else answered"
	if name != RequestNonce {
		unaccepted = "a reply from the target's address that does not prove it read our " + name +
			" request (no nonce): the datagram arrived"
	}
	return classifyDgram(ctx, obs, src, r, why, unaccepted)
}

func classifyDgram(ctx context.Context, obs Observation, src source, r dgram, reachedWhy, unacceptedWhy string) Observation {
	obs.Evidence.Sent = r.sent
	if r.setupErr != nil {
		if ctx.Err() != nil {
			return fail(obs, "cancelled: "+ctx.Err().Error())
		}
		return fail(obs, fmt.Sprintf("%s probe %s: %v", obs.Kind, obs.Target, r.setupErr))
	}
	if r.errno != 0 {
		obs.Evidence.Errno = errnoName(r.errno)
	}
	switch {
	case r.reply != nil:
		obs.Evidence.From = src.target.WithZone("").String()
		obs.Evidence.Reply = printable(r.reply, 200)
		if r.accepted {
			return done(obs, Reached, reachedWhy)
		}
		return done(obs, Refused, unacceptedWhy)
	case r.icmp != nil:
		obs.Evidence.ICMP = r.icmp
		o, why, _ := classifyICMP(r.icmp)
		return done(obs, o, why)
	case r.errno == unix.ECONNREFUSED:
		return fail(obs, "ECONNREFUSED without an ICMP error on the error queue to say who sent it")
	case r.errno == unix.EHOSTUNREACH || r.errno == unix.EHOSTDOWN:
		return fail(obs, localUnreachable(errnoName(r.errno)))
	case r.errno == unix.ENETUNREACH:
		return fail(obs, "no route to the target")
	case r.errno == unix.EPERM || r.errno == unix.EACCES:
		return done(obs, Rejected, "our own firewall refused to send it ("+errnoName(r.errno)+")")
	case r.errno != 0:
		return fail(obs, "socket error "+errnoName(r.errno))
	case r.sent == 0:
		return fail(obs, "nothing could be sent before the deadline")
	}
	return done(obs, Silent, fmt.Sprintf("no reply and no ICMP error to %d datagrams before the deadline", r.sent))
}
