package drill

import (
	"bytes"
	"encoding/json"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/drill/topo"
	"github.com/box-isolation/box/probes"
	"github.com/box-isolation/box/stack/nft"
)

// testBox is a probe box as boxEnd would find it after minting.
func testBox(place Place, instance, ip, mac string) BoxEnd {
	hw, err := net.ParseMAC(mac)
	if err != nil {
		panic(err)
	}
	return BoxEnd{Place: place, Instance: instance, IP: netip.MustParseAddr(ip), MAC: hw, LinkLocal: drillLinkLocal(hw)}
}

// testTopology is a run in the hermetic world, written out by hand (the
// addresses of fixtures/world, a stack on 10.88.0.0/24), so a change in
// the world's Topology does not silently change what these tests check.
func testTopology() Scene {
	subnet := netip.MustParsePrefix("10.88.0.0/24")
	gw := netip.MustParseAddr("10.88.0.1")
	gwMAC, _ := net.ParseMAC("00:16:3e:00:00:01")
	t := Scene{
		Subnet:     subnet,
		Gateway:    gw,
		GatewayMAC: gwMAC,
		A:          testBox(PlaceA, "drill-0a1b2c-a", "10.88.0.11", "00:16:3e:00:00:0a"),
		B:          testBox(PlaceB, "drill-0a1b2c-b", "10.88.0.12", "00:16:3e:00:00:0b"),
		C:          testBox(PlaceC, "drill-0a1b2c-c", "10.88.0.13", "00:16:3e:00:00:0c"),
		T:          testBox(PlaceT, "drill-0a1b2c-t", "10.88.0.14", "00:16:3e:00:00:0d"),
		W:          testBox(PlaceW, "drill-0a1b2c-w", "10.88.0.15", "00:16:3e:00:00:0e"),
		N:          testBox(PlaceN, "drill-0a1b2c-n", "10.88.0.16", "00:16:3e:00:00:0f"),
		L:          testBox(PlaceL, "drill-0a1b2c-l", "10.88.0.17", "00:16:3e:00:00:10"),
		DHCPFirst:  netip.MustParseAddr("10.88.0.2"),
		DHCPSize:   253,
		DHCPPrefix: [3]byte{0x0a, 0xb0, 0xc5},

		Topology: topo.Topology{
			Source:         topo.SourceWorld,
			Canary:         netip.MustParseAddr("203.0.113.10"),
			CanaryTCP:      80,
			CanaryUDP:      7,
			CanaryGreeting: "hello from canary 5f3e",
			PublicName:     "canary.example.net.",
			PublicNameAddr: netip.MustParseAddr("203.0.113.10"),
			LANVia:         netip.MustParsePrefix("192.168.20.0/24"),
			LANNAT:         netip.MustParseAddr("192.168.20.1"),
			LANSources:     []netip.Addr{netip.MustParseAddr("192.168.20.2")},
			Door:           netip.MustParseAddrPort("127.0.0.1:19100"),
			Upstream:       netip.MustParseAddr("203.0.113.53"),
			Allow: topo.AllowTargets{OtherName: "other.example.net.", Other: netip.MustParseAddr("203.0.113.20"), OtherGreeting: "hello from canary2",
				RebindName: "rebind.example.net.", RebindAddr: netip.MustParseAddr("192.168.20.10"),
				InetNS: "inet", InetVia: netip.MustParsePrefix("198.51.100.0/24"), InetNAT: netip.MustParseAddr("198.51.100.2"),
				WitnessLog: "/run/box-world/test/dns-witness.log", AttackerZone: "attacker.example.", AltPort: 8080, ResolverGreeting: "hello from the resolver"},
		},
		DNSDomain: "incus",

		HostAddrs: []HostAddr{
			{Name: "gateway", Addr: gw, Via: subnet},
			{Name: "lan-side", Addr: netip.MustParseAddr("192.168.20.1"), Via: netip.MustParsePrefix("192.168.20.0/24")},
			{Name: "uplink", Addr: netip.MustParseAddr("198.51.100.2"), Via: netip.MustParsePrefix("198.51.100.0/24")},
		},
	}
	for _, h := range []struct{ name, addr string }{
		{"lan-10", "10.20.0.10"},
		{"lan-172", "172.16.20.10"},
		{"lan-192", "192.168.20.10"},
		{"lan-cgnat", "100.64.20.10"},
		{"lan-metadata", "169.254.169.254"},
	} {
		t.LANHosts = append(t.LANHosts, Target{Name: h.name, Addr: netip.MustParseAddr(h.addr), TCPPort: 80, UDPPort: 7})
	}
	return t
}

func claimsByID(t *testing.T, ids ...ClaimID) []Claim {
	t.Helper()
	var out []Claim
	for _, id := range ids {
		c, ok := ClaimByID(id)
		require.True(t, ok, id)
		out = append(out, c)
	}
	return out
}

func actionsOf(sc *Scenario, claim ClaimID) []Action {
	var out []Action
	for _, a := range sc.Actions {
		if a.Claim == claim {
			out = append(out, a)
		}
	}
	return out
}

// selections are the claim sets every structural check runs on.
func selections() map[string][]ClaimID {
	m := map[string][]ClaimID{"all": specClaims}
	for _, id := range specClaims {
		m["only "+string(id)] = []ClaimID{id}
	}
	return m
}

func TestBuildScenarioCoversEverySelectedClaim(t *testing.T) {
	for name, ids := range selections() {
		t.Run(name, func(t *testing.T) {
			sc := BuildScenario(testTopology(), claimsByID(t, ids...))
			for _, id := range ids {
				if c, _ := ClaimByID(id); !slices.Contains(c.Evidence, EvidenceProbes) {
					continue // judged from Verify's census, not from a probe
				}
				assert.NotEmpty(t, actionsOf(sc, id), "%s has no action", id)
			}
			// Baselines are built whatever is selected: they decide what a
			// block means.
			for _, id := range []ClaimID{"C-EGRESS", "C-DNS", "C-DHCP"} {
				as := actionsOf(sc, id)
				assert.NotEmpty(t, as, "baseline %s missing", id)
				for _, a := range as {
					assert.True(t, a.Baseline, "%s %s is a positive control", a.ID, id)
				}
			}
			// Nothing unselected (other than the baselines) is built.
			for _, a := range sc.Actions {
				assert.True(t, a.Baseline || slices.Contains(ids, a.Claim), "%s built for unselected %s", a.ID, a.Claim)
				assert.Equal(t, a.Baseline, slices.Contains([]ClaimID{"C-EGRESS", "C-DNS", "C-DHCP"}, a.Claim), a.ID)
			}
		})
	}
}

func TestBuildScenarioOnlySiblingStillHasBaselines(t *testing.T) {
	sc := BuildScenario(testTopology(), claimsByID(t, "C-SIBLING"))
	got := map[ClaimID]int{}
	for _, a := range sc.Actions {
		got[a.Claim]++
	}
	assert.Equal(t, 3, got["C-EGRESS"], "tcp, udp and icmp to the canary")
	assert.Equal(t, 1, got["C-DNS"])
	assert.Equal(t, 1, got["C-DHCP"])
	assert.NotZero(t, got["C-SIBLING"])
	assert.Len(t, got, 4, "only the baselines and C-SIBLING: %v", got)
}

// Every catalogue channel of a claim is exercised by some action (an
// action may cover several, joined by "+").
func TestBuildScenarioCoversEveryChannel(t *testing.T) {
	sc := BuildScenario(testTopology(), Catalogue)
	for _, c := range Catalogue {
		t.Run(string(c.ID), func(t *testing.T) {
			have := map[Channel]bool{}
			for _, a := range actionsOf(sc, c.ID) {
				for _, ch := range strings.Split(string(a.Channel), "+") {
					have[Channel(ch)] = true
				}
			}
			for _, ch := range c.Channels {
				if evidenceOf(ch) != EvidenceProbes {
					continue // judged from Verify's census or Incus's answers, not from a probe
				}
				assert.True(t, have[ch], "channel %s of %s has no action (have %v)", ch, c.ID, have)
			}
		})
	}
}

func TestBuildScenarioPlansDecode(t *testing.T) {
	for name, ids := range selections() {
		t.Run(name, func(t *testing.T) {
			sc := BuildScenario(testTopology(), claimsByID(t, ids...))
			require.NotEmpty(t, sc.Plans)
			for place, p := range sc.Plans {
				require.NoError(t, p.Validate(), place)
				// The agent's strict decoder is the real gate: what the drill
				// marshals is what the agent must accept.
				data, err := json.Marshal(p)
				require.NoError(t, err, place)
				got, err := probes.DecodePlan(bytes.NewReader(data))
				require.NoError(t, err, "plan for %s: %s", place, data)
				assert.Equal(t, len(p.Probes), len(got.Probes), place)
				assert.Equal(t, len(p.Witnesses), len(got.Witnesses), place)
				assert.Equal(t, len(p.Listeners), len(got.Listeners), place)
			}
		})
	}
}

func TestBuildScenarioActionsAndPlansAgree(t *testing.T) {
	sc := BuildScenario(testTopology(), Catalogue)
	places := []Place{PlaceA, PlaceB, PlaceC, PlaceT, PlaceW, PlaceN, PlaceL, PlaceK, PlaceNestNAT, PlaceNestMAC, PlaceHost, PlaceLAN, PlaceInet}
	for p := range sc.Plans {
		assert.Contains(t, places, p, "a plan for an unknown place")
	}
	ids := map[string]bool{}
	nonces := map[string]string{}
	probesInPlans, controls := 0, 0
	controlIDs := map[string]bool{}
	for _, a := range sc.Actions {
		for _, r := range []ProbeRef{a.SelfControl, a.Reference} {
			if r.Valid() {
				controlIDs[r.ID] = true
			}
		}
	}
	for id := range sc.References {
		controlIDs[id] = true
	}
	for _, a := range sc.Actions {
		delete(controlIDs, a.ID) // a reference to another action (the clone's to box-a's lease)
	}
	for _, p := range sc.Plans {
		probesInPlans += len(p.Probes)
		for _, s := range p.Probes {
			if s.Kind == probes.KindControl || controlIDs[s.ID] {
				controls++
			}
		}
	}
	assert.Equal(t, len(sc.Actions), probesInPlans-controls, "one probe per action, the rest are positive controls, no orphan probe")
	for _, a := range sc.Actions {
		assert.False(t, ids[a.ID], "duplicate action id %s", a.ID)
		ids[a.ID] = true
		assert.NotEmpty(t, a.Claim, a.ID)
		assert.NotEmpty(t, a.Channel, a.ID)
		assert.NotEmpty(t, a.Target, a.ID)
		assert.NotEmpty(t, a.TargetKey, a.ID)
		assert.NotEmpty(t, a.Expect, a.ID)
		assert.Equal(t, a.ID, a.Probe.ID, a.ID)
		p, ok := sc.Plans[a.From]
		require.True(t, ok, "%s runs from %s, which has no plan", a.ID, a.From)
		i := slices.IndexFunc(p.Probes, func(s probes.ProbeSpec) bool { return s.ID == a.ID })
		require.GreaterOrEqual(t, i, 0, "%s's probe is not in %s's plan", a.ID, a.From)
		assert.Equal(t, a.Probe, p.Probes[i], "%s: the action's probe and the plan's differ", a.ID)
		// A nonce is unique across the run, not only within one plan: a
		// witness elsewhere must never credit one probe's frame to another.
		if n := a.Probe.Nonce; n != "" {
			assert.Empty(t, nonces[n], "%s reuses the nonce of %s", a.ID, nonces[n])
			nonces[n] = a.ID
		}
	}
}

// controlledTarget is where the witness for a blocked action must be, for
// targets the drill runs something at.
func controlledTarget(t Scene, a Action) (Place, bool) {
	switch Place(a.TargetKey) {
	case PlaceB, PlaceC, PlaceA:
		return Place(a.TargetKey), true
	case TargetHostBridge:
		return PlaceHost, true
	case "internet-2", "resolver":
		return PlaceInet, true // C-ALLOW's witness in the internet
	case "internet":
		if a.Claim == AllowID { // the allowed canary, with another name
			return PlaceInet, true
		}
	case "lan-rebind":
		return PlaceLAN, true
	}
	for _, h := range t.LANHosts {
		if a.TargetKey == h.Name {
			return PlaceLAN, true
		}
	}
	return "", false
}

func keys(ks []nft.CountKey) []string {
	var out []string
	for _, k := range ks {
		out = append(out, k.String())
	}
	return out
}

func TestBuildScenarioBlockedActionsHaveWitnesses(t *testing.T) {
	topo := testTopology()
	sc := BuildScenario(topo, Catalogue)
	hostListeners := map[string]probes.ListenerSpec{}
	if hp := sc.Plans[PlaceHost]; hp != nil {
		for _, l := range hp.Listeners {
			hostListeners[l.ID] = l
		}
	}
	blocked := 0
	for _, a := range sc.Actions {
		if a.Expect != ExpectBlocked {
			continue
		}
		blocked++
		t.Run(a.ID+" "+string(a.Claim)+" "+string(a.Channel)+" "+a.TargetKey, func(t *testing.T) {
			// C-TIER's host probes from box-t are judged as C-HOST's are.
			if strings.HasPrefix(a.TargetKey, "host-") && a.TargetKey != TargetHostBridge {
				switch {
				case a.Count != "":
					// A service of the host's own (or a port nothing
					// listens on): judged by the counting chain after the
					// filter, which counts its control too.
					require.Contains(t, keys(sc.Counters), a.Count, "the counting chain counts what the action names")
					require.Contains(t, keys(sc.Counters), sc.CountControl.String(), "and its control")
				case a.Channel == "tcp" || a.Channel == "udp":
					require.Equal(t, PlaceHost, a.ListenerAt, "a host tcp/udp probe is judged by the host's listener")
					l, ok := hostListeners[a.ListenerID]
					require.True(t, ok, "listener %q is not in the host plan", a.ListenerID)
					assert.Equal(t, a.Probe.Port, l.Port, "the probe aims at the listener's port")
					assert.True(t, l.Via.Contains(a.Probe.Target), "the listener is bound in the probe target's subnet")
					want := probes.KindTCPGreeter
					if a.Channel == "udp" {
						want = probes.KindUDPEcho
					}
					assert.Equal(t, want, l.Kind)
					e, _ := topo.box(a.From)
					if a.From == PlaceNestNAT {
						e = topo.N // past box-n's NAT, the box's own address
					}
					assert.Equal(t, e.IP, a.Source.Addr(), "the listener knows the sender by where it arrives from")
				case a.Channel == "icmp":
					// The host's kernel answers every echo: its answer to
					// the host's own is the control its silence needs.
					require.True(t, a.SelfControl.Valid(), "an echo to a host address is judged by the host's answer to its own")
					assert.Equal(t, PlaceHost, a.SelfControl.At)
				default:
					t.Fatalf("a host action with nothing at the target: %+v", a)
				}
				return
			}
			place, ok := controlledTarget(topo, a)
			require.True(t, ok, "a blocked action towards %q, which the drill does not control", a.TargetKey)
			require.NotNil(t, a.Witness, "no witness at %s", place)
			assert.Equal(t, place, a.WitnessAt)
			wp := sc.Plans[a.WitnessAt]
			require.NotNil(t, wp, "no plan at the witness's place %s", a.WitnessAt)
			i := slices.IndexFunc(wp.Witnesses, func(w probes.WitnessSpec) bool { return w.ID == a.Witness.ID })
			require.GreaterOrEqual(t, i, 0, "witness %s is not in %s's plan", a.Witness.ID, a.WitnessAt)
			assert.Equal(t, *a.Witness, wp.Witnesses[i])
			if a.Probe.Nonce != "" {
				assert.Contains(t, a.Witness.Nonces, a.Probe.Nonce, "the witness looks for the probe's nonce")
			} else {
				assert.True(t, len(a.Witness.SrcIPs)+len(a.Witness.SrcMACs) > 0, "a witness without a nonce matches by source")
			}
			if a.Claim == "C-INBOUND" {
				assert.Equal(t, PlaceA, a.WitnessAt, "inbound is witnessed in box-a")
			}
		})
	}
	assert.NotZero(t, blocked)
}

func TestBuildScenarioTiming(t *testing.T) {
	for name, ids := range selections() {
		t.Run(name, func(t *testing.T) {
			sc := BuildScenario(testTopology(), claimsByID(t, ids...))
			for _, a := range sc.Actions {
				total := a.Probe.DelayMS + a.Probe.DeadlineMS
				assert.LessOrEqual(t, total, int((planDeadline - probes.AgentMargin).Milliseconds()), "%s fits in the plan deadline", a.ID)
				if a.Witness != nil {
					assert.GreaterOrEqual(t, a.Witness.WindowMS, total, "%s: the witness window covers the probe's delay and deadline", a.ID)
				}
				switch {
				case a.Expect == ExpectBlocked && a.Claim == "C-SPOOF":
					// The lies come past the ARP locktime after box-b's
					// first traffic, which the host must have seen.
					assert.Equal(t, int(spoofDelay.Milliseconds()), a.Probe.DelayMS, a.ID)
					assert.GreaterOrEqual(t, spoofDelay, probeDelay+time.Second+100*time.Millisecond, "%s: past the ARP locktime after box-b's first traffic", a.ID)
				case a.Expect == ExpectBlocked && a.Probe.Name != "":
					// A connection by name asks the resolver first: it gets
					// the time for that and TCP's first retransmission.
					assert.Equal(t, int(probeDelay.Milliseconds()), a.Probe.DelayMS, a.ID)
					assert.Equal(t, int(allowDeadline.Milliseconds()), a.Probe.DeadlineMS, a.ID)
				case a.Expect == ExpectBlocked:
					// All blocked probes fire together: the scenario costs
					// one deadline, not one per probe.
					assert.Equal(t, int(probeDelay.Milliseconds()), a.Probe.DelayMS, "%s fires after probeDelay, so every witness is armed", a.ID)
					assert.Equal(t, int(probeDeadline.Milliseconds()), a.Probe.DeadlineMS, a.ID)
				case a.Probe.Kind == probes.KindNDPRS:
					// RFC 4861: MIN_DELAY_BETWEEN_RAS (3 s) + MAX_RA_DELAY_TIME (0.5 s).
					assert.GreaterOrEqual(t, a.Probe.DeadlineMS, 4000, "%s: a solicitation window outlasts the protocol's timers", a.ID)
				case a.Probe.Kind == probes.KindIPv6State:
					assert.GreaterOrEqual(t, a.Probe.DelayMS, int((rsDelay + rsWindow).Milliseconds()), "%s reads the state at the end of the phase", a.ID)
				}
			}
			// Warm probe phase at or under 6 s: the plan plus exec overhead.
			assert.LessOrEqual(t, planDeadline, 5500*time.Millisecond)
			for place, p := range sc.Plans {
				assert.Equal(t, int(planDeadline.Milliseconds()), p.DeadlineMS, place)
				for _, w := range p.Witnesses {
					assert.LessOrEqual(t, w.WindowMS, p.DeadlineMS-int(probes.AgentMargin.Milliseconds()), "%s %s", place, w.ID)
				}
				for _, l := range p.Listeners {
					assert.Equal(t, int((planDeadline - probes.AgentMargin - passiveCushion).Milliseconds()), l.WindowMS,
						"%s listener %s listens as long as the witnesses, and ends before the agent collects", place, l.ID)
					for _, a := range sc.Actions {
						if a.ListenerAt == place && a.SelfControl.Valid() {
							i := slices.IndexFunc(p.Probes, func(s probes.ProbeSpec) bool { return s.ID == a.SelfControl.ID })
							require.GreaterOrEqual(t, i, 0)
							assert.LessOrEqual(t, p.Probes[i].DelayMS+p.Probes[i].DeadlineMS, l.WindowMS, "%s: the control ends while the listener listens", a.SelfControl.ID)
						}
					}
				}
			}
		})
	}
}

// TestBuildScenarioWitnessesHaveControls: every witness names a control
// nonce that the host sends on its wire, to the witness's own box, until
// after the probe it judges has started.
func TestBuildScenarioWitnessesHaveControls(t *testing.T) {
	topo := testTopology()
	sc := BuildScenario(topo, Catalogue)
	require.NotNil(t, sc.Plans[PlaceHost])
	// The host sends the boxes' and the LAN's controls; box-a sends the
	// host's bridge witnesses theirs (C-SPOOF).
	ctl := map[string]probes.ProbeSpec{}
	for _, place := range []Place{PlaceHost, PlaceA} {
		for _, s := range sc.Plans[place].Probes {
			if s.Kind == probes.KindControl {
				ctl[s.Nonce] = s
			}
		}
	}
	macs := map[Place]string{PlaceA: topo.A.MAC.String(), PlaceB: topo.B.MAC.String(), PlaceC: topo.C.MAC.String(), PlaceHost: topo.GatewayMAC.String()}
	n := 0
	for _, a := range sc.Actions {
		if a.Witness == nil {
			continue
		}
		n++
		c, ok := ctl[a.Witness.Control]
		require.True(t, ok, "%s: the witness at %s has control %q, which nobody sends", a.ID, a.WitnessAt, a.Witness.Control)
		assert.Equal(t, a.Witness.Via, c.Via, "%s: the control goes on the witness's wire", a.ID)
		if a.WitnessAt == PlaceLAN {
			assert.Empty(t, c.DstMAC, "the LAN wire's control is a broadcast")
		} else {
			assert.Equal(t, macs[a.WitnessAt], c.DstMAC, "%s: a box's control goes to that box only", a.ID)
		}
		// The last frame leaves at the control's deadline; agents start a
		// few hundred milliseconds apart at worst.
		const skew = 500
		assert.GreaterOrEqual(t, c.DelayMS+c.DeadlineMS, a.Probe.DelayMS+skew, "%s: controls go on after the probe started, with room for skew", a.ID)
		assert.LessOrEqual(t, c.DelayMS+c.DeadlineMS, a.Witness.WindowMS, "%s: the sender ends with the witness windows, well before the agent collects", a.ID)
	}
	assert.Greater(t, n, 30)
	for _, a := range sc.Actions {
		if a.ListenerAt != "" {
			require.True(t, a.SelfControl.Valid(), "%s: a listener needs its control", a.ID)
			i := slices.IndexFunc(sc.Plans[a.SelfControl.At].Probes, func(s probes.ProbeSpec) bool { return s.ID == a.SelfControl.ID })
			require.GreaterOrEqual(t, i, 0, "%s: control %s is not in %s's plan", a.ID, a.SelfControl.ID, a.SelfControl.At)
			c := sc.Plans[a.SelfControl.At].Probes[i]
			assert.GreaterOrEqual(t, c.DelayMS, a.Probe.DelayMS+a.Probe.DeadlineMS, "%s: the listener's control comes after the box's probe ended", a.ID)
		}
	}
}

// TestBuildScenarioPinsPeers: box-a pins both peers' IPv4 and link-local
// addresses, and every L3 sibling probe names the address it relies on.
func TestBuildScenarioPinsPeers(t *testing.T) {
	topo := testTopology()
	sc := BuildScenario(topo, claimsByID(t, "C-SIBLING"))
	pinned := map[netip.Addr]string{}
	for _, n := range sc.Plans[PlaceA].Neighbors {
		pinned[n.Address] = n.MAC
	}
	for _, e := range []BoxEnd{topo.B, topo.C} {
		assert.Equal(t, e.MAC.String(), pinned[e.IP], e.Place)
		assert.Equal(t, e.MAC.String(), pinned[e.LinkLocal], e.Place)
	}
	for _, a := range actionsOf(sc, "C-SIBLING") {
		switch a.Channel {
		case "icmp", "tcp", "udp", "icmpv6-link-local":
			assert.True(t, a.Pinned.IsValid(), "%s %s relies on a pinned neighbour", a.ID, a.Channel)
			assert.Equal(t, a.Probe.Target, a.Pinned, a.ID)
			assert.Contains(t, pinned, a.Pinned, a.ID)
		case "arp":
			assert.False(t, a.Pinned.IsValid(), "ARP is the probe the pins go around")
		}
	}
}

func TestBuildScenarioCloneComparesWithDHCP(t *testing.T) {
	sc := BuildScenario(testTopology(), claimsByID(t, "C-CLONE"))
	dhcp := actionsOf(sc, "C-DHCP")
	require.Len(t, dhcp, 1)
	assert.Equal(t, PlaceA, dhcp[0].From, "judgeDistinct reads the source's lease at box-a")
	clone := actionsOf(sc, "C-CLONE")
	require.Len(t, clone, 1)
	c := clone[0]
	assert.Equal(t, PlaceC, c.From, "the clone reads its own lease")
	assert.Equal(t, ExpectDistinct, c.Expect)
	assert.Equal(t, probes.KindDHCPLease, c.Probe.Kind)
	assert.Equal(t, ProbeRef{At: PlaceA, ID: dhcp[0].ID}, c.Reference)
}

func TestBuildScenarioTargets(t *testing.T) {
	topo := testTopology()
	sc := BuildScenario(topo, Catalogue)
	targets := func(claim ClaimID) map[string]bool {
		m := map[string]bool{}
		for _, a := range actionsOf(sc, claim) {
			m[a.TargetKey] = true
		}
		return m
	}
	assert.Equal(t, map[string]bool{string(PlaceB): true, string(PlaceC): true}, targets("C-SIBLING"), "the peer and the clone")
	assert.Equal(t, map[string]bool{"host-gateway": true, "host-lan-side": true, "host-uplink": true}, targets("C-HOST"), "every host address")
	lan := targets("C-LAN")
	for _, h := range topo.LANHosts {
		assert.True(t, lan[h.Name], "LAN host %s probed", h.Name)
	}
	// 169.254.169.254:80 is named by C-LAN (docs/claims.md).
	assert.True(t, slices.ContainsFunc(actionsOf(sc, "C-LAN"), func(a Action) bool {
		return a.Probe.Kind == probes.KindTCP && a.Probe.Target == netip.MustParseAddr("169.254.169.254") && a.Probe.Port == 80
	}), "the metadata service on tcp/80")
	from := map[Place]bool{}
	for _, a := range actionsOf(sc, "C-INBOUND") {
		from[a.From] = true
		assert.Equal(t, topo.A.IP, a.Probe.Target)
	}
	assert.Equal(t, map[Place]bool{PlaceHost: true, PlaceLAN: true}, from, "inbound from the host and from the LAN")
	var names []string
	for _, a := range actionsOf(sc, "C-NAMES") {
		names = append(names, a.Probe.Name)
	}
	for _, want := range []string{"drill-0a1b2c-b.", "drill-0a1b2c-b.incus.", "drill-0a1b2c-c.", "10.88.0.12", "10.88.0.13"} {
		assert.Contains(t, names, want)
	}
}

// A witness that matches by source address must not match the replies to
// the probes its own place sends: a witness at P with src_ips S and proto
// p sees every p packet from S to P, and when P itself probes an address
// in S over p, the answers (an echo reply, an ICMP error) are such
// packets. Port-narrowed tcp/udp witnesses are safe (replies go to an
// ephemeral port); icmp ones are not, unless dst_ip rules the replies out.
func TestBuildScenarioWitnessesDoNotMatchReplies(t *testing.T) {
	topo := testTopology()
	sc := BuildScenario(topo, Catalogue)
	// The address each place's probes leave from.
	source := map[Place]netip.Addr{PlaceA: topo.A.IP, PlaceB: topo.B.IP, PlaceC: topo.C.IP, PlaceHost: topo.Gateway, PlaceLAN: topo.LANSources[0]}
	for _, a := range sc.Actions {
		if a.Witness == nil || a.Witness.Port != 0 || len(a.Witness.SrcIPs) == 0 {
			continue
		}
		w := a.Witness
		for _, other := range sc.Actions {
			if other.From != a.WitnessAt || other.ID == a.ID || !slices.Contains(w.SrcIPs, other.Probe.Target) {
				continue
			}
			proto := string(other.Probe.Kind)
			if other.Probe.Kind == probes.KindICMP && other.Probe.Target.Is6() {
				proto = "icmpv6"
			}
			if w.Proto != "" && w.Proto != proto {
				continue
			}
			if w.DstIP.IsValid() && w.DstIP != source[other.From] {
				continue
			}
			t.Errorf("%s (%s %s from %s) has a witness at %s matching src_ips %v proto %q: it also matches the replies to %s (%s %s from %s to %s), so a hole in %s is reported against %s too",
				a.ID, a.Claim, a.Channel, a.From, a.WitnessAt, w.SrcIPs, w.Proto,
				other.ID, other.Claim, other.Channel, other.From, other.Probe.Target, other.Claim, a.Claim)
		}
	}
}

// hostScene is a real host's topology as discovery gives it (host mode):
// no LAN namespace of the drill's own, LAN targets from the host's routes,
// neighbours and samples; outward interfaces where the host has them.
func hostScene(outward bool) Scene {
	t := testTopology()
	t.Source = topo.SourceHost
	t.LANVia, t.LANNAT = netip.Prefix{}, netip.Addr{}
	t.LANNS, t.LANSources = "", []netip.Addr{netip.MustParseAddr("10.99.0.2")}
	t.Allow = topo.AllowTargets{}
	t.CanaryGreeting, t.CanaryUDP = "", 0
	t.LANHosts = []Target{
		{Name: "router-192.168.1.1", Addr: netip.MustParseAddr("192.168.1.1"), TCPPort: 80, UDPPort: 53, Provenance: topo.FromRoute},
		{Name: "sample-10", Addr: netip.MustParseAddr("10.0.0.1"), TCPPort: 22, Provenance: topo.FromSample},
		{Name: "metadata", Addr: netip.MustParseAddr("169.254.169.254"), TCPPort: 80, Provenance: topo.FromSample},
	}
	if outward {
		t.Outward = []string{"eth0"}
	}
	t.HostTCP, t.HostUDP = 50123, 50124
	return t
}

// routedScene is the world's routed shape in host mode (drill run --host
// in the world's host namespace): the LAN behind a router, reached by a
// routed prefix, one outward interface.
func routedScene() Scene {
	t := hostScene(true)
	t.LANHosts = []Target{
		{Name: "route-gw-10.30.0.1", Addr: netip.MustParseAddr("10.30.0.1"), TCPPort: 80, Provenance: topo.FromRoute},
		{Name: "route-10.40.0.0/24", Addr: netip.MustParseAddr("10.40.0.10"), TCPPort: 80, UDPPort: 7, Provenance: topo.FromRoute},
	}
	return t
}

// topologies are every shape the builder knows, with the claims their mode
// runs (C-TIER too in host mode, as a recorded run selects it).
func topologies(t *testing.T) map[string]struct {
	scene  Scene
	claims []Claim
} {
	t.Helper()
	world, err := Resolve(ModeWorld, nil, nil, false)
	require.NoError(t, err)
	host, err := Resolve(ModeHost, nil, nil, true)
	require.NoError(t, err)
	return map[string]struct {
		scene  Scene
		claims []Claim
	}{
		"world":                   {testTopology(), world.Claims},
		"cluster":                 {clusterScene(3), world.Claims},
		"host":                    {hostScene(true), host.Claims},
		"host, no outward iface":  {hostScene(false), host.Claims},
		"routed world, host mode": {routedScene(), host.Claims},
	}
}

// TestNoEvidenceIsAnotherSenders: a witness that matches by source (a SYN
// carries no nonce) matches none of another sender's probes: each probe
// names its own source port where senders share an address past a NAT.
func TestNoEvidenceIsAnotherSenders(t *testing.T) {
	for name, tp := range topologies(t) {
		t.Run(name, func(t *testing.T) {
			s := tp.scene
			sc := BuildScenario(s, tp.claims)
			// Where a probe by name lands.
			byName := map[string]netip.Addr{trimDot(s.PublicName): s.Canary, trimDot(s.Allow.OtherName): s.Allow.Other, trimDot(s.Allow.RebindName): s.Allow.RebindAddr}
			dst := func(a Action) netip.Addr {
				if a.Probe.Target.IsValid() {
					return a.Probe.Target
				}
				return byName[a.Probe.Name]
			}
			// What a box's packet may carry as its source past the host.
			sources := func(a Action) []netip.Addr {
				out := []netip.Addr{s.LANNAT, s.Allow.InetNAT}
				if e, ok := s.box(a.From); ok {
					out = append(out, e.IP)
				}
				if a.From == PlaceNestNAT {
					out = append(out, s.N.IP) // past box-n's NAT
				}
				return out
			}
			for _, a := range sc.Actions {
				w := a.Witness
				if w == nil || len(w.SrcIPs) == 0 || w.Proto != "tcp" {
					continue
				}
				// A witness in a box sees what is sent to that box.
				at, inBox := s.box(a.WitnessAt)
				for _, o := range sc.Actions {
					if inBox && dst(o) != at.IP && dst(o) != at.LinkLocal {
						continue
					}
					if o.ID == a.ID || o.Probe.Kind != probes.KindTCP || (w.Port != 0 && o.Probe.Port != w.Port) ||
						(w.DstIP.IsValid() && dst(o) != w.DstIP) || (w.SrcPort != 0 && o.Probe.SrcPort != w.SrcPort) {
						continue
					}
					if slices.ContainsFunc(sources(o), func(src netip.Addr) bool { return src.IsValid() && slices.Contains(w.SrcIPs, src) }) {
						t.Errorf("%s's witness (%s %s from %s) would take %s's SYN (%s %s from %s) for its own", a.ID, a.Claim, a.Channel, a.From, o.ID, o.Claim, o.Channel, o.From)
					}
				}
			}
		})
	}
}

func trimDot(s string) string {
	if len(s) > 0 && s[len(s)-1] == '.' {
		return s[:len(s)-1]
	}
	return s
}
