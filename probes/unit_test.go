package probes

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/mdlayher/arp"
	"github.com/mdlayher/ethernet"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

func TestOutcomeJSON(t *testing.T) {
	for _, o := range Outcomes() {
		b, err := json.Marshal(o)
		require.NoError(t, err)
		var back Outcome
		require.NoError(t, json.Unmarshal(b, &back))
		require.Equal(t, o, back)
	}
	_, err := json.Marshal(Outcome("blocked"))
	require.Error(t, err, "an outcome outside the set never reaches the wire")
	var o Outcome
	require.Error(t, json.Unmarshal([]byte(`"blocked"`), &o))
	require.Error(t, json.Unmarshal([]byte(`""`), &o))

	// Each outcome is on exactly one side, or on neither (error).
	for _, o := range Outcomes() {
		require.False(t, o.Arrived() && o.Stopped(), o)
	}
	require.True(t, Reached.Arrived() && Refused.Arrived())
	require.True(t, Rejected.Stopped() && Silent.Stopped())
	require.False(t, Error.Arrived() || Error.Stopped())
}

func TestClassifyICMP(t *testing.T) {
	target := netip.MustParseAddr("10.201.2.2")
	router := netip.MustParseAddr("10.201.1.1")
	self := netip.MustParseAddr("10.201.1.2")
	target6 := netip.MustParseAddr("2001:db8:2::2")
	router6 := netip.MustParseAddr("2001:db8:1::1")
	local := map[netip.Addr]bool{self: true}
	tests := []struct {
		name      string
		fam, t, c int
		from, to  netip.Addr
		want      Outcome
		decisive  bool
		reasonHas string
	}{
		{"port unreachable from target", 4, 3, 3, target, target, Refused, true, "arrived"},
		{"port unreachable from router", 4, 3, 3, router, target, Rejected, true, "not the target"},
		{"admin prohibited from router", 4, 3, 13, router, target, Rejected, true, "policy"},
		{"host prohibited from router", 4, 3, 10, router, target, Rejected, true, "policy"},
		{"admin prohibited from target", 4, 3, 13, target, target, Rejected, true, "target's own firewall"},
		{"host unreachable from router", 4, 3, 1, router, target, Rejected, true, "host-unreachable"},
		{"host unreachable from ourselves", 4, 3, 1, self, target, Error, true, "packet never left"},
		{"admin prohibited from ourselves", 4, 3, 13, self, target, Rejected, true, "local firewall"},
		{"network unreachable from ourselves", 4, 3, 0, self, target, Error, true, "never left"},
		{"port unreachable from ourselves, the target", 4, 3, 3, self, self, Refused, true, "arrived"},
		{"frag needed decides nothing", 4, 3, 4, router, target, "", false, ""},
		{"redirect decides nothing", 4, 5, 1, router, target, "", false, ""},
		{"time exceeded", 4, 11, 0, router, target, Rejected, true, "time-exceeded"},
		{"v6 port unreachable from target", 6, 1, 4, target6, target6, Refused, true, "arrived"},
		{"v6 port unreachable from router", 6, 1, 4, router6, target6, Rejected, true, "not the target"},
		{"v6 admin prohibited", 6, 1, 1, router6, target6, Rejected, true, "admin-prohibited"},
		{"v6 policy fail", 6, 1, 5, router6, target6, Rejected, true, "policy-fail"},
		{"v6 reject route", 6, 1, 6, router6, target6, Rejected, true, "reject-route"},
		{"v6 address unreachable", 6, 1, 3, router6, target6, Rejected, true, "addr-unreachable"},
		{"v6 packet too big", 6, 2, 0, router6, target6, "", false, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ev := newICMPEvidence(tt.fam, tt.t, tt.c, tt.from, tt.to, local)
			o, why, decisive := classifyICMP(ev)
			require.Equal(t, tt.decisive, decisive)
			require.Equal(t, tt.want, o)
			require.Contains(t, why, tt.reasonHas)
			require.Equal(t, tt.from.String(), ev.Offender)
		})
	}
}

// ipv4Packet builds an IPv4 header plus payload (checksums are not needed
// by the parsers under test).
func ipv4Packet(proto byte, src, dst netip.Addr, payload []byte) []byte {
	h := make([]byte, 20)
	h[0] = 0x45
	binary.BigEndian.PutUint16(h[2:4], uint16(20+len(payload)))
	h[8] = 64
	h[9] = proto
	s, d := src.As4(), dst.As4()
	copy(h[12:16], s[:])
	copy(h[16:20], d[:])
	return append(h, payload...)
}

func ipv6Packet(next byte, src, dst netip.Addr, payload []byte) []byte {
	h := make([]byte, 40)
	h[0] = 0x60
	binary.BigEndian.PutUint16(h[4:6], uint16(len(payload)))
	h[6] = next
	h[7] = 64
	s, d := src.As16(), dst.As16()
	copy(h[8:24], s[:])
	copy(h[24:40], d[:])
	return append(h, payload...)
}

func ports(s, d uint16, rest ...byte) []byte {
	b := make([]byte, 4)
	binary.BigEndian.PutUint16(b[0:2], s)
	binary.BigEndian.PutUint16(b[2:4], d)
	return append(b, rest...)
}

func TestParseQuote(t *testing.T) {
	src, dst := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2")
	q, ok := parseQuote(ipv4Packet(unix.IPPROTO_TCP, src, dst, ports(40000, 7000, 0, 0, 0, 0)))
	require.True(t, ok)
	require.Equal(t, quote{proto: unix.IPPROTO_TCP, src: src, dst: dst, sport: 40000, dport: 7000}, q)

	echo := []byte{8, 0, 0, 0, 0x12, 0x34, 0, 1}
	q, ok = parseQuote(ipv4Packet(unix.IPPROTO_ICMP, src, dst, echo))
	require.True(t, ok)
	require.Equal(t, 0x1234, q.icmpID)
	require.Equal(t, 8, q.icmpType)

	s6, d6 := netip.MustParseAddr("2001:db8::1"), netip.MustParseAddr("2001:db8::2")
	q, ok = parseQuote(ipv6Packet(unix.IPPROTO_UDP, s6, d6, ports(1, 2, 0, 0, 0, 0)))
	require.True(t, ok)
	require.Equal(t, d6, q.dst)
	require.Equal(t, 2, q.dport)

	for _, bad := range [][]byte{nil, {0x45}, {0x75, 0, 0}, ipv4Packet(6, src, dst, nil), make([]byte, 47)} {
		_, ok := parseQuote(bad)
		require.False(t, ok, "%x", bad)
	}
}

func cmsg(level, typ int, data []byte) []byte {
	b := make([]byte, unix.CmsgSpace(len(data)))
	h := (*unix.Cmsghdr)(unsafe.Pointer(&b[0]))
	h.Level = int32(level)
	h.Type = int32(typ)
	h.SetLen(unix.CmsgLen(len(data)))
	copy(b[unix.CmsgLen(0):], data)
	return b
}

func TestParseRecvErr(t *testing.T) {
	ee := make([]byte, sizeofSockExtendedErr)
	binary.NativeEndian.PutUint32(ee[0:4], uint32(unix.EHOSTUNREACH))
	ee[4], ee[5], ee[6] = unix.SO_EE_ORIGIN_ICMP, 3, 13
	sa := make([]byte, 16)
	binary.NativeEndian.PutUint16(sa[0:2], unix.AF_INET)
	copy(sa[4:8], []byte{10, 201, 1, 1})
	fam, typ, code, off, errno, ok := parseRecvErr(cmsg(unix.SOL_IP, unix.IP_RECVERR, append(ee, sa...)))
	require.True(t, ok)
	require.Equal(t, []int{4, 3, 13}, []int{fam, typ, code})
	require.Equal(t, "10.201.1.1", off.String())
	require.Equal(t, unix.EHOSTUNREACH, errno)

	ee[4], ee[5], ee[6] = unix.SO_EE_ORIGIN_ICMP6, 1, 4
	sa6 := make([]byte, 28)
	binary.NativeEndian.PutUint16(sa6[0:2], unix.AF_INET6)
	a := netip.MustParseAddr("2001:db8:2::2").As16()
	copy(sa6[8:24], a[:])
	fam, typ, code, off, _, ok = parseRecvErr(cmsg(unix.SOL_IPV6, unix.IPV6_RECVERR, append(ee, sa6...)))
	require.True(t, ok)
	require.Equal(t, []int{6, 1, 4}, []int{fam, typ, code})
	require.Equal(t, "2001:db8:2::2", off.String())

	ee[4] = unix.SO_EE_ORIGIN_LOCAL
	_, _, _, _, _, ok = parseRecvErr(cmsg(unix.SOL_IP, unix.IP_RECVERR, append(ee, sa...)))
	require.False(t, ok, "a local error has no ICMP offender")
	_, _, _, _, _, ok = parseRecvErr([]byte{1, 2, 3})
	require.False(t, ok)
}

func TestBroadcastAndEUI64(t *testing.T) {
	require.Equal(t, "10.88.0.255", broadcastOf(netip.MustParsePrefix("10.88.0.17/24")).String())
	require.Equal(t, "10.127.255.255", broadcastOf(netip.MustParsePrefix("10.88.0.0/9")).String())
	require.Equal(t, "10.0.0.1", broadcastOf(netip.MustParsePrefix("10.0.0.1/32")).String())
	require.Equal(t, "255.255.255.255", broadcastOf(netip.MustParsePrefix("0.0.0.0/0")).String())
	mac, _ := net.ParseMAC("00:16:3e:12:34:56")
	a, err := LinkLocalFromMAC(mac)
	require.NoError(t, err)
	require.Equal(t, "fe80::216:3eff:fe12:3456", a.String())
	_, err = LinkLocalFromMAC(nil)
	require.Error(t, err)
}

func TestDNSNames(t *testing.T) {
	require.Equal(t, []string{"peer-a.", "peer-a.incus.", "peer-a.lxd.", "peer-a.box.internal."},
		DNSNameForms("Peer-A", "box.internal.", "incus", ""))
	r, err := ReverseName(netip.MustParseAddr("10.88.0.6"))
	require.NoError(t, err)
	require.Equal(t, "6.0.88.10.in-addr.arpa.", r)
	q, err := dnsQuestion("10.88.0.6", "PTR")
	require.NoError(t, err)
	require.Equal(t, r, q.Name)
	q, err = dnsQuestion("canary.box.test", "")
	require.NoError(t, err)
	require.Equal(t, "canary.box.test.", q.Name)
}

func frame(src, dst net.HardwareAddr, et ethernet.EtherType, payload []byte) []byte {
	f := &ethernet.Frame{Source: src, Destination: dst, EtherType: et, Payload: payload}
	b, err := f.MarshalBinary()
	if err != nil {
		panic(err)
	}
	return b
}

func TestWitnessMatch(t *testing.T) {
	macA, _ := net.ParseMAC("02:00:00:00:00:0a")
	macB, _ := net.ParseMAC("02:00:00:00:00:0b")
	a, b := netip.MustParseAddr("10.201.1.2"), netip.MustParseAddr("10.201.2.2")
	nonce := "0123456789abcdef"
	udpWithNonce := frame(macA, macB, ethernet.EtherTypeIPv4,
		ipv4Packet(unix.IPPROTO_UDP, netip.MustParseAddr("10.9.9.9"), b, ports(5000, 7001, append([]byte{0, 0, 0, 0}, probeLine(nonce)...)...)))
	tcpFromA := frame(macB, macB, ethernet.EtherTypeIPv4, ipv4Packet(unix.IPPROTO_TCP, a, b, ports(40000, 7000, make([]byte, 16)...)))
	arpReq, _ := arp.NewPacket(arp.OperationRequest, macA, a, ethernet.Broadcast, b)
	arpBytes, _ := arpReq.MarshalBinary()
	arpFromA := frame(macA, ethernet.Broadcast, ethernet.EtherTypeARP, arpBytes)
	v6 := frame(macB, macB, ethernet.EtherTypeIPv6, ipv6Packet(unix.IPPROTO_ICMPV6,
		netip.MustParseAddr("2001:db8:1::2"), netip.MustParseAddr("2001:db8:2::2"), []byte{128, 0, 0, 0}))

	ll, allNodes := netip.MustParseAddr("fe80::1"), netip.MustParseAddr("ff02::1")
	ra := frame(macB, macA, ethernet.EtherTypeIPv6, ipv6Packet(unix.IPPROTO_ICMPV6, ll, allNodes, make([]byte, 16)))
	ra[14+40] = 134
	redirect := frame(macB, macA, ethernet.EtherTypeIPv6, ipv6Packet(unix.IPPROTO_ICMPV6, ll, allNodes, make([]byte, 40)))
	redirect[14+40] = 137
	dhcp6 := frame(macB, macA, ethernet.EtherTypeIPv6, ipv6Packet(unix.IPPROTO_UDP, ll, netip.MustParseAddr("fe80::2"), ports(547, 546, make([]byte, 8)...)))
	dhcp6ToServer := frame(macA, macB, ethernet.EtherTypeIPv6, ipv6Packet(unix.IPPROTO_UDP, netip.MustParseAddr("fe80::2"), netip.MustParseAddr("ff02::1:2"), ports(546, 547, make([]byte, 8)...)))

	w := func(spec WitnessSpec) *Witness {
		x := &Witness{spec: spec, ips: map[netip.Addr]bool{}}
		for _, n := range spec.Nonces {
			x.nonces = append(x.nonces, []byte(n))
		}
		for _, ip := range spec.SrcIPs {
			x.ips[ip] = true
		}
		for _, m := range spec.SrcMACs {
			hw, _ := net.ParseMAC(m)
			x.macs = append(x.macs, hw)
		}
		return x
	}
	tests := []struct {
		name  string
		spec  WitnessSpec
		frame []byte
		want  bool
		by    string
	}{
		{"nonce anywhere", WitnessSpec{Nonces: []string{nonce}}, udpWithNonce, true, "nonce"},
		{"nonce absent", WitnessSpec{Nonces: []string{"ffffffffffffffff"}}, udpWithNonce, false, ""},
		{"src ip", WitnessSpec{SrcIPs: []netip.Addr{a}}, tcpFromA, true, "src_ip"},
		{"src ip, proto and port", WitnessSpec{SrcIPs: []netip.Addr{a}, Proto: "tcp", Port: 7000}, tcpFromA, true, "src_ip"},
		{"src ip, other port", WitnessSpec{SrcIPs: []netip.Addr{a}, Proto: "tcp", Port: 7999}, tcpFromA, false, ""},
		{"src ip and its source port", WitnessSpec{SrcIPs: []netip.Addr{a}, Proto: "tcp", Port: 7000, SrcPort: 40000}, tcpFromA, true, "src_ip"},
		{"src ip, another sender's source port", WitnessSpec{SrcIPs: []netip.Addr{a}, Proto: "tcp", Port: 7000, SrcPort: 40001}, tcpFromA, false, ""},
		{"src ip, other proto", WitnessSpec{SrcIPs: []netip.Addr{a}, Proto: "udp"}, tcpFromA, false, ""},
		{"src ip, its destination", WitnessSpec{SrcIPs: []netip.Addr{a}, DstIP: b}, tcpFromA, true, "src_ip"},
		{"src ip, another destination", WitnessSpec{SrcIPs: []netip.Addr{a}, DstIP: a}, tcpFromA, false, ""},
		{"arp sender ip", WitnessSpec{SrcIPs: []netip.Addr{a}, Proto: "arp"}, arpFromA, true, "src_ip"},
		{"arp for its target", WitnessSpec{SrcIPs: []netip.Addr{a}, Proto: "arp", DstIP: b}, arpFromA, true, "src_ip"},
		{"arp sender mac", WitnessSpec{SrcMACs: []string{macA.String()}}, arpFromA, true, "src_mac"},
		{"mac of someone else", WitnessSpec{SrcMACs: []string{macA.String()}}, tcpFromA, false, ""},
		{"ipv6 source", WitnessSpec{SrcIPs: []netip.Addr{netip.MustParseAddr("2001:db8:1::2")}, Proto: "icmpv6"}, v6, true, "src_ip"},
		{"runt frame", WitnessSpec{Nonces: []string{nonce}}, []byte{1, 2, 3}, false, ""},
		{"ipv6-config: a router advertisement", WitnessSpec{Proto: ProtoIPv6Config}, ra, true, "icmpv6 router advertisement"},
		{"ipv6-config: a redirect", WitnessSpec{Proto: ProtoIPv6Config}, redirect, true, "icmpv6 redirect"},
		{"ipv6-config: dhcpv6 to a client", WitnessSpec{Proto: ProtoIPv6Config}, dhcp6, true, "dhcpv6"},
		{"ipv6-config: an echo request is not configuration", WitnessSpec{Proto: ProtoIPv6Config}, v6, false, ""},
		{"ipv6-config: dhcpv6 to a server is not", WitnessSpec{Proto: ProtoIPv6Config}, dhcp6ToServer, false, ""},
		{"ipv6-config: ipv4 is not", WitnessSpec{Proto: ProtoIPv6Config}, tcpFromA, false, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, ok := w(tt.spec).match(tt.frame)
			require.Equal(t, tt.want, ok, "%+v", s)
			require.True(t, strings.HasPrefix(s.MatchedBy, tt.by), s.MatchedBy)
		})
	}
	s, _ := w(WitnessSpec{SrcIPs: []netip.Addr{a}, Proto: "arp"}).match(arpFromA)
	require.Equal(t, FrameSummary{EtherType: "arp", SrcMAC: macA.String(), DstMAC: ethernet.Broadcast.String(), SrcIP: a.String(),
		DstIP: b.String(), Proto: "arp", ARPOp: "request", ARPSenderMAC: macA.String(), MatchedBy: "src_ip 10.201.1.2"}, s)
	// A forged reply: b's MAC sends a's address at a third MAC. The summary
	// shows the sender is neither the frame's source nor a's own MAC.
	macX, _ := net.ParseMAC("02:00:00:00:00:99")
	forged, _ := arp.NewPacket(arp.OperationReply, macX, a, macA, b)
	forgedBytes, _ := forged.MarshalBinary()
	s, ok := w(WitnessSpec{SrcMACs: []string{macX.String()}}).match(frame(macB, macA, ethernet.EtherTypeARP, forgedBytes))
	require.True(t, ok)
	require.Equal(t, "reply", s.ARPOp)
	require.Equal(t, macX.String(), s.ARPSenderMAC)
	require.Equal(t, macB.String(), s.SrcMAC)
	require.Equal(t, "arp sender "+macX.String(), s.MatchedBy, "names the ARP sender it matched, not the frame source")
	require.Equal(t, "op-9", arpOpName(9))
	// arp_sender narrows: the forged frame claims a, but a's own ARP does
	// not match a witness for the forger's frames.
	_, ok = w(WitnessSpec{SrcIPs: []netip.Addr{a}, Proto: "arp", ARPSender: macX.String()}).match(frame(macB, macA, ethernet.EtherTypeARP, forgedBytes))
	require.True(t, ok, "the forged ARP matches")
	_, ok = w(WitnessSpec{SrcIPs: []netip.Addr{a}, Proto: "arp", ARPSender: macX.String()}).match(arpFromA)
	require.False(t, ok, "a's genuine ARP does not")

	s, _ = w(WitnessSpec{SrcIPs: []netip.Addr{a}}).match(tcpFromA)
	require.Equal(t, FrameSummary{EtherType: "ipv4", SrcMAC: macB.String(), DstMAC: macB.String(), SrcIP: a.String(),
		DstIP: b.String(), Proto: "tcp", DstPort: 7000, MatchedBy: "src_ip 10.201.1.2"}, s)
}

// TestWitnessCountsControls: a control frame proves the capture alive and
// is never a match, whatever else the witness looks for.
func TestWitnessCountsControls(t *testing.T) {
	macA, _ := net.ParseMAC("02:00:00:00:00:0a")
	macB, _ := net.ParseMAC("02:00:00:00:00:0b")
	ctl, other := "c0ffee0123456789", "feedface01234567"
	w := &Witness{spec: WitnessSpec{SrcMACs: []string{macA.String()}, Control: ctl}, ips: map[netip.Addr]bool{},
		macs: [][]byte{macA}, control: []byte(ControlPrefix + ctl)}
	w.record(ControlFrame(macB, macA, ctl))   // from a matched MAC, yet only a control
	w.record(ControlFrame(macB, macA, other)) // another wire's control: an ordinary frame, matched by MAC
	w.record(ControlFrame(macB, macA, ctl))
	require.Equal(t, 2, w.controls)
	require.Equal(t, 1, w.count)
	require.Equal(t, 3, w.captured)
	require.False(t, w.controlLast.IsZero())
	f := ControlFrame(macB, macA, ctl)
	require.Equal(t, []byte(macB), f[0:6])
	require.Equal(t, []byte(macA), f[6:12])
	require.Equal(t, []byte{0x88, 0xb5}, f[12:14])
}

func TestInterfaceForSubnet(t *testing.T) {
	// Loopback is in every namespace: 127.0.0.0/8 finds it by subnet.
	ifi, p, err := InterfaceForSubnet(netip.MustParsePrefix("127.0.0.0/8"))
	require.NoError(t, err)
	require.NotZero(t, ifi.Flags&net.FlagLoopback)
	require.Equal(t, "127.0.0.1/8", p.String())

	_, _, err = InterfaceForSubnet(netip.MustParsePrefix("198.18.250.0/24"))
	require.ErrorIs(t, err, ErrNoInterface)
	_, _, err = InterfaceForSubnet(netip.Prefix{})
	require.Error(t, err)
}

func TestRunProbeInvalidSpec(t *testing.T) {
	o := RunProbe(context.Background(), ProbeSpec{ID: "x", Kind: KindTCP, DeadlineMS: 100})
	require.Equal(t, Error, o.Outcome)
	require.Contains(t, o.Reason, "invalid probe")
}

// TestRunAgentNoPackets runs the agent in-process with probes that only
// read local state (no packet leaves), so it runs anywhere.
func TestRunAgentNoPackets(t *testing.T) {
	plan := `{"version":1,"deadline_ms":1000,"probes":[
	  {"id":"lease","kind":"dhcp_lease","via":"127.0.0.0/8","deadline_ms":100},
	  {"id":"nolease","kind":"dhcp_lease","via":"198.18.250.0/24","deadline_ms":100},
	  {"id":"v6","kind":"ipv6_state","via":"127.0.0.0/8","deadline_ms":100}]}`
	var out bytes.Buffer
	require.NoError(t, RunAgent(context.Background(), strings.NewReader(plan), &out))
	rep, err := DecodeReport(&out)
	require.NoError(t, err)
	require.Empty(t, rep.Error)
	require.Len(t, rep.Observations, 3)
	lease := rep.Observations[0]
	require.Equal(t, Reached, lease.Outcome, lease.Reason)
	require.Equal(t, "127.0.0.1/8", lease.Evidence.Lease.Address)
	require.Equal(t, Silent, rep.Observations[1].Outcome, rep.Observations[1].Reason)
	require.NotEqual(t, Error, rep.Observations[2].Outcome, rep.Observations[2].Reason)
	require.Equal(t, "v6", rep.Observations[2].ID)
}

// runAgentPlan runs the agent on a plan and reads its report, which must
// carry no error and n observations.
func runAgentPlan(t *testing.T, plan string, n int) *Report {
	t.Helper()
	var out bytes.Buffer
	require.NoError(t, RunAgent(context.Background(), strings.NewReader(plan), &out))
	rep, err := DecodeReport(&out)
	require.NoError(t, err)
	require.Empty(t, rep.Error)
	require.Len(t, rep.Observations, n)
	return rep
}

// TestRunAgentStartsAtStartAt: an agent handed a start_at ahead starts
// its clocks there (its report's and its probe's started_at, and its
// deadline, count from it); one whose start_at has passed starts at once.
func TestRunAgentStartsAtStartAt(t *testing.T) {
	run := func(at time.Time) (*Report, time.Time) {
		// The listener runs to the plan's end, so the agent returns then.
		plan := fmt.Sprintf(`{"version":1,"deadline_ms":300,"start_at":%q,
		  "listeners":[{"id":"l","kind":"udp_echo","port":47392,"via":"127.0.0.0/8"}],
		  "probes":[{"id":"lease","kind":"dhcp_lease","via":"127.0.0.0/8","deadline_ms":100}]}`, at.Format(time.RFC3339Nano))
		rep := runAgentPlan(t, plan, 2)
		return rep, time.Now()
	}
	at := time.Now().Add(400 * time.Millisecond)
	rep, returned := run(at)
	require.False(t, rep.StartedAt.Before(at), "started %s, before start_at %s", rep.StartedAt, at)
	require.False(t, rep.Observations[1].StartedAt.Before(at), "the probe ran before start_at")
	require.False(t, returned.Before(at.Add(300*time.Millisecond-AgentMargin/2)), "the deadline counts from start_at")

	past := time.Now().Add(-time.Hour)
	before := time.Now()
	rep, _ = run(past)
	require.Less(t, rep.StartedAt.Sub(before), 200*time.Millisecond, "a start_at that has passed starts at once")
}

// TestRunAgentArmsBeforeStartAt: the agent arms its listener before the
// agreed start and counts the listener's window from the start, not from
// its arming: a probe at the end of the window, 500 ms after a start 600
// ms ahead, still finds it listening (a window counted from the arming
// would have ended 100 ms before the start). The report says how long
// arming took and the slack it left; an agent handed a start that has
// passed says it armed late.
func TestRunAgentArmsBeforeStartAt(t *testing.T) {
	run := func(at time.Time) *Report {
		plan := fmt.Sprintf(`{"version":1,"deadline_ms":1000,"start_at":%q,
		  "listeners":[{"id":"l","kind":"udp_echo","port":47393,"via":"127.0.0.0/8","window_ms":700}],
		  "probes":[{"id":"p","kind":"udp","target":"127.0.0.1","port":47393,"via":"127.0.0.0/8","delay_ms":500,"deadline_ms":300,"nonce":"arming-nonce-1"}]}`, at.Format(time.RFC3339Nano))
		return runAgentPlan(t, plan, 2)
	}
	rep := run(time.Now().Add(600 * time.Millisecond))
	assert.Equal(t, Reached, rep.Observations[1].Outcome, "the probe 500 ms after the start found the listener: %s", rep.Observations[1].Reason)
	assert.Less(t, rep.ArmingMS, int64(500), "arming a listener takes milliseconds")
	assert.Greater(t, rep.SlackMS, int64(0), "armed before the start: slack left")
	assert.LessOrEqual(t, rep.SlackMS, int64(600))

	rep = run(time.Now().Add(-200 * time.Millisecond))
	assert.LessOrEqual(t, rep.SlackMS, int64(-200), "a start that had passed when it armed: negative slack, as late as it was")

	// A slow arming (300 ms, made by hand) before a start 600 ms ahead
	// moves nothing: the agent starts at the start, its probe fires then.
	armingHook = func() { time.Sleep(300 * time.Millisecond) }
	t.Cleanup(func() { armingHook = nil })
	at := time.Now().Add(600 * time.Millisecond)
	rep = run(at)
	assert.Less(t, rep.StartedAt.Sub(at), 50*time.Millisecond, "the agent started at the agreed start, arming done before it")
	assert.Less(t, rep.Observations[1].StartedAt.Sub(at), 550*time.Millisecond, "the probe (500 ms delay) fired on time")
	assert.GreaterOrEqual(t, rep.ArmingMS, int64(300), "the report has the arming's time")
	assert.Greater(t, rep.SlackMS, int64(0))
}

func TestPlanStart(t *testing.T) {
	now := time.Now()
	p := Plan{}
	require.Equal(t, now, p.Start(now), "no start_at: now")
	p.StartAt = now.Add(-time.Second)
	require.Equal(t, now, p.Start(now), "past: now")
	p.StartAt = now.Add(time.Second)
	require.Equal(t, p.StartAt, p.Start(now))
	p.StartAt = now.Add(time.Hour)
	require.Equal(t, now.Add(MaxStartWait), p.Start(now), "never more than MaxStartWait ahead")
}

func TestRunAgentBadPlan(t *testing.T) {
	var out bytes.Buffer
	err := RunAgent(context.Background(), strings.NewReader(`{"version":1,"deadline_ms":5}`), &out)
	require.Error(t, err)
	rep, derr := DecodeReport(&out)
	require.NoError(t, derr, "a bad plan still gets a report: %s", out.String())
	require.Contains(t, rep.Error, "deadline_ms 5 out of range")
	require.Empty(t, rep.Observations)
}

func TestRunAgentStdinNeverCloses(t *testing.T) {
	r, w := net.Pipe()
	defer w.Close()
	defer r.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var out bytes.Buffer
	err := RunAgent(ctx, r, &out)
	require.ErrorIs(t, err, context.Canceled)
}

// BenchmarkRunAgentOvershoot: how long after its tasks stop (AgentMargin/2
// before the plan's deadline) the agent returns, with a listener that
// runs to the end (late-ms; past AgentMargin/2 it is late for the plan).
func BenchmarkRunAgentOvershoot(b *testing.B) {
	const deadline = 100 * time.Millisecond
	var late time.Duration
	i := 0
	for b.Loop() {
		// A port of its own each time: the last one's socket may still
		// be closing.
		plan := fmt.Sprintf(`{"version":1,"deadline_ms":100,"listeners":[{"id":"l","kind":"udp_echo","port":%d,"via":"127.0.0.0/8"}]}`, 47400+i%100)
		i++
		var out bytes.Buffer
		start := time.Now()
		if err := RunAgent(context.Background(), strings.NewReader(plan), &out); err != nil {
			b.Fatal(err)
		}
		late += time.Since(start) - (deadline - AgentMargin/2)
		rep, err := DecodeReport(&out)
		if err != nil {
			b.Fatal(err)
		}
		if o := rep.Observations[0]; o.Outcome == Error {
			b.Fatalf("the listener did not run: %s", o.Reason)
		}
	}
	b.ReportMetric(float64(late.Microseconds())/1000/float64(b.N), "late-ms")
}

func TestDecodeReportStrict(t *testing.T) {
	_, err := DecodeReport(strings.NewReader(`{"version":1,"observations":[{"id":"a","kind":"tcp","target":"x","outcome":"blocked","reason":"","evidence":{},"started_at":"2026-01-01T00:00:00Z","elapsed_ms":1}]}`))
	require.ErrorContains(t, err, "outcome \"blocked\"")
	_, err = DecodeReport(strings.NewReader(`{"version":1,"extra":1}`))
	require.ErrorContains(t, err, "unknown field")
	_, err = DecodeReport(strings.NewReader(`{"version":7}`))
	require.ErrorContains(t, err, "unsupported version 7")
}

// TestRunAgentReturnsWithinDeadline: a listener runs until the plan's end,
// and the agent returns then, not after. The lower bound is exact (the
// tasks stop on a context deadline, which never fires early); the upper
// one has slack for a loaded machine and still catches an agent that
// waits for its listener past the deadline (it would wait for ever).
// BenchmarkRunAgentOvershoot measures how late it really is. It binds
// loopback only and sends nothing.
func TestRunAgentReturnsWithinDeadline(t *testing.T) {
	const deadline = 300 * time.Millisecond
	plan := `{"version":1,"deadline_ms":300,"listeners":[{"id":"l","kind":"udp_echo","port":47391,"via":"127.0.0.0/8"}]}`
	start := time.Now()
	var out bytes.Buffer
	done := make(chan error, 1)
	go func() { done <- RunAgent(context.Background(), strings.NewReader(plan), &out) }()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(deadline + 10*time.Second):
		t.Fatalf("the agent has not returned 10 s past its plan's %s deadline", deadline)
	}
	took := time.Since(start)
	t.Logf("returned %s after the start of a %s plan", took, deadline)
	require.GreaterOrEqual(t, took, deadline-AgentMargin/2, "the listener served until the tasks' end, AgentMargin/2 before the deadline")
	rep, err := DecodeReport(&out)
	require.NoError(t, err)
	require.Len(t, rep.Observations, 1)
	require.NotEqual(t, Reached, rep.Observations[0].Outcome)
}

func TestSpeak(t *testing.T) {
	nonce := NewNonce()
	http := string(spoken(ProbeSpec{Speak: SpeakHTTP, ServerName: "canary.example.net", Nonce: nonce}))
	assert.True(t, strings.HasPrefix(http, "GET /"+nonce+" HTTP/1.1\r\nHost: canary.example.net\r\n"), http)

	for _, sni := range []string{"canary.example.net", "", "a-much-longer-name.under.some.zone.example.org"} {
		hello := spoken(ProbeSpec{Speak: SpeakTLS, ServerName: sni, Nonce: nonce})
		i := bytes.Index(hello, []byte(nonce))
		require.Positive(t, i, "the nonce is in the hello")
		assert.NotContains(t, string(hello[:i+len(nonce)]), "\n", "a greeter's first line holds the nonce")
		// crypto/tls reads it as a ClientHello, with its server name.
		var got *tls.ClientHelloInfo
		c1, c2 := net.Pipe()
		go func() { c2.Write(hello); c2.Close() }()
		tls.Server(c1, &tls.Config{GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
			got = h
			return nil, errors.New("enough")
		}}).Handshake()
		c1.Close()
		require.NotNil(t, got, "crypto/tls parsed it")
		assert.Equal(t, sni, got.ServerName)
		assert.Contains(t, got.SupportedVersions, uint16(tls.VersionTLS13))
	}

	o, why, ok := policyRefusal(ProbeSpec{Speak: SpeakHTTP}, []byte("HTTP/1.1 403 Forbidden\r\nX-Box-Egress: refused\r\nContent-Length: 9\r\n\r\nbox egress: other.example.net is not allowed\n"))
	assert.True(t, ok)
	assert.Equal(t, Rejected, o)
	assert.Contains(t, why, "other.example.net is not allowed")
	_, _, ok = policyRefusal(ProbeSpec{Speak: SpeakHTTP}, []byte("HTTP/1.1 403 Forbidden\r\n\r\n"))
	assert.False(t, ok, "a target's own 403 is its answer, not a proxy's refusal")
	o, why, ok = policyRefusal(ProbeSpec{Speak: SpeakTLS}, []byte{0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x31})
	assert.True(t, ok)
	assert.Equal(t, Rejected, o)
	assert.Contains(t, why, "access_denied")
	_, _, ok = policyRefusal(ProbeSpec{Speak: SpeakTLS}, []byte("BOXWORLD canary x\n"))
	assert.False(t, ok)

	q := quicInitial(nonce)
	assert.Len(t, q, 1200)
	assert.Equal(t, byte(0xc3), q[0])
	assert.Contains(t, string(q), nonce)

	for _, bad := range []ProbeSpec{
		{Kind: KindTCP, Target: netip.MustParseAddr("203.0.113.10"), Port: 443, Speak: "ftp", DeadlineMS: 100},
		{Kind: KindTCP, Target: netip.MustParseAddr("203.0.113.10"), Port: 443, ServerName: "x.example", DeadlineMS: 100},
		{Kind: KindTCP, Target: netip.MustParseAddr("203.0.113.10"), Port: 443, Speak: SpeakTLS, ServerName: "a b", DeadlineMS: 100},
		{Kind: KindUDP, Target: netip.MustParseAddr("203.0.113.10"), Port: 443, Speak: SpeakTLS, DeadlineMS: 100},
	} {
		assert.Error(t, bad.Validate(), "%+v", bad)
	}
	ok1 := ProbeSpec{Kind: KindTCP, Target: netip.MustParseAddr("203.0.113.10"), Port: 443, Speak: SpeakTLS, ServerName: "x.example", DeadlineMS: 100}
	assert.NoError(t, ok1.Validate())
	ok2 := ProbeSpec{Kind: KindUDP, Target: netip.MustParseAddr("203.0.113.10"), Port: 443, Payload: RequestQUIC, DeadlineMS: 100}
	assert.NoError(t, ok2.Validate())
}
