package hostscan

import (
	"net"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/vishvananda/netlink"
)

func mac(s string) net.HardwareAddr {
	m, err := net.ParseMAC(s)
	if err != nil {
		panic(err)
	}
	return m
}

func TestUsableNeighbours(t *testing.T) {
	names := map[int]string{1: "lo", 2: "eth0", 3: "br0"}
	dump := []netlink.Neigh{
		{LinkIndex: 2, IP: net.ParseIP("10.0.0.9"), HardwareAddr: mac("02:00:00:00:00:09"), State: netlink.NUD_STALE},
		{LinkIndex: 2, IP: net.ParseIP("10.0.0.1"), HardwareAddr: mac("02:00:00:00:00:01"), State: netlink.NUD_REACHABLE},
		{LinkIndex: 2, IP: net.ParseIP("10.0.0.2"), State: netlink.NUD_FAILED},
		{LinkIndex: 2, IP: net.ParseIP("10.0.0.3"), State: netlink.NUD_INCOMPLETE},
		{LinkIndex: 2, IP: net.ParseIP("10.0.0.4"), HardwareAddr: mac("02:00:00:00:00:04"), State: netlink.NUD_DELAY},
		{LinkIndex: 2, IP: net.ParseIP("10.0.0.5"), HardwareAddr: mac("02:00:00:00:00:05"), State: netlink.NUD_PROBE},
		{LinkIndex: 1, IP: net.ParseIP("127.0.0.1"), State: netlink.NUD_NOARP},
		{LinkIndex: 3, IP: net.ParseIP("224.0.0.251"), HardwareAddr: mac("01:00:5e:00:00:fb"), State: netlink.NUD_NOARP},
		{LinkIndex: 3, IP: net.ParseIP("10.9.0.7"), HardwareAddr: mac("02:00:00:00:09:07"), State: netlink.NUD_PERMANENT},
		{LinkIndex: 2, IP: net.ParseIP("fe80::1"), HardwareAddr: mac("02:00:00:00:00:01"), State: netlink.NUD_REACHABLE, Flags: netlink.NTF_ROUTER},
		{LinkIndex: 2, IP: net.ParseIP("fd00::5"), HardwareAddr: mac("02:00:00:00:00:05"), State: netlink.NUD_STALE},
		{LinkIndex: 2, IP: net.ParseIP("fd00::6"), State: netlink.NUD_NONE},
		{LinkIndex: 9, IP: net.ParseIP("10.7.0.1"), HardwareAddr: mac("02:00:00:00:07:01"), State: netlink.NUD_STALE},
	}
	var got []string
	for _, n := range UsableNeighbours(dump, names) {
		got = append(got, n.String())
	}
	assert.Equal(t, []string{
		"10.0.0.1 lladdr 02:00:00:00:00:01 dev eth0 reachable",
		"10.0.0.4 lladdr 02:00:00:00:00:04 dev eth0 delay",
		"10.0.0.5 lladdr 02:00:00:00:00:05 dev eth0 probe",
		"10.0.0.9 lladdr 02:00:00:00:00:09 dev eth0 stale",
		"fd00::5 lladdr 02:00:00:00:00:05 dev eth0 stale",
		"fe80::1 lladdr 02:00:00:00:00:01 dev eth0 reachable",
		"10.9.0.7 lladdr 02:00:00:00:09:07 dev br0 permanent",
		"10.7.0.1 lladdr 02:00:00:00:07:01 dev  stale",
	}, got)
	n := UsableNeighbours(dump[9:10], names)[0]
	assert.True(t, n.Router)
	assert.Equal(t, "eth0", n.Addr.Zone(), "a link-local address carries its device as zone")
	assert.Empty(t, UsableNeighbours(nil, names))
}
