package hostns

import (
	"github.com/vishvananda/netlink"

	"fmt"
	"slices"
	"syscall"

	"github.com/box-isolation/box/stack/nft"
	"golang.org/x/sys/unix"
)

// routeLocalTable is the kernel's local routing table: the host's own
// addresses, never a way out.
const routeLocalTable = 255

// IsDefault reports whether a route covers the whole IPv4 space or half
// of it: a default route (0.0.0.0/0, in any table: a full-tunnel VPN such
// as wg-quick puts its own in a table of its own) or one of the pair a
// full-tunnel VPN such as OpenVPN's def1 adds (0.0.0.0/1, 128.0.0.0/1)
// to win over the default route without replacing it.
func IsDefault(r netlink.Route) bool {
	if r.Dst == nil {
		return true
	}
	ones, bits := r.Dst.Mask.Size()
	return bits == 32 && ones <= 1
}

// uplinks lists the interfaces the host's IPv4 default routes leave by, in
// every routing table but the local one, sorted: the only interfaces a
// box's forwarded traffic may leave by. A multipath route names each of
// its next hops' interfaces; a blackhole or unreachable default names
// none. The bridge and loopback are never uplinks.
func (g *NS) uplinks(bridge string) ([]string, error) {
	rt, err := g.RouteView(bridge)
	return rt.Uplinks, err
}

// RouteView is what the route table holds for the host's routes of the
// moment: the uplinks, and the routed prefixes: the destinations of the
// unicast routes that are not default routes, in every table but the
// local one, by any interface but the bridge and loopback (the bridge's
// own subnet is the boxes'; an egress design's local routes are not a
// way out).
func (g *NS) RouteView(bridge string) (nft.Route, error) {
	var rt nft.Route
	routes, err := g.Netlink.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: syscall.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return rt, fmt.Errorf("listing routes: %w", err)
	}
	links, err := g.Links()
	if err != nil {
		return rt, fmt.Errorf("listing links: %w", err)
	}
	names := map[int]string{}
	for _, l := range links {
		names[l.Attrs().Index] = l.Attrs().Name
	}
	ours := func(idx int) bool { n := names[idx]; return n == "" || n == "lo" || n == bridge }
	add := func(idx int) {
		if !ours(idx) && !slices.Contains(rt.Uplinks, names[idx]) {
			rt.Uplinks = append(rt.Uplinks, names[idx])
		}
	}
	for _, r := range routes {
		if r.Table == routeLocalTable {
			continue
		}
		if IsDefault(r) {
			add(r.LinkIndex)
			for _, nh := range r.MultiPath {
				add(nh.LinkIndex)
			}
			continue
		}
		if r.Type != unix.RTN_UNICAST || (r.LinkIndex != 0 && ours(r.LinkIndex)) {
			continue
		}
		if r.LinkIndex == 0 && !slices.ContainsFunc(r.MultiPath, func(nh *netlink.NexthopInfo) bool { return !ours(nh.LinkIndex) }) {
			continue
		}
		if p, ok := PrefixOf(r.Dst); ok && p.Addr().Is4() {
			if p = p.Masked(); !slices.Contains(rt.Routed, p) {
				rt.Routed = append(rt.Routed, p)
			}
		}
	}
	slices.Sort(rt.Uplinks)
	return rt, nil
}
