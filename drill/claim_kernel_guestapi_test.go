package drill

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/probes"
)

// TestKernelGuestAPIOff: a box with no /dev/incus passes when its config
// turns the guest API off (box's profile does), and is inconclusive when
// its config has it on or was not read: the missing socket alone could
// have been anything.
func TestKernelGuestAPIOff(t *testing.T) {
	r, rs := kernelRun(t, func(p Place, a Action) (probes.Observation, bool) {
		if a.Channel == ChannelGuestAPI {
			return probes.Observation{Outcome: probes.Error, Reason: "no socket at /dev/incus/sock",
				Evidence: probes.Evidence{HTTP: []probes.HTTPAnswer{{Path: "/1.0", Error: "dial unix: no such file or directory"}}}}, true
		}
		return probes.Observation{}, false
	})
	off := stateOf[guestAPIConfig](r.state, KernelID).off
	for p := range r.names {
		off[p] = true
	}
	off[PlaceB] = false
	delete(off, PlaceC)
	seen := 0
	for _, res := range judgeKernel(r, claimKernel, rs) {
		if res.Channel != ChannelGuestAPI {
			continue
		}
		seen++
		switch res.From {
		case PlaceB:
			assert.Equal(t, Inconclusive, res.Verdict, res.Evidence)
			assert.Contains(t, res.Evidence, "though its config has it on")
		case PlaceC:
			assert.Equal(t, Inconclusive, res.Verdict, res.Evidence)
			assert.Contains(t, res.Evidence, "its config could not be read")
		default:
			assert.Equal(t, Pass, res.Verdict, res.Evidence)
			assert.Contains(t, res.Evidence, "no guest API in the box")
			assert.Contains(t, res.Evidence, "security.guestapi=false")
		}
	}
	assert.Greater(t, seen, 3)
}

// TestSplitGuestAPI: the guest API probes of the whole scenario leave
// their plans for plans of their own (run one box at a time), every other
// probe stays where it was, and no probe is lost or doubled.
func TestSplitGuestAPI(t *testing.T) {
	sc := BuildScenario(testTopology(), Catalogue)
	rest, guest := splitGuestAPI(sc.Plans)
	require.NotEmpty(t, guest)
	count := func(plans map[Place]*probes.Plan) (n int) {
		for _, p := range plans {
			n += len(p.Probes)
		}
		return n
	}
	assert.Equal(t, count(sc.Plans), count(rest)+count(guest), "every probe, once")
	for place, g := range guest {
		for _, s := range g.Probes {
			assert.Equal(t, probes.KindUnixHTTP, s.Kind, "%s", place)
			assert.Equal(t, guestAPISocket, s.Socket)
		}
		assert.LessOrEqual(t, g.DeadlineMS, guestAPIDeadlineMS+guestAPIPlanMarginMS)
		for _, s := range rest[place].Probes {
			assert.False(t, s.Kind == probes.KindUnixHTTP && s.Socket == guestAPISocket, "%s keeps no guest API probe", place)
		}
		assert.NotSame(t, sc.Plans[place], rest[place], "a plan with a guest API probe is copied, not changed")
		assert.Contains(t, sc.Plans[place].Probes, g.Probes[0], "the scenario's plans are left as they were")
	}
}
