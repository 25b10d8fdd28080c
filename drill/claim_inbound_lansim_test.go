package drill

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/box-isolation/box/drill/topo"
)

// The LAN stand-in sends from the host's own LAN prefixes (the routed
// world's: its LAN link, the LAN behind the router, the non-private prefix
// there), then from a sample in each private range they leave uncovered.
func TestLANSimSources(t *testing.T) {
	pfx, addr := netip.MustParsePrefix, netip.MustParseAddr
	routes := []topo.Route{
		{Gw: addr("198.51.100.1"), Dev: "up"},
		{Dst: pfx("198.51.100.0/24"), Dev: "up"}, // the uplink's own prefix: the default way, not the LAN
		{Dst: pfx("192.168.30.0/24"), Dev: "lan"},
		{Dst: pfx("10.40.0.0/24"), Gw: addr("192.168.30.2"), Dev: "lan"},
		{Dst: pfx("198.18.40.0/24"), Gw: addr("192.168.30.2"), Dev: "lan"},
		{Dst: pfx("10.30.0.7/32"), Gw: addr("192.168.30.2"), Dev: "lan"}, // a host route: no free address
		{Dst: pfx("10.88.0.0/24"), Dev: "boxnet"},
	}
	taken := func(a netip.Addr) bool { return a == addr("10.40.0.245") }
	got := lanSimSources(routes, pfx("10.88.0.0/24"), taken)
	var s []string
	for _, a := range got {
		s = append(s, a.String())
	}
	assert.Equal(t, []string{"192.168.30.245", "198.18.40.245", "10.255.255.77", "172.31.255.77", "100.127.255.77"}, s,
		"one per LAN prefix but the taken one, then the private ranges left uncovered")
	assert.Equal(t, addr("10.40.0.255"), lastAddr(pfx("10.40.0.0/24")))
	assert.Equal(t, addr("198.18.255.255"), lastAddr(pfx("198.18.0.0/16")))
}
