package probes

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestPrivilegedNestedWorkloads: a plan with a nest runs in a workload the
// agent builds in the box (a) and takes down again. Behind a NAT, its UDP
// to the peer (b) arrives from the box's own address; on a macvlan child
// of the box's interface, its ARP leaves with a MAC of its own. Neither
// leaves anything behind in the box.
func TestPrivilegedNestedWorkloads(t *testing.T) {
	w := newBridgeWorld(t)
	startListener(t, w.b, ListenerSpec{ID: "echo", Kind: KindUDPEcho, Name: "peer-b", Port: echoPort})
	plan := func(n *NestSpec, probe ProbeSpec) string {
		p := Plan{Version: PlanVersion, DeadlineMS: 3000, Nest: n, Probes: []ProbeSpec{probe}}
		require.NoError(t, p.Validate())
		b, err := json.Marshal(p)
		require.NoError(t, err)
		return string(b)
	}
	t.Run("nat", func(t *testing.T) {
		nonce := NewNonce()
		wit := startWitness(t, w.b, WitnessSpec{ID: "w", Via: w.subnet, WindowMS: 10000, Nonces: []string{nonce}, Proto: "udp"})
		n := &NestSpec{Kind: NestNAT, Via: w.subnet, Address: netip.MustParsePrefix("172.29.0.2/24"), Gateway: netip.MustParseAddr("172.29.0.1")}
		rep, _, raw := startAgentIn(t, w.a, plan(n, ProbeSpec{ID: "u", Kind: KindUDP, Target: w.bIP, Port: echoPort, Nonce: nonce,
			Via: netip.MustParsePrefix("172.29.0.0/24"), DeadlineMS: 1500}))()
		require.Empty(t, rep.Error, raw)
		require.Len(t, rep.Observations, 1, raw)
		o := rep.Observations[0]
		require.Equal(t, Reached, o.Outcome, "the peer echoes the workload through the box's NAT: %s", o.Reason)
		require.Equal(t, "172.29.0.2", o.Evidence.Source, "it left from the workload's own address")
		seen := wit.Stop()
		require.Equal(t, Reached, seen.Outcome)
		require.Equal(t, w.aIP.String(), seen.Evidence.Witness.First.SrcIP, "on the wire it is the box's address")
		require.Equal(t, w.aMAC.String(), seen.Evidence.Witness.First.SrcMAC, "and the box's MAC")
		w.a.requireNoLeftovers(t)
	})
	t.Run("macvlan", func(t *testing.T) {
		mac := "02:b0:c5:00:00:99"
		wit := startWitness(t, w.b, WitnessSpec{ID: "w", Via: w.subnet, WindowMS: 10000, SrcMACs: []string{mac}, Proto: "arp"})
		n := &NestSpec{Kind: NestMACVLAN, Via: w.subnet, Address: netip.MustParsePrefix("10.202.0.99/24"), Gateway: w.aIP, MAC: mac}
		rep, _, raw := startAgentIn(t, w.a, plan(n, ProbeSpec{ID: "arp", Kind: KindARP, Target: w.bIP, Via: w.subnet, DeadlineMS: 1500}))()
		require.Empty(t, rep.Error, raw)
		o := rep.Observations[0]
		require.Equal(t, Reached, o.Outcome, "b answers the workload's ARP: %s", o.Reason)
		seen := wit.Stop()
		require.Equal(t, Reached, seen.Outcome)
		require.Equal(t, mac, seen.Evidence.Witness.First.SrcMAC, "the frame carries the workload's own MAC, not the box's")
		w.a.requireNoLeftovers(t)
	})
	t.Run("a spec that does not hold is refused", func(t *testing.T) {
		for _, n := range []NestSpec{
			{Kind: "bridge", Via: w.subnet, Address: netip.MustParsePrefix("172.29.0.2/24"), Gateway: netip.MustParseAddr("172.29.0.1")},
			{Kind: NestNAT, Via: w.subnet, Address: netip.MustParsePrefix("10.202.0.5/24"), Gateway: netip.MustParseAddr("10.202.0.1")},
			{Kind: NestMACVLAN, Via: w.subnet, Address: netip.MustParsePrefix("10.202.0.99/24"), Gateway: w.aIP},
			{Kind: NestMACVLAN, Via: w.subnet, Address: netip.MustParsePrefix("172.29.0.2/24"), Gateway: netip.MustParseAddr("172.29.0.1"), MAC: "02:b0:c5:00:00:99"},
		} {
			require.Error(t, (&Plan{Version: PlanVersion, DeadlineMS: 3000, Nest: &n}).Validate(), fmt.Sprintf("%+v", n))
		}
	})
}

// requireNoLeftovers: nothing of a nested workload stays in the box.
func (n *testNS) requireNoLeftovers(t *testing.T) {
	t.Helper()
	h := n.Netlink(t)
	for _, name := range []string{nestBridge, nestHost, nestPeer, nestMACVLN} {
		_, err := h.LinkByName(name)
		require.Error(t, err, "%s left behind in %s", name, n.Name)
	}
	tables, err := n.nft(t).ListTables()
	require.NoError(t, err)
	for _, tb := range tables {
		require.NotEqual(t, nestTable, tb.Name, "the NAT table left behind")
	}
}
