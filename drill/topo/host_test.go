package topo

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
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
	for _, not := range []string{"192.168.1.20", "203.0.113.1", "192.168.0.1", "172.16.0.1", "10.0.0.1"} {
		assert.False(t, got[not], "%s is no LAN target (own, public, or its range is already covered)", not)
	}
}
