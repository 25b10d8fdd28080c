package stack

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"github.com/box-isolation/box/stack/incus"
)

// MoveResult says how a move went.
type MoveResult struct {
	Box *Box `json:"box"`
	// From and To are the members it was on and is on now.
	From string `json:"from"`
	To   string `json:"to"`
	// Address is its fixed address on the bridge, kept across the move
	// (unique in the cluster, so no member hands it out again).
	Address string `json:"address"`
	// Notes say what the move decided on its own.
	Notes []string `json:"notes,omitempty"`
}

// Move moves a stopped box to another member of the cluster. It keeps its
// fixed address (a box minted before box gave them gets one of its new
// member's slice), its snapshots and its stamps; its doors listen on the
// new member's loopback from its next start.
func (host *Host) Move(ctx context.Context, name, member string) (*MoveResult, error) {
	inst, _, err := host.resolve(ctx, name)
	if err != nil {
		return nil, err
	}
	ci, err := host.Cluster(ctx)
	if err != nil {
		return nil, fmt.Errorf("moving %s: %w", name, err)
	}
	if !ci.Clustered() {
		return nil, fmt.Errorf("moving %s: this incusd is not a member of a cluster, so there is no member to move it to (box export and box import carry a box to another host)", name)
	}
	if member == "" {
		return nil, fmt.Errorf("moving %s: which member? (members: %s)", name, strings.Join(ci.Names(), ", "))
	}
	if err := ci.checkMember(member); err != nil {
		return nil, fmt.Errorf("moving %s: %w", name, err)
	}
	if inst.Status != "Stopped" {
		return nil, fmt.Errorf("%s is %s: stop it first (box down %s), then move it", name, strings.ToLower(inst.Status), name)
	}
	res := &MoveResult{From: inst.Location, To: member}
	addr := fixedAddressOf(inst)
	if inst.Location == member {
		res.Notes = append(res.Notes, fmt.Sprintf("it is on %s already: nothing was moved", member))
	} else {
		// A member without a slice has never had its host layers set up
		// by box: a box there would be off the stack.
		if err := host.requireSlice(ctx, member); err != nil {
			return nil, fmt.Errorf("moving %s: %w", name, err)
		}
		if err := host.Incus.MoveInstance(ctx, name, member); err != nil {
			return nil, fmt.Errorf("moving %s: %w", name, err)
		}
		if doors := doorDevices(inst); len(doors) > 0 {
			res.Notes = append(res.Notes, fmt.Sprintf("its doors (%s) listen on %s's loopback from its next start", strings.Join(doors, ", "), member))
		}
	}
	if !addr.IsValid() {
		if addr, err = host.fixAddress(ctx, name, member); err != nil {
			return nil, fmt.Errorf("moved %s to %s, but: %w", name, member, err)
		}
		res.Notes = append(res.Notes, fmt.Sprintf("it had no fixed address (minted before box gave boxes on a cluster one): it has %s now, of %s's slice", addr, member))
	}
	res.Address = addr.String()
	if _, err := host.refreshPorts(ctx); err != nil {
		return nil, fmt.Errorf("moved %s to %s, but refreshing the bridge ports failed: %w (run box doctor --fix)", name, member, err)
	}
	if res.Box, err = host.Info(ctx, name); err != nil {
		return nil, err
	}
	return res, nil
}

// requireSlice refuses a member that has no address slice on the bridge.
func (host *Host) requireSlice(ctx context.Context, member string) error {
	n, _, err := host.Incus.Network(ctx, Current.Network)
	if err != nil {
		return fmt.Errorf("reading network %s: %w", Current.Network, err)
	}
	sl, err := slicesOf(n.Config)
	if err != nil {
		return err
	}
	if _, ok := sl[member]; !ok {
		return fmt.Errorf("member %s has no address slice on %s, so box has not set it up: run box setup-host on any member, then box setup-host --member-only on %s", member, Current.Network, member)
	}
	return nil
}

// doorDevices names a box's doors (box expose), sorted.
func doorDevices(inst *incus.Instance) []string {
	var out []string
	for name, d := range inst.Devices {
		if d["type"] == "proxy" && d[DoorTag] == "1" {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out
}
