package probes

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mdlayher/packet"
	"golang.org/x/sys/unix"
)

// Witness is a passive capture at a probe's target. It records every
// incoming frame that carries one of a probe's nonces or comes from a given
// source, so that "blocked" can rest on the sender seeing nothing and the
// target seeing nothing.
//
// Its observation uses the same outcomes: reached means at least one
// matching frame arrived, silent means none did during the whole window,
// error means the capture could not run (then it proves nothing).
type Witness struct {
	spec    WitnessSpec
	ifi     *net.Interface
	conn    *packet.Conn
	armedAt time.Time
	// untilNS is when the window ends (Unix ns): armedAt plus the window,
	// moved to the plan's start plus the window by begin.
	untilNS atomic.Int64
	macs    [][]byte
	ips     map[netip.Addr]bool
	nonces  [][]byte
	control []byte
	// An outbound witness (spec.Ifaces) reads one socket per interface.
	taps []*outTap
	name string // what it captures on: the interface, or the ifaces joined

	mu          sync.Mutex
	count       int
	captured    int
	controls    int
	controlLast time.Time
	first       *FrameSummary
	recorded    int
	records     []PacketRecord
	readErr     error
	stopped     chan struct{}
	stopOnce    sync.Once
	finished    chan struct{}
}

// StartWitness arms a witness on the interface holding spec.Via. The
// packet socket is opened on the calling goroutine, so a caller whose OS
// thread is in a network namespace captures there. The capture runs until
// the window ends or Stop is called, whichever is first.
func StartWitness(spec WitnessSpec) (*Witness, error) {
	w, err := armWitness(spec)
	if err != nil {
		return nil, err
	}
	w.begin(time.Now())
	return w, nil
}

// armWitness arms a witness whose window is not counted yet: it captures
// until begin ends its window (or MaxStartWait and its window pass, should
// begin never come).
func armWitness(spec WitnessSpec) (*Witness, error) {
	if err := spec.validate(MaxPlanDeadline); err != nil {
		return nil, fmt.Errorf("witness %s: %w", spec.ID, err)
	}
	if len(spec.Ifaces) > 0 {
		return startOutbound(spec)
	}
	ifi, _, err := InterfaceForSubnet(spec.Via)
	if err != nil {
		return nil, fmt.Errorf("witness %s: %w", spec.ID, err)
	}
	c, err := packet.Listen(ifi, packet.Raw, unix.ETH_P_ALL, nil)
	if err != nil {
		return nil, fmt.Errorf("witness %s: packet socket on %s (needs CAP_NET_RAW): %w", spec.ID, ifi.Name, err)
	}
	// Only frames arriving at the target count: its own replies carry the
	// nonce too and would otherwise read as "arrived".
	rc, err := c.SyscallConn()
	if err == nil {
		var serr error
		err = rc.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_PACKET, unix.PACKET_IGNORE_OUTGOING, 1)
		})
		if err == nil {
			err = serr
		}
	}
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("witness %s: ignore outgoing frames: %w", spec.ID, err)
	}
	w := newWitness(spec)
	w.ifi, w.conn, w.name = ifi, c, ifi.Name
	w.armedAt = time.Now()
	w.untilNS.Store(w.armedAt.Add(MaxStartWait + ms(spec.WindowMS)).UnixNano())
	// Set before the reader starts: Stop moves it to now to wake the
	// reader, and only begin, before Stop, moves it.
	if err := c.SetReadDeadline(w.until()); err != nil {
		c.Close()
		return nil, fmt.Errorf("witness %s: deadline: %w", spec.ID, err)
	}
	go w.read()
	return w, nil
}

// until is when the window ends.
func (w *Witness) until() time.Time { return time.Unix(0, w.untilNS.Load()) }

// begin counts the window from start (the plan's common start, at or
// after the witness was armed): it captures from its arming on, and ends
// its window after start, so arming early never shortens it. Called once,
// before Wait or Stop.
func (w *Witness) begin(start time.Time) {
	if start.Before(w.armedAt) {
		start = w.armedAt
	}
	select {
	case <-w.stopped:
		return // Stop's deadline stays
	default:
	}
	until := start.Add(ms(w.spec.WindowMS))
	w.untilNS.Store(until.UnixNano())
	if w.conn != nil {
		_ = w.conn.SetReadDeadline(until)
	}
	for _, t := range w.taps {
		_ = t.sock.setReadDeadline(until)
	}
}

// newWitness compiles a spec's keys.
func newWitness(spec WitnessSpec) *Witness {
	w := &Witness{
		spec: spec, ips: map[netip.Addr]bool{},
		stopped: make(chan struct{}), finished: make(chan struct{}),
	}
	for _, m := range spec.SrcMACs {
		hw, _ := net.ParseMAC(m)
		w.macs = append(w.macs, hw)
	}
	for _, a := range spec.SrcIPs {
		w.ips[a.WithZone("").Unmap()] = true
	}
	for _, n := range spec.Nonces {
		w.nonces = append(w.nonces, []byte(n))
	}
	if spec.Control != "" {
		w.control = []byte(ControlPrefix + spec.Control)
	}
	return w
}

// Interface is the name of the interface the witness captures on (the
// interfaces, comma-separated, for an outbound witness).
func (w *Witness) Interface() string { return w.name }

func (w *Witness) read() {
	defer close(w.finished)
	w.readLoop(func(buf []byte) error {
		n, _, err := w.conn.ReadFrom(buf)
		if err == nil {
			w.record(buf[:n])
		}
		return err
	})
}

// readLoop reads frames with next (which records what it read) until the
// window ends or Stop is called; a read timeout only wakes it to look at
// the clock, any other error ends the capture and is kept.
func (w *Witness) readLoop(next func(buf []byte) error) {
	buf := make([]byte, 65536)
	for {
		select {
		case <-w.stopped:
			return
		default:
		}
		if !time.Now().Before(w.until()) {
			return
		}
		if err := next(buf); err != nil {
			select {
			case <-w.stopped:
				return
			default:
			}
			if isTimeout(err) {
				continue
			}
			w.mu.Lock()
			w.readErr = err
			w.mu.Unlock()
			return
		}
	}
}

// countControl counts f as a positive-control frame if it carries the
// control nonce, and says whether it did: a control is never a match.
func (w *Witness) countControl(f []byte, at time.Time) bool {
	if w.control == nil || !bytes.Contains(f, w.control) {
		return false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.captured++
	w.controls++
	w.controlLast = at
	return true
}

func (w *Witness) record(f []byte) {
	at := time.Now()
	if w.countControl(f, at) {
		return
	}
	sum, ok := w.match(f)
	w.mu.Lock()
	defer w.mu.Unlock()
	w.captured++
	if ok {
		w.count++
		if w.first == nil {
			sum.At = at
			w.first = &sum
		}
	}
}

// drain reads, without blocking, every frame already queued on the
// socket. A probe that got its answer returns before the reader goroutine
// may have looked at the request frame, but the kernel queued that frame
// here before the target could answer it: stopping must not drop it.
func (w *Witness) drain() {
	rc, err := w.conn.SyscallConn()
	if err != nil {
		return
	}
	buf := make([]byte, 65536)
	_ = rc.Control(func(fd uintptr) {
		for range 100000 {
			n, _, err := unix.Recvfrom(int(fd), buf, unix.MSG_DONTWAIT)
			if err != nil {
				return
			}
			w.record(buf[:n])
		}
	})
}

// Wait blocks until the window ends (or ctx is done) and returns the
// observation.
func (w *Witness) Wait(ctx context.Context) Observation {
	select {
	case <-w.finished:
	case <-ctx.Done():
	}
	return w.Stop()
}

// Stop ends the capture now and returns the observation. Safe to call more
// than once.
func (w *Witness) Stop() Observation {
	w.stopOnce.Do(func() {
		close(w.stopped)
		if w.conn != nil {
			_ = w.conn.SetReadDeadline(time.Now()) // wakes a blocked ReadFrom
		}
		for _, t := range w.taps {
			_ = t.sock.setReadDeadline(time.Now())
		}
		<-w.finished
		if time.Now().Before(w.until()) {
			if w.conn != nil {
				w.drain()
			}
			for _, t := range w.taps {
				t.drain(w)
			}
		}
		if w.conn != nil {
			w.conn.Close()
		}
		for _, t := range w.taps {
			t.sock.close()
		}
	})
	w.mu.Lock()
	defer w.mu.Unlock()
	end := time.Now()
	if u := w.until(); end.After(u) {
		end = u
	}
	obs := Observation{
		ID: w.spec.ID, Kind: KindWitness, Target: w.name,
		StartedAt: w.armedAt, ElapsedMS: end.Sub(w.armedAt).Milliseconds(),
	}
	obs.Evidence.Interface = w.name
	obs.Evidence.Witness = &WitnessEvidence{ArmedAt: w.armedAt, Until: end, Count: w.count, First: w.first, Captured: w.captured,
		Controls: w.controls, ControlLast: w.controlLast, Recorded: w.recorded, Records: append([]PacketRecord(nil), w.records...)}
	arrived := "arrived at"
	if w.taps != nil {
		arrived = "left"
	}
	switch {
	case w.count > 0:
		return done(obs, Reached, fmt.Sprintf("%d matching frame(s) %s %s", w.count, arrived, w.name))
	case w.readErr != nil:
		return fail(obs, fmt.Sprintf("witness on %s: capture failed: %v", w.name, w.readErr))
	}
	return done(obs, Silent, fmt.Sprintf("no matching frame %s %s in %d ms", arrived, w.name, obs.ElapsedMS))
}

// match decodes just enough of an Ethernet frame to apply the witness's
// keys and filters.
func (w *Witness) match(f []byte) (FrameSummary, bool) {
	var s FrameSummary
	if len(f) < 14 {
		return s, false
	}
	s.DstMAC = net.HardwareAddr(f[0:6]).String()
	s.SrcMAC = net.HardwareAddr(f[6:12]).String()
	et := binary.BigEndian.Uint16(f[12:14])
	l3 := f[14:]
	for (et == 0x8100 || et == 0x88a8) && len(l3) >= 4 {
		et = binary.BigEndian.Uint16(l3[2:4])
		l3 = l3[4:]
	}
	var src netip.Addr
	proto, srcPort := "", 0
	switch et {
	case unix.ETH_P_ARP:
		s.EtherType = "arp"
		proto = "arp"
		// Ethernet/IPv4 ARP: operation at 6, sender MAC at 8, sender IP
		// at 14, target IP at 24.
		if len(l3) >= 28 && l3[4] == 6 && l3[5] == 4 {
			src = netip.AddrFrom4([4]byte(l3[14:18]))
			s.DstIP = netip.AddrFrom4([4]byte(l3[24:28])).String()
			s.ARPOp = arpOpName(binary.BigEndian.Uint16(l3[6:8]))
			s.ARPSenderMAC = net.HardwareAddr(l3[8:14]).String()
		}
	case unix.ETH_P_IP:
		s.EtherType = "ipv4"
		if len(l3) >= 20 && l3[0]>>4 == 4 {
			ihl := int(l3[0]&0x0f) * 4
			src = netip.AddrFrom4([4]byte(l3[12:16]))
			s.DstIP = netip.AddrFrom4([4]byte(l3[16:20])).String()
			proto, srcPort, s.DstPort = l4Ports(int(l3[9]), l3, ihl)
		}
	case unix.ETH_P_IPV6:
		s.EtherType = "ipv6"
		if len(l3) >= 40 {
			src = netip.AddrFrom16([16]byte(l3[8:24]))
			s.DstIP = netip.AddrFrom16([16]byte(l3[24:40])).String()
			proto, srcPort, s.DstPort = l4Ports(int(l3[6]), l3, 40)
		}
	default:
		s.EtherType = fmt.Sprintf("0x%04x", et)
	}
	if src.IsValid() {
		s.SrcIP = src.String()
	}
	s.Proto = proto
	if w.spec.Proto == ProtoIPv6Config {
		if what := ipv6Config(et, l3); what != "" {
			s.MatchedBy = what
			return s, true
		}
		return s, false
	}
	if w.spec.Proto != "" && w.spec.Proto != proto {
		return s, false
	}
	if w.spec.Port != 0 && w.spec.Port != s.DstPort {
		return s, false
	}
	if w.spec.SrcPort != 0 && w.spec.SrcPort != srcPort {
		return s, false
	}
	if w.spec.DstIP.IsValid() && w.spec.DstIP.String() != s.DstIP {
		return s, false
	}
	if w.spec.ARPSender != "" && !strings.EqualFold(w.spec.ARPSender, s.ARPSenderMAC) {
		return s, false
	}
	for _, n := range w.nonces {
		if bytes.Contains(f, n) {
			s.MatchedBy = "nonce " + string(n)
			return s, true
		}
	}
	if src.IsValid() && w.ips[src] {
		s.MatchedBy = "src_ip " + src.String()
		return s, true
	}
	for _, m := range w.macs {
		if bytes.Equal(f[6:12], m) {
			s.MatchedBy = "src_mac " + s.SrcMAC
			return s, true
		}
		// An ARP sender hardware address can differ from the frame's source
		// (a proxy); match either.
		if et == unix.ETH_P_ARP && len(l3) >= 14 && bytes.Equal(l3[8:14], m) {
			s.MatchedBy = "arp sender " + net.HardwareAddr(m).String()
			return s, true
		}
	}
	return s, false
}

// arpOpName names an ARP operation as FrameSummary.ARPOp spells it.
func arpOpName(op uint16) string {
	switch op {
	case 1:
		return "request"
	case 2:
		return "reply"
	}
	return fmt.Sprintf("op-%d", op)
}

// ProtoIPv6Config is the witness proto that matches IPv6 configuration
// arriving at a box: what would give it an IPv6 path the IPv4-only rules do
// not cover.
const ProtoIPv6Config = "ipv6-config"

// ipv6Config names the IPv6 configuration an IPv6 packet carries (a router
// advertisement, a redirect, a DHCPv6 message to a client), or "".
// Extension headers are not walked: neither RAs nor DHCPv6 replies carry
// them in practice.
func ipv6Config(et uint16, l3 []byte) string {
	if et != unix.ETH_P_IPV6 || len(l3) < 44 {
		return ""
	}
	switch l3[6] {
	case unix.IPPROTO_ICMPV6:
		switch l3[40] {
		case 134:
			return "icmpv6 router advertisement"
		case 137:
			return "icmpv6 redirect"
		}
	case unix.IPPROTO_UDP:
		if binary.BigEndian.Uint16(l3[42:44]) == 546 {
			return "dhcpv6 to a client (udp 546)"
		}
	}
	return ""
}

func l4Info(p int, l3 []byte, off int) (string, int) {
	proto, _, dst := l4Ports(p, l3, off)
	return proto, dst
}

// l4Ports is l4Info with the source port too (0 when there is none).
func l4Ports(p int, l3 []byte, off int) (proto string, src, dst int) {
	ports := func() (int, int) {
		if len(l3) >= off+4 {
			return int(binary.BigEndian.Uint16(l3[off : off+2])), int(binary.BigEndian.Uint16(l3[off+2 : off+4]))
		}
		return 0, 0
	}
	switch p {
	case unix.IPPROTO_TCP:
		src, dst = ports()
		return "tcp", src, dst
	case unix.IPPROTO_UDP:
		src, dst = ports()
		return "udp", src, dst
	case unix.IPPROTO_ICMP:
		return "icmp", 0, 0
	case unix.IPPROTO_ICMPV6:
		return "icmpv6", 0, 0
	}
	return fmt.Sprintf("ip-proto-%d", p), 0, 0
}
