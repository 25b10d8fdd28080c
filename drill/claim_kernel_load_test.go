package drill

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/probes"
)

// TestKernelIsolatedMaps: box-l's and box-k's maps must be apart; the
// shared map holding both is said, not failed (Incus keeps isolated boxes
// apart from each other only).
func TestKernelIsolatedMaps(t *testing.T) {
	a := Action{ID: "d", Claim: KernelID, Channel: ChannelIDMapDisjoint, From: PlaceL}
	res := disjoint(Result{Action: a}, map[Place][]probes.IDRange{PlaceL: isolatedL, PlaceK: isolatedK, PlaceA: sharedMap})
	assert.Equal(t, Pass, res.Verdict)
	assert.Contains(t, res.Evidence, "share no host id")
	assert.Contains(t, res.Evidence, "the boxes that are not isolated (box-a) share one map that holds both ranges")
	res = disjoint(Result{Action: a}, map[Place][]probes.IDRange{PlaceL: isolatedL, PlaceK: isolatedL})
	assert.Equal(t, Fail, res.Verdict)
	assert.Contains(t, res.Evidence, "share host id 1065536")
	res = disjoint(Result{Action: a}, map[Place][]probes.IDRange{PlaceL: isolatedL, PlaceA: sharedMap})
	assert.Equal(t, Inconclusive, res.Verdict, "one isolated box compares with nothing")
}

// TestKernelLoads: each load held at box-l's limit passes and says what
// it reached; one that reached its own cap fails.
func TestKernelLoads(t *testing.T) {
	for _, tc := range []struct {
		ch      Channel
		o       probes.Observation
		verdict Verdict
		want    string
	}{
		{ChannelProcesses, probes.Observation{Outcome: probes.Rejected, Evidence: probes.Evidence{Load: &probes.LoadEvidence{Reached: 101, StoppedBy: "EAGAIN", Tasks: 128, HeldMS: 3000}}}, Pass, "the fork bomb stopped at 128 tasks in the box (101 processes of its own"},
		{ChannelProcesses, probes.Observation{Outcome: probes.Reached, Evidence: probes.Evidence{Load: &probes.LoadEvidence{Reached: loadProcCap}}}, Fail, "its own cap: limits.processes=128 did not stop it"},
		{ChannelProcesses, probes.Observation{Outcome: probes.Rejected, Evidence: probes.Evidence{Load: &probes.LoadEvidence{Reached: 200, StoppedBy: "EAGAIN", Tasks: 230}}}, Fail, "refused only at 230 tasks"},
		{ChannelCPU, probes.Observation{Outcome: probes.Reached, Evidence: probes.Evidence{Load: &probes.LoadEvidence{CPUSeconds: 1.0, WallSeconds: 4.5}}}, Pass, "got 0.22 CPUs"},
		{ChannelCPU, probes.Observation{Outcome: probes.Reached, Evidence: probes.Evidence{Load: &probes.LoadEvidence{CPUSeconds: 8, WallSeconds: 4.5}}}, Fail, "got 1.78 CPUs, past the allowance's 0.25"},
		{ChannelMemory, probes.Observation{Outcome: probes.Rejected, Evidence: probes.Evidence{Load: &probes.LoadEvidence{Reached: 240, StoppedBy: "SIGKILL"}}}, Pass, "killed (the OOM killer, in the box) after touching 240 MiB"},
		{ChannelMemory, probes.Observation{Outcome: probes.Reached, Evidence: probes.Evidence{Load: &probes.LoadEvidence{Reached: loadMemoryCap}}}, Fail, "did not stop it"},
		{ChannelDisk, probes.Observation{Outcome: probes.Rejected, Evidence: probes.Evidence{Load: &probes.LoadEvidence{Reached: 58, StoppedBy: "EDQUOT", HeldMS: 2000}}}, Pass, "stopped at 58 MiB (EDQUOT)"},
		{ChannelDisk, probes.Observation{Outcome: probes.Reached, Evidence: probes.Evidence{Load: &probes.LoadEvidence{Reached: loadDiskCap}}}, Fail, "the 64MiB root disk did not stop it"},
		{ChannelDisk, probes.Observation{Outcome: probes.Error, Reason: "cut short after 90 MiB", Evidence: probes.Evidence{Load: &probes.LoadEvidence{Reached: 90}}}, Inconclusive, "without meeting a limit or its cap"},
		// Stopped far short of the limit: another limit, or nothing pushed.
		{ChannelProcesses, probes.Observation{Outcome: probes.Rejected, Evidence: probes.Evidence{Load: &probes.LoadEvidence{Reached: 3, StoppedBy: "EAGAIN", Tasks: 5}}}, Inconclusive, "well short of limits.processes=128"},
		{ChannelCPU, probes.Observation{Outcome: probes.Reached, Evidence: probes.Evidence{Load: &probes.LoadEvidence{CPUSeconds: 0, WallSeconds: 3}}}, Inconclusive, "far below the allowance"},
		{ChannelMemory, probes.Observation{Outcome: probes.Rejected, Evidence: probes.Evidence{Load: &probes.LoadEvidence{Reached: 10, StoppedBy: "SIGKILL"}}}, Inconclusive, "after only 10 MiB"},
		{ChannelDisk, probes.Observation{Outcome: probes.Rejected, Evidence: probes.Evidence{Load: &probes.LoadEvidence{Reached: 0, StoppedBy: "ENOSPC"}}}, Inconclusive, "a full pool says the same"},
	} {
		t.Run(string(tc.ch)+" "+string(tc.verdict), func(t *testing.T) {
			r, rs := kernelRun(t, func(p Place, a Action) (probes.Observation, bool) {
				if a.Channel == tc.ch {
					return tc.o, true
				}
				return probes.Observation{}, false
			})
			var got *Result
			for _, res := range judgeKernel(r, claimKernel, rs) {
				if res.Channel == tc.ch {
					got = &res
				}
			}
			require.NotNil(t, got)
			assert.Equal(t, tc.verdict, got.Verdict, got.Evidence)
			assert.Contains(t, got.Evidence, tc.want)
			assert.Equal(t, "limits", got.TargetKey)
		})
	}
}

// kernelScenario builds C-KERNEL's scenario on the test topology, as if
// mintLoadBox had found lp for its box-l.
func kernelScenario(lp loadPlan) *Scenario {
	scene := testTopology()
	loadPlans.Lock()
	loadPlans.m[scene.L.Instance] = lp
	loadPlans.Unlock()
	defer func() {
		loadPlans.Lock()
		delete(loadPlans.m, scene.L.Instance)
		loadPlans.Unlock()
	}()
	return BuildScenario(scene, []Claim{claimKernel})
}

// TestKernelLoadLeftOut: a load box without a memory limit or a disk
// quota gets no memory or disk load (mintLoadBox's note says why).
func TestKernelLoadLeftOut(t *testing.T) {
	sc := kernelScenario(loadPlan{k: true})
	for _, a := range sc.Actions {
		assert.NotContains(t, []Channel{ChannelMemory, ChannelDisk}, a.Channel, "no load the host cannot bound")
	}
	loads := map[Channel]bool{}
	for _, a := range sc.Actions {
		if a.Expect == ExpectHeld {
			loads[a.Channel] = true
			assert.Equal(t, PlaceL, a.From)
			assert.Positive(t, a.Probe.Max, "every load has its own cap")
		}
	}
	assert.Equal(t, map[Channel]bool{ChannelProcesses: true, ChannelCPU: true}, loads)
}

// TestKernelSpinApartFromTheBomb: box-l's CPU spin and its fork bomb's
// starts never share the box's allowance (the spin halved the bomb's
// starts on a slow machine): without the memory hog the spin comes well
// after the bomb starts, with it the spin ends before the bomb starts;
// every load ends at the same time, before the plan gives them back.
func TestKernelSpinApartFromTheBomb(t *testing.T) {
	for _, lp := range []loadPlan{{k: true}, {memory: true, disk: true, k: true}} {
		sc := kernelScenario(lp)
		at := map[Channel]probes.ProbeSpec{}
		for _, a := range sc.Actions {
			if a.Expect == ExpectHeld {
				at[a.Channel] = a.Probe
			}
		}
		cpu, bomb := at[ChannelCPU], at[ChannelProcesses]
		require.NotZero(t, bomb.DeadlineMS)
		spinEnd := cpu.DelayMS + cpu.DeadlineMS - int(probes.LoadReserve.Milliseconds())
		if lp.memory {
			assert.LessOrEqual(t, spinEnd, bomb.DelayMS, "with the hog the spin ends before the bomb starts")
		} else {
			assert.GreaterOrEqual(t, cpu.DelayMS, bomb.DelayMS+1000, "without it the spin comes after the bomb's starts")
			assert.GreaterOrEqual(t, spinEnd-cpu.DelayMS, 1000, "and spins for a second or more")
		}
		end := int((planDeadline - loadGiveBack).Milliseconds())
		for ch, p := range at {
			if ch != ChannelCPU || !lp.memory {
				assert.LessOrEqual(t, p.DelayMS+p.DeadlineMS, end, "%s ends before the plan gives the loads back", ch)
			}
		}
	}
}
