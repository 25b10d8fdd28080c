package topo

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/box-isolation/box/internal/hostscan"
)

func TestHostTargets(t *testing.T) {
	pfx := netip.MustParsePrefix
	addr := netip.MustParseAddr
	box := pfx("10.88.0.0/24")
	gw := addr("10.88.0.1")
	addrs := []IfaceAddr{
		{"lo", pfx("127.0.0.1/8")},
		{"eth0", pfx("192.168.1.20/24")},
		{"eth1", pfx("203.0.113.7/24")},
		{"boxnet", pfx("10.88.0.1/24")},
		{"veth1", pfx("10.88.0.55/24")}, // a box's address seen on the host: not a host target
		{"eth0", pfx("192.168.1.20/24")},
	}
	routes := []Route{
		{Gw: addr("192.168.1.1")}, // the default route
		{Dst: pfx("192.168.1.0/24")},
		{Dst: pfx("203.0.113.0/24")},
		{Dst: pfx("10.88.0.0/24")},
		{Dst: pfx("172.20.0.0/16"), Gw: addr("192.168.1.254")},
		{Dst: pfx("10.30.0.7/32"), Gw: addr("192.168.1.254")},
	}
	hosts := HostAddrs(addrs, box, gw)
	lan := LANTargets(addrs, routes)

	var hostAddrs []string
	for _, h := range hosts {
		hostAddrs = append(hostAddrs, h.Addr.String())
		assert.Equal(t, netip.PrefixFrom(h.Addr, 32), h.Via, "listeners bind to the address itself")
	}
	assert.Equal(t, []string{"10.88.0.1", "192.168.1.20", "203.0.113.7"}, hostAddrs, "every own address, the gateway first, no loopback, no box")
	assert.Equal(t, "gateway", hosts[0].Name)

	got := map[string]bool{}
	for _, l := range lan {
		got[l.Addr.String()] = true
		assert.False(t, box.Contains(l.Addr), "no box is a LAN target")
		assert.NotEmpty(t, l.Provenance, "%s says why it is a target", l.Addr)
	}
	for _, want := range []string{
		"192.168.1.1",     // the default gateway
		"192.168.1.254",   // a router for a private route
		"172.20.0.1",      // a routed private subnet
		"10.30.0.7",       // a host route: the host itself
		"100.64.0.1",      // the CGNAT range: a sample
		"169.254.169.254", // the metadata address, always
	} {
		assert.True(t, got[want], "LAN target %s", want)
	}
	// A public prefix the host routes other than by its default route
	// (eth1's segment): L-ROUTE drops it, so it is a target.
	assert.True(t, got["203.0.113.1"], "203.0.113.1, in a public prefix routed beside the default route")
	for _, not := range []string{"192.168.1.20", "192.168.0.1", "172.16.0.1", "10.0.0.1"} {
		assert.False(t, got[not], "%s is no LAN target (own, public, or its range is already covered)", not)
	}
}

// Every source of a real host's LAN targets lands once, with its
// provenance; the host's own addresses and public addresses never do.
func TestHostFactsTopology(t *testing.T) {
	pfx, addr := netip.MustParsePrefix, netip.MustParseAddr
	f := hostFacts{
		addrs: []IfaceAddr{{"eth0", pfx("192.168.1.20/24")}},
		routes: []Route{{Gw: addr("192.168.1.1"), Dev: "eth0"}, {Dst: pfx("10.30.0.7/32"), Gw: addr("192.168.1.254"), Dev: "eth0"},
			{Dst: pfx("10.88.0.0/24"), Dev: "boxnet"}, {Dst: pfx("172.17.0.0/16"), Dev: "docker0"}, {Dst: pfx("203.0.113.0/24"), Dev: "eth1"}},
		neighbours: []hostscan.Neighbour{{Addr: addr("192.168.1.33")}, {Addr: addr("192.168.1.1")}, {Addr: addr("192.168.1.20")}},
		dns:        hostscan.DNS{Conf: hostscan.ResolvConf{Nameservers: []netip.Addr{addr("192.168.1.53"), addr("9.9.9.9")}, Search: []string{"corp.example"}}},
		leases:     []hostscan.DHCPLease{{Server: addr("192.168.1.2")}},
		hostname:   "build7",
		hosts:      []hostscan.HostsEntry{{Addr: addr("192.168.1.20"), Name: "build7.corp.example", Aliases: []string{"build7"}}},
		notes:      []string{"a note"},
	}
	top := f.topology(HostOptions{Canary: netip.MustParseAddrPort("1.1.1.1:443"), PublicName: "example.com.", Upstream: addr("1.1.1.1")})
	got := map[string]Provenance{}
	for _, l := range top.LANHosts {
		_, dup := got[l.Addr.String()]
		assert.False(t, dup, "%s once", l.Addr)
		got[l.Addr.String()] = l.Provenance
	}
	for a, why := range map[string]Provenance{
		"192.168.1.1": FromRoute, "10.30.0.7": FromRoute, "192.168.1.254": FromRoute, "192.168.1.33": FromNeighbour,
		"192.168.1.53": FromResolver, "192.168.1.2": FromDHCPServer, "169.254.169.254": FromSample, "172.17.0.1": FromRoute, "100.64.0.1": FromSample,
	} {
		assert.Equal(t, why, got[a], a)
	}
	for _, not := range []string{"192.168.1.20", "9.9.9.9"} {
		assert.NotContains(t, got, not, "own or public")
	}
	assert.Equal(t, FromRoute, got["203.0.113.1"], "a public prefix routed by eth1, not the default route's eth0, is a LAN target")
	assert.Equal(t, []string{"corp.example"}, top.SearchDomains)
	assert.Equal(t, "build7.corp.example", top.FQDN)
	assert.Equal(t, []string{"a note"}, top.Notes)
	assert.Equal(t, SourceHost, top.Source)
	assert.Equal(t, []string{"eth0", "docker0", "eth1"}, top.Outward, "where the default route, private traffic and every route elsewhere leave, not the box bridge")
}

// Only what leaves by another interface than the default routes' is
// routed elsewhere; with two default routes, neither's prefixes are.
func TestRoutedElsewhere(t *testing.T) {
	pfx, addr := netip.MustParsePrefix, netip.MustParseAddr
	routes := []Route{
		{Gw: addr("192.168.1.1"), Dev: "eth0"},
		{Dst: pfx("0.0.0.0/0"), Gw: addr("10.9.0.1"), Dev: "wg0"}, // a second default route
		{Dst: pfx("128.0.0.0/1"), Dev: "tun0"},                    // half of a full tunnel's pair
		{Dst: pfx("192.168.1.0/24"), Dev: "eth0"},
		{Dst: pfx("10.9.0.0/24"), Dev: "wg0"},
		{Dst: pfx("198.18.40.0/24"), Gw: addr("192.168.30.2"), Dev: "lan0"},
		{Dst: pfx("192.168.30.0/24"), Dev: "lan0"},
		{Dst: pfx("10.88.0.0/24"), Dev: "boxnet"},
		{Dst: pfx("127.0.0.0/8"), Dev: "lo"},
	}
	assert.Equal(t, []string{"eth0", "wg0", "tun0"}, DefaultDevs(routes))
	// The uplinks' own segments and what is routed by them count: a
	// second router beside the modem is reached by the default route's
	// interface.
	assert.Equal(t, []netip.Prefix{pfx("192.168.1.0/24"), pfx("10.9.0.0/24"), pfx("198.18.40.0/24"), pfx("192.168.30.0/24")}, RoutedElsewhere(routes))
	assert.Equal(t, []netip.Prefix{pfx("198.18.40.0/24"), pfx("192.168.30.0/24")}, RoutedOffUplinks(routes), "the LANs beside the uplinks")
	got := map[string]bool{}
	for _, l := range LANTargets(nil, routes) {
		got[l.Addr.String()] = true
	}
	assert.True(t, got["198.18.40.1"], "the non-private prefix behind the LAN router is sampled")
	sameNIC := append(slices.Clone(routes), Route{Dst: pfx("198.18.50.0/24"), Gw: addr("192.168.1.254"), Dev: "eth0"})
	got = map[string]bool{}
	for _, l := range LANTargets(nil, sameNIC) {
		got[l.Addr.String()] = true
	}
	assert.True(t, got["198.18.50.1"], "a non-private prefix routed by the default route's own interface is sampled")
	assert.False(t, got["198.18.0.1"], "nothing outside what is routed")
}
