package hostns

import (
	"errors"
	"fmt"

	"github.com/box-isolation/box/stack/model"
	"github.com/vishvananda/netlink"
)

// LinkState reads one link's bridge membership and isolated flag.
func (g *NS) LinkState(name string) model.KernelPort {
	l, err := g.Netlink.LinkByName(name)
	if err != nil {
		return model.KernelPort{}
	}
	kp := model.KernelPort{Exists: true}
	if _, veth := l.(*netlink.Veth); veth && l.Attrs().NetNsID < 0 && l.Attrs().ParentIndex > 0 {
		if p, err := g.Netlink.LinkByIndex(l.Attrs().ParentIndex); err == nil {
			kp.Peer = p.Attrs().Name
		}
	}
	if m := l.Attrs().MasterIndex; m > 0 {
		if ml, err := g.Netlink.LinkByIndex(m); err == nil {
			kp.Master = ml.Attrs().Name
		}
		if pi, err := g.Netlink.LinkGetProtinfo(l); err == nil {
			kp.Isolated = pi.Isolated
		}
	}
	return kp
}

// Port is one port of a bridge, as the kernel has it.
type Port struct {
	Name     string
	Isolated bool
}

// BridgePorts lists a bridge's ports with their isolated flag.
func (g *NS) BridgePorts(bridge string) ([]Port, error) {
	br, err := g.Netlink.LinkByName(bridge)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil, nil
		}
		return nil, fmt.Errorf("finding bridge %s: %w", bridge, err)
	}
	links, err := g.Links()
	if err != nil {
		return nil, fmt.Errorf("listing links: %w", err)
	}
	var ports []Port
	for _, l := range links {
		if l.Attrs().MasterIndex != br.Attrs().Index {
			continue
		}
		pi, err := g.Netlink.LinkGetProtinfo(l)
		if err != nil {
			return nil, fmt.Errorf("reading bridge port flags of %s: %w", l.Attrs().Name, err)
		}
		ports = append(ports, Port{Name: l.Attrs().Name, Isolated: pi.Isolated})
	}
	return ports, nil
}

func PortNames(ports []Port) []string {
	out := make([]string, len(ports))
	for i, p := range ports {
		out[i] = p.Name
	}
	return out
}

// IsolatePorts turns the isolated flag on for every port of the bridge,
// whatever attached it, and returns the ports and the names it changed.
func (g *NS) IsolatePorts(bridge string) ([]Port, []string, error) {
	ports, err := g.BridgePorts(bridge)
	if err != nil {
		return nil, nil, err
	}
	var changed []string
	for i, p := range ports {
		if p.Isolated {
			continue
		}
		l, err := g.Netlink.LinkByName(p.Name)
		if err == nil {
			err = g.Netlink.LinkSetIsolated(l, true)
		}
		if err != nil {
			return nil, nil, fmt.Errorf("isolating bridge port %s: %w", p.Name, err)
		}
		ports[i].Isolated = true
		changed = append(changed, p.Name)
	}
	return ports, changed, nil
}
