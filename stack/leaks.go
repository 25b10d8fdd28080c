package stack

import (
	"context"
	"fmt"
	"net"
	"sort"
	"time"

	"github.com/box-isolation/box/stack/hostns"
	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/model"
)

// Leaked veths: a veth pair an instance's NIC left on the bridge, with its
// other end down in the host's namespace, belongs to no instance and is
// no box's port. Ensure sweeps such pairs away (sweepLeaks); removing an
// instance takes its own with it (removeLeftPorts). The census names any
// that remain.

// leakGrace is how long a port must stay unclaimed, with its other end
// down in the host's namespace, before it counts as leaked: Incus plugs a
// NIC's host end into the bridge a moment before it moves the other end
// into the instance, and a sweep must never take a NIC being plugged.
const leakGrace = time.Second

// sweepLeaks removes veth pairs left on the bridge by an instance's NIC
// (measured: Incus 6.0 leaves the pair when a container fails to start
// after its NIC was plugged): a port no instance claims whose other end is
// down in the host's own namespace, seen so twice leakGrace apart. It
// returns the ports it removed.
func sweepLeaks(ctx context.Context, c *incus.Client, g *hostns.NS) ([]string, error) {
	candidates, err := leakCandidates(ctx, c, g)
	if err != nil || len(candidates) == 0 {
		return nil, err
	}
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-time.After(leakGrace):
	}
	again, err := leakCandidates(ctx, c, g)
	if err != nil {
		return nil, err
	}
	var removed []string
	for port, peer := range again {
		if candidates[port] != peer {
			continue
		}
		l, err := g.Netlink.LinkByName(port)
		if err != nil {
			continue
		}
		if err := g.Netlink.LinkDel(l); err != nil {
			return removed, fmt.Errorf("removing the leaked veth %s: %w", port, err)
		}
		removed = append(removed, port)
	}
	sort.Strings(removed)
	return removed, nil
}

// RemoveLeftPorts removes the ports a removed instance's NICs left on the
// bridge with their other end in the host's namespace (best effort: a
// port left behind is what Ensure's sweep and the census are for).
func (host *Host) RemoveLeftPorts(inst *incus.Instance) {
	if h := host.here(); h != "" && inst.Location != "" && inst.Location != h {
		// On another member: its kernel holds the pair, where reachable.
		if mh, ok := host.ForMember(inst.Location); ok {
			mh.RemoveLeftPorts(inst)
		}
		return
	}
	g, err := host.OpenNS()
	if err != nil {
		return
	}
	defer g.Close()
	for _, port := range model.PortsOf(model.Current.Network, inst) {
		if port == "" || g.LinkState(port).Peer == "" {
			continue
		}
		if l, err := g.Netlink.LinkByName(port); err == nil {
			_ = g.Netlink.LinkDel(l)
		}
	}
}

// leakCandidates maps each unclaimed port of the bridge whose other end is
// down in the host's namespace to that end's name.
func leakCandidates(ctx context.Context, c *incus.Client, g *hostns.NS) (map[string]string, error) {
	insts, err := c.Instances().All(ctx)
	if err != nil {
		return nil, err
	}
	claimed := map[string]bool{}
	for i := range insts {
		for _, p := range model.PortsOf(model.Current.Network, &insts[i]) {
			claimed[p] = true
		}
	}
	ports, err := g.BridgePorts(model.Current.Network)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, p := range ports {
		if claimed[p.Name] {
			continue
		}
		kp := g.LinkState(p.Name)
		if kp.Peer == "" {
			continue
		}
		if peer, err := g.Netlink.LinkByName(kp.Peer); err == nil && peer.Attrs().Flags&net.FlagUp == 0 {
			out[p.Name] = kp.Peer
		}
	}
	return out, nil
}
