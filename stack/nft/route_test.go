package nft

import (
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"

	"github.com/box-isolation/box/internal/nstest"
)

func TestRouteStringGolden(t *testing.T) {
	r, err := Route{Uplinks: []string{"wlan0", "eth0", "eth0"},
		Routed: []netip.Prefix{netip.MustParsePrefix("30.1.7.0/16"), netip.MustParsePrefix("192.168.1.0/24"), netip.MustParsePrefix("172.16.0.0/12"), netip.MustParsePrefix("30.1.0.0/16"), netip.MustParsePrefix("100.64.0.1/32")}}.Desired(Config{})

	require.NoError(t, err)
	golden(t, "route.golden", r.String())
	// Every rule is scoped to the bridge: no other traffic is looked at.
	for _, ru := range r.Tables[0].Chains[0].Rules {
		assert.Contains(t, ru.Text, `iifname "boxnet"`, ru.Text)
	}
	assert.Equal(t, "box_route", Config{}.RouteTable())
}

func TestRouteRefusesBadUplinks(t *testing.T) {
	for _, up := range [][]string{{"boxnet"}, {""}, {"a-name-far-too-long"}} {
		_, err := Route{Uplinks: up}.Desired(Config{})
		assert.Error(t, err, "%q", up)
	}
	for _, p := range []string{"0.0.0.0/1", "128.0.0.0/0", "fd00::/8"} {
		_, err := Route{Routed: []netip.Prefix{netip.MustParsePrefix(p)}}.Desired(Config{})
		assert.Error(t, err, "%s is no routed prefix", p)
	}
	r, err := Route{}.Desired(Config{})
	require.NoError(t, err, "no default route: an empty set, which drops every new connection")
	assert.Empty(t, r.Tables[0].Sets[0].Elements)
}

// L-ROUTE on real packets, in throwaway namespaces (boxnft-<run>-*): box
// a behind the bridge, the host's default route by up0 to "inet", and a
// non-private prefix (198.18.40.0/24, RFC 2544's benchmark range) routed
// by lan0 to "lan", and another (198.18.50.0/24) routed by up0 itself, by
// a second router on the uplink's segment. With the table, a's traffic
// leaves by up0 only and never to a routed prefix; the host's own traffic
// and a connection opened into a from the LAN are untouched; the set and
// the routed prefixes decide, as Route.Apply changes them.
func TestPrivilegedRouteDropsAllButTheDefaultWay(t *testing.T) {
	requireRoot(t)
	run := runID()
	host, a := newNS(t, run, "host"), newNS(t, run, "a")
	inet, lan := newNS(t, run, "inet"), newNS(t, run, "lan")
	require.NoError(t, host.Sysctl("net.ipv4.ip_forward", "1"))
	host.bridge(t, "boxnet", "10.99.0.1/24")
	host.plug(t, "boxnet", "vA", a, "10.99.0.2/24")
	nstest.Veth(t, host.NS, "up0", inet.NS, "eth0")
	nstest.Veth(t, host.NS, "lan0", lan.NS, "eth0")
	host.AddAddr(t, "up0", "192.0.2.1/24")
	host.AddAddr(t, "lan0", "192.168.30.1/24")
	inet.AddAddr(t, "eth0", "192.0.2.2/24")
	lan.AddAddr(t, "eth0", "192.168.30.2/24")
	lan.AddAddr(t, "eth0", "198.18.40.10/32")
	inet.AddAddr(t, "eth0", "192.0.2.3/24") // the second router on the uplink's segment
	inet.AddAddr(t, "eth0", "198.18.50.10/32")
	inet.AddAddr(t, "eth0", "203.0.113.1/32") // the internet, past the default route
	for _, n := range []*testNS{host, inet, lan} {
		for _, l := range []string{"up0", "lan0", "eth0"} {
			if _, err := n.Netlink(t).LinkByName(l); err == nil {
				n.LinkUp(t, l)
			}
		}
	}
	route := func(n *testNS, dev, dst, gw string) {
		t.Helper()
		r := &netlink.Route{LinkIndex: n.Link(t, dev).Attrs().Index, Gw: net.ParseIP(gw)}
		if dst != "" {
			_, r.Dst, _ = net.ParseCIDR(dst)
		}
		require.NoError(t, n.Netlink(t).RouteAdd(r), "%s via %s", dst, gw)
	}
	route(a, "eth0", "", "10.99.0.1")
	route(host, "up0", "", "192.0.2.2")
	route(host, "lan0", "198.18.40.0/24", "192.168.30.2")
	route(host, "up0", "198.18.50.0/24", "192.0.2.3")
	route(inet, "eth0", "10.99.0.0/24", "192.0.2.1")
	route(lan, "eth0", "10.99.0.0/24", "192.168.30.1")
	host.WaitOperUp(t, "up0", "lan0")

	// Positive controls: every way works before the table.
	require.Equal(t, reached, a.ping(t, "192.0.2.2"), "a -> the default way, before")
	require.Equal(t, reached, a.ping(t, "198.18.40.10"), "a -> the routed prefix, before")
	require.Equal(t, reached, a.ping(t, "198.18.50.10"), "a -> the prefix routed by the uplink, before")

	cfg := Config{NetNS: int(host.Handle)}
	// The uplinks alone (the table before routed prefixes): the prefix the
	// uplink's own interface routes gets through.
	changes, err := Route{Uplinks: []string{"up0"}}.Apply(cfg)
	require.NoError(t, err)
	assert.Equal(t, []string{"created table inet box_route"}, changes)
	assert.Equal(t, silent, a.ping(t, "198.18.40.10"), "a -> the prefix routed by lan0: dropped")
	assert.Equal(t, reached, a.ping(t, "198.18.50.10"), "a -> the prefix routed by up0: through, by interface alone")
	both := Route{Uplinks: []string{"up0"}, Routed: []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24"), netip.MustParsePrefix("198.18.40.0/24"), netip.MustParsePrefix("198.18.50.0/24")}}
	f, err := both.Verify(cfg)
	require.NoError(t, err)
	require.NotEmpty(t, f, "the routed prefixes missing: a finding")
	changes, err = both.Apply(cfg)
	require.NoError(t, err)
	assert.NotEmpty(t, changes)
	f, err = both.Verify(cfg)
	require.NoError(t, err)
	assert.Empty(t, f)
	assert.Equal(t, reached, a.ping(t, "203.0.113.1"), "a -> the internet, the default way")
	assert.Equal(t, silent, a.ping(t, "198.18.40.10"), "a -> the routed prefix: dropped")
	assert.Equal(t, silent, a.ping(t, "198.18.50.10"), "a -> the prefix routed by the uplink: dropped by destination")
	assert.Equal(t, silent, a.ping(t, "192.0.2.2"), "a -> the uplink's own segment: the LAN, dropped")
	assert.Equal(t, reached, host.ping(t, "198.18.40.10"), "the host's own traffic is not looked at")
	assert.Equal(t, reached, lan.ping(t, "10.99.0.2"), "the LAN -> a: the table keeps a's replies (the ACL is what drops this)")

	changed, err := Route{Uplinks: []string{"lan0", "up0"}, Routed: both.Routed[:2]}.Apply(cfg)
	require.NoError(t, err)
	assert.Contains(t, strings.Join(changed, "; "), "added interfaces lan0")
	assert.Equal(t, reached, a.ping(t, "198.18.50.10"), "a -> the prefix routed by up0, no longer a routed prefix")
	_, err = Route{}.Apply(cfg)
	require.NoError(t, err)
	assert.Equal(t, silent, a.ping(t, "203.0.113.1"), "no uplink: nothing leaves")
	f, err = both.Verify(cfg)
	require.NoError(t, err)
	require.NotEmpty(t, f)
	assert.Contains(t, f[0].Problem+f[len(f)-1].Problem, "missing interfaces up0")

	ok, err := DeleteRoute(cfg)
	require.NoError(t, err)
	assert.True(t, ok)
	assert.Equal(t, reached, a.ping(t, "198.18.40.10"), "the table gone: a reaches the routed prefix again")
}
