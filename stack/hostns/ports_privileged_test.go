package hostns

import (
	"fmt"
	"net/netip"
	"os/exec"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/internal/nstest"
	"github.com/box-isolation/box/internal/testenv/tier"
)

// TestBridgePortsOneDump: the ports and isolated flags read from one dump
// of the bridge ports are what netlink's per-port LinkGetProtinfo reads,
// in a throwaway namespace with two bridges (a port of the other bridge is
// not one of ours), and LinkStates agrees with LinkState link by link.
func TestBridgePortsOneDump(t *testing.T) {
	name, ip := throwawayNS(t, "ports")
	ip("link", "add", "br0", "type", "bridge")
	ip("link", "add", "br1", "type", "bridge")
	for i, br := range []string{"br0", "br0", "br0", "br1"} {
		v := fmt.Sprintf("v%d", i)
		ip("link", "add", v, "type", "veth", "peer", "name", v+"p")
		ip("link", "set", v, "master", br, "up")
	}
	ip("link", "set", "dev", "v1", "type", "bridge_slave", "isolated", "on")
	ip("link", "set", "dev", "v3", "type", "bridge_slave", "isolated", "on")

	g, err := Open(name)
	require.NoError(t, err)
	defer g.Close()
	ports, err := g.BridgePorts("br0")
	require.NoError(t, err)
	assert.Equal(t, []Port{{Name: "v0"}, {Name: "v1", Isolated: true}, {Name: "v2"}}, ports, "br0's ports, v1 isolated; br1's v3 is not br0's")
	for _, p := range ports {
		l, err := g.Netlink.LinkByName(p.Name)
		require.NoError(t, err)
		pi, err := g.Netlink.LinkGetProtinfo(l)
		require.NoError(t, err)
		assert.Equal(t, pi.Isolated, p.Isolated, "%s: the dump's flag is netlink's own", p.Name)
	}
	none, err := g.BridgePorts("nosuch")
	require.NoError(t, err)
	assert.Empty(t, none)

	names := []string{"v0", "v1", "v3", "v0p", "gone"}
	states, err := g.LinkStates(names)
	require.NoError(t, err)
	for _, n := range names {
		assert.Equal(t, g.LinkState(n), states[n], "%s: one dump for all says what a dump per link says", n)
	}
	assert.True(t, states["v3"].Isolated)
	assert.Equal(t, "br1", states["v3"].Master)
	assert.Equal(t, "v0", states["v0p"].Peer, "a veth's other end")
	assert.False(t, states["gone"].Exists)
}

// TestGatewayHoldersOneDump: the links other than the bridge holding the
// gateway's address, read from one dump of the addresses.
func TestGatewayHoldersOneDump(t *testing.T) {
	name, ip := throwawayNS(t, "gw")
	ip("link", "add", "br0", "type", "bridge")
	ip("link", "add", "d1", "type", "veth", "peer", "name", "d1p")
	ip("link", "add", "d2", "type", "veth", "peer", "name", "d2p")
	ip("addr", "add", "10.9.0.1/24", "dev", "br0")
	ip("addr", "add", "10.9.0.1/32", "dev", "d2")
	ip("addr", "add", "10.9.0.2/32", "dev", "d1")
	g, err := Open(name)
	require.NoError(t, err)
	defer g.Close()
	got, err := g.GatewayHolders("br0", netip.MustParseAddr("10.9.0.1"))
	require.NoError(t, err)
	assert.Equal(t, []string{"d2"}, got, "d2 holds the gateway's address besides the bridge; d1 holds another")
}

// throwawayNS is a throwaway network namespace (nstest) and what runs ip
// in it, for a test that must be root.
func throwawayNS(t *testing.T, role string) (string, func(args ...string)) {
	t.Helper()
	tier.Root(t)
	name := "boxhns-" + nstest.RunID() + "-" + role
	nstest.New(t, name)
	return name, func(args ...string) {
		t.Helper()
		out, err := exec.Command("ip", append([]string{"-n", name}, args...)...).CombinedOutput()
		require.NoError(t, err, "ip %v: %s", args, out)
	}
}
