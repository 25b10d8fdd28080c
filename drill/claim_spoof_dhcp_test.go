package drill

import (
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/probes"
	"github.com/box-isolation/box/stack"
	"github.com/box-isolation/box/stack/nft"
)

// spoofDHCPRun is a run whose DHCP lies were sent, with the server's
// lease file before and after them.
func spoofDHCPRun(before, after []stack.DHCPLease) *run {
	sc := testTopology()
	d := &dhcpRun{before: stack.DHCPPool{Leases: before}, after: stack.DHCPPool{Leases: after}}
	return &run{scene: sc, state: claimStates{SpoofID: &spoofRun{dhcp: d}},
		obs: observations{PlaceA: {dhcpOwnID: {Outcome: probes.Silent}}}}
}

func dhcpLease(hw, addr string, exp time.Time) stack.DHCPLease {
	return stack.DHCPLease{Hwaddr: hw, Address: netip.MustParseAddr(addr), Expires: exp}
}

func lie(ch Channel, spec probes.ProbeSpec) Result {
	return Result{Action: Action{Claim: SpoofID, Channel: ch, From: PlaceA, Expect: ExpectNoLease, Probe: spec}, Obs: &probes.Observation{Outcome: probes.Silent}}
}

// Each DHCP lie is judged by what the server did: its lease file before
// and after, with box-a's own lease renewed after the lies as the proof
// the server was answering.
func TestJudgeSpoofDHCP(t *testing.T) {
	sc := testTopology()
	t0 := time.Unix(1796180000, 0)
	a := dhcpLease(sc.A.MAC.String(), sc.A.IP.String(), t0)
	aRenewed := dhcpLease(sc.A.MAC.String(), sc.A.IP.String(), t0.Add(5*time.Second))
	b := dhcpLease(sc.B.MAC.String(), sc.B.IP.String(), t0)
	c := dhcpLease(sc.C.MAC.String(), sc.C.IP.String(), t0)
	held := []stack.DHCPLease{a, b, c}
	after := func(more ...stack.DHCPLease) []stack.DHCPLease {
		return append([]stack.DHCPLease{aRenewed, b, c}, more...)
	}
	release, decline := lie(ChannelDHCPRelease, probes.ProbeSpec{}), lie(ChannelDHCPDecline, probes.ProbeSpec{})
	starve, clientID := lie(ChannelDHCPStarve, probes.ProbeSpec{}), lie(ChannelDHCPClientID, probes.ProbeSpec{})
	htype, hlen := lie(ChannelDHCPHType, probes.ProbeSpec{HType: 6}), lie(ChannelDHCPHType, probes.ProbeSpec{})

	for _, tc := range []struct {
		name          string
		before, after []stack.DHCPLease
		res           Result
		want          Verdict
		says          string
	}{
		{"release held", held, after(), release, Pass, "box-b's lease of 10.88.0.12 is still in the DHCP server's lease file"},
		{"release took", held, []stack.DHCPLease{aRenewed, c}, release, Fail, "box-b's lease of 10.88.0.12 went"},
		{"decline took", held, []stack.DHCPLease{aRenewed, b}, decline, Fail, "clone-a's lease of 10.88.0.13 went"},
		{"no lease to lose", []stack.DHCPLease{a, c}, after(), release, Inconclusive, "box-b held no lease"},
		{"no control", held, []stack.DHCPLease{a, b, c}, release, Inconclusive, "did not renew box-a's own lease"},
		{"starve held", held, after(), starve, Pass, "leased nothing"},
		{"starve took", held, after(dhcpLease("0a:b0:c5:00:00:07", "10.88.0.99", t0)), starve, Fail, "0a:b0:c5:00:00:07 at 10.88.0.99"},
		{"client id took", held, after(stack.DHCPLease{Hwaddr: sc.A.MAC.String(), Address: netip.MustParseAddr("10.88.0.98"), ClientID: "ff:0a:b0:c5:00:00:01"}),
			clientID, Fail, "at 10.88.0.98"},
		{"htype 6 took", held, after(dhcpLease("06-"+sc.A.MAC.String(), "10.88.0.97", t0)), htype, Fail, "06-"},
		{"htype's lease is not hlen's", held, after(dhcpLease("06-"+sc.A.MAC.String(), "10.88.0.97", t0)), hlen, Pass, "leased nothing"},
		{"hlen 16 took", held, after(dhcpLease(sc.A.MAC.String()+":0a:b0:c5:00:01:02:03:04:05:06", "10.88.0.96", t0)), hlen, Fail, "10.88.0.96"},
		{"an old stray is no answer to the lie", append(held, dhcpLease("0a:b0:c5:00:00:01", "10.88.0.95", t0)),
			after(dhcpLease("0a:b0:c5:00:00:01", "10.88.0.95", t0)), starve, Pass, "leased nothing"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := spoofDHCPRun(tc.before, tc.after)
			got := refineSpoof(r, tc.res)
			assert.Equal(t, tc.want, got.Verdict, got.Evidence)
			assert.Contains(t, got.Evidence, tc.says)
		})
	}

	r := spoofDHCPRun(held, after())
	dhcpOf(r.state).afterErr = "open /var/lib/incus/networks/boxnet/dnsmasq.leases: permission denied"
	got := refineSpoof(r, starve)
	assert.Equal(t, Inconclusive, got.Verdict, "an unread lease file proves nothing")
	assert.Contains(t, got.Evidence, "permission denied")

	r = spoofDHCPRun(held, after())
	unsent := starve
	unsent.Obs = &probes.Observation{Outcome: probes.Error, Reason: "cut short after 300 of 506 messages"}
	unsent.Observed = "error: cut short"
	assert.Equal(t, Inconclusive, refineSpoof(r, unsent).Verdict, "a lie not sent proves nothing")
	r = spoofDHCPRun(held, after(dhcpLease("0a:b0:c5:00:00:07", "10.88.0.99", t0)))
	assert.Equal(t, Fail, refineSpoof(r, unsent).Verdict, "what the server leased fails it, whatever the sender saw")
	r = spoofDHCPRun(held, []stack.DHCPLease{a, b, c, dhcpLease("0a:b0:c5:00:00:07", "10.88.0.99", t0)})
	assert.Equal(t, Fail, refineSpoof(r, starve).Verdict, "and needs no control")

	// The made-up leases are what the run releases afterwards.
	r = spoofDHCPRun(held, after(dhcpLease("0a:b0:c5:00:00:07", "10.88.0.99", t0), dhcpLease("06-"+sc.A.MAC.String(), "10.88.0.97", t0)))
	assert.Len(t, dhcpOf(r.state).madeUp(r.scene), 2)
}

// A box minted after the lies is a result of C-SPOOF's own, beside its
// actions and the stack channel.
func TestJudgeSpoofNewLease(t *testing.T) {
	for _, tc := range []struct {
		d    dhcpRun
		want Verdict
	}{
		{dhcpRun{newBox: "drill-x-d", newAddr: "10.88.0.20"}, Pass},
		{dhcpRun{newBox: "drill-x-d", newErr: "every address of boxnet is taken by a box or a lease", newRefused: true}, Fail},
		{dhcpRun{newBox: "drill-x-d", newErr: "drill-x-d has no address in 10.88.0.0/24 after 20s"}, Fail},
		{dhcpRun{newBox: "drill-x-d", newErr: "no image box-probe"}, Inconclusive},
	} {
		rs := judgeSpoofClaim(&run{state: claimStates{SpoofID: &spoofRun{dhcp: &tc.d}}}, claimSpoof, nil)
		require.Len(t, rs, 2, "the new box, and the stack channel beside it")
		assert.Equal(t, ChannelNewLease, rs[0].Channel)
		assert.Equal(t, EvidenceRequests, evidenceOf(rs[0].Channel))
		assert.Equal(t, tc.want, rs[0].Verdict, rs[0].Evidence)
	}
	assert.Empty(t, judgeSpoofClaim(&run{}, claimSpoof, nil), "no DHCP lies, no box minted after them")
}

// The dhcp-open mutation finds the pin table's DHCP drops, and only them.
func TestIsDHCPDrop(t *testing.T) {
	r, err := nft.DesiredPins(nft.Config{}, nft.Capabilities{}, []string{"vA"}, nil)
	require.NoError(t, err)
	var dhcp []string
	for _, ru := range r.Tables[0].Chains[0].Rules {
		if isDHCPDrop(ru.Exprs) {
			dhcp = append(dhcp, ru.Text)
		}
	}
	require.Len(t, dhcp, 3, "%v", dhcp)
	for _, text := range dhcp {
		assert.Contains(t, text, "udp dport 67")
		assert.Contains(t, text, "drop")
	}
}
