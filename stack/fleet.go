package stack

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"

	"github.com/box-isolation/box/stack/hostns"
	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/model"
	"github.com/box-isolation/box/stack/nft"
)

// The fleet census (claim C-FLEET). The probes meet only the drill's own
// fresh boxes; the boxes people work in were minted weeks ago and may have
// been changed since (a profile edit re-plugs their NICs, the escape hatch
// or plain incus adds devices). The census starts from the bridge, not
// from box's tag: every instance of any project whose NIC uses the bridge,
// running or stopped (stopped ones by their config), and every port the
// kernel has on the bridge, is a sibling, and each is checked for what
// could take it off the stack.

// censusOf takes the fleet census of the stack's bridge from a listing of
// every instance (Verify's, and BoxesOnStack's). On a cluster, member is
// the member g is on: an instance placed elsewhere is judged by what it is
// made of only, its port being in another member's kernel.
func censusOf(g *hostns.NS, insts []incus.Instance, member string) (*model.Census, error) {
	bridge := model.Current.Network
	ports, err := g.BridgePorts(bridge)
	if err != nil {
		return nil, err
	}
	members, setOK, err := nft.PortSetMembers(g.NFTConfig(model.Current))
	if err != nil {
		return nil, fmt.Errorf("reading the bridge drop's port set: %w", err)
	}
	// Each port's state, and each sibling's port that is not on the
	// bridge (where is it?), from one dump for them all.
	names := hostns.PortNames(ports)
	named := map[string]bool{}
	for _, n := range names {
		named[n] = true
	}
	for _, i := range insts {
		for _, port := range model.PortsOf(bridge, &i) {
			if port != "" && !named[port] {
				named[port] = true
				names = append(names, port)
			}
		}
	}
	links, err := g.LinkStates(names)
	if err != nil {
		return nil, err
	}
	c := model.TakeCensus(bridge, insts, hostns.PortNames(ports), links, members, setOK, member)
	return c, nil
}

// BoxesOnStack lists the boxes of the client's project as Boxes does,
// each marked by the fleet census, from one listing of every project's
// instances (the census needs them all). censusErr says why the boxes are
// unmarked when the census could not be taken (reading the kernel's view
// of the ports needs root).
func (host *Host) BoxesOnStack(ctx context.Context) (boxes []Box, censusErr, err error) {
	if host.Tier.Granted {
		boxes, err := Boxes(ctx, host.Incus)
		return boxes, errors.New("a granted user sees only their own project"), err
	}
	insts, err := host.Incus.Instances().All(ctx)
	if err != nil {
		// A client that may not list every project still lists its own.
		boxes, berr := Boxes(ctx, host.Incus)
		return boxes, err, berr
	}
	project := model.ProjectOf(host.Incus.ProjectName())
	boxes = []Box{}
	for i := range insts {
		if gen, ok := model.IsBox(&insts[i]); ok && model.ProjectOf(insts[i].Project) == project {
			boxes = append(boxes, boxOf(&insts[i], gen))
		}
	}
	sort.Slice(boxes, func(a, b int) bool { return boxes[a].Name < boxes[b].Name })
	g, err := host.OpenNS()
	if err != nil {
		return boxes, err, nil
	}
	defer g.Close()
	// Which member this is matters only on a cluster, which the listing
	// already shows (a standalone server places everything "none"): a
	// standalone list stays one request.
	member := ""
	if slices.ContainsFunc(insts, func(i incus.Instance) bool { return i.Location != "" && i.Location != "none" }) {
		ci, err := host.Cluster(ctx)
		if err != nil {
			return boxes, nil, err
		}
		member = ci.Local
	}
	c, err := censusOf(g, insts, member)
	if err != nil {
		return boxes, err, nil
	}
	markOnStack(c, project, boxes)
	return boxes, nil, nil
}

// markOnStack records the census's verdict on each box of project (as `box list`
// shows it): a box the census did not meet has no NIC on the bridge.
func markOnStack(c *model.Census, project string, boxes []Box) {
	for i := range boxes {
		b := &boxes[i]
		on := false
		s, ok := c.Sibling(project, b.Name)
		switch {
		case !ok:
			b.OffStack = []string{"has no NIC on " + c.Bridge}
		case s.OnStack():
			on = true
		default:
			for _, p := range s.Problems {
				b.OffStack = append(b.OffStack, p.What)
			}
		}
		b.OnStack = &on
	}
}
