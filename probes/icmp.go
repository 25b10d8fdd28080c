package probes

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net"
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
	fam := family(src.target)
	network, laddr := "ip4:icmp", "0.0.0.0"
	if fam == 6 {
		network, laddr = "ip6:ipv6-icmp", "::"
	}
	if src.local.IsValid() && !src.local.IsLinkLocalUnicast() {
		laddr = src.local.String()
	}
	c, err := icmp.ListenPacket(network, laddr)
	if err != nil {
		return fail(obs, fmt.Sprintf("icmp probe %s: raw socket (needs CAP_NET_RAW): %v", obs.Target, err))
	}
	defer c.Close()
	multicast := src.target.IsMulticast()
	if fam == 6 {
		var f ipv6.ICMPFilter
		f.SetAll(true)
		for _, t := range []ipv6.ICMPType{ipv6.ICMPTypeEchoReply, ipv6.ICMPTypeDestinationUnreachable,
			ipv6.ICMPTypePacketTooBig, ipv6.ICMPTypeTimeExceeded, ipv6.ICMPTypeParameterProblem} {
			f.Accept(t)
		}
		p := c.IPv6PacketConn()
		if err := p.SetICMPFilter(&f); err != nil {
			return fail(obs, fmt.Sprintf("icmp probe %s: icmpv6 filter: %v", obs.Target, err))
		}
		if multicast {
			// Our own stack would answer its own multicast echo; never
			// count ourselves as a responder.
			if err := p.SetMulticastInterface(src.ifi); err != nil {
				return fail(obs, fmt.Sprintf("icmp probe %s: multicast interface: %v", obs.Target, err))
			}
			if err := p.SetMulticastLoopback(false); err != nil {
				return fail(obs, fmt.Sprintf("icmp probe %s: multicast loopback: %v", obs.Target, err))
			}
		}
	}
	id := rand.IntN(0xffff) + 1
	payload := probeLine(spec.Nonce)
	var reqType icmp.Type = ipv4.ICMPTypeEcho
	if fam == 6 {
		reqType = ipv6.ICMPTypeEchoRequest
	}
	dst := &net.IPAddr{IP: src.target.AsSlice(), Zone: src.target.Zone()}
	local := localAddrs()
	target := src.target.WithZone("")
	var answers echoes // multicast only
	var outcome Outcome
	var why string
	var writeErr error
	buf := make([]byte, 1500)
	resend := newResender(ctx)
	answered, err := resend.run(c.SetReadDeadline, func(seq int) (bool, error) {
		msg := icmp.Message{Type: reqType, Body: &icmp.Echo{ID: id, Seq: seq + 1, Data: payload}}
		b, err := msg.Marshal(nil) // the kernel fills the ICMPv6 checksum
		if err != nil {
			return false, fmt.Errorf("icmp probe %s: %v", obs.Target, err)
		}
		if _, err := c.WriteTo(b, dst); err != nil {
			writeErr = err
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
		typ, code := int(buf[0]), int(buf[1])
		isReply := (fam == 4 && typ == icmp4EchoReply) || (fam == 6 && typ == icmp6EchoReply)
		switch {
		case isReply:
			if int(binary.BigEndian.Uint16(buf[4:6])) != id || !bytes.Contains(buf[8:n], []byte(spec.Nonce)) {
				return false, nil // someone else's echo
			}
			if multicast {
				if !local[from] {
					answers.add(resend, from, buf[8:n])
				}
				return false, nil
			}
			if from != target {
				return false, nil
			}
			obs.Evidence.From = from.String()
			obs.Evidence.Reply = printable(buf[8:n], 200)
			outcome, why = Reached, "echo reply from the target with the nonce"
			return true, nil
		case isICMPError(fam, typ):
			q, ok := parseQuote(buf[8:n])
			wantProto := unix.IPPROTO_ICMP
			if fam == 6 {
				wantProto = unix.IPPROTO_ICMPV6
			}
			if !ok || q.proto != wantProto || q.dst != target || q.icmpID != id {
				return false, nil
			}
			ev := newICMPEvidence(fam, typ, code, from, target, local)
			o, reason, decisive := classifyICMP(ev)
			if !decisive {
				return false, nil
			}
			obs.Evidence.ICMP = ev
			outcome, why = o, reason
			return true, nil
		}
		return false, nil
	})
	switch {
	case writeErr != nil:
		obs.Evidence.Sent = resend.sent
		if e, ok := errnoOf(writeErr); ok {
			obs.Evidence.Errno = errnoName(e)
			if e == unix.EPERM || e == unix.EACCES {
				return done(obs, Rejected, "our own firewall refused to send it ("+errnoName(e)+")")
			}
			if e == unix.EHOSTUNREACH {
				return fail(obs, localUnreachable(errnoName(e)))
			}
		}
		return fail(obs, fmt.Sprintf("icmp probe %s: send: %v", obs.Target, writeErr))
	case err != nil:
		return fail(obs, err.Error())
	}
	obs.Evidence.Sent = resend.sent
	if answered {
		return done(obs, outcome, why)
	}
	if len(answers.from) > 0 {
		answers.fill(&obs)
		return done(obs, Reached, fmt.Sprintf("%d host(s) answered the multicast echo with the nonce", len(answers.from)))
	}
	return done(obs, Silent, fmt.Sprintf("no echo reply and no ICMP error to %d requests before the deadline", resend.sent))
}
