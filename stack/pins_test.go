package stack

import (
	"strings"
	"testing"

	"github.com/box-isolation/box/stack/stacktest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/model"
)

// The pins come from the host's account: the MAC Incus gave each NIC and
// the fixed address box stored for it, never from the box, nor from the
// lease file (which a DHCP message a box gets through can change).
func TestPinPlan(t *testing.T) {
	box := func(name, mac, addr string) incus.Instance {
		return stacktest.FleetInst(name, func(i *incus.Instance) {
			if mac != "" {
				i.Config["volatile.eth0.hwaddr"] = mac
			}
			if addr != "" {
				i.ExpandedDevices["eth0"]["ipv4.address"] = addr
			}
		})
	}
	a := box("a", "10:66:6a:00:00:0a", "10.88.0.10")
	b := box("b", "10:66:6a:00:00:0b", "10.88.0.11")
	// A NIC whose MAC the operator set on the device itself.
	c := box("c", "", "10.88.0.12")
	c.ExpandedDevices["eth0"]["hwaddr"] = "10:66:6a:00:00:0c"
	// An instance with the same fixed address as b (another project's).
	twin := box("twin", "10:66:6a:00:00:0d", "10.88.0.11")
	// A box minted before box stored addresses: it leases one, and is
	// pinned to none.
	old := box("old", "10:66:6a:00:00:0e", "")
	p := pinPlanOf("boxnet", []incus.Instance{a, b, c, twin, old}, []string{"veth-a", "veth-b", "veth-c", "veth-twin", "veth-old", "veth-stray"})

	got := map[string]string{}
	for _, pin := range p.Pins {
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
		"veth-twin": "10:66:6a:00:00:0d ",
		"veth-old":  "10:66:6a:00:00:0e ",
	}, got, "each NIC's fixed address; one two NICs ask for is pinned to neither")
	assert.Equal(t, []string{"veth-a", "veth-b", "veth-c", "veth-twin", "veth-old"}, p.Scope)
	assert.Equal(t, []string{"veth-stray"}, p.unresolved, "a port no instance claims is left out of the scope, not cut off")
	require.Len(t, p.notes, 1)
	assert.Contains(t, p.notes[0], "10.88.0.11 is the fixed address of the NICs of both veth-b and veth-twin")
	f := pinFindings(nil, p)
	require.Len(t, f, 2)
	assert.Equal(t, model.LayerPin, f[0].Layer)
	assert.False(t, f[0].Advisory, "two boxes with one address fail the layer")
	assert.True(t, f[1].Advisory, "an unclaimed port is the census's to name")
}
