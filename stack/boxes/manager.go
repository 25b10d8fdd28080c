// Package boxes is the box lifecycle on a host, behind the ownership tag
// (user.box=1): minting from an image or a template (Manager.Mint; a
// template's box is a copy of the template's image, TemplateImages, or a
// standby box of it taken, TemplateImages.Warm), cloning with a fresh identity (Clone), snapshots and restores, start,
// stop, rename and removal, moving between cluster members, export and
// import as Incus backup files, a box's egress allowlist, its limits, and
// its loopback doors (Doors). Every verb resolves the name through the tag
// and refuses an instance box did not mint. The isolated network the boxes
// live on, their fixed addresses and their ports' state are package
// stack's: this package asks it for each.
package boxes

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/box-isolation/box/stack"
	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/model"
)

// Snapshot takes a snapshot; an empty label gets a time-stamped name.
func (mgr *Manager) Snapshot(ctx context.Context, name, label string) (string, error) {
	host := mgr.host
	if _, _, err := stack.Resolve(ctx, host.Incus, name); err != nil {
		return "", err
	}
	if label == "" {
		label = "snap-" + time.Now().UTC().Format("20060102-150405")
	}
	if err := host.Incus.Instances().CreateSnapshot(ctx, name, label); err != nil {
		if strings.Contains(err.Error(), "freezing") {
			return "", fmt.Errorf("snapshotting %s: this host cannot freeze a running container: stop it first (box down %s)", name, name)
		}
		return "", fmt.Errorf("snapshotting %s: %w", name, err)
	}
	return label, nil
}

// Snapshots lists a box's snapshots.
func (mgr *Manager) Snapshots(ctx context.Context, name string) ([]incus.Snapshot, error) {
	host := mgr.host
	if _, _, err := stack.Resolve(ctx, host.Incus, name); err != nil {
		return nil, err
	}
	return host.Incus.Instances().Snapshots(ctx, name)
}

// RestoreResult is what Restore did.
type RestoreResult struct {
	Box      string `json:"box"`
	Snapshot string `json:"snapshot"`
	// Policy is the box's policy now; Source says whose it is: "current"
	// (the box's, kept) or "snapshot" (--with-policy).
	Policy PolicyNote `json:"policy"`
	// Restarted: the box ran before, and was stopped for the restore and
	// started again after its policy was put back.
	Restarted bool `json:"restarted"`
}

// Restore rolls a box back to a snapshot and keeps its current policy
// (docs/design.md, "A box's policy is the operator's"): a running box is
// stopped first, restored, given its current policy back and started
// again, so it never runs with the snapshot's. withPolicy takes the
// snapshot's policy instead (its allowlist stored again on the bridge if
// a converge dropped it). The box keeps its own MAC: Incus restores the
// snapshot's volatile keys, and a snapshot a clone carried holds its
// source's (two boxes with one MAC), while the box's lease is its own
// MAC's.
func (mgr *Manager) Restore(ctx context.Context, name, snap string, withPolicy bool) (*RestoreResult, error) {
	host := mgr.host
	inst, _, err := stack.Resolve(ctx, host.Incus, name)
	if err != nil {
		return nil, err
	}
	defs, err := host.Incus.Instances().SnapshotDefinitions(ctx, name)
	if err != nil {
		return nil, err
	}
	i := slices.IndexFunc(defs, func(d incus.Instance) bool { return d.Name == snap })
	if i < 0 {
		return nil, fmt.Errorf("%s has no snapshot %s (box info %s lists them)", name, snap, name)
	}
	cur, err := currentPolicy(ctx, host, inst)
	if err != nil {
		return nil, err
	}
	held := model.PolicyOf(defs[i].Config, defs[i].Devices)
	res := &RestoreResult{Box: name, Snapshot: snap, Policy: PolicyNote{Policy: cur, Source: "current", Other: "the snapshot", Differs: held.Diff(cur)}}
	want := cur
	if withPolicy {
		want = held
		res.Policy = PolicyNote{Policy: held, Source: "snapshot", Other: "the box", Differs: cur.Diff(held)}
		if len(held.Egress) > 0 {
			if _, err := host.Policies().EnsureAllowlist(ctx, model.PolicyID(held.Egress), held.Egress); err != nil {
				return nil, fmt.Errorf("restoring %s to %s with its policy: %w", name, snap, err)
			}
		}
	}
	// The current policy is recorded before anything changes: a restore
	// cut short leaves box's copy of it (box info shows how the box's
	// differs from it).
	if err := host.Policies().Record(ctx, inst.Project, name, cur); err != nil {
		return nil, err
	}
	if inst.Status != "Stopped" {
		if err := host.Incus.Instances().SetState(ctx, name, "stop", time.Minute, false); err != nil {
			return nil, fmt.Errorf("stopping %s for its restore (box down %s --force, then restore again): %w", name, name, err)
		}
		res.Restarted = true
	}
	if err := host.Incus.Instances().RestoreSnapshot(ctx, name, snap); err != nil {
		if res.Restarted {
			return nil, fmt.Errorf("restoring %s to %s: %w (it was stopped for the restore: box start %s)", name, snap, err, name)
		}
		return nil, fmt.Errorf("restoring %s to %s: %w", name, snap, err)
	}
	if err := mgr.putBack(ctx, inst, want); err != nil {
		return nil, fmt.Errorf("restored %s to %s, but: %w (box restore %s %s again puts it back)", name, snap, err, name, snap)
	}
	if err := host.Policies().Record(ctx, inst.Project, name, want); err != nil {
		return nil, err
	}
	if err := host.Addresses().ReaddressIfTaken(ctx, name); err != nil && !host.Tier.Granted {
		return nil, fmt.Errorf("restored %s to %s, but: %w", name, snap, err)
	}
	if res.Restarted {
		return res, mgr.Start(ctx, name)
	}
	_, err = host.RefreshPorts(ctx)
	return res, err
}

// Start starts a box. A box without a fixed address gets one first
// (L-DHCP): on a cluster the one it held when a move of it stopped
// half-way, else the one it still leases, else a free one of its member's
// slice (a box minted before box gave them). A granted user's gets one
// from the port watcher once it runs.
func (mgr *Manager) Start(ctx context.Context, name string) error {
	host := mgr.host
	inst, _, err := stack.Resolve(ctx, host.Incus, name)
	if err != nil {
		return err
	}
	member, err := host.Addresses().MemberOf(ctx, inst)
	if err != nil {
		return fmt.Errorf("starting %s: %w", name, err)
	}
	if host.Tier.Granted {
		err = host.Incus.Instances().SetState(ctx, name, "start", 0, false)
	} else {
		if !model.FixedAddressOf(inst).IsValid() {
			if a := movingAddress(inst); a.IsValid() {
				_, err = host.Addresses().LandAddress(ctx, name, member, a)
			} else {
				_, err = host.Addresses().EnsureFixed(ctx, inst, member)
			}
			if err != nil {
				return fmt.Errorf("starting %s: %w", name, err)
			}
		}
		err = host.Addresses().StartFixed(ctx, name, member)
	}
	if err != nil {
		return fmt.Errorf("starting %s: %w", name, err)
	}
	return host.Addresses().RefreshStarted(ctx, name)
}

// Stop stops a box, cleanly within a minute or at once with force, and
// takes its port out of the bridge drop's port set (on whatever member it
// is: a stale name there is a doctor finding).
func (mgr *Manager) Stop(ctx context.Context, name string, force bool) error {
	host := mgr.host
	if _, _, err := stack.Resolve(ctx, host.Incus, name); err != nil {
		return err
	}
	if err := host.Incus.Instances().SetState(ctx, name, "stop", time.Minute, force); err != nil {
		return fmt.Errorf("stopping %s: %w", name, err)
	}
	if host.Tier.Granted {
		return nil // the port watcher's to refresh
	}
	if _, err := host.RefreshPorts(ctx); err != nil {
		return fmt.Errorf("stopped %s, but refreshing the bridge ports failed: %w (run box doctor --fix)", name, err)
	}
	return nil
}

// Remove deletes a box with its snapshots, stopping it first, and drops
// its port from the bridge drop's port set.
func (mgr *Manager) Remove(ctx context.Context, name string) error {
	project, err := mgr.removeInstance(ctx, name)
	if err != nil {
		return err
	}
	if err := mgr.host.Policies().Forget(ctx, project, name); err != nil {
		return fmt.Errorf("removed %s, but: %w", name, err)
	}
	_, err = mgr.host.RefreshPorts(ctx)
	return err
}

// RemoveAll removes boxes as Remove does, side by side, then forgets
// their records in one write and refreshes the ports once: beside a full
// bridge a record's write and a refresh each read the whole bridge or
// fleet, and removing many boxes one by one paid for them per box. A box
// already gone is no error; one busy with an operation (a killed
// command's create still in flight) is tried again for up to busy.
func (mgr *Manager) RemoveAll(ctx context.Context, names []string, busy time.Duration) error {
	var mu sync.Mutex
	var errs []error
	removed := map[string][]string{} // project -> its boxes removed
	var wg sync.WaitGroup
	for _, name := range names {
		wg.Go(func() {
			project, err := mgr.removeWhenIdle(ctx, name, busy)
			mu.Lock()
			defer mu.Unlock()
			var gone *stack.NoSuchBoxError
			switch {
			case errors.As(err, &gone) || incus.IsNotFound(err):
			case err != nil:
				errs = append(errs, err)
			default:
				removed[project] = append(removed[project], name)
			}
		})
	}
	wg.Wait()
	for _, project := range slices.Sorted(maps.Keys(removed)) {
		if err := mgr.host.Policies().Forget(ctx, project, removed[project]...); err != nil {
			errs = append(errs, fmt.Errorf("removed %s, but: %w", strings.Join(removed[project], ", "), err))
		}
	}
	if len(removed) > 0 {
		if _, err := mgr.host.RefreshPorts(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// removeWhenIdle is removeInstance, again every half second for up to
// busy while Incus says the instance is busy.
func (mgr *Manager) removeWhenIdle(ctx context.Context, name string, busy time.Duration) (string, error) {
	deadline := time.Now().Add(busy)
	for {
		project, err := mgr.removeInstance(ctx, name)
		if err == nil || !strings.Contains(err.Error(), "is busy") || time.Now().After(deadline) {
			return project, err
		}
		select {
		case <-ctx.Done():
			return project, err
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// removeInstance deletes a box's instance and its doors' sockets, and
// says which project it was in.
func (mgr *Manager) removeInstance(ctx context.Context, name string) (string, error) {
	host := mgr.host
	inst, _, err := stack.Resolve(ctx, host.Incus, name)
	if err != nil {
		return "", err
	}
	if err := stack.RemoveInstance(ctx, host.Incus, name); err != nil {
		return "", err
	}
	for _, d := range inst.Devices {
		if d["type"] == "proxy" && d[model.DoorTag] == "1" {
			removeDoorSocket(d)
		}
	}
	return inst.Project, nil
}

// Rename renames a stopped box; a running one is refused with the fix.
func (mgr *Manager) Rename(ctx context.Context, name, newName string) error {
	host := mgr.host
	inst, _, err := stack.Resolve(ctx, host.Incus, name)
	if err != nil {
		return err
	}
	if inst.Status != "Stopped" {
		return fmt.Errorf("%s is %s: stop it first (box down %s), then rename it", name, strings.ToLower(inst.Status), name)
	}
	if err := host.Incus.Instances().Rename(ctx, name, newName); err != nil {
		return fmt.Errorf("renaming %s: %w", name, err)
	}
	if err := (&Doors{host: host}).renameDoors(ctx, newName); err != nil {
		return fmt.Errorf("renamed %s to %s, but: %w", name, newName, err)
	}
	if err := host.Policies().Rename(ctx, inst.Project, name, newName); err != nil {
		return fmt.Errorf("renamed %s to %s, but: %w", name, newName, err)
	}
	return nil
}

// Manager runs the box lifecycle on a host, behind the ownership tag.
type Manager struct {
	host *stack.Host
}

// NewManager is the box manager of host.
func NewManager(host *stack.Host) *Manager { return &Manager{host: host} }
