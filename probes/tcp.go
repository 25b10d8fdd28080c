package probes

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/netip"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// icmpGrace is how long a failed connect waits for the raw socket to hand
// over the ICMP error the kernel already matched to it.
const icmpGrace = 100 * time.Millisecond

// probeTCP connects to target:port, sends the nonce line and reads until the
// nonce comes back.
//
//   - nonce echoed: reached.
//   - connected but no nonce before the deadline, or the peer closed first:
//     refused. The handshake proves the SYN arrived at something holding the
//     target's address, but not that the target's service answered.
//   - connect failed with ECONNREFUSED and no ICMP error quoting our SYN:
//     a TCP RST came back, refused. Limitation: an nft "reject with tcp
//     reset" in a middle box forges the RST with the target's address and
//     reads as refused too; the target's witness (which saw nothing) is what
//     exposes it.
//   - connect failed and the raw ICMP socket holds an error quoting our SYN
//     (our source port, the target and port): classified by classifyICMP, so
//     a router's port-unreachable is rejected, never refused.
//   - nothing before the deadline: silent.
//
// Evidence.SrcPort is the source port, bound before the SYN leaves, and
// Evidence.ISN the SYN's initial sequence number, read from a capture of
// the SYN leaving this host (synCapture). Both let a witness elsewhere
// recognise a SYN, which carries no nonce. Learning the ISN is best
// effort: when it fails, Evidence.ISNError says why and the outcome is
// the same.
//
// Telling a RST from a middle box's ICMP port-unreachable needs the raw
// ICMP socket (CAP_NET_RAW). Without it an ECONNREFUSED is an error, not a
// guess.
func probeTCP(ctx context.Context, spec ProbeSpec, obs Observation) (out Observation) {
	src, err := resolveSource(&spec)
	if err != nil {
		return fail(obs, fmt.Sprintf("tcp probe %s: %v", obs.Target, err))
	}
	fillSource(&obs, src)
	fam := family(src.target)
	watch, werr := openICMPWatch(fam)
	if watch != nil {
		defer watch.close()
	}
	var localPort int
	var syn *synCapture
	var synErr error
	defer func() { recordSYN(ctx, &out, localPort, syn, synErr) }()
	network := "tcp4"
	if fam == 6 {
		network = "tcp6"
	}
	d := net.Dialer{
		Control: func(_, _ string, c syscall.RawConn) error {
			var serr error
			cerr := c.Control(func(fd uintptr) {
				if serr = setRecvErr(fd, fam); serr != nil {
					return
				}
				// Bind here so the source port is known before the SYN
				// leaves: it is how an ICMP error is matched to this probe.
				if localPort, serr = bindSource(int(fd), src); serr != nil {
					return
				}
				// Armed before connect sends the SYN, on this thread (the
				// probe's network namespace). A failure is only recorded.
				if localPort != 0 {
					syn, synErr = startSYNCapture(src.target, localPort, spec.Port, deadlineOf(ctx))
				}
			})
			if cerr != nil {
				return cerr
			}
			return serr
		},
	}
	raddr := net.TCPAddrFromAddrPort(netip.AddrPortFrom(src.target, uint16(spec.Port)))
	conn, err := d.DialContext(ctx, network, raddr.String())
	if err != nil {
		return tcpConnectFailed(ctx, obs, src, spec, err, watch, werr, localPort)
	}
	defer conn.Close()
	obs.Evidence.Connected = true
	obs.Evidence.From = src.target.WithZone("").String()
	if obs.Evidence.Source == "" {
		obs.Evidence.Source = conn.LocalAddr().String()
	}
	_ = conn.SetDeadline(deadlineOf(ctx))
	return tcpAwaitEcho(conn, spec, obs)
}

// recordSYN puts the source port of a SYN that left, and its ISN when the
// capture saw it, in out: a witness elsewhere knows a SYN by them alone.
func recordSYN(ctx context.Context, out *Observation, localPort int, syn *synCapture, synErr error) {
	if localPort == 0 {
		return // nothing was sent
	}
	out.Evidence.SrcPort = localPort
	if syn == nil {
		out.Evidence.ISNError = "no capture of the SYN: " + synErr.Error()
		return
	}
	isn, ok := syn.stop(min(synGrace, time.Until(deadlineOf(ctx))))
	if !ok {
		out.Evidence.ISNError = "the SYN was not seen leaving this host"
		return
	}
	out.Evidence.ISN, out.Evidence.ISNCaptured = isn, true
}

// bindSource binds fd to src's address (any, when src has none), port and
// interface, and returns the source port the SYN will carry.
func bindSource(fd int, src source) (int, error) {
	addr := src.local
	if !addr.IsValid() {
		addr = netip.IPv4Unspecified()
		if family(src.target) == 6 {
			addr = netip.IPv6Unspecified()
		}
	}
	ifindex := 0
	if src.ifi != nil {
		ifindex = src.ifi.Index
	}
	if err := unix.Bind(fd, sockaddrOf(addr, src.port, ifindex)); err != nil {
		return 0, fmt.Errorf("bind %s: %w", addr, err)
	}
	sa, err := unix.Getsockname(fd)
	if err != nil {
		return 0, err
	}
	switch v := sa.(type) {
	case *unix.SockaddrInet4:
		return v.Port, nil
	case *unix.SockaddrInet6:
		return v.Port, nil
	}
	return 0, nil
}

// tcpAwaitEcho sends what the probe speaks on conn and reads until the
// nonce comes back, an egress proxy's refusal is read, or the connection
// ends.
func tcpAwaitEcho(conn net.Conn, spec ProbeSpec, obs Observation) Observation {
	if _, err := conn.Write(spoken(spec)); err != nil {
		return tcpConnectedNoEcho(obs, nil, fmt.Sprintf("write after connect: %v", err))
	}
	want := []byte(spec.Nonce)
	var got []byte
	buf := make([]byte, 512)
	for len(got) < 4096 {
		n, err := conn.Read(buf)
		got = append(got, buf[:n]...)
		if bytes.Contains(got, want) {
			obs.Evidence.Reply = printable(got, 200)
			return done(obs, Reached, "connected and the peer echoed the nonce")
		}
		if o, why, ok := policyRefusal(spec, got); ok && (err != nil || o == Rejected) {
			obs.Evidence.Reply = printable(got, 200)
			return done(obs, o, why)
		}
		if err != nil {
			why := "the peer closed the connection without echoing the nonce"
			if isTimeout(err) {
				why = "no nonce echo before the deadline"
			} else if e, ok := errnoOf(err); ok {
				why = "the connection failed (" + errnoName(e) + ") before the nonce came back"
			}
			return tcpConnectedNoEcho(obs, got, why)
		}
	}
	return tcpConnectedNoEcho(obs, got, "4096 bytes without the nonce")
}

func tcpConnectedNoEcho(obs Observation, got []byte, why string) Observation {
	obs.Evidence.Reply = printable(got, 200)
	return done(obs, Refused, "connected (the SYN arrived at the target's address) but not reached: "+why)
}

func tcpConnectFailed(ctx context.Context, obs Observation, src source, spec ProbeSpec, err error, watch *icmpWatch, werr error, localPort int) Observation {
	if isTimeout(err) {
		// The deadline passed with no answer, but an ICMP error may have
		// been missed by connect's own error path; the raw socket knows.
		if h, ok := findTCPError(watch, src, spec, localPort, time.Now()); ok {
			return fromWatchHit(obs, h, src.target)
		}
		return done(obs, Silent, "no SYN-ACK, RST or ICMP error before the deadline")
	}
	e, isErrno := errnoOf(err)
	if isErrno {
		obs.Evidence.Errno = errnoName(e)
	}
	if !isErrno {
		return fail(obs, fmt.Sprintf("tcp probe %s: %v", obs.Target, err))
	}
	if localPort == 0 {
		return fail(obs, fmt.Sprintf("tcp probe %s: %v", obs.Target, err))
	}
	if h, ok := findTCPError(watch, src, spec, localPort, time.Now().Add(icmpGrace)); ok {
		return fromWatchHit(obs, h, src.target)
	}
	switch {
	case e == unix.ECONNREFUSED && watch != nil:
		return done(obs, Refused, "TCP RST from the target's address: the packet arrived, nothing listens")
	case e == unix.ECONNREFUSED:
		return fail(obs, "connection refused, but without a raw ICMP socket ("+werr.Error()+
			") a target's RST cannot be told from a middle box's port-unreachable")
	case e == unix.EHOSTUNREACH || e == unix.EHOSTDOWN:
		return fail(obs, localUnreachable(errnoName(e)))
	case e == unix.ENETUNREACH:
		return fail(obs, "no route to the target")
	case e == unix.EPERM || e == unix.EACCES:
		return done(obs, Rejected, "our own firewall refused to send it ("+errnoName(e)+")")
	}
	return fail(obs, fmt.Sprintf("tcp probe %s: %v", obs.Target, err))
}

func findTCPError(watch *icmpWatch, src source, spec ProbeSpec, localPort int, until time.Time) (watchHit, bool) {
	if watch == nil || localPort == 0 {
		return watchHit{}, false
	}
	target := src.target.WithZone("")
	return watch.find(func(q quote) bool {
		return q.proto == unix.IPPROTO_TCP && q.dst == target && q.dport == spec.Port && q.sport == localPort
	}, until)
}

func fromWatchHit(obs Observation, h watchHit, target netip.Addr) Observation {
	ev := newICMPEvidence(family(target), h.typ, h.code, h.from, target, localAddrs())
	obs.Evidence.ICMP = ev
	o, reason, _ := classifyICMP(ev)
	return done(obs, o, reason)
}

func fillSource(obs *Observation, src source) {
	if src.ifi != nil {
		obs.Evidence.Interface = src.ifi.Name
	}
	if src.local.IsValid() {
		obs.Evidence.Source = src.local.String()
	}
}
