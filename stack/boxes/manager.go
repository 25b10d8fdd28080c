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
	"fmt"
	"strings"
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

// Restore rolls a box back to a snapshot. A stopped box keeps its own
// MAC: Incus restores the snapshot's volatile keys, and a snapshot a clone
// carried holds its source's (two boxes with one MAC), while the box's
// lease is its own MAC's.
func (mgr *Manager) Restore(ctx context.Context, name, snap string) error {
	host := mgr.host
	inst, _, err := stack.Resolve(ctx, host.Incus, name)
	if err != nil {
		return err
	}
	if err := host.Incus.Instances().RestoreSnapshot(ctx, name, snap); err != nil {
		return fmt.Errorf("restoring %s to %s: %w", name, snap, err)
	}
	if err := mgr.keepMACs(ctx, inst); err != nil && !host.Tier.Granted {
		return fmt.Errorf("restored %s to %s, but: %w", name, snap, err)
	}
	if err := host.Addresses().ReaddressIfTaken(ctx, name); err != nil && !host.Tier.Granted {
		return fmt.Errorf("restored %s to %s, but: %w", name, snap, err)
	}
	_, err = host.RefreshPorts(ctx)
	return err
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
	_, err = host.RefreshPorts(ctx)
	return err
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
	host := mgr.host
	inst, _, err := stack.Resolve(ctx, host.Incus, name)
	if err != nil {
		return err
	}
	if err := stack.RemoveInstance(ctx, host.Incus, name); err != nil {
		return err
	}
	for _, d := range inst.Devices {
		if d["type"] == "proxy" && d[model.DoorTag] == "1" {
			removeDoorSocket(d)
		}
	}
	_, err = host.RefreshPorts(ctx)
	return err
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
	return nil
}

// Manager runs the box lifecycle on a host, behind the ownership tag.
type Manager struct {
	host *stack.Host
}

// NewManager is the box manager of host.
func NewManager(host *stack.Host) *Manager { return &Manager{host: host} }
