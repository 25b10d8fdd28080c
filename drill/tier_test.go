package drill

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/box-isolation/box/stack"
	"github.com/box-isolation/box/stack/model"
)

func TestJudgeEscape(t *testing.T) {
	a := Action{ID: "t-nic-decoy", Claim: "C-TIER", Channel: ChannelRestriction, Target: "a NIC on managed network decoy", Expect: ExpectRefused}
	reason := "Network not allowed in project"
	for _, tc := range []struct {
		name string
		err  error
		want Verdict
	}{
		{"allowed is a failure", nil, Fail},
		{"refused for the restriction", errors.New(`updating instance t: incus: PUT /1.0/instances/t: failed checking if instance update allowed: Invalid device "eth1": Network not allowed in project`), Pass},
		{"the reason is matched whatever its case", errors.New("creating network x: network not allowed in project"), Pass},
		{"refused for another reason proves nothing", errors.New(`Image "box-probe" not found`), Inconclusive},
		{"a dead daemon proves nothing", errors.New("incus: dial unix /var/lib/incus/unix.socket.user: connect: connection refused"), Inconclusive},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := judgeEscape(a, reason, tc.err)
			assert.Equal(t, tc.want, r.Verdict, r.Evidence)
			assert.Equal(t, a.ID, r.ID)
		})
	}
}

func TestPlaceControlled(t *testing.T) {
	res := func(from Place, e Expectation, v Verdict) Result {
		return Result{Action: Action{From: from, Expect: e, Target: "x"}, Verdict: v}
	}
	blocked := res(PlaceT, ExpectBlocked, Pass)
	noName := res(PlaceT, ExpectNoName, Pass)
	okCtl := res(PlaceT, ExpectReach, Pass)
	badCtl := res(PlaceT, ExpectResolve, Fail)
	fromA := res(PlaceA, ExpectBlocked, Pass)

	got := placeControlled([]Result{okCtl, blocked, noName}, PlaceT)
	assert.Equal(t, Pass, got[1].Verdict, "controls passed: the block stands")
	assert.Equal(t, Pass, got[2].Verdict)

	got = placeControlled([]Result{okCtl, badCtl, blocked, noName, fromA}, PlaceT)
	assert.Equal(t, Inconclusive, got[2].Verdict, "box-t reached nothing: its block proves nothing")
	assert.Equal(t, Inconclusive, got[3].Verdict)
	assert.Equal(t, Fail, got[1].Verdict, "the failed control stays a failure")
	assert.Equal(t, Pass, got[4].Verdict, "box-a's results are not box-t's to judge")

	got = placeControlled([]Result{blocked}, PlaceT)
	assert.Equal(t, Inconclusive, got[0].Verdict, "no control at all is no evidence")
}

func TestTierBoxFindingsAreOnlyBoxTsIsolation(t *testing.T) {
	fs := []model.Finding{
		{Layer: model.LayerFleet, Object: "box drill-1-t (project user-993)", Problem: `NIC eth0 has port isolation off (security.port_isolation="false")`},
		{Layer: model.LayerFleet, Object: "box drill-1-t (project user-993)", Problem: "has a proxy device door"},
		{Layer: model.LayerFleet, Object: "box work (project user-993)", Problem: `NIC eth0 has port isolation off (security.port_isolation="false")`},
		{Layer: model.LayerFleet, Object: "box drill-1-t", Problem: `NIC eth0 has port isolation off (security.port_isolation="false")`},
		{Layer: "L-PORTISO", Object: "bridge port veth1 (drill-1-t, project user-993)", Problem: "port isolation off"},
	}
	got := tierBoxFindings(fs, "user-993", "drill-1-t")
	assert.Equal(t, fs[:1], got, "only the isolation the drill turned off on box-t, in its project, is C-TIER's")

	r := &run{tier: &tierRun{project: "user-993"}, ends: map[Place]*BoxEnd{PlaceT: {Instance: "drill-1-t"}}}
	assert.Equal(t, fs[:1], r.tierBoxFindings(fs), "the run's box-t only")
	assert.Empty(t, (&run{}).tierBoxFindings(fs), "no box-t, no such finding")
}

// TestTierUserOf: a run removes only its own host's leftover tier users:
// two worlds on one machine share /etc/passwd, not their runs.
func TestTierUserOf(t *testing.T) {
	boxw, boxs := &stack.Host{NetNS: "boxw-host"}, &stack.Host{NetNS: "boxs-host"}
	c := tierUserComment + " 2e29c9" + tierUserHost(boxs)
	assert.True(t, tierUserOf(c, boxs), "its own world's")
	assert.False(t, tierUserOf(c, boxw), "another world's run is not this one's leftover")
	assert.False(t, tierUserOf(c, &stack.Host{}), "nor the machine's own host's")
	assert.True(t, tierUserOf(tierUserComment+" 2e29c9", boxw), "an older build's, naming no host")
	assert.False(t, tierUserOf("Debian-exim", boxw))
}
