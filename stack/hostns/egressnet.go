package hostns

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/box-isolation/box/stack/nft"
)

// The egress design's host objects beside its table (stack/nft/egress.go):
// the resolver's address on the loopback device (nft.EgressDNSAddr), and
// the policy route that delivers the packets TPROXY marked for the proxy
// (rule: fwmark nft.EgressMark lookup nft.EgressRouteTable; that table:
// local 0.0.0.0/0 dev lo). They exist while a policy does, like the table.
// Without the address an allowlisted box's DNS goes nowhere, without the
// route its web traffic is dropped: closed, never open.

// egressAddr is the resolver's address as the kernel holds it.
func egressAddr() *netlink.Addr {
	return &netlink.Addr{IPNet: &net.IPNet{IP: nft.EgressDNSAddr.AsSlice(), Mask: net.CIDRMask(32, 32)}, Scope: unix.RT_SCOPE_HOST}
}

func egressRule() *netlink.Rule {
	r := netlink.NewRule()
	r.Family = unix.AF_INET
	r.Mark = nft.EgressMark
	mask := uint32(0xffffffff)
	r.Mask = &mask
	r.Table = nft.EgressRouteTable
	r.Priority = nft.EgressRulePriority
	return r
}

func egressRoute(lo int) *netlink.Route {
	return &netlink.Route{LinkIndex: lo, Dst: &net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)},
		Table: nft.EgressRouteTable, Type: unix.RTN_LOCAL, Scope: unix.RT_SCOPE_HOST}
}

// egressNetState says which of the three objects are there.
type egressNetState struct {
	lo                netlink.Link
	addr, rule, route bool
}

func (g *NS) readEgressNet() (egressNetState, error) {
	var st egressNetState
	lo, err := g.Netlink.LinkByName("lo")
	if err != nil {
		return st, fmt.Errorf("the loopback device: %w", err)
	}
	st.lo = lo
	addrs, err := g.Netlink.AddrList(lo, netlink.FAMILY_V4)
	if err != nil {
		return st, fmt.Errorf("the loopback device's addresses: %w", err)
	}
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP); ok && ip.Unmap() == nft.EgressDNSAddr {
			st.addr = true
		}
	}
	rules, err := g.Netlink.RuleList(netlink.FAMILY_V4)
	if err != nil {
		return st, fmt.Errorf("listing the policy routing rules: %w", err)
	}
	for _, r := range rules {
		if r.Priority != nft.EgressRulePriority {
			continue
		}
		if r.Mark == nft.EgressMark && r.Table == nft.EgressRouteTable && (r.Mask == nil || *r.Mask == 0xffffffff) {
			st.rule = true
		}
	}
	routes, err := g.Netlink.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: nft.EgressRouteTable}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return st, fmt.Errorf("listing routing table %d: %w", nft.EgressRouteTable, err)
	}
	for _, r := range routes {
		if r.Type == unix.RTN_LOCAL && r.LinkIndex == lo.Attrs().Index && (r.Dst == nil || r.Dst.IP.IsUnspecified()) {
			st.route = true
		}
	}
	return st, nil
}

// EnsureEgressNet puts the three objects in place and says what it did.
func (g *NS) EnsureEgressNet() ([]string, error) {
	st, err := g.readEgressNet()
	if err != nil {
		return nil, err
	}
	var did []string
	if !st.addr {
		if err := g.Netlink.AddrAdd(st.lo, egressAddr()); err != nil && !errors.Is(err, os.ErrExist) {
			return did, fmt.Errorf("adding the egress resolver's address %s to lo: %w", nft.EgressDNSAddr, err)
		}
		did = append(did, "added "+nft.EgressDNSAddr.String()+"/32 to lo (box's egress resolver)")
	}
	if !st.route {
		if err := g.Netlink.RouteReplace(egressRoute(st.lo.Attrs().Index)); err != nil {
			return did, fmt.Errorf("adding the egress proxy's route (local 0.0.0.0/0 dev lo table %d): %w", nft.EgressRouteTable, err)
		}
		did = append(did, fmt.Sprintf("added route local 0.0.0.0/0 dev lo table %d (box's egress proxy)", nft.EgressRouteTable))
	}
	if !st.rule {
		if err := g.Netlink.RuleAdd(egressRule()); err != nil && !errors.Is(err, os.ErrExist) {
			return did, fmt.Errorf("adding the egress proxy's rule (fwmark 0x%x lookup %d): %w", nft.EgressMark, nft.EgressRouteTable, err)
		}
		did = append(did, fmt.Sprintf("added rule fwmark 0x%x lookup %d (box's egress proxy)", nft.EgressMark, nft.EgressRouteTable))
	}
	return did, nil
}

// EgressNetProblems says which objects are missing.
func (g *NS) EgressNetProblems() ([]string, error) {
	st, err := g.readEgressNet()
	if err != nil {
		return nil, err
	}
	var p []string
	if !st.addr {
		p = append(p, fmt.Sprintf("the egress resolver's address %s is not on lo: allowlisted boxes resolve nothing", nft.EgressDNSAddr))
	}
	if !st.rule {
		p = append(p, fmt.Sprintf("no rule fwmark 0x%x lookup %d: allowlisted boxes' web traffic is dropped", nft.EgressMark, nft.EgressRouteTable))
	}
	if !st.route {
		p = append(p, fmt.Sprintf("no route local 0.0.0.0/0 dev lo in table %d: allowlisted boxes' web traffic is dropped", nft.EgressRouteTable))
	}
	return p, nil
}

// DeleteEgressNet removes whichever of the objects are there.
func (g *NS) DeleteEgressNet() ([]string, error) {
	st, err := g.readEgressNet()
	if err != nil {
		return nil, err
	}
	var did []string
	if st.rule {
		if err := g.Netlink.RuleDel(egressRule()); err != nil {
			return did, fmt.Errorf("removing the egress proxy's rule: %w", err)
		}
		did = append(did, fmt.Sprintf("removed rule fwmark 0x%x lookup %d", nft.EgressMark, nft.EgressRouteTable))
	}
	if st.route {
		if err := g.Netlink.RouteDel(egressRoute(st.lo.Attrs().Index)); err != nil {
			return did, fmt.Errorf("removing the egress proxy's route: %w", err)
		}
		did = append(did, fmt.Sprintf("removed route local 0.0.0.0/0 dev lo table %d", nft.EgressRouteTable))
	}
	if st.addr {
		if err := g.Netlink.AddrDel(st.lo, egressAddr()); err != nil {
			return did, fmt.Errorf("removing %s from lo: %w", nft.EgressDNSAddr, err)
		}
		did = append(did, "removed "+nft.EgressDNSAddr.String()+"/32 from lo")
	}
	return did, nil
}
