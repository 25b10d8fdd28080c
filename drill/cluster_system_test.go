package drill_test

import (
	"context"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/drill"
	"github.com/box-isolation/box/drill/image"
	"github.com/box-isolation/box/fixtures/world"
	"github.com/box-isolation/box/internal/testenv"
	"github.com/box-isolation/box/stack"
	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/model"
)

// clusterConfig is a drill run on the cluster world: the host is its first
// member, and every other member's namespace is known.
func clusterConfig(t *testing.T) (drill.Config, *world.State) {
	t.Helper()
	st := testenv.Cluster(t)
	c := incus.New(st.IncusSocket)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, err := image.Ensure(ctx, c, image.DefaultAlias, image.Options{})
	require.NoError(t, err)
	return drill.Config{
		Host:     &stack.Host{Incus: c, NetNS: st.Names.HostNS, Options: model.Options{DNS: []netip.Addr{world.Resolver}}, Members: stack.Membership{NetNS: st.MemberNetNS()}},
		Topology: st.Topology(), Image: image.DefaultAlias, Agent: agent(t), Version: "test",
		Log: testWriter{t},
	}, st
}

// TestSystemClusterDrill: on a 3-member cluster the drill mints a probe
// box on every member, every claim holds, and the cross-member pairs (each
// member's box to every other member's cluster address, the cluster API
// port among its listeners) were probed and judged at their target.
func TestSystemClusterDrill(t *testing.T) {
	cfg, st := clusterConfig(t)
	rep := run(t, cfg)
	for id, v := range claimVerdicts(rep) {
		assert.Equal(t, drill.Pass, v, "%s on a cluster", id)
	}
	require.Len(t, rep.Environment.Members, len(st.Members))
	on := map[drill.Place]string{}
	for _, b := range rep.Boxes {
		on[b.Place] = b.Member
	}
	for _, m := range st.Members[1:] {
		assert.Equal(t, m.Name, on[drill.Place("box@"+m.Name)], "a probe box ran on %s", m.Name)
	}
	for _, p := range []drill.Place{drill.PlaceA, drill.PlaceB, drill.PlaceC, drill.PlaceT} {
		assert.Equal(t, st.Members[0].Name, on[p], "%s ran on the member the drill talks to", p)
	}
	// Every ordered pair of members: a box on the first to the second's
	// cluster address, the cluster API (8443) among the targets, judged by
	// a witness at the target (its counting chain or its listener).
	host := claim(t, rep, "C-HOST")
	for _, from := range st.Members {
		place := drill.Place("box@" + from.Name)
		if from.Index == 1 {
			place = drill.PlaceA
		}
		for _, to := range st.Members {
			if to.Name == from.Name {
				continue
			}
			api := false
			n := 0
			for _, r := range host.Results {
				if r.From != place || !strings.Contains(r.Target, to.ClusterAddr.String()) {
					continue
				}
				n++
				assert.Equal(t, drill.Pass, r.Verdict, "%s -> %s", place, r.Target)
				assert.NotEmpty(t, r.AtTarget, "%s -> %s was judged at the target", place, r.Target)
				if strings.Contains(r.Target, "tcp/8443") {
					api = true
				}
			}
			assert.Positive(t, n, "%s probed %s's cluster address", place, to.Name)
			assert.True(t, api, "%s probed %s's cluster API port", place, to.Name)
		}
	}
	t.Logf("cluster of %d: %d probes, probe phase %d ms, run %d ms", len(st.Members), rep.Summary.Probes, rep.Summary.ProbePhaseMS, rep.DurationMS)
}

// TestSystemClusterMemberFirewallGone: one member's host table deleted by
// hand (as a person would, nft delete table), and its guard's qdisc, fails
// C-HOST for that member
// only: its own box reaches its host, Verify names it, and nothing about
// the other members fails.
func TestSystemClusterMemberFirewallGone(t *testing.T) {
	cfg, st := clusterConfig(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	_, err := cfg.Host.Ensure(ctx)
	require.NoError(t, err)
	_, err = cfg.Host.EnsureMembers(ctx)
	require.NoError(t, err)
	victim := st.Members[1]
	t.Cleanup(func() {
		// Put it back the way an operator would: member-only setup there.
		h := &stack.Host{Incus: incus.New(victim.IncusSocket), NetNS: victim.Name, Options: model.Options{DNS: []netip.Addr{world.Resolver}}, Members: stack.Membership{Only: true}}
		_, err := h.Ensure(context.Background())
		assert.NoError(t, err)
	})
	out, err := exec.Command("ip", "netns", "exec", victim.Name, "nft", "delete", "table", "inet", "box").CombinedOutput()
	require.NoError(t, err, "%s", out)
	// And its guard, which would hold the host alone (TestSystemDrillCanFail).
	unguardedIn(t, victim.Name)

	cfg.NoSetup = true // the run must find the hole, not mend it
	host := claimOf(t, "C-HOST")
	cfg.Claims = []drill.Claim{host}
	ctx2, cancel2 := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel2()
	rep, err := drill.Run(ctx2, cfg)
	require.NoError(t, err)
	cr := claim(t, rep, "C-HOST")
	require.Equal(t, drill.Fail, cr.Verdict)
	var probeFails, stackFails int
	for _, r := range cr.Results {
		if r.Verdict != drill.Fail {
			continue
		}
		assert.Equal(t, victim.Name, r.Member, "every failure is about %s: %s -> %s (%s)", victim.Name, r.From, r.Target, r.Evidence)
		if r.Channel == drill.ChannelStack {
			stackFails++
			assert.Contains(t, r.Target, victim.Name, "the stack channel names the member")
			continue
		}
		probeFails++
		assert.Equal(t, drill.Place("box@"+victim.Name), r.From, "only the member's own box got through to its host")
	}
	assert.Positive(t, probeFails, "a probe from %s's box reached its host", victim.Name)
	assert.Positive(t, stackFails, "Verify named %s's missing table", victim.Name)
	others := slices.DeleteFunc(slices.Clone(st.Members), func(m world.Member) bool { return m.Name == victim.Name })
	for _, m := range others {
		for _, f := range rep.Stack.Findings {
			assert.NotEqual(t, m.Name, f.Member, "no finding about %s: %s", m.Name, f)
		}
	}
}
