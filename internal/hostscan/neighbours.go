package hostscan

import (
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Neighbour is a usable entry of the kernel's neighbour table (ARP for
// IPv4, NDP for IPv6): a peer the namespace has recently talked to or
// was told about.
type Neighbour struct {
	Addr    netip.Addr // with its zone (the device) when link-local
	MAC     net.HardwareAddr
	Device  string // "" when the link index has no name (it vanished)
	IfIndex int
	State   string // "reachable", "stale", "delay", "probe" or "permanent"
	Router  bool   // IPv6: the peer said it is a router
}

func (n Neighbour) String() string {
	return fmt.Sprintf("%s lladdr %s dev %s %s", n.Addr.WithZone(""), n.MAC, n.Device, n.State)
}

// usableStates are the NUD states whose link-layer address can be used;
// INCOMPLETE, FAILED, NOARP and NONE entries have none worth aiming at.
var usableStates = []struct {
	bit  int
	name string
}{
	{netlink.NUD_PERMANENT, "permanent"},
	{netlink.NUD_REACHABLE, "reachable"},
	{netlink.NUD_DELAY, "delay"},
	{netlink.NUD_PROBE, "probe"},
	{netlink.NUD_STALE, "stale"},
}

// Neighbours returns the usable IPv4 and IPv6 neighbour entries of the
// calling thread's network namespace (wrap it in nsrun.Do for another
// one), ordered by link index, then address.
func Neighbours() ([]Neighbour, error) {
	ns, err := netns.Get() // the calling thread's namespace
	if err != nil {
		return nil, fmt.Errorf("opening the current network namespace: %w", err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("opening a netlink socket: %w", err)
	}
	defer h.Close()
	links, err := h.LinkList()
	if err != nil {
		return nil, fmt.Errorf("listing links: %w", err)
	}
	names := make(map[int]string, len(links))
	for _, l := range links {
		names[l.Attrs().Index] = l.Attrs().Name
	}
	var all []netlink.Neigh
	for _, fam := range []struct {
		family int
		name   string
	}{{netlink.FAMILY_V4, "IPv4"}, {netlink.FAMILY_V6, "IPv6"}} {
		got, err := h.NeighList(0, fam.family)
		if err != nil {
			return nil, fmt.Errorf("listing %s neighbours: %w", fam.name, err)
		}
		all = append(all, got...)
	}
	return UsableNeighbours(all, names), nil
}

// UsableNeighbours keeps the entries of a neighbour dump that are usable
// (REACHABLE, STALE, DELAY, PROBE or PERMANENT, with a link-layer address,
// and not NOARP, FAILED or INCOMPLETE), naming their devices from names
// (link index to name). It orders them by link index, then address.
func UsableNeighbours(neighs []netlink.Neigh, names map[int]string) []Neighbour {
	var out []Neighbour
	for _, n := range neighs {
		if n.State&(netlink.NUD_NOARP|netlink.NUD_FAILED|netlink.NUD_INCOMPLETE) != 0 || len(n.HardwareAddr) == 0 {
			continue
		}
		state := ""
		for _, s := range usableStates {
			if n.State&s.bit != 0 {
				state = s.name
				break
			}
		}
		if state == "" {
			continue
		}
		a, ok := netip.AddrFromSlice(n.IP)
		if !ok {
			continue
		}
		a = a.Unmap()
		dev := names[n.LinkIndex]
		if a.Is6() && (a.IsLinkLocalUnicast() || a.IsLinkLocalMulticast()) && dev != "" {
			a = a.WithZone(dev)
		}
		out = append(out, Neighbour{
			Addr:    a,
			MAC:     slices.Clone(n.HardwareAddr),
			Device:  dev,
			IfIndex: n.LinkIndex,
			State:   state,
			Router:  n.Flags&netlink.NTF_ROUTER != 0,
		})
	}
	slices.SortFunc(out, func(a, b Neighbour) int {
		if a.IfIndex != b.IfIndex {
			return a.IfIndex - b.IfIndex
		}
		return a.Addr.Compare(b.Addr)
	})
	return out
}
