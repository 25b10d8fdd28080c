package boxes

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sort"
	"strings"

	"github.com/box-isolation/box/stack"
	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/model"
)

// MoveResult says how a move went.
type MoveResult struct {
	Box *stack.Box `json:"box"`
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
func (mgr *Manager) Move(ctx context.Context, name, member string) (*MoveResult, error) {
	host := mgr.host
	inst, _, err := stack.Resolve(ctx, host.Incus, name)
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
	if err := ci.CheckMember(member); err != nil {
		return nil, fmt.Errorf("moving %s: %w", name, err)
	}
	if inst.Status != "Stopped" {
		return nil, fmt.Errorf("%s is %s: stop it first (box down %s), then move it", name, strings.ToLower(inst.Status), name)
	}
	res := &MoveResult{From: inst.Location, To: member}
	addr := model.FixedAddressOf(inst)
	if inst.Location == member {
		res.Notes = append(res.Notes, fmt.Sprintf("it is on %s already: nothing was moved", member))
	} else {
		// A member without a slice has never had its host layers set up
		// by box: a box there would be off the stack.
		if _, _, err := host.Addresses().Slice(ctx, member); err != nil {
			return nil, fmt.Errorf("moving %s: %w", name, err)
		}
		if err := mgr.leaveMember(ctx, name, addr); err != nil {
			return nil, fmt.Errorf("moving %s: %w", name, err)
		}
		if err := host.Incus.Instances().Move(ctx, name, member); err != nil {
			if _, rerr := host.Addresses().LandAddress(context.WithoutCancel(ctx), name, inst.Location, addr); rerr != nil {
				err = errors.Join(err, fmt.Errorf("giving it its address back: %w (box start %s gives it one)", rerr, name))
			}
			return nil, fmt.Errorf("moving %s: %w", name, err)
		}
		if doors := doorDevices(inst); len(doors) > 0 {
			res.Notes = append(res.Notes, fmt.Sprintf("its doors (%s) listen on %s's loopback from its next start", strings.Join(doors, ", "), member))
		}
	}
	now, _, err := host.Incus.Instances().Get(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("moved %s to %s, but: %w", name, member, err)
	}
	if !model.FixedAddressOf(now).IsValid() {
		got, err := host.Addresses().LandAddress(ctx, name, member, addr)
		if err != nil {
			return nil, fmt.Errorf("moved %s to %s, but: %w (box start %s gives it an address)", name, member, err, name)
		}
		switch {
		case !addr.IsValid():
			res.Notes = append(res.Notes, fmt.Sprintf("it had no fixed address (minted before box gave boxes on a cluster one): it has %s now, of %s's slice", got, member))
		case got != addr:
			res.Notes = append(res.Notes, fmt.Sprintf("its address %s was taken on %s meanwhile: it has %s now, of %s's slice", addr, member, got, member))
		}
		addr = got
	}
	res.Address = addr.String()
	if _, err := host.RefreshPorts(ctx); err != nil {
		return nil, fmt.Errorf("moved %s to %s, but refreshing the bridge ports failed: %w (run box doctor --fix)", name, member, err)
	}
	if res.Box, err = stack.Info(ctx, host.Incus, name); err != nil {
		return nil, err
	}
	return res, nil
}

// leaveMember makes Incus forget a box's DHCP state on the member it is
// about to leave. Incus 6.0 moves an instance without it (measured: the
// member keeps the instance's dnsmasq.hosts entry for good and its lease
// for the lease time), so a box later given the address there gets a
// dynamic one instead, from the range every member hands out. Incus drops
// both when a NIC is removed, which for a stopped box only a change it
// cannot apply in place does: the NIC loses its address and is renamed
// (transitName) at once. The address is kept under keyMoving until
// landAddress puts the NIC back as it was, on the new member.
func (mgr *Manager) leaveMember(ctx context.Context, name string, addr netip.Addr) error {
	host := mgr.host
	if !addr.IsValid() {
		return nil
	}
	inst, etag, err := host.Incus.Instances().Get(ctx, name)
	if err != nil {
		return err
	}
	put := inst.Writable()
	if put.Devices == nil {
		put.Devices = map[string]map[string]string{}
	}
	nic := model.BoxNIC()
	nic["name"] = model.TransitName
	put.Devices["eth0"] = nic
	put.Config[model.KeyMoving] = addr.String()
	if err := host.Incus.Instances().Update(ctx, name, put, etag); err != nil {
		return fmt.Errorf("clearing its address on %s before the move: %w", inst.Location, err)
	}
	return nil
}

// movingAddress is the address a box held when a move of it stopped half
// way (invalid when none).
func movingAddress(inst *incus.Instance) netip.Addr {
	a, _ := netip.ParseAddr(inst.Config[model.KeyMoving])
	return a
}

// doorDevices names a box's doors (box expose), sorted.
func doorDevices(inst *incus.Instance) []string {
	var out []string
	for name, d := range inst.Devices {
		if d["type"] == "proxy" && d[model.DoorTag] == "1" {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out
}
