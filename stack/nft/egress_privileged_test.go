package nft

import (
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"

	"github.com/box-isolation/box/internal/nstest"
	"github.com/box-isolation/box/internal/testenv/tier"
)

// egressWorld: boxes a (10.99.0.2) and b (10.99.0.3) on boxnet in a host
// namespace that routes them to an "internet" namespace holding two
// servers, 10.98.0.10 and 10.98.0.20.
type egressWorld struct {
	*world
	inet *testNS
}

func newEgressWorld(t *testing.T) *egressWorld {
	t.Helper()
	w := &egressWorld{world: newWorld(t)}
	w.inet = newNS(t, w.run, "inet")
	// A routed link, no bridge.
	nstest.Veth(t, w.host.NS, "up", w.inet.NS, "eth0")
	w.host.AddAddr(t, "up", "10.98.0.1/24")
	for _, a := range []string{"10.98.0.2/24", "10.98.0.10/24", "10.98.0.20/24"} {
		w.inet.AddAddr(t, "eth0", a)
	}
	w.host.LinkUp(t, "up")
	w.inet.LinkUp(t, "eth0")
	w.host.WaitOperUp(t, "up")
	w.inet.WaitOperUp(t, "eth0")
	require.NoError(t, w.host.Sysctl("net.ipv4.ip_forward", "1"))
	route(t, w.inet, "10.99.0.0/24", "10.98.0.1")
	for _, b := range []*testNS{w.a, w.b} {
		route(t, b, "0.0.0.0/0", "10.99.0.1")
	}
	for _, addr := range []string{"10.98.0.10:80", "10.98.0.20:80"} {
		w.inet.serve(t, "tcp", addr, "inet "+addr)
	}
	return w
}

func route(t *testing.T, n *testNS, dst, via string) {
	t.Helper()
	_, d, err := net.ParseCIDR(dst)
	require.NoError(t, err)
	require.NoError(t, n.Netlink(t).RouteAdd(&netlink.Route{Dst: d, Gw: net.ParseIP(via)}), "route %s via %s in %s", dst, via, n.Name)
}

// nftIn runs nft in the host namespace, as dnsmasq would to add elements.
func nftIn(t *testing.T, ns string, args ...string) string {
	t.Helper()
	nft := tier.Tool(t, "nft", "nftables")
	out, err := exec.Command("ip", append([]string{"netns", "exec", ns, nft}, args...)...).CombinedOutput()
	require.NoError(t, err, "nft %v: %s", args, out)
	return string(out)
}

func TestPrivilegedEgress(t *testing.T) {
	requireRoot(t)
	tier.Tool(t, "nft", "nftables") // nftIn adds elements with it, as dnsmasq does
	w := newEgressWorld(t)
	cfg := w.cfg
	a := netip.MustParseAddr("10.99.0.2")
	p1 := []EgressPolicy{{ID: "p1", Boxes: []netip.Addr{a}}}

	// Before any policy, both boxes reach both servers.
	assert.Equal(t, reached, w.a.dial(t, "tcp", "10.98.0.10:80", "inet 10.98.0.10:80"))

	changes, err := ApplyEgress(cfg, p1)
	require.NoError(t, err)
	assert.Equal(t, []string{"created table inet box_egress"}, changes)
	f, err := VerifyEgress(cfg, p1)
	require.NoError(t, err)
	assert.Empty(t, f)

	// Box a is allowlisted and nothing is allowed yet; b is open.
	assert.Equal(t, silent, w.a.dial(t, "tcp", "10.98.0.10:80", "inet 10.98.0.10:80"), "a under p1 with an empty allow set")
	assert.Equal(t, reached, w.b.dial(t, "tcp", "10.98.0.10:80", "inet 10.98.0.10:80"), "b is open")

	// dnsmasq adds an answer (without a timeout of its own).
	nftIn(t, w.host.Name, "add", "element", "inet", "box_egress", "allow_p1", "{ 10.98.0.10 }")
	assert.Equal(t, reached, w.a.dial(t, "tcp", "10.98.0.10:80", "inet 10.98.0.10:80"), "the answered address")
	assert.Equal(t, silent, w.a.dial(t, "tcp", "10.98.0.20:80", "inet 10.98.0.20:80"), "not the other one")
	listing := nftIn(t, w.host.Name, "list", "set", "inet", "box_egress", "allow_p1")
	assert.Contains(t, listing, "timeout 1h", "the set's default timeout")
	assert.Contains(t, listing, "expires", "dnsmasq's element takes the default timeout: %s", listing)

	// Box's own converge leaves dnsmasq's elements alone, also when a new
	// policy's sets and rule are added.
	p12 := append(p1, EgressPolicy{ID: "p2", Boxes: []netip.Addr{netip.MustParseAddr("10.99.0.3")}})
	changes, err = ApplyEgress(cfg, p12)
	require.NoError(t, err)
	t.Logf("adding p2: %v", changes)
	for _, c := range changes {
		assert.NotContains(t, c, "replaced table", "a new policy is added in place")
	}
	allowed, err := EgressAllowed(cfg, "p1")
	require.NoError(t, err)
	assert.Equal(t, []netip.Addr{netip.MustParseAddr("10.98.0.10")}, allowed, "p1's answers survive p2's arrival")
	assert.Equal(t, silent, w.b.dial(t, "tcp", "10.98.0.10:80", "inet 10.98.0.10:80"), "b under p2 now")
	assert.Equal(t, reached, w.a.dial(t, "tcp", "10.98.0.10:80", "inet 10.98.0.10:80"))

	// Moving a box between policies is an element change only.
	moved := []EgressPolicy{{ID: "p1", Boxes: []netip.Addr{a, netip.MustParseAddr("10.99.0.3")}}, {ID: "p2"}}
	changes, err = ApplyEgress(cfg, moved)
	require.NoError(t, err)
	assert.Len(t, changes, 2, "two boxes sets changed: %v", changes)
	assert.Equal(t, reached, w.b.dial(t, "tcp", "10.98.0.10:80", "inet 10.98.0.10:80"), "b under p1 reaches p1's answer")

	// An established connection outlives its address leaving the set (a
	// long download is not cut when the answer times out).
	t.Run("established outlives the allow element", func(t *testing.T) {
		err := w.a.Run(func() error {
			c, err := net.DialTimeout("tcp", "10.98.0.10:80", probeWait)
			if err != nil {
				return err
			}
			defer c.Close()
			nftIn(t, w.host.Name, "delete", "element", "inet", "box_egress", "allow_p1", "{ 10.98.0.10 }")
			_ = c.SetReadDeadline(time.Now().Add(probeWait))
			buf := make([]byte, 64)
			k, err := c.Read(buf)
			if err != nil {
				return err
			}
			assert.True(t, strings.HasPrefix(string(buf[:k]), "inet"), "the greeting came on the established connection")
			return nil
		})
		require.NoError(t, err)
		assert.Equal(t, silent, w.a.dial(t, "tcp", "10.98.0.10:80", "inet 10.98.0.10:80"), "but no new one")
	})

	// What a repeated answer does to an element's timeout.
	t.Run("a repeated answer", func(t *testing.T) {
		nftIn(t, w.host.Name, "add", "element", "inet", "box_egress", "allow_p1", "{ 10.98.0.10 timeout 10s }")
		time.Sleep(2 * time.Second)
		nftIn(t, w.host.Name, "add", "element", "inet", "box_egress", "allow_p1", "{ 10.98.0.10 }")
		listing := nftIn(t, w.host.Name, "list", "set", "inet", "box_egress", "allow_p1")
		t.Logf("after a second add, 2 s into a 10 s element: %s", strings.TrimSpace(listing))
		// Measured on kernel 6.18: the second add (dnsmasq's, with no
		// timeout) gives the element the set's default timeout again, so
		// every answer for a name keeps its address allowed another hour.
		assert.Contains(t, listing, "expires 59m", "a repeated answer refreshes the element's timeout to the set's default")
	})

	// No policy left: DeleteEgress removes the table.
	gone, err := DeleteEgress(cfg)
	require.NoError(t, err)
	assert.True(t, gone)
	assert.Equal(t, reached, w.a.dial(t, "tcp", "10.98.0.20:80", "inet 10.98.0.20:80"), "open again")
}
