package hostns

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"syscall"

	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/box-isolation/box/stack/model"
	"github.com/vishvananda/netlink"
)

// LinkState reads one link's bridge membership and isolated flag.
func (g *NS) LinkState(name string) model.KernelPort {
	l, err := g.Netlink.LinkByName(name)
	if err != nil {
		return model.KernelPort{}
	}
	kp := g.linkState(l)
	if l.Attrs().MasterIndex > 0 {
		if ports, err := g.bridgePortDump(); err == nil {
			kp.Isolated = ports[l.Attrs().Index].Isolated
		}
	}
	return kp
}

// linkState is a link's state but for its isolated flag.
func (g *NS) linkState(l netlink.Link) model.KernelPort {
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
	}
	return kp
}

// LinkStates reads the state of each named link (absent ones' zero), with
// one dump of the links and one of the bridge ports' flags for them all:
// LinkState's own dump per link would cost a dump per box on a full
// bridge (docs/measurements.md, "A busy host").
func (g *NS) LinkStates(names []string) (map[string]model.KernelPort, error) {
	links, err := g.Links()
	if err != nil {
		return nil, fmt.Errorf("listing links: %w", err)
	}
	ports, err := g.bridgePortDump()
	if err != nil {
		return nil, err
	}
	byName := map[string]netlink.Link{}
	byIndex := map[int]string{}
	for _, l := range links {
		byName[l.Attrs().Name] = l
		byIndex[l.Attrs().Index] = l.Attrs().Name
	}
	out := map[string]model.KernelPort{}
	for _, n := range names {
		l, ok := byName[n]
		if !ok {
			out[n] = model.KernelPort{}
			continue
		}
		kp := model.KernelPort{Exists: true, Master: byIndex[l.Attrs().MasterIndex]}
		if _, veth := l.(*netlink.Veth); veth && l.Attrs().NetNsID < 0 && l.Attrs().ParentIndex > 0 {
			kp.Peer = byIndex[l.Attrs().ParentIndex]
		}
		if kp.Master != "" {
			kp.Isolated = ports[l.Attrs().Index].Isolated
		}
		out[n] = kp
	}
	return out, nil
}

// Port is one port of a bridge, as the kernel has it.
type Port struct {
	Name     string
	Isolated bool
}

// bridgePort is one bridge port from the kernel's dump of them.
type bridgePort struct {
	Port
	Master int
}

// bridgePortDump reads every bridge port of the namespace, with its
// flags, in one dump (RTM_GETLINK for AF_BRIDGE): netlink's
// LinkGetProtinfo makes that same dump for each port it is asked about.
func (g *NS) bridgePortDump() (map[int]bridgePort, error) {
	s, err := nl.GetNetlinkSocketAt(g.Handle, netns.None(), unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("reading the bridge ports: %w", err)
	}
	defer s.Close()
	if err := s.SetReceiveTimeout(&unix.Timeval{Sec: 10}); err != nil {
		return nil, fmt.Errorf("reading the bridge ports: %w", err)
	}
	req := nl.NewNetlinkRequest(unix.RTM_GETLINK, unix.NLM_F_DUMP)
	req.AddData(nl.NewIfInfomsg(unix.AF_BRIDGE))
	if err := s.Send(req); err != nil {
		return nil, fmt.Errorf("reading the bridge ports: %w", err)
	}
	out := map[int]bridgePort{}
	for {
		msgs, _, err := s.Receive()
		if err != nil {
			return nil, fmt.Errorf("reading the bridge ports: %w", err)
		}
		for i := range msgs {
			m := &msgs[i]
			switch m.Header.Type {
			case unix.NLMSG_DONE:
				return out, nil
			case unix.NLMSG_ERROR:
				if len(m.Data) >= 4 {
					if errno := int32(nl.NativeEndian().Uint32(m.Data[:4])); errno != 0 {
						return nil, fmt.Errorf("reading the bridge ports: %w", syscall.Errno(-errno))
					}
				}
				return out, nil
			case unix.RTM_NEWLINK:
				hdr := unix.NlMsghdr{Len: m.Header.Len, Type: m.Header.Type, Flags: m.Header.Flags, Seq: m.Header.Seq, Pid: m.Header.Pid}
				l, err := netlink.LinkDeserialize(&hdr, m.Data)
				if err != nil {
					return nil, fmt.Errorf("reading the bridge ports: %w", err)
				}
				a := l.Attrs()
				p := bridgePort{Port: Port{Name: a.Name}, Master: a.MasterIndex}
				if a.Protinfo != nil {
					p.Isolated = a.Protinfo.Isolated
				}
				out[a.Index] = p
			}
		}
	}
}

// BridgePorts lists a bridge's ports with their isolated flag, from one
// dump of the namespace's bridge ports.
func (g *NS) BridgePorts(bridge string) ([]Port, error) {
	br, err := g.Netlink.LinkByName(bridge)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil, nil
		}
		return nil, fmt.Errorf("finding bridge %s: %w", bridge, err)
	}
	dump, err := g.bridgePortDump()
	if err != nil {
		return nil, err
	}
	var ports []Port
	for _, idx := range slices.Sorted(maps.Keys(dump)) {
		if p := dump[idx]; p.Master == br.Attrs().Index {
			ports = append(ports, p.Port)
		}
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

// IsolatePort turns the isolated flag on for one link if it is a port of
// the bridge, with no dump of the bridge's ports (the port watcher's first
// answer to a port that joined); false when it is not a port of it.
func (g *NS) IsolatePort(bridge, name string) (bool, error) {
	br, err := g.Netlink.LinkByName(bridge)
	if err != nil {
		return false, fmt.Errorf("finding bridge %s: %w", bridge, err)
	}
	l, err := g.Netlink.LinkByName(name)
	if err != nil {
		return false, fmt.Errorf("finding bridge port %s: %w", name, err)
	}
	if l.Attrs().MasterIndex != br.Attrs().Index {
		return false, nil
	}
	if err := g.Netlink.LinkSetIsolated(l, true); err != nil {
		return false, fmt.Errorf("isolating bridge port %s: %w", name, err)
	}
	return true, nil
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
