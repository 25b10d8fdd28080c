package stack

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/stack/incus"
)

// The pins come from the host's account: the MAC Incus gave each NIC and
// the addresses dnsmasq leased to that MAC, never from the box.
func TestPinPlan(t *testing.T) {
	withMAC := func(name, mac string) incus.Instance {
		return fleetInst(name, func(i *incus.Instance) { i.Config["volatile.eth0.hwaddr"] = mac })
	}
	a := withMAC("a", "10:66:6a:00:00:0a")
	b := withMAC("b", "10:66:6a:00:00:0b")
	// A NIC whose MAC the operator set on the device itself.
	c := fleetInst("c", func(i *incus.Instance) { i.ExpandedDevices["eth0"]["hwaddr"] = "10:66:6a:00:00:0c" })
	// A clone that kept its source's MAC.
	twin := withMAC("twin", "10:66:6a:00:00:0b")
	leases := []incus.NetworkLease{
		{Address: "10.88.0.1", Type: "gateway"},
		{Address: "10.88.0.10", Hwaddr: "10:66:6a:00:00:0a", Type: "dynamic"},
		{Address: "10.88.0.11", Hwaddr: "10:66:6a:00:00:0b", Type: "dynamic"},
		{Address: "10.88.0.12", Hwaddr: "10:66:6a:00:00:0c", Type: "static"},
		{Address: "fd00::1", Hwaddr: "10:66:6a:00:00:0a", Type: "dynamic"},
	}
	p := pinPlanOf("boxnet", []incus.Instance{a, b, c, twin}, leases, []string{"veth-a", "veth-b", "veth-c", "veth-twin", "veth-stray"})

	got := map[string]string{}
	for _, pin := range p.pins {
		var addrs []string
		for _, x := range pin.Addrs {
			addrs = append(addrs, x.String())
		}
		got[pin.Port] = pin.MAC.String() + " " + strings.Join(addrs, ",")
	}
	assert.Equal(t, map[string]string{
		"veth-a":    "10:66:6a:00:00:0a 10.88.0.10",
		"veth-b":    "10:66:6a:00:00:0b ",
		"veth-c":    "10:66:6a:00:00:0c 10.88.0.12",
		"veth-twin": "10:66:6a:00:00:0b ",
	}, got, "IPv4 only, the gateway's never; an address two ports' MACs hold is pinned to neither")
	assert.Equal(t, []string{"veth-a", "veth-b", "veth-c", "veth-twin"}, p.scope)
	assert.Equal(t, []string{"veth-stray"}, p.unresolved, "a port no instance claims is left out of the scope, not cut off")
	require.Len(t, p.notes, 1)
	assert.Contains(t, p.notes[0], "10.88.0.11 is leased to the MACs of both veth-b and veth-twin")
	f := pinFindings(nil, p)
	require.Len(t, f, 2)
	assert.Equal(t, LayerPin, f[0].Layer)
	assert.False(t, f[0].Advisory, "two boxes with one address fail the layer")
	assert.True(t, f[1].Advisory, "an unclaimed port is the census's to name")
}
