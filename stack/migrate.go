package stack

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/box-isolation/box/stack/hostns"
	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/model"
	"github.com/box-isolation/box/stack/nft"
)

// MigrateRequest says what Migrate moves: one box, every legacy box, or
// (RetireLegacy) the legacy objects themselves once no box uses them.
type MigrateRequest struct {
	Box          string
	AllBoxes     bool
	RetireLegacy bool
}

// onLegacyStack reports whether an instance still uses a legacy object: the
// legacy profile, or a NIC of its own on the legacy bridge.
func onLegacyStack(i *incus.Instance) bool {
	if slices.Contains(i.Profiles, model.Legacy.Profile) {
		return true
	}
	for _, d := range i.Devices {
		if d["type"] == "nic" && (d["network"] == model.Legacy.Network || d["parent"] == model.Legacy.Network) {
			return true
		}
	}
	return false
}

// Migrate moves boxes from the legacy stack (claudenet, claude-dev,
// user.claudebox=1) onto the current one, keeping their state: each box is
// stopped, given the box-net profile and only it, tagged user.box=1 (the
// legacy tag stays: it is honoured forever), started again if it was
// running, and waited for until it has an address on boxnet. The current
// stack is ensured first. RetireLegacy removes the legacy objects, and
// refuses while any instance still uses them.
func (host *Host) Migrate(ctx context.Context, req MigrateRequest) ([]model.Change, error) {
	changes := []model.Change{}
	if req.RetireLegacy {
		g, err := host.OpenNS()
		if err != nil {
			return nil, err
		}
		defer g.Close()
		return retireLegacy(ctx, host.Incus, g)
	}
	if req.Box == "" && !req.AllBoxes {
		return nil, errors.New("migrate what? name a box (--box N), or --all-boxes, or --retire-legacy")
	}
	var todo []string
	if req.Box != "" {
		// The boundary before anything changes on the host.
		inst, _, err := Resolve(ctx, host.Incus, req.Box)
		if err != nil {
			return nil, err
		}
		if !onLegacyStack(inst) {
			return changes, nil // already on the current stack
		}
		todo = []string{req.Box}
	}
	if _, err := host.Ensure(ctx); err != nil {
		return nil, fmt.Errorf("ensuring the current stack before migrating: %w", err)
	}
	if req.AllBoxes {
		insts, err := host.Incus.Instances().Where(ctx, boxFilter)
		if err != nil {
			return nil, fmt.Errorf("listing boxes: %w", err)
		}
		for i := range insts {
			if _, ok := model.IsBox(&insts[i]); ok && onLegacyStack(&insts[i]) {
				todo = append(todo, insts[i].Name)
			}
		}
	}
	for _, name := range todo {
		if err := host.migrateOne(ctx, name); err != nil {
			return changes, err
		}
		changes = append(changes, model.Change{Object: "box " + name, Action: "updated", Detail: "moved to " + model.Current.Network})
	}
	return changes, nil
}

func (host *Host) migrateOne(ctx context.Context, name string) (err error) {
	c := host.Incus
	inst, _, err := Resolve(ctx, host.Incus, name)
	if err != nil {
		return err
	}
	wasRunning := inst.Status != "Stopped"
	if wasRunning {
		if err := c.Instances().SetState(ctx, name, "stop", time.Minute, false); err != nil {
			return fmt.Errorf("migrating %s: stopping it: %w", name, err)
		}
		// A failed move must not leave a working box stopped.
		defer func() {
			if err == nil {
				return
			}
			if st, serr := c.Instances().State(context.WithoutCancel(ctx), name); serr == nil && st.Status == "Stopped" {
				if serr := c.Instances().SetState(context.WithoutCancel(ctx), name, "start", 0, false); serr != nil {
					err = errors.Join(err, fmt.Errorf("starting %s again: %w", name, serr))
				}
			}
		}()
	}
	inst, etag, err := c.Instances().Get(ctx, name)
	if err != nil {
		return fmt.Errorf("migrating %s: %w", name, err)
	}
	put := inst.Writable()
	put.Profiles = []string{model.Current.Profile}
	put.Devices = maps.Clone(put.Devices)
	for dev, d := range put.Devices {
		// The box-net profile brings the NIC; an instance NIC of its own
		// would override it.
		if d["type"] == "nic" {
			delete(put.Devices, dev)
		}
	}
	put.Config[model.Current.Tag] = "1"
	if put.Config[model.StampOrigin] == "" {
		put.Config[model.StampOrigin] = "migrated from " + model.Legacy.Network
	}
	if err := c.Instances().Update(ctx, name, put, etag); err != nil {
		return fmt.Errorf("migrating %s: moving it to %s: %w", name, model.Current.Profile, err)
	}
	if !wasRunning {
		return nil
	}
	if err := c.Instances().SetState(ctx, name, "start", 0, false); err != nil {
		return fmt.Errorf("migrating %s: starting it again: %w", name, err)
	}
	if _, err := host.RefreshPorts(ctx); err != nil {
		return err
	}
	if _, err := host.Addresses().Wait(ctx, name, 30*time.Second); err != nil {
		return fmt.Errorf("migrating %s: %w", name, err)
	}
	return nil
}

// retireLegacy removes the legacy profile, bridge and ACL once nothing uses
// them.
func retireLegacy(ctx context.Context, c *incus.Client, g *hostns.NS) ([]model.Change, error) {
	insts, err := c.Instances().List(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("listing instances: %w", err)
	}
	var still []string
	for i := range insts {
		if onLegacyStack(&insts[i]) {
			still = append(still, insts[i].Name)
		}
	}
	if len(still) > 0 {
		return nil, fmt.Errorf("instances still on the legacy stack: %v: migrate them first (box migrate-host --all-boxes)", still)
	}
	changes, err := removeObjects(ctx, c, model.Legacy)
	if err != nil {
		return changes, err
	}
	removed, err := nft.Delete(g.NFTConfig(model.Legacy))
	for _, r := range removed {
		changes = append(changes, model.Change{Object: "nft " + r, Action: "removed"})
	}
	return changes, err
}
