package drill

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/internal/hostscan"
	"github.com/box-isolation/box/probes"
	"github.com/box-isolation/box/stack/nft"
)

// clusterScene is testTopology on a cluster of n members (n 0: none):
// box-a's member is m1; every other member has its probe box, its own
// gateway, uplink and cluster address, and incusd on its cluster address.
func clusterScene(n int) Scene {
	t := testTopology()
	if n == 0 {
		return t
	}
	cl := netip.MustParsePrefix("192.168.40.0/24")
	clAddr := func(k int) netip.Addr { return netip.MustParseAddr(fmt.Sprintf("192.168.40.%d", 10+k)) }
	api := func(a netip.Addr) hostscan.Listener {
		return hostscan.Listener{Proto: "tcp", Family: 4, Addr: a, Port: 8443, Process: "incusd"}
	}
	t.HostAddrs = append(t.HostAddrs, HostAddr{Name: "cluster", Addr: clAddr(1), Via: cl})
	sshd := hostscan.Listener{Proto: "tcp", Family: 4, Addr: netip.IPv4Unspecified(), Port: 22, Process: "sshd"}
	t.Listeners = append(t.Listeners, api(clAddr(1)), sshd)
	t.Members = append(t.Members, MemberScene{Name: "m1", Local: true, ClusterAddr: clAddr(1), HostAddrs: t.HostAddrs, Listeners: t.Listeners})
	for k := 2; k <= n; k++ {
		name := fmt.Sprintf("m%d", k)
		box := testBox(memberBoxPlace(name), "drill-0a1b2c-m"+name, fmt.Sprintf("10.88.0.%d", 30+k), fmt.Sprintf("00:16:3e:00:01:%02x", k))
		box.Member = name
		t.Members = append(t.Members, MemberScene{Name: name, NetNS: "ns-" + name, ClusterAddr: clAddr(k), Box: box,
			HostAddrs: []HostAddr{
				{Name: "gateway", Addr: t.Gateway, Via: t.Subnet},
				{Name: "uplink", Addr: netip.MustParseAddr(fmt.Sprintf("192.0.2.%d", 4*(k-2)+2)), Via: netip.MustParsePrefix(fmt.Sprintf("192.0.2.%d/30", 4*(k-2)))},
				{Name: "cluster", Addr: clAddr(k), Via: cl},
			},
			Listeners: []hostscan.Listener{api(clAddr(k)), sshd},
		})
	}
	return t
}

// TestClusterScenarioPairs: every member's box probes every other
// member's cluster address (the cluster API among the targets), each
// blocked probe judged at the target member: its listener, its own probe
// of it, or its counting chain keyed by the probe's source port, with
// that chain's control; no probe goes box to box across members.
func TestClusterScenarioPairs(t *testing.T) {
	scene := clusterScene(3)
	sc := BuildScenario(scene, Catalogue)
	byPlace := map[Place]MemberScene{}
	for _, m := range scene.Members {
		byPlace[m.hostPlace()] = m
	}
	for _, from := range scene.Members {
		src := from.Box
		if from.Local {
			src = scene.A
		}
		for _, to := range scene.Members {
			if to.Name == from.Name {
				continue
			}
			var pair []Action
			for _, a := range sc.Actions {
				if a.From == src.Place && a.Probe.Target == to.ClusterAddr {
					pair = append(pair, a)
				}
			}
			require.NotEmpty(t, pair, "%s probes %s's cluster address", src.Place, to.Name)
			assert.True(t, slices.ContainsFunc(pair, func(a Action) bool { return a.Probe.Port == 8443 }), "%s probes %s's cluster API", src.Place, to.Name)
			for _, a := range pair {
				assert.Equal(t, ExpectBlocked, a.Expect, a.Target)
				assert.Equal(t, to.Name, a.Member, "%s is about %s", a.Target, to.Name)
				switch {
				case a.Count != "":
					assert.Equal(t, to.filterPlace(), cmp.Or(a.CountAt, PlaceFilter), "%s is counted at %s", a.Target, to.Name)
					keys := sc.Counters
					if !to.Local {
						keys = sc.MemberCounters[to.filterPlace()]
					}
					i := slices.IndexFunc(keys, func(k nft.CountKey) bool { return k.String() == a.Count })
					require.GreaterOrEqual(t, i, 0, "%s's key is in %s's chain", a.Target, to.Name)
					assert.Equal(t, from.ClusterAddr, keys[i].Src, "counted from %s's NAT address", from.Name)
					assert.NotZero(t, keys[i].SrcPort, "keyed by the probe's source port")
					assert.Equal(t, a.Probe.SrcPort, int(keys[i].SrcPort), "the probe binds the port its key counts")
				case a.Channel == "tcp" || a.Channel == "udp":
					assert.Equal(t, to.hostPlace(), a.ListenerAt, a.Target)
					l := slices.IndexFunc(sc.Plans[a.ListenerAt].Listeners, func(l probes.ListenerSpec) bool { return l.ID == a.ListenerID })
					assert.GreaterOrEqual(t, l, 0, "%s's listener runs at %s", a.Target, to.Name)
					fallthrough
				default:
					assert.Equal(t, to.hostPlace(), a.SelfControl.At, "%s's control runs at %s", a.Target, to.Name)
				}
			}
		}
		if !from.Local {
			k, ok := sc.CountControls[from.filterPlace()]
			require.True(t, ok, "%s's chain has a control", from.Name)
			assert.Equal(t, from.Box.IP, k.Src)
		}
	}
	// No probe from one member's box to another member's box: their
	// bridges are separate segments, so it could not fail.
	boxes := map[netip.Addr]string{}
	for _, m := range scene.Members {
		if m.Box.IP.IsValid() {
			boxes[m.Box.IP] = m.Name
		}
	}
	for _, a := range sc.Actions {
		if to, ok := boxes[a.Probe.Target]; ok {
			assert.Equal(t, memberBoxPlace(to), a.From, "%s from %s aims at %s's box", a.ID, a.From, to)
		}
	}
	for place := range sc.Plans {
		if m := memberOfPlace(place); m != "" {
			assert.Contains(t, []Place{memberBoxPlace(m), memberHostPlace(m)}, place)
		}
	}
}

// TestClusterProbeGrowth measures how the probes grow with the members:
// each added member brings its own host's probes and its box's controls,
// and every ordered pair of members a fixed set toward the cluster
// address, so the count grows with the square of the members while the
// time does not (every place's plan runs at once).
func TestClusterProbeGrowth(t *testing.T) {
	count := func(n int) (all, pairs int) {
		scene := clusterScene(n)
		sc := BuildScenario(scene, Catalogue)
		for _, p := range sc.Plans {
			all += len(p.Probes)
		}
		for _, a := range sc.Actions {
			from := memberOfPlace(a.From)
			if a.From == PlaceA && n > 0 {
				from = scene.Members[0].Name
			}
			if from != "" && a.Member != "" && a.Member != from {
				pairs++
			}
		}
		return all, pairs
	}
	base, _ := count(0)
	_, perPair := count(2)
	perPair /= 2
	require.Positive(t, perPair)
	prev := base
	for n := 2; n <= 6; n++ {
		all, pairs := count(n)
		assert.Equal(t, n*(n-1)*perPair, pairs, "%d members: %d ordered pairs, %d probes each", n, n*(n-1), perPair)
		assert.Greater(t, all, prev)
		t.Logf("%d members: %d probes (%d standalone; %d toward other members' cluster addresses)", n, all, base, pairs)
		prev = all
	}
}

// TestClusterSourcePortsAreDistinct: the probes a counting chain past a
// NAT keys on bind a port each, none twice, all below the kernel's
// ephemeral range where the other probes' ports come from (one shared
// with another probe of the same box made it "address already in use").
func TestClusterSourcePortsAreDistinct(t *testing.T) {
	sc := BuildScenario(clusterScene(6), Catalogue)
	seen := map[int]string{}
	cross := 0
	for _, a := range sc.Actions {
		p := a.Probe.SrcPort
		if p == 0 {
			continue
		}
		assert.Empty(t, seen[p], "%s and %s both bind %d", a.ID, seen[p], p)
		seen[p] = a.ID
		assert.Less(t, p, 32768, "%s binds %d, in the ephemeral range", a.ID, p)
		assert.GreaterOrEqual(t, p, firstSrcPort)
		if a.Source.Port() != 0 {
			assert.Equal(t, p, int(a.Source.Port()), "%s is known at its target by the port it binds", a.ID)
			cross++
		}
	}
	assert.Equal(t, 30*(5+2), cross, "a 6-member run pins a port for each of the 5 counted services and the 2 listeners of its 30 ordered pairs")
}

// TestClusterPlansValid: every plan of a cluster's scene is one an agent
// takes (a member's box is named box@MEMBER, and an id may not hold '@':
// C-KERNEL's controls did, and every member's agent refused its plan).
func TestClusterPlansValid(t *testing.T) {
	sc := BuildScenario(clusterScene(3), Catalogue)
	require.NotEmpty(t, sc.Plans)
	for place, p := range sc.Plans {
		assert.NoError(t, p.Validate(), "the plan for %s", place)
	}
}
