package drill

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sort"

	"github.com/vishvananda/netlink"

	"github.com/box-isolation/box/stack"
)

// HostMode is a run on a real Incus host (drill run --host), never on a
// development or CI machine: the targets are the host's own addresses from
// its interfaces, LAN targets from its routes plus a sample in each private
// range, and a public canary the operator names.
type HostMode struct {
	// Canary is a public host that accepts TCP on its port and, being a
	// public resolver, answers DNS on 53 (e.g. 1.1.1.1:443).
	Canary netip.AddrPort
	// PublicName must resolve through the box's resolver.
	PublicName string
}

// IfaceAddr is one address on one of the host's interfaces.
type IfaceAddr struct {
	Iface  string
	Prefix netip.Prefix // the address with its prefix length
}

// Route is one of the host's IPv4 routes.
type Route struct {
	Dst netip.Prefix // invalid for the default route
	Gw  netip.Addr
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

// HostTargets works out a real host's targets: every IPv4 address of its
// own (the bridge's gateway named "gateway"), and LAN targets: the gateway
// of every route into a private range, the first address of every private
// subnet it is connected to, and a sample in each private range (the cloud
// metadata address always). Nothing in the box subnet but the gateway is a
// target: those are boxes.
func HostTargets(addrs []IfaceAddr, routes []Route, boxSubnet netip.Prefix, gateway netip.Addr) ([]HostAddr, []Target) {
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

	seen := map[netip.Addr]bool{}
	var lan []Target
	add := func(ip netip.Addr, why string) {
		if !ip.IsValid() || !ip.Is4() || own[ip] || seen[ip] || boxSubnet.Contains(ip) || !private(ip) {
			return
		}
		seen[ip] = true
		lan = append(lan, Target{Name: why + "-" + ip.String(), Addr: ip, TCPPort: 80, UDPPort: 53})
	}
	for _, r := range routes {
		add(r.Gw, "router")
		if r.Dst.IsValid() && r.Dst.Bits() > 0 && r.Dst.Bits() < 31 && !r.Dst.Overlaps(boxSubnet) {
			add(r.Dst.Masked().Addr().Next(), "lan")
		}
	}
	for _, s := range samples {
		covered := slices.ContainsFunc(lan, func(t Target) bool { return s.rng.Contains(t.Addr) })
		if !covered || s.sample == netip.MustParseAddr("169.254.169.254") {
			add(s.sample, "sample")
		}
	}
	return hosts, lan
}

func private(ip netip.Addr) bool {
	for _, r := range stack.PrivateRanges {
		if r.Contains(ip) {
			return true
		}
	}
	return false
}

// readHost reads the addresses and IPv4 routes of this process's network
// namespace (the host's).
func readHost() ([]IfaceAddr, []Route, error) {
	links, err := netlink.LinkList()
	if err != nil {
		return nil, nil, fmt.Errorf("listing the host's links: %w", err)
	}
	var addrs []IfaceAddr
	for _, l := range links {
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
		var rt Route
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

// hostTopology fills the targets on a real host.
func hostTopology(hm *HostMode, v *stack.Verification, a, b, c BoxEnd) (Topology, error) {
	addrs, routes, err := readHost()
	if err != nil {
		return Topology{}, err
	}
	hosts, lan := HostTargets(addrs, routes, v.Subnet, v.Gateway)
	// Listener ports picked per run from the dynamic range, so a service
	// the host runs on a fixed port is never in the way.
	var rnd [2]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		return Topology{}, err
	}
	port := 49152 + int(binary.BigEndian.Uint16(rnd[:]))%16000
	return Topology{
		HostTCP: port, HostUDP: port + 1,
		Subnet: v.Subnet, Gateway: v.Gateway, A: a, B: b, C: c,
		Canary: hm.Canary.Addr(), CanaryTCP: int(hm.Canary.Port()), PublicName: hm.PublicName, DNSDomain: "incus",
		HostAddrs: hosts, LANHosts: lan,
	}, nil
}
