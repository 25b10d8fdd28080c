package nft

import (
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// L-ROUTE, table inet box_route, chain forward (hook forward, priority
// filter, policy accept): a box's forwarded traffic (iifname the bridge)
// may leave only by an interface in the set uplinks, the interfaces of the
// host's default routes, which the caller keeps current from the kernel's
// route events (Route.Apply). Whatever the host routes any other way (a LAN
// router's prefixes, a VPN's split routes, another bridge, a cluster's
// own network) is dropped, private or not: the ACL drops only the private
// ranges. Replies (ct direction reply, ct state established,related)
// pass, so a connection opened into a box from outside (an exposed port)
// is answered by the way it came; a flow the box began is looked at packet
// by packet, so one that got out while the table was gone (another tool's
// flush) stops when it is back. An empty set drops every new connection a box opens: with no
// default route there is no internet to reach.
//
// An interface is not enough: a LAN router's prefix may be routed by the
// default route's own interface (30.1.0.0/16 via another router on the
// uplink's segment, as enterprise networks and VPN concentrators do), and
// the uplink's own segment is the LAN. So every prefix the host routes
// other than by a default route (the routed prefixes: non-default routes
// in every table but the local one) is dropped by destination too, one
// rule each, kept current from the same route events (Route.Apply).
//
// It is a table of its own so that it can be removed apart from the host
// firewall (the drill's route mutation does).

// RouteTable names the route table (inet family): Table + "_route".
func (c Config) RouteTable() string { return cmpOr(c.Table, DefaultTable) + "_route" }

// UplinkSet is the route table's set of the default routes' interfaces.
const UplinkSet = "uplinks"

// uplinkSetID is the set's batch-local id when it is created with its rule.
const uplinkSetID = 20

// Route is what the route table holds: the default routes' interfaces
// and the prefixes routed any other way.
type Route struct {
	Uplinks []string
	Routed  []netip.Prefix
}

// Desired returns the route table for cfg: its set holding the
// uplinks, a drop for each routed prefix.
func (rt Route) Desired(cfg Config) (Ruleset, error) {
	cfg, err := cfg.normalized()
	if err != nil {
		return Ruleset{}, err
	}
	for _, u := range rt.Uplinks {
		if err := checkIfname(u); err != nil {
			return Ruleset{}, fmt.Errorf("uplink: %w", err)
		}
		if u == cfg.Bridge {
			return Ruleset{}, fmt.Errorf("uplink %s is the bridge itself", u)
		}
	}
	var routed []netip.Prefix
	for _, p := range rt.Routed {
		if !p.IsValid() || !p.Addr().Is4() || p.Bits() < 2 {
			return Ruleset{}, fmt.Errorf("routed prefix %s: not an IPv4 prefix narrower than half the space (those are default routes)", p)
		}
		if p = p.Masked(); !slices.Contains(routed, p) {
			routed = append(routed, p)
		}
	}
	slices.SortFunc(routed, func(a, b netip.Prefix) int {
		if c := a.Addr().Compare(b.Addr()); c != 0 {
			return c
		}
		return a.Bits() - b.Bits()
	})
	return Ruleset{Tables: []Table{routeTable(cfg, rt.Uplinks, routed)}}, nil
}

func routeTable(cfg Config, uplinks []string, routed []netip.Prefix) Table {
	br := cfg.Bridge
	notUplink := part{fmt.Sprintf("oifname != @%s", UplinkSet), []expr.Any{
		&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1},
		&expr.Lookup{SourceRegister: 1, SetName: UplinkSet, SetID: uplinkSetID, Invert: true},
	}}
	rules := []Rule{
		rule(accept(), iifname(br), ctReplyOfFlow()),
		rule(drop(), iifname(br), notUplink),
	}
	for _, p := range routed {
		rules = append(rules, rule(drop(), iifname(br), ipDaddrPrefix(p)))
	}
	return Table{Family: "inet", Name: cfg.RouteTable(),
		Sets: []Set{{Name: UplinkSet, Type: "ifname", Elements: normPorts(uplinks), id: uplinkSetID}},
		Chains: []Chain{{
			Name: "forward", Type: "filter", Hook: "forward", Priority: priorityFilter("inet"), Policy: "accept",
			Rules: rules,
		}},
	}
}

// ipDaddrPrefix matches an IPv4 destination in p as nft encodes it (so
// that nft lists it as one): a byte-aligned prefix's bytes loaded and
// compared; any other prefix's whole address loaded, masked and compared.
func ipDaddrPrefix(p netip.Prefix) part {
	if p.Bits() == 32 {
		return ipDaddr(p.Addr())
	}
	a := p.Masked().Addr().As4()
	n := 4
	if p.Bits()%8 == 0 {
		n = p.Bits() / 8
	}
	exprs := []expr.Any{&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: uint32(n)}}
	if p.Bits()%8 != 0 {
		m := net.CIDRMask(p.Bits(), 32)
		exprs = append(exprs, &expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: []byte(m), Xor: make([]byte, 4)})
	}
	exprs = append(exprs, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: slices.Clone(a[:n])})
	return part{"ip daddr " + p.Masked().String(), exprs}.after(nfproto(unix.NFPROTO_IPV4))
}

// Apply converges the route table to Desired in one batch and
// says what it changed.
func (rt Route) Apply(cfg Config) ([]string, error) {
	r, err := rt.Desired(cfg)
	if err != nil {
		return nil, err
	}
	cfg, _ = cfg.normalized()
	return converge(cfg, r.Tables)
}

// Verify compares the live route table with Desired; no findings
// means they match, the set's elements and the routed prefixes included.
func (rt Route) Verify(cfg Config) ([]Finding, error) {
	r, err := rt.Desired(cfg)
	if err != nil {
		return nil, err
	}
	cfg, _ = cfg.normalized()
	return verifyTables(cfg, r.Tables)
}

// RoutePresent reports whether the route table exists.
func RoutePresent(cfg Config) (bool, error) { return tablePresent(cfg, "inet", cfg.RouteTable()) }

// DeleteRoute removes the route table and reports whether it was there.
func DeleteRoute(cfg Config) (bool, error) { return deleteTable(cfg, "inet", cfg.RouteTable()) }
