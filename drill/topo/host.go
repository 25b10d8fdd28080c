package topo

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"sort"

	"github.com/vishvananda/netlink"

	"github.com/box-isolation/box/internal/hostscan"
	"github.com/box-isolation/box/internal/nsrun"
	"github.com/box-isolation/box/stack/model"
)

// IfaceAddr is one address on one of the host's interfaces.
type IfaceAddr struct {
	Iface  string
	Prefix netip.Prefix // the address with its prefix length
}

// Route is one of the host's IPv4 routes.
type Route struct {
	Dst netip.Prefix // invalid for the default route
	Gw  netip.Addr
	Dev string // the interface it leaves by
}

// samples are what the drill probes in a private range the host has no
// route into: the addresses a LAN most often uses for its router.
var samples = []struct {
	rng    netip.Prefix
	sample netip.Addr
}{
	{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParseAddr("10.0.0.1")},
	{netip.MustParsePrefix("172.16.0.0/12"), netip.MustParseAddr("172.16.0.1")},
	{netip.MustParsePrefix("192.168.0.0/16"), netip.MustParseAddr("192.168.0.1")},
	{netip.MustParsePrefix("100.64.0.0/10"), netip.MustParseAddr("100.64.0.1")},
	{netip.MustParsePrefix("169.254.0.0/16"), netip.MustParseAddr("169.254.169.254")},
}

// metadata is the cloud metadata address, always a target.
var metadata = netip.MustParseAddr("169.254.169.254")

// HostAddrs picks the host's own IPv4 addresses a box could aim at: every
// one but loopback, and in the box subnet only the gateway (the rest are
// boxes). The gateway comes first, named "gateway"; the others are named
// interface-address.
func HostAddrs(addrs []IfaceAddr, boxSubnet netip.Prefix, gateway netip.Addr) []HostAddr {
	var hosts []HostAddr
	own := map[netip.Addr]bool{}
	for _, a := range addrs {
		ip := a.Prefix.Addr()
		if !ip.Is4() || ip.IsLoopback() || own[ip] {
			continue
		}
		own[ip] = true
		if boxSubnet.Contains(ip) && ip != gateway {
			continue
		}
		name := a.Iface + "-" + ip.String()
		if ip == gateway {
			name = "gateway"
		}
		hosts = append(hosts, HostAddr{Name: name, Addr: ip, Via: netip.PrefixFrom(ip, 32)})
	}
	sort.SliceStable(hosts, func(i, j int) bool { return hosts[i].Name == "gateway" && hosts[j].Name != "gateway" })
	return hosts
}

// lanSet collects LAN targets once each, never the host's own addresses:
// an address in a private range, or one the host routes elsewhere than
// by its default routes (a LAN router's non-private prefix, a VPN's).
type lanSet struct {
	own   map[netip.Addr]bool
	seen  map[netip.Addr]bool
	other []netip.Prefix // prefixes routed elsewhere (RoutedElsewhere)
	out   []Target
}

func newLANSet(addrs []IfaceAddr, routes []Route) *lanSet {
	s := &lanSet{own: map[netip.Addr]bool{}, seen: map[netip.Addr]bool{}, other: RoutedElsewhere(routes)}
	for _, a := range addrs {
		s.own[a.Prefix.Addr()] = true
	}
	return s
}

func (s *lanSet) add(ip netip.Addr, why Provenance, name string) {
	if !ip.IsValid() || !ip.Is4() || s.own[ip] || s.seen[ip] {
		return
	}
	if !Private(ip) && !slices.ContainsFunc(s.other, func(p netip.Prefix) bool { return p.Contains(ip) }) {
		return
	}
	s.seen[ip] = true
	s.out = append(s.out, Target{Name: name + "-" + ip.String(), Addr: ip, TCPPort: 80, UDPPort: 53, Provenance: why})
}

// DefaultDevs are the interfaces the host's default routes leave by (a
// full tunnel's 0.0.0.0/1 and 128.0.0.0/1 count, as the stack counts
// them): the only way L-ROUTE lets a box's traffic out.
func DefaultDevs(routes []Route) []string {
	var out []string
	for _, r := range routes {
		if (!r.Dst.IsValid() || r.Dst.Bits() <= 1) && !slices.Contains(out, r.Dev) {
			out = append(out, r.Dev)
		}
	}
	return out
}

// RoutedElsewhere are the prefixes the host routes other than by its
// default routes (a LAN, a router's prefixes behind it, a VPN's split
// routes, the uplink's own segment and a second router on it), private or
// not, but loopback and the box bridge: what a box must not reach, whether
// or not it is in a private range, and whichever interface it leaves by
// (L-ROUTE drops each such prefix, the default route's interface too).
func RoutedElsewhere(routes []Route) []netip.Prefix { return routedBy(routes, nil) }

// RoutedOffUplinks are the prefixes of RoutedElsewhere routed by an
// interface none of the default routes leaves by: the host's LANs beside
// its uplinks.
func RoutedOffUplinks(routes []Route) []netip.Prefix { return routedBy(routes, DefaultDevs(routes)) }

// routedBy lists the prefixes routed other than by the default routes,
// loopback and the box bridge, by no interface in skip.
func routedBy(routes []Route, skip []string) []netip.Prefix {
	var out []netip.Prefix
	for _, r := range routes {
		if !r.Dst.IsValid() || r.Dst.Bits() <= 1 || slices.Contains(skip, r.Dev) ||
			r.Dev == "lo" || r.Dev == model.Current.Network || r.Dst.Addr().IsLoopback() || slices.Contains(out, r.Dst.Masked()) {
			continue
		}
		out = append(out, r.Dst.Masked())
	}
	return out
}

// LANTargets works out a real host's LAN targets from its routes: the
// gateway of every route, the destination itself for a host route and the
// first address of every other prefix, when private or routed elsewhere
// than by the default routes, then a sample in each private range nothing
// else covers (the cloud metadata address always). Boxes are filtered out
// by the caller, who knows the box subnet.
func LANTargets(addrs []IfaceAddr, routes []Route) []Target {
	s := newLANSet(addrs, routes)
	s.routes(routes)
	s.samples()
	return s.out
}

func (s *lanSet) routes(routes []Route) {
	for _, r := range routes {
		s.add(r.Gw, FromRoute, "router")
		if !r.Dst.IsValid() || r.Dst.Bits() == 0 {
			continue
		}
		if r.Dst.IsSingleIP() {
			s.add(r.Dst.Addr(), FromRoute, "host")
		} else if r.Dst.Bits() < 31 {
			s.add(r.Dst.Masked().Addr().Next(), FromRoute, "lan")
		}
	}
}

func (s *lanSet) samples() {
	for _, smp := range samples {
		covered := slices.ContainsFunc(s.out, func(t Target) bool { return smp.rng.Contains(t.Addr) })
		if !covered || smp.sample == metadata {
			s.add(smp.sample, FromSample, "sample")
		}
	}
}

// Private reports whether ip is in a range C-LAN calls private (docs/claims.md).
func Private(ip netip.Addr) bool {
	for _, r := range model.PrivateRanges {
		if r.Contains(ip) {
			return true
		}
	}
	return false
}

// ReadInterfaces reads the IPv4 addresses and routes of a network
// namespace ("" for the caller's own).
func ReadInterfaces(ns string) (addrs []IfaceAddr, routes []Route, err error) {
	err = nsrun.Do(ns, func() error {
		addrs, routes, err = readHost()
		return err
	})
	return addrs, routes, err
}

func readHost() ([]IfaceAddr, []Route, error) {
	links, err := netlink.LinkList()
	if err != nil {
		return nil, nil, fmt.Errorf("listing the host's links: %w", err)
	}
	var addrs []IfaceAddr
	names := map[int]string{}
	for _, l := range links {
		names[l.Attrs().Index] = l.Attrs().Name
		as, err := netlink.AddrList(l, netlink.FAMILY_V4)
		if err != nil {
			continue
		}
		for _, a := range as {
			if p, ok := toPrefix(a.IPNet); ok {
				addrs = append(addrs, IfaceAddr{Iface: l.Attrs().Name, Prefix: p})
			}
		}
	}
	rs, err := netlink.RouteList(nil, netlink.FAMILY_V4)
	if err != nil {
		return nil, nil, fmt.Errorf("listing the host's routes: %w", err)
	}
	var routes []Route
	for _, r := range rs {
		rt := Route{Dev: names[r.LinkIndex]}
		if r.Dst != nil {
			rt.Dst, _ = toPrefix(r.Dst)
		}
		if r.Gw != nil {
			rt.Gw, _ = netip.AddrFromSlice(r.Gw.To4())
		}
		routes = append(routes, rt)
	}
	return addrs, routes, nil
}

func toPrefix(n *net.IPNet) (netip.Prefix, bool) {
	ip, ok := netip.AddrFromSlice(n.IP)
	if !ok {
		return netip.Prefix{}, false
	}
	ones, _ := n.Mask.Size()
	return netip.PrefixFrom(ip.Unmap(), ones), true
}

// HostOptions is what an operator tells host discovery.
type HostOptions struct {
	// NetNS is the namespace incusd's bridge lives in ("" for this one).
	NetNS string
	// Canary is a public host that accepts TCP on its port and, being a
	// public resolver, answers DNS on 53 (e.g. 1.1.1.1:443).
	Canary netip.AddrPort
	// PublicName must resolve through the box's resolver.
	PublicName string
	// Upstream is the public resolver the stack pins.
	Upstream netip.Addr
}

// Discover builds a real host's Topology from its kernel and files. With
// a namespace (BOX_NETNS), the files are the ones `ip netns exec` shows
// incusd there (/etc/netns/NS/hosts and resolv.conf when they exist), and
// the machine's DHCP leases, which belong to the machine's own interfaces,
// are not read.
func Discover(o HostOptions) (Topology, error) {
	var f hostFacts
	var err error
	f.addrs, f.routes, err = ReadInterfaces(o.NetNS)
	if err != nil {
		return Topology{}, err
	}
	f.hostsFile = "/etc/hosts"
	if p := "/etc/netns/" + o.NetNS + "/hosts"; o.NetNS != "" && fileExists(p) {
		f.hostsFile = p
	}
	if err := nsrun.Do(o.NetNS, func() error {
		var err error
		f.neighbours, err = hostscan.Neighbours()
		return err
	}); err != nil {
		f.notes = append(f.notes, "the neighbour table was not read: "+err.Error())
	}
	if p := "/etc/netns/" + o.NetNS + "/resolv.conf"; o.NetNS != "" && fileExists(p) {
		rc, err := readResolvConf(p)
		if err != nil {
			f.notes = append(f.notes, p+" was not read: "+err.Error())
		}
		f.dns = hostscan.DNS{Conf: rc}
	} else if f.dns, err = hostscan.Resolvers("/"); err != nil {
		f.notes = append(f.notes, "resolv.conf was not read: "+err.Error())
	}
	if o.NetNS == "" {
		if f.leases, err = hostscan.DHCPServers("/"); err != nil {
			f.notes = append(f.notes, "some DHCP lease files were not read: "+err.Error())
		}
	} else {
		f.notes = append(f.notes, "the DHCP lease files are the machine's, not namespace "+o.NetNS+"'s: no DHCP server is a target")
	}
	if f.hostname, err = hostscan.Hostname(); err == nil {
		f.hosts, _ = hostscan.ReadHosts(f.hostsFile)
	}
	return f.topology(o), nil
}

// hostFacts is what Discover read; topology turns it into targets.
type hostFacts struct {
	addrs      []IfaceAddr
	routes     []Route
	neighbours []hostscan.Neighbour
	dns        hostscan.DNS
	leases     []hostscan.DHCPLease
	hostname   string
	hostsFile  string
	hosts      []hostscan.HostsEntry
	notes      []string
}

func (f hostFacts) topology(o HostOptions) Topology {
	t := Topology{Source: SourceHost, Canary: o.Canary.Addr(), CanaryTCP: int(o.Canary.Port()),
		PublicName: o.PublicName, Upstream: o.Upstream, Names: []Name{}, HostsFile: f.hostsFile, Notes: f.notes}
	s := newLANSet(f.addrs, f.routes)
	s.routes(f.routes)
	for _, n := range f.neighbours {
		s.add(n.Addr, FromNeighbour, "neighbour")
	}
	for _, a := range f.dns.Servers() {
		s.add(a, FromResolver, "resolver")
	}
	for _, l := range f.leases {
		s.add(l.Server, FromDHCPServer, "dhcp-server")
	}
	s.samples()
	t.LANHosts = s.out
	t.Outward = outward(f.routes)
	t.SearchDomains = f.dns.SearchDomains()
	if f.hostname != "" {
		t.Hostname = f.hostname
		t.FQDN = hostscan.FQDN(f.hostname, f.hosts, f.dns.Conf)
	}
	return t
}

// outward lists the interfaces the default routes, the routes into
// private ranges and every route elsewhere leave by, but loopback and the
// box bridge.
func outward(routes []Route) []string {
	defs := DefaultDevs(routes)
	var out []string
	for _, r := range routes {
		if r.Dev == "" || r.Dev == "lo" || r.Dev == model.Current.Network || slices.Contains(out, r.Dev) {
			continue
		}
		if !r.Dst.IsValid() || r.Dst.Bits() == 0 || slices.ContainsFunc(model.PrivateRanges, r.Dst.Overlaps) || !slices.Contains(defs, r.Dev) {
			out = append(out, r.Dev)
		}
	}
	return out
}

func readResolvConf(path string) (hostscan.ResolvConf, error) {
	fh, err := os.Open(path)
	if err != nil {
		return hostscan.ResolvConf{}, err
	}
	defer fh.Close()
	return hostscan.ParseResolvConf(fh)
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
