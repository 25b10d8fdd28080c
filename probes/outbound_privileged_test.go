package probes

import (
	"net/netip"
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/stretchr/testify/require"
)

// TestPrivilegedOutboundWitness: a "host" namespace with an uplink veth to
// a "lan" namespace and a "box" namespace behind it, masqueraded out of the
// uplink. An outbound witness on the uplink records a UDP probe's
// datagram to a private address with its nonce; the host's own TCP probe's
// SYN and the box's (after the NAT changed its source address) with the
// source port and ISN their probes reported; never a packet to a
// non-private address; and a control probe's frames as controls.
func TestPrivilegedOutboundWitness(t *testing.T) {
	requireRoot(t)
	id := runID()
	host, lan, box := newNS(t, id, "host"), newNS(t, id, "lan"), newNS(t, id, "box")
	veth(t, host, "uplink", lan, "veth-lan")
	veth(t, host, "to-box", box, "veth-box")
	host.AddAddr(t, "uplink", "10.203.0.1/24")
	lan.AddAddr(t, "veth-lan", "10.203.0.2/24")
	lan.AddAddr(t, "veth-lan", "10.99.0.5/32") // the private target, one hop out
	host.AddAddr(t, "to-box", "10.204.0.1/24")
	box.AddAddr(t, "veth-box", "10.204.0.2/24")
	links := []struct {
		ns   *testNS
		link string
	}{{host, "uplink"}, {host, "to-box"}, {lan, "veth-lan"}, {box, "veth-box"}}
	for _, x := range links {
		x.ns.LinkUp(t, x.link)
	}
	for _, x := range links {
		x.ns.WaitOperUp(t, x.link)
	}
	// Everything the host does not know leaves by the uplink, public
	// addresses included: they end in lan, which drops what is not its own.
	host.defaultRoute(t, "10.203.0.2")
	box.defaultRoute(t, "10.204.0.1")
	lan.defaultRoute(t, "10.203.0.1")
	host.sysctl(t, "net.ipv4.ip_forward", "1")
	nftc := host.nft(t)
	tbl := nftc.AddTable(&nftables.Table{Family: nftables.TableFamilyIPv4, Name: "boxpt"})
	post := nftc.AddChain(&nftables.Chain{Name: "post", Table: tbl, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource})
	nftc.AddRule(&nftables.Rule{Table: tbl, Chain: post, Exprs: []expr.Any{
		&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifname("uplink")},
		&expr.Masq{},
	}})
	require.NoError(t, nftc.Flush())
	// Bound to the target address: a wildcard UDP socket would answer
	// from 10.203.0.2, the route's source, which the probe does not hear.
	startListener(t, lan, ListenerSpec{ID: "echo", Kind: KindUDPEcho, Name: "lan", Port: echoPort, Via: netip.MustParsePrefix("10.99.0.5/32")})
	startListener(t, lan, ListenerSpec{ID: "greet", Kind: KindTCPGreeter, Name: "lan", Port: greetPort})

	target := netip.MustParseAddr("10.99.0.5")
	public := netip.MustParseAddr("198.51.100.7") // TEST-NET-2: it goes nowhere past lan
	udpNonce, publicNonce, tcpNonce, ctlNonce := NewNonce(), NewNonce(), NewNonce(), NewNonce()
	private := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("172.16.0.0/12"), netip.MustParsePrefix("192.168.0.0/16")}
	wit := startWitness(t, host, WitnessSpec{ID: "out", Ifaces: []string{"uplink"}, DstPrefixes: private, WindowMS: 10000,
		Nonces: []string{udpNonce, publicNonce, tcpNonce}, Control: ctlNonce})

	u := probeIn(t, host, ProbeSpec{ID: "u", Kind: KindUDP, Target: target, Port: echoPort, Nonce: udpNonce, DeadlineMS: probeDeadlineMS})
	require.Equal(t, Reached, u.Outcome, u.Reason)
	p := probeIn(t, host, ProbeSpec{ID: "p", Kind: KindUDP, Target: public, Port: echoPort, Nonce: publicNonce, DeadlineMS: 300})
	require.Equal(t, Silent, p.Outcome, "lan drops what is not its own: %s", p.Reason)
	tc := probeIn(t, host, ProbeSpec{ID: "t", Kind: KindTCP, Target: target, Port: greetPort, Nonce: tcpNonce, DeadlineMS: probeDeadlineMS})
	require.Equal(t, Reached, tc.Outcome, tc.Reason)
	require.True(t, tc.Evidence.ISNCaptured, tc.Evidence.ISNError)
	bt := probeIn(t, box, ProbeSpec{ID: "b", Kind: KindTCP, Target: target, Port: greetPort, DeadlineMS: probeDeadlineMS})
	require.Equal(t, Reached, bt.Outcome, bt.Reason)
	require.True(t, bt.Evidence.ISNCaptured, bt.Evidence.ISNError)
	ctl := probeIn(t, host, ProbeSpec{ID: "c", Kind: KindControl, Via: netip.MustParsePrefix("10.203.0.0/24"), Nonce: ctlNonce, DeadlineMS: 300})
	require.Equal(t, Reached, ctl.Outcome, ctl.Reason)

	seen := wit.Stop()
	ev := seen.Evidence.Witness
	t.Logf("witness: %s %s; recorded %d, captured %d, controls %d", seen.Outcome, seen.Reason, ev.Recorded, ev.Captured, ev.Controls)
	for _, r := range ev.Records {
		t.Logf("  %+v", r)
	}
	require.Equal(t, Reached, seen.Outcome, seen.Reason)
	require.Equal(t, "uplink", seen.Target)
	require.Equal(t, ctl.Evidence.Sent, ev.Controls, "every control frame was seen leaving")

	var udpSeen, tcpSeen, boxSeen bool
	for _, r := range ev.Records {
		require.Equal(t, "uplink", r.Iface)
		dst := netip.MustParseAddr(r.DstIP)
		require.True(t, dst == target, "only packets to the private target are recorded: %+v", r)
		require.NotEqual(t, publicNonce, r.Nonce)
		switch {
		case r.Proto == "udp" && r.Nonce == udpNonce:
			udpSeen = true
			require.True(t, r.Matched)
			require.Equal(t, echoPort, r.DstPort)
		case r.Proto == "tcp" && r.TCPFlags == "S" && r.SrcPort == tc.Evidence.SrcPort && r.SrcIP == "10.203.0.1" && r.Seq == tc.Evidence.ISN:
			tcpSeen = true
		case r.Proto == "tcp" && r.TCPFlags == "S" && r.SrcPort == bt.Evidence.SrcPort && r.Seq == bt.Evidence.ISN:
			boxSeen = true
			require.Equal(t, "10.203.0.1", r.SrcIP, "masqueraded: the box's address is gone, its port and ISN are not")
		}
	}
	require.True(t, udpSeen, "the UDP probe's datagram is recorded with its nonce")
	require.True(t, tcpSeen, "the host's SYN is recorded with the probe's source port and ISN (%d, %d)", tc.Evidence.SrcPort, tc.Evidence.ISN)
	require.True(t, boxSeen, "the box's SYN is recorded after the NAT with its source port and ISN (%d, %d)", bt.Evidence.SrcPort, bt.Evidence.ISN)
	require.GreaterOrEqual(t, ev.Count, 2, "the UDP datagram and the TCP nonce line match")
}

// TestPrivilegedOutboundWitnessOnlyOutgoing: frames arriving on the
// uplink are never recorded, and a named interface that does not exist is
// an error, not silence.
func TestPrivilegedOutboundWitnessOnlyOutgoing(t *testing.T) {
	requireRoot(t)
	id := runID()
	host, lan := newNS(t, id, "host"), newNS(t, id, "lan")
	veth(t, host, "uplink", lan, "veth-lan")
	host.AddAddr(t, "uplink", "10.203.0.1/24")
	lan.AddAddr(t, "veth-lan", "10.203.0.2/24")
	host.LinkUp(t, "uplink")
	lan.LinkUp(t, "veth-lan")
	host.WaitOperUp(t, "uplink")
	lan.WaitOperUp(t, "veth-lan")
	nonce := NewNonce()
	wit := startWitness(t, host, WitnessSpec{ID: "out", Ifaces: []string{"uplink"},
		DstPrefixes: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}, WindowMS: 10000, Nonces: []string{nonce}})
	// lan sends to the host: it arrives on the uplink and is answered
	// (port unreachable), which leaves toward 10.203.0.2 with the nonce
	// quoted. The datagram itself is never recorded; the answer is.
	o := probeIn(t, lan, ProbeSpec{ID: "u", Kind: KindUDP, Target: netip.MustParseAddr("10.203.0.1"), Port: closedPort, Nonce: nonce, DeadlineMS: 300})
	require.Equal(t, Refused, o.Outcome, o.Reason)
	seen := wit.Stop()
	for _, r := range seen.Evidence.Witness.Records {
		t.Logf("  %+v", r)
		require.Equal(t, "10.203.0.1", r.SrcIP, "only what the host sends")
		require.Equal(t, "icmp", r.Proto)
	}
	require.NotZero(t, seen.Evidence.Witness.Recorded)

	err := host.Run(func() error {
		_, err := StartWitness(WitnessSpec{ID: "out", Ifaces: []string{"nosuch0"}, DstPrefixes: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}, WindowMS: 100})
		return err
	})
	require.ErrorContains(t, err, "interface nosuch0")
}
