package boxes

import (
	"context"
	"maps"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/model"
)

// policyBox adds box b (at 10.88.0.33 on m1, status) under the policy
// now, with snapshot s1 holding the policy then.
func policyBox(t *testing.T, status string, now, then model.Policy) (*Manager, func() *incus.Instance, func() map[string]string, func() ([]map[string]string, []string)) {
	t.Helper()
	f, h := newClusterFake(t)
	f.Add("b", "m1", status, "10.88.0.33")
	f.Mu.Lock()
	inst := f.Insts["b"]
	snap := incus.Instance{Name: "s1", Location: inst.Location, Architecture: inst.Architecture, Profiles: inst.Profiles, Config: maps.Clone(inst.Config), Devices: map[string]map[string]string{}}
	for k, d := range inst.Devices {
		snap.Devices[k] = maps.Clone(d)
	}
	then.ApplyTo(snap.Config, snap.Devices)
	now.ApplyTo(inst.Config, inst.Devices)
	f.Snaps["b"] = []incus.Instance{snap}
	f.Mu.Unlock()
	return &Manager{host: h}, func() *incus.Instance { return f.Inst(t, "b") },
		func() map[string]string { return f.Bridge.Config() },
		func() ([]map[string]string, []string) {
			f.Mu.Lock()
			defer f.Mu.Unlock()
			return f.Started["b"], f.Restored["b"]
		}
}

var (
	door      = model.Policy{Doors: map[string]map[string]string{"box-door-8080": {"type": "proxy", model.DoorTag: "1", "listen": "tcp:127.0.0.1:8080", "connect": "tcp:127.0.0.1:8080"}}}
	policyNow = model.Policy{Egress: []string{"a.example"}, Config: map[string]string{"limits.cpu": "2"}, Disk: "20GiB", Doors: door.Doors}
	policyOld = model.Policy{Config: map[string]string{"limits.cpu": "1", "limits.processes": "100"}, Disk: "20GiB"}
)

// A restore keeps the box's current policy, whatever the snapshot held,
// says what the snapshot held, and records the policy on the bridge; a
// running box is stopped before the restore and never started with the
// snapshot's policy.
func TestRestoreKeepsTheCurrentPolicy(t *testing.T) {
	for _, status := range []string{"Stopped", "Running"} {
		t.Run(status, func(t *testing.T) {
			mgr, inst, store, seen := policyBox(t, status, policyNow, policyOld)
			res, err := mgr.Restore(context.Background(), "b", "s1", false)
			require.NoError(t, err)
			got := inst()
			assert.True(t, model.PolicyOf(got.Config, got.Devices).Equal(policyNow), "the current policy kept: %v", model.PolicyOf(got.Config, got.Devices).Diff(policyNow))
			assert.Equal(t, "current", res.Policy.Source)
			assert.Equal(t, []string{"egress: open -> allow a.example", "limits.cpu: 1 -> 2", "limits.processes: 100 -> unset", "door box-door-8080: added"}, res.Policy.Differs)
			assert.Contains(t, res.Policy.Line("b"), "b kept its current policy (egress allow a.example, limits.cpu=2, disk 20GiB, door 8080); the snapshot held otherwise (then -> now): ")
			assert.Equal(t, model.MarshalPolicy(policyNow), store()[model.PolicyKey("default", "b")], "recorded")
			starts, restores := seen()
			assert.Equal(t, []string{"Stopped"}, restores, "restored while stopped")
			assert.Equal(t, status == "Running", res.Restarted)
			assert.Equal(t, status, got.Status)
			for _, cfg := range starts {
				assert.Equal(t, "2", cfg["limits.cpu"], "started with the current policy only")
			}
		})
	}
}

// --with-policy takes the snapshot's policy and says what the box had.
func TestRestoreWithPolicyTakesTheSnapshots(t *testing.T) {
	mgr, inst, store, _ := policyBox(t, "Running", policyNow, policyOld)
	res, err := mgr.Restore(context.Background(), "b", "s1", true)
	require.NoError(t, err)
	got := inst()
	assert.True(t, model.PolicyOf(got.Config, got.Devices).Equal(policyOld), "the snapshot's policy: %v", model.PolicyOf(got.Config, got.Devices).Diff(policyOld))
	assert.Equal(t, "snapshot", res.Policy.Source)
	assert.Equal(t, []string{"egress: allow a.example -> open", "limits.cpu: 2 -> 1", "limits.processes: unset -> 100", "door box-door-8080: removed"}, res.Policy.Differs)
	assert.Equal(t, model.MarshalPolicy(policyOld), store()[model.PolicyKey("default", "b")])
}

// The same policy on both sides: nothing to say.
func TestRestoreSameNothingToSay(t *testing.T) {
	mgr, _, _, _ := policyBox(t, "Stopped", policyOld, policyOld)
	res, err := mgr.Restore(context.Background(), "b", "s1", false)
	require.NoError(t, err)
	assert.Empty(t, res.Policy.Differs)
	assert.Empty(t, res.Policy.Line("b"))
}

// A clone takes its source's current policy (but its doors), whatever the
// snapshot it is copied from held, says how the snapshot's differed, and
// its policy is recorded.
func TestCloneTakesTheSourcesCurrentPolicy(t *testing.T) {
	for _, snap := range []string{"", "s1"} {
		t.Run("snapshot="+snap, func(t *testing.T) {
			mgr, _, store, _ := policyBox(t, "Stopped", policyNow, policyOld)
			res, err := mgr.Clone(context.Background(), "b", snap, "c")
			require.NoError(t, err)
			got := res.Box
			require.NotNil(t, got)
			want := policyNow.WithoutDoors()
			inst, _, err := mgr.host.Incus.Instances().Get(context.Background(), "c")
			require.NoError(t, err)
			assert.True(t, model.PolicyOf(inst.Config, inst.Devices).Equal(want), "the source's policy: %v", model.PolicyOf(inst.Config, inst.Devices).Diff(want))
			assert.Equal(t, "source", res.Policy.Source)
			if snap == "" {
				assert.Empty(t, res.Policy.Differs, "a copy of the box itself held its policy")
			} else {
				assert.Equal(t, []string{"egress: open -> allow a.example", "limits.cpu: 1 -> 2", "limits.processes: 100 -> unset"}, res.Policy.Differs)
				assert.Contains(t, res.Policy.Line("c"), "c took its source's current policy (egress allow a.example, limits.cpu=2, disk 20GiB); the snapshot held otherwise")
			}
			if snap == "" {
				assert.Equal(t, []string{"box-door-8080"}, res.DoorsDropped, "the source's doors stay behind")
			}
			assert.Equal(t, model.MarshalPolicy(want), store()[model.PolicyKey("default", "c")])
		})
	}
}
