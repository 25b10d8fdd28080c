package probes

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"time"

	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
	"golang.org/x/sys/unix"
)

// multicastLinger is how long a multicast echo keeps listening for more
// responders after the first one.
const multicastLinger = 300 * time.Millisecond

// probeICMP sends ICMP or ICMPv6 echo requests carrying the nonce on a raw
// socket.
//
//   - an echo reply from the target with our id and nonce: reached;
//   - to a multicast group (ff02::1): any reply with the nonce from an
//     address that is not ours is reached, and every responder is named;
//   - an ICMP error quoting our echo: classifyICMP;
//   - nothing: silent.
//
// On IPv6 the socket's ICMP filter passes only echo replies and errors, so
// NDP and MLD traffic never reach the probe.
func probeICMP(ctx context.Context, spec ProbeSpec, obs Observation) Observation {
	src, err := resolveSource(&spec)
	if err != nil {
		return fail(obs, fmt.Sprintf("icmp probe %s: %v", obs.Target, err))
	}
	fillSource(&obs, src)
	c, err := listenICMP(src)
	if err != nil {
		return fail(obs, fmt.Sprintf("icmp probe %s: %v", obs.Target, err))
	}
	defer c.Close()
	r := exchangeEcho(ctx, c, src, spec.Nonce, &obs)
	switch {
	case r.writeErr != nil:
		return icmpSendFailed(obs, r.sent, r.writeErr)
	case r.err != nil:
		return fail(obs, r.err.Error())
	}
	obs.Evidence.Sent = r.sent
	if r.answered {
		return done(obs, r.outcome, r.why)
	}
	if len(r.answers.from) > 0 {
		r.answers.fill(&obs)
		return done(obs, Reached, fmt.Sprintf("%d host(s) answered the multicast echo with the nonce", len(r.answers.from)))
	}
	return done(obs, Silent, fmt.Sprintf("no echo reply and no ICMP error to %d requests before the deadline", r.sent))
}

// echoed is the result of one echo exchange.
type echoed struct {
	answered bool // a decisive answer came: outcome and why say what
	outcome  Outcome
	why      string
	answers  echoes // multicast only
	sent     int
	writeErr error // a send our own stack refused
	err      error
}

// exchangeEcho sends echo requests carrying nonce to src's target on c,
// resending, until a decisive answer (the target's echo, or an ICMP error
// quoting ours) or ctx's deadline. A multicast echo collects every other
// host's echo instead. The evidence of a decisive answer goes in obs.
func exchangeEcho(ctx context.Context, c *icmp.PacketConn, src source, nonce string, obs *Observation) echoed {
	var r echoed
	fam := family(src.target)
	multicast := src.target.IsMulticast()
	id := rand.IntN(0xffff) + 1
	payload := probeLine(nonce)
	dst := &net.IPAddr{IP: src.target.AsSlice(), Zone: src.target.Zone()}
	local := localAddrs()
	target := src.target.WithZone("")
	buf := make([]byte, 1500)
	resend := newResender(ctx)
	r.answered, r.err = resend.run(c.SetReadDeadline, func(seq int) (bool, error) {
		b, err := echoRequest(fam, id, seq+1, payload)
		if err != nil {
			return false, fmt.Errorf("icmp probe %s: %v", obs.Target, err)
		}
		if _, err := c.WriteTo(b, dst); err != nil {
			r.writeErr = err
			return false, err
		}
		return true, nil
	}, func(wake time.Time) (bool, error) {
		_ = c.SetReadDeadline(wake)
		n, peer, err := c.ReadFrom(buf)
		if err != nil {
			if isTimeout(err) {
				return false, nil
			}
			return false, fmt.Errorf("icmp probe %s: read: %v", obs.Target, err)
		}
		if n < 8 {
			return false, nil
		}
		from := addrOf(net.ParseIP(peerIP(peer)))
		typ := int(buf[0])
		isReply := (fam == 4 && typ == icmp4EchoReply) || (fam == 6 && typ == icmp6EchoReply)
		switch {
		case isReply:
			if int(binary.BigEndian.Uint16(buf[4:6])) != id || !bytes.Contains(buf[8:n], []byte(nonce)) {
				return false, nil // someone else's echo
			}
			if multicast {
				if !local[from] {
					r.answers.add(resend, from, buf[8:n])
				}
				return false, nil
			}
			if from != target {
				return false, nil
			}
			obs.Evidence.From = from.String()
			obs.Evidence.Reply = printable(buf[8:n], 200)
			r.outcome, r.why = Reached, "echo reply from the target with the nonce"
			return true, nil
		case isICMPError(fam, typ):
			ev, o, why, ok := echoError(fam, buf[:n], from, target, id, local)
			if !ok {
				return false, nil
			}
			obs.Evidence.ICMP = ev
			r.outcome, r.why = o, why
			return true, nil
		}
		return false, nil
	})
	r.sent = resend.sent
	return r
}

// listenICMP opens the raw socket an echo probe to src sends and reads on.
func listenICMP(src source) (*icmp.PacketConn, error) {
	network, laddr := "ip4:icmp", "0.0.0.0"
	if family(src.target) == 6 {
		network, laddr = "ip6:ipv6-icmp", "::"
	}
	if src.local.IsValid() && !src.local.IsLinkLocalUnicast() {
		laddr = src.local.String()
	}
	c, err := icmp.ListenPacket(network, laddr)
	if err != nil {
		return nil, fmt.Errorf("raw socket (needs CAP_NET_RAW): %w", err)
	}
	if family(src.target) == 6 {
		if err := setICMPv6Options(c.IPv6PacketConn(), src); err != nil {
			c.Close()
			return nil, err
		}
	}
	return c, nil
}

// setICMPv6Options lets only echo replies and errors through, so NDP and
// MLD traffic never reach the probe, and sends a multicast echo out of
// src's interface without looping it back to us.
func setICMPv6Options(p *ipv6.PacketConn, src source) error {
	var f ipv6.ICMPFilter
	f.SetAll(true)
	for _, t := range []ipv6.ICMPType{ipv6.ICMPTypeEchoReply, ipv6.ICMPTypeDestinationUnreachable,
		ipv6.ICMPTypePacketTooBig, ipv6.ICMPTypeTimeExceeded, ipv6.ICMPTypeParameterProblem} {
		f.Accept(t)
	}
	if err := p.SetICMPFilter(&f); err != nil {
		return fmt.Errorf("icmpv6 filter: %w", err)
	}
	if !src.target.IsMulticast() {
		return nil
	}
	// Our own stack would answer its own multicast echo; never count
	// ourselves as a responder.
	if err := p.SetMulticastInterface(src.ifi); err != nil {
		return fmt.Errorf("multicast interface: %w", err)
	}
	if err := p.SetMulticastLoopback(false); err != nil {
		return fmt.Errorf("multicast loopback: %w", err)
	}
	return nil
}

// echoRequest builds the seq-th echo request of family fam; the kernel
// fills the ICMPv6 checksum.
func echoRequest(fam, id, seq int, payload []byte) ([]byte, error) {
	var typ icmp.Type = ipv4.ICMPTypeEcho
	if fam == 6 {
		typ = ipv6.ICMPTypeEchoRequest
	}
	msg := icmp.Message{Type: typ, Body: &icmp.Echo{ID: id, Seq: seq, Data: payload}}
	return msg.Marshal(nil)
}

// echoError judges an ICMP error msg from from: ok only when it quotes our
// echo (to target, with our id), since any other is about someone else's
// packet, and decides the probe (classifyICMP), since an advisory one is
// waited past.
func echoError(fam int, msg []byte, from, target netip.Addr, id int, local map[netip.Addr]bool) (*ICMPEvidence, Outcome, string, bool) {
	q, ok := parseQuote(msg[8:])
	wantProto := unix.IPPROTO_ICMP
	if fam == 6 {
		wantProto = unix.IPPROTO_ICMPV6
	}
	if !ok || q.proto != wantProto || q.dst != target || q.icmpID != id {
		return nil, "", "", false
	}
	ev := newICMPEvidence(fam, int(msg[0]), int(msg[1]), from, target, local)
	o, why, decisive := classifyICMP(ev)
	if !decisive {
		return nil, "", "", false
	}
	return ev, o, why, true
}

// icmpSendFailed judges an echo our own stack would not send: a local
// firewall's refusal is a verdict, a missing next hop proves nothing about
// the path.
func icmpSendFailed(obs Observation, sent int, err error) Observation {
	obs.Evidence.Sent = sent
	if e, ok := errnoOf(err); ok {
		obs.Evidence.Errno = errnoName(e)
		if e == unix.EPERM || e == unix.EACCES {
			return done(obs, Rejected, "our own firewall refused to send it ("+errnoName(e)+")")
		}
		if e == unix.EHOSTUNREACH {
			return fail(obs, localUnreachable(errnoName(e)))
		}
	}
	return fail(obs, fmt.Sprintf("icmp probe %s: send: %v", obs.Target, err))
}
