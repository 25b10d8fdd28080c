package drill

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/drill/topo"
	"github.com/box-isolation/box/probes"
)

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

// TestSilenceAloneIsNeverAPass: for every blocked action of every
// topology, the sender's silence with nothing reported at the target is
// never a pass. Either the action has evidence at its target (a witness,
// a listener, a counter or the target's own control) and its absence makes
// it inconclusive, or it has none and is inconclusive by design.
func TestSilenceAloneIsNeverAPass(t *testing.T) {
	for name, tp := range topologies(t) {
		t.Run(name, func(t *testing.T) {
			sc := BuildScenario(tp.scene, tp.claims)
			blocked := 0
			for _, a := range sc.Actions {
				if a.Expect != ExpectBlocked && !(a.Expect == ExpectNone && a.Probe.Kind != probes.KindIPv6State) {
					continue
				}
				blocked++
				silent := probes.Observation{ID: a.ID, Kind: a.Probe.Kind, Outcome: probes.Silent, Reason: "nothing came back",
					StartedAt: t0.Add(probeDelay), ElapsedMS: 1500}
				r := judge(a, observations{a.From: {a.ID: silent}}, tp.scene, true, nil)
				assert.NotEqual(t, Pass, r.Verdict, "%s %s %s from %s to %s: passed on the sender's silence alone: %s",
					a.ID, a.Claim, a.Channel, a.From, a.Target, r.Evidence)
			}
			assert.NotZero(t, blocked)
		})
	}
}

// TestBlockedActionsAreWatched: in the world every blocked action has
// evidence at its target; on a real host, every one but those no watcher
// could be put beside (a LAN target on a host without an outward
// interface: judged inconclusive, and the claim says so).
func TestBlockedActionsAreWatched(t *testing.T) {
	for name, tp := range topologies(t) {
		t.Run(name, func(t *testing.T) {
			sc := BuildScenario(tp.scene, tp.claims)
			for _, a := range sc.Actions {
				if a.Expect != ExpectBlocked {
					continue
				}
				lanUnwatchable := !tp.scene.LANVia.IsValid() && len(tp.scene.Outward) == 0 &&
					slices.ContainsFunc(tp.scene.LANHosts, func(h Target) bool { return h.Addr == a.Probe.Target })
				if lanUnwatchable {
					assert.False(t, watched(a), "%s", a.ID)
					continue
				}
				assert.True(t, watched(a), "%s %s %s from %s to %s has nothing at its target", a.ID, a.Claim, a.Channel, a.From, a.Target)
			}
		})
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
