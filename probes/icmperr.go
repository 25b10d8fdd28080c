package probes

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"sync"
	"time"

	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv6"
	"golang.org/x/sys/unix"
)

// ICMP types and codes the classifier needs, by family.
const (
	icmp4DestUnreach  = 3
	icmp4SourceQuench = 4
	icmp4Redirect     = 5
	icmp4TimeExceeded = 11
	icmp4ParamProblem = 12
	icmp4EchoReply    = 0
	icmp4Echo         = 8

	icmp6DestUnreach  = 1
	icmp6PacketTooBig = 2
	icmp6TimeExceeded = 3
	icmp6ParamProblem = 4
	icmp6Echo         = 128
	icmp6EchoReply    = 129
)

// icmpName names an ICMP error for the report.
func icmpName(family, typ, code int) string {
	icmp4UnreachNames := [...]string{
		"net-unreachable", "host-unreachable", "protocol-unreachable", "port-unreachable",
		"frag-needed", "source-route-failed", "net-unknown", "host-unknown", "host-isolated",
		"net-prohibited", "host-prohibited", "net-unreachable-for-tos", "host-unreachable-for-tos",
		"admin-prohibited", "host-precedence-violation", "precedence-cutoff",
	}
	icmp6UnreachNames := [...]string{
		"no-route", "admin-prohibited", "beyond-scope", "addr-unreachable", "port-unreachable",
		"policy-fail", "reject-route",
	}
	if family == 4 {
		switch typ {
		case icmp4DestUnreach:
			if code < len(icmp4UnreachNames) {
				return icmp4UnreachNames[code]
			}
			return fmt.Sprintf("unreachable-code-%d", code)
		case icmp4TimeExceeded:
			return "time-exceeded"
		case icmp4ParamProblem:
			return "parameter-problem"
		case icmp4SourceQuench:
			return "source-quench"
		case icmp4Redirect:
			return "redirect"
		}
		return fmt.Sprintf("icmp-type-%d-code-%d", typ, code)
	}
	switch typ {
	case icmp6DestUnreach:
		if code < len(icmp6UnreachNames) {
			return icmp6UnreachNames[code]
		}
		return fmt.Sprintf("unreachable-code-%d", code)
	case icmp6PacketTooBig:
		return "packet-too-big"
	case icmp6TimeExceeded:
		return "time-exceeded"
	case icmp6ParamProblem:
		return "parameter-problem"
	}
	return fmt.Sprintf("icmpv6-type-%d-code-%d", typ, code)
}

// isPortUnreach is the answer a host's own stack gives for a closed UDP
// port (or an unknown protocol): the packet arrived.
func isPortUnreach(family, typ, code int) bool {
	if family == 4 {
		return typ == icmp4DestUnreach && (code == 3 || code == 2)
	}
	return typ == icmp6DestUnreach && code == 4
}

// isHostUnreach is "no ARP/NDP answer" as a stack reports it: ICMPv4 3/1
// (host unreachable) and ICMPv6 1/3 (address unreachable).
func isHostUnreach(family, typ, code int) bool {
	if family == 4 {
		return typ == icmp4DestUnreach && code == 1
	}
	return typ == icmp6DestUnreach && code == 3
}

// isAdminProhibited is a firewall's "no": ICMPv4 3/9, 3/10, 3/13 and
// ICMPv6 1/1 (admin), 1/5 (policy) and 1/6 (reject route).
func isAdminProhibited(family, typ, code int) bool {
	if family == 4 {
		return typ == icmp4DestUnreach && (code == 9 || code == 10 || code == 13)
	}
	return typ == icmp6DestUnreach && (code == 1 || code == 5 || code == 6)
}

// isAdvisory marks ICMP messages that say nothing about delivery (path MTU,
// redirects, source quench): the kernel handles them and the probe waits on.
func isAdvisory(family, typ, code int) bool {
	if family == 4 {
		return typ == icmp4SourceQuench || typ == icmp4Redirect || (typ == icmp4DestUnreach && code == 4)
	}
	return typ == icmp6PacketTooBig
}

// newICMPEvidence fills who sent an ICMP error relative to the target.
func newICMPEvidence(family, typ, code int, offender, target netip.Addr, local map[netip.Addr]bool) *ICMPEvidence {
	offender = offender.WithZone("")
	return &ICMPEvidence{
		Family:           family,
		Type:             typ,
		Code:             code,
		Name:             icmpName(family, typ, code),
		Offender:         offender.String(),
		OffenderIsTarget: offender == target.WithZone(""),
		OffenderIsLocal:  local[offender],
	}
}

// classifyICMP maps an ICMP error matched to the probe's own packet to an
// outcome. The rules, in order:
//
//   - advisory messages (MTU, redirect) decide nothing;
//   - port-unreachable (or protocol-unreachable) sent by the target itself,
//     our own address included: the packet arrived (refused);
//   - an error our own stack generated: admin-prohibited is our own
//     firewall (rejected); host or address unreachable means the next hop
//     never answered ARP/NDP, so the packet never left (error, never
//     silence); anything else from our own stack is an error too;
//   - admin-prohibited from anyone: policy (rejected, naming who);
//   - any other error, including port-unreachable from an address that is
//     not the target (an nft "reject" in a router): something in the path
//     said the packet will not be delivered (rejected, naming who).
func classifyICMP(ev *ICMPEvidence) (Outcome, string, bool) {
	if isAdvisory(ev.Family, ev.Type, ev.Code) {
		return "", "", false
	}
	admin := isAdminProhibited(ev.Family, ev.Type, ev.Code)
	switch {
	case ev.OffenderIsTarget && isPortUnreach(ev.Family, ev.Type, ev.Code):
		return Refused, fmt.Sprintf("ICMP %s from the target itself: the packet arrived, nothing listens", ev.Name), true
	case ev.OffenderIsLocal && admin:
		return Rejected, fmt.Sprintf("ICMP %s from our own stack (%s): a local firewall rejected it", ev.Name, ev.Offender), true
	case ev.OffenderIsLocal && isHostUnreach(ev.Family, ev.Type, ev.Code):
		return Error, localUnreachable(fmt.Sprintf("ICMP %s from our own stack, %s", ev.Name, ev.Offender)), true
	case ev.OffenderIsLocal:
		return Error, fmt.Sprintf("ICMP %s from our own stack (%s): the packet never left, so it proves nothing", ev.Name, ev.Offender), true
	case ev.OffenderIsTarget && admin:
		return Rejected, fmt.Sprintf("ICMP %s from the target's own firewall (%s)", ev.Name, ev.Offender), true
	case admin:
		return Rejected, fmt.Sprintf("ICMP %s from %s, a hop in the path: blocked by policy", ev.Name, ev.Offender), true
	case ev.OffenderIsTarget:
		return Rejected, fmt.Sprintf("ICMP %s from the target itself", ev.Name), true
	default:
		return Rejected, fmt.Sprintf("ICMP %s from %s, a hop in the path, not the target", ev.Name, ev.Offender), true
	}
}

// quote is the start of our own packet as an ICMP error quotes it.
type quote struct {
	proto    int
	src, dst netip.Addr
	sport    int
	dport    int
	icmpType int
	icmpID   int
}

// parseQuote reads the IP header and first 8 bytes that an ICMP error
// carries (RFC 792, RFC 4443).
func parseQuote(b []byte) (quote, bool) {
	var q quote
	if len(b) < 1 {
		return q, false
	}
	var l4 []byte
	switch b[0] >> 4 {
	case 4:
		ihl := int(b[0]&0x0f) * 4
		if ihl < 20 || len(b) < ihl+8 {
			return q, false
		}
		q.proto = int(b[9])
		q.src = netip.AddrFrom4([4]byte(b[12:16]))
		q.dst = netip.AddrFrom4([4]byte(b[16:20]))
		l4 = b[ihl : ihl+8]
	case 6:
		if len(b) < 48 {
			return q, false
		}
		q.proto = int(b[6])
		q.src = netip.AddrFrom16([16]byte(b[8:24]))
		q.dst = netip.AddrFrom16([16]byte(b[24:40]))
		l4 = b[40:48]
	default:
		return q, false
	}
	switch q.proto {
	case unix.IPPROTO_TCP, unix.IPPROTO_UDP:
		q.sport = int(binary.BigEndian.Uint16(l4[0:2]))
		q.dport = int(binary.BigEndian.Uint16(l4[2:4]))
	case unix.IPPROTO_ICMP, unix.IPPROTO_ICMPV6:
		q.icmpType = int(l4[0])
		q.icmpID = int(binary.BigEndian.Uint16(l4[4:6]))
	}
	return q, true
}

// isICMPError reports whether an ICMP type is an error that quotes a packet.
func isICMPError(family, typ int) bool {
	if family == 4 {
		return typ == icmp4DestUnreach || typ == icmp4TimeExceeded || typ == icmp4ParamProblem ||
			typ == icmp4SourceQuench || typ == icmp4Redirect
	}
	return typ >= icmp6DestUnreach && typ <= icmp6ParamProblem
}

// parseRecvErr reads an IP_RECVERR / IPV6_RECVERR control message: the
// kernel's sock_extended_err followed by the offender's address. Only
// errors that came as ICMP are returned; local ones give ok=false.
func parseRecvErr(oob []byte) (family, typ, code int, offender netip.Addr, errno unix.Errno, ok bool) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return
	}
	for _, m := range msgs {
		isV4 := m.Header.Level == unix.SOL_IP && m.Header.Type == unix.IP_RECVERR
		isV6 := m.Header.Level == unix.SOL_IPV6 && m.Header.Type == unix.IPV6_RECVERR
		if !isV4 && !isV6 || len(m.Data) < sizeofSockExtendedErr {
			continue
		}
		ee := m.Data[:sizeofSockExtendedErr]
		errno = unix.Errno(binary.NativeEndian.Uint32(ee[0:4]))
		origin := ee[4]
		if origin != unix.SO_EE_ORIGIN_ICMP && origin != unix.SO_EE_ORIGIN_ICMP6 {
			return 0, 0, 0, netip.Addr{}, errno, false
		}
		typ, code = int(ee[5]), int(ee[6])
		family = 4
		if origin == unix.SO_EE_ORIGIN_ICMP6 {
			family = 6
		}
		sa := m.Data[sizeofSockExtendedErr:]
		if len(sa) >= 2 {
			switch binary.NativeEndian.Uint16(sa[0:2]) {
			case unix.AF_INET:
				if len(sa) >= 8 {
					offender = netip.AddrFrom4([4]byte(sa[4:8]))
				}
			case unix.AF_INET6:
				if len(sa) >= 24 {
					offender = netip.AddrFrom16([16]byte(sa[8:24])).Unmap()
				}
			}
		}
		return family, typ, code, offender, errno, true
	}
	return
}

// icmpWatch reads every ICMP error delivered to this host on a raw socket,
// for probes (TCP) whose own socket only reports an errno. Raw ICMP sockets
// get a copy of each ICMP message before the kernel hands the error to the
// TCP socket, so the error that made connect fail is always in here.
type icmpWatch struct {
	conn   *icmp.PacketConn
	family int
	mu     sync.Mutex
	hits   []watchHit
	more   chan struct{}
	done   chan struct{}
}

type watchHit struct {
	typ, code int
	from      netip.Addr
	q         quote
}

// openICMPWatch opens the raw socket on the calling goroutine (so it lives
// in the caller's network namespace) and starts reading.
func openICMPWatch(family int) (*icmpWatch, error) {
	network, addr := "ip4:icmp", "0.0.0.0"
	if family == 6 {
		network, addr = "ip6:ipv6-icmp", "::"
	}
	c, err := icmp.ListenPacket(network, addr)
	if err != nil {
		return nil, fmt.Errorf("raw icmp socket: %w", err)
	}
	if family == 6 {
		// Errors only: NDP and echo traffic never reach this socket.
		var f ipv6.ICMPFilter
		f.SetAll(true)
		for _, t := range []ipv6.ICMPType{ipv6.ICMPTypeDestinationUnreachable, ipv6.ICMPTypePacketTooBig,
			ipv6.ICMPTypeTimeExceeded, ipv6.ICMPTypeParameterProblem} {
			f.Accept(t)
		}
		if err := c.IPv6PacketConn().SetICMPFilter(&f); err != nil {
			c.Close()
			return nil, fmt.Errorf("icmpv6 filter: %w", err)
		}
	}
	w := &icmpWatch{conn: c, family: family, more: make(chan struct{}, 1), done: make(chan struct{})}
	go w.read()
	return w, nil
}

func (w *icmpWatch) read() {
	defer close(w.done)
	buf := make([]byte, 1500)
	for {
		n, peer, err := w.conn.ReadFrom(buf)
		if err != nil {
			return
		}
		if n < 8 || !isICMPError(w.family, int(buf[0])) {
			continue
		}
		q, ok := parseQuote(buf[8:n])
		if !ok {
			continue
		}
		from, _ := netip.ParseAddr(peerIP(peer))
		w.mu.Lock()
		w.hits = append(w.hits, watchHit{typ: int(buf[0]), code: int(buf[1]), from: from.WithZone(""), q: q})
		w.mu.Unlock()
		select {
		case w.more <- struct{}{}:
		default:
		}
	}
}

// find waits until until for an ICMP error whose quote matches.
func (w *icmpWatch) find(match func(quote) bool, until time.Time) (watchHit, bool) {
	for {
		w.mu.Lock()
		for _, h := range w.hits {
			if match(h.q) && !isAdvisory(w.family, h.typ, h.code) {
				w.mu.Unlock()
				return h, true
			}
		}
		w.mu.Unlock()
		wait := time.Until(until)
		if wait <= 0 {
			return watchHit{}, false
		}
		t := time.NewTimer(wait)
		select {
		case <-w.more:
			t.Stop()
		case <-t.C:
		case <-w.done:
			t.Stop()
			until = time.Now()
		}
	}
}

func (w *icmpWatch) close() {
	w.conn.Close()
	<-w.done
}

// sizeofSockExtendedErr is sizeof(struct sock_extended_err).
const sizeofSockExtendedErr = 16
