package daemon

import (
	"bytes"
	"net"
	"net/netip"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/box-isolation/box/stack"
	"github.com/box-isolation/box/stack/hostns"
	"github.com/box-isolation/box/stack/model"
	"github.com/box-isolation/box/stack/nft"
)

// uplinkSet reads the route table's uplink set from the kernel.
func (w *watchWorld) uplinkSet(t testing.TB) []string {
	t.Helper()
	c, err := nftables.New(nftables.WithNetNSFd(int(w.ns.Handle)))
	require.NoError(t, err)
	s, err := c.GetSetByName(&nftables.Table{Family: nftables.TableFamilyINet, Name: "box_route"}, nft.UplinkSet)
	require.NoError(t, err)
	elems, err := c.GetSetElements(s)
	require.NoError(t, err)
	out := []string{}
	for _, e := range elems {
		out = append(out, strings.TrimRight(string(e.Key), "\x00"))
	}
	sort.Strings(out)
	return out
}

// dummy adds a link, up, with an address: a veth pair whose peer is up
// too (this kernel may have no dummy links).
func (w *watchWorld) dummy(t testing.TB, name, cidr string) netlink.Link {
	t.Helper()
	w.veth(t, name)
	w.ns.AddAddr(t, name, cidr)
	w.ns.LinkUp(t, name+"p")
	w.ns.LinkUp(t, name)
	return w.ns.Link(t, name)
}

func routeVia(l netlink.Link, dst string, gw string, table int) *netlink.Route {
	r := &netlink.Route{LinkIndex: l.Attrs().Index, Gw: net.ParseIP(gw), Table: table}
	if dst != "" {
		_, r.Dst, _ = net.ParseCIDR(dst)
	}
	return r
}

// L-ROUTE in a throwaway namespace (boxpw-<run>-host, never the
// machine's or a world's): Ensure's part writes the uplinks, the watcher
// follows default routes as they come and go (another table's, a full
// tunnel's pair), Verify names a stale set and a missing table, and a
// table someone deleted stays deleted until Ensure.
func TestPrivilegedRouteUplinks(t *testing.T) {
	w := newWatchWorld(t)
	up := w.dummy(t, "up0", "192.0.2.2/24")
	require.NoError(t, w.h.RouteAdd(routeVia(up, "", "192.0.2.1", 0)))
	lan := w.dummy(t, "lan0", "192.168.30.1/24")
	require.NoError(t, w.h.RouteAdd(routeVia(lan, "198.18.40.0/24", "192.168.30.2", 0)))

	g, err := hostns.Open(w.host.NetNS)
	require.NoError(t, err)
	defer g.Close()
	changes, err := stack.EnsureRoute(g)
	require.NoError(t, err)
	require.NotEmpty(t, changes, "the table was made")
	assert.Equal(t, []string{"up0"}, w.uplinkSet(t), "the default route's interface only, not the LAN's")
	f, notes, err := stack.VerifyRoute(g)
	require.NoError(t, err)
	assert.Empty(t, f)
	assert.Empty(t, notes)

	w.watch(t, defaultWatchOptions())
	settle := func(what string, want ...string) {
		t.Helper()
		start := time.Now()
		require.Eventually(t, func() bool { return strings.Join(w.uplinkSet(t), ",") == strings.Join(want, ",") }, 5*time.Second, time.Millisecond,
			"%s: the set never held %v; the watcher said:\n%s", what, want, w.log.String())
		t.Logf("%s: set %v within %s", what, want, time.Since(start).Round(100*time.Microsecond))
	}

	// A VPN's default route in a table of its own (wg-quick's way).
	wg := w.dummy(t, "wg0", "10.9.0.2/24")
	require.NoError(t, w.h.RouteAdd(routeVia(wg, "0.0.0.0/0", "", 51820)))
	settle("a default route in table 51820", "up0", "wg0")
	// Roaming: the uplink's default route goes.
	require.NoError(t, w.h.RouteDel(routeVia(up, "", "192.0.2.1", 0)))
	settle("the main default route removed", "wg0")
	// A full tunnel's pair.
	tun := w.dummy(t, "tun0", "10.8.0.2/24")
	require.NoError(t, w.h.RouteAdd(routeVia(tun, "0.0.0.0/1", "", 0)))
	require.NoError(t, w.h.RouteAdd(routeVia(tun, "128.0.0.0/1", "", 0)))
	settle("0.0.0.0/1 and 128.0.0.0/1 by tun0", "tun0", "wg0")
	// A link that goes down takes its routes with it.
	require.NoError(t, w.h.LinkSetDown(wg))
	settle("wg0 down", "tun0")
	// Nothing but LAN routes: no way out at all.
	require.NoError(t, w.h.LinkSetDown(tun))
	settle("no default route", []string{}...)
	_, notes, err = stack.VerifyRoute(g)
	require.NoError(t, err)
	assert.Len(t, notes, 1, "Verify says boxes reach nothing without a default route")
	require.NoError(t, w.h.RouteAdd(routeVia(up, "", "192.0.2.1", 0)))
	settle("the default route back", "up0")

	// A prefix routed by the uplink's own interface (a second router on its
	// segment): dropped by destination, the rule following the route.
	rt, err := g.RouteView("boxnet")
	require.NoError(t, err)
	assert.Contains(t, rt.Routed, netip.MustParsePrefix("192.0.2.0/24"), "the uplink's own segment is routed elsewhere (the LAN)")
	assert.Contains(t, rt.Routed, netip.MustParsePrefix("198.18.40.0/24"))
	same := netip.MustParsePrefix("198.18.50.0/24")
	assert.NotContains(t, rt.Routed, same)
	current := func(what string) {
		t.Helper()
		require.Eventually(t, func() bool {
			f, _, err := stack.VerifyRoute(g)
			return err == nil && len(f) == 0
		}, 5*time.Second, time.Millisecond, "%s: the table never matched the routes; the watcher said:\n%s", what, w.log.String())
	}
	require.NoError(t, w.h.RouteAdd(routeVia(up, same.String(), "192.0.2.9", 0)))
	current("a prefix routed by up0")
	rt, err = g.RouteView("boxnet")
	require.NoError(t, err)
	require.Contains(t, rt.Routed, same)
	ruleFor := func(p netip.Prefix) bool {
		c, err := nftables.New(nftables.WithNetNSFd(int(w.ns.Handle)))
		require.NoError(t, err)
		rules, err := c.GetRules(&nftables.Table{Family: nftables.TableFamilyINet, Name: "box_route"}, &nftables.Chain{Name: "forward"})
		require.NoError(t, err)
		a := p.Addr().As4()
		for _, r := range rules {
			for _, e := range r.Exprs {
				if cmp, ok := e.(*expr.Cmp); ok && bytes.Equal(cmp.Data, a[:p.Bits()/8]) {
					return true
				}
			}
		}
		return false
	}
	assert.True(t, ruleFor(same), "a drop rule for %s", same)
	require.NoError(t, w.h.RouteDel(routeVia(up, same.String(), "192.0.2.9", 0)))
	current("the prefix's route removed")
	assert.False(t, ruleFor(same), "its rule gone with it")

	// A stale set behind the watcher's back is a finding.
	c, err := nftables.New(nftables.WithNetNSFd(int(w.ns.Handle)))
	require.NoError(t, err)
	key := make([]byte, unix.IFNAMSIZ)
	copy(key, "lan0")
	require.NoError(t, c.SetAddElements(&nftables.Set{Table: &nftables.Table{Family: nftables.TableFamilyINet, Name: "box_route"}, Name: nft.UplinkSet, KeyType: nftables.TypeIFName}, []nftables.SetElement{{Key: key}}))
	require.NoError(t, c.Flush())
	f, _, err = stack.VerifyRoute(g)
	require.NoError(t, err)
	require.Len(t, f, 1)
	assert.Equal(t, model.LayerRoute, f[0].Layer)
	assert.Contains(t, f[0].Problem, "unexpected interfaces lan0")

	// Deleted: Verify says so, the watcher leaves it deleted, Ensure makes it again.
	ok, err := nft.DeleteRoute(g.NFTConfig(model.Current))
	require.NoError(t, err)
	require.True(t, ok)
	require.NoError(t, w.h.RouteAdd(routeVia(lan, "0.0.0.0/0", "192.168.30.2", 7)))
	w.waitLog(t, "table inet box_route is missing")
	present, err := nft.RoutePresent(g.NFTConfig(model.Current))
	require.NoError(t, err)
	assert.False(t, present, "the watcher does not make the table")
	f, _, err = stack.VerifyRoute(g)
	require.NoError(t, err)
	require.Len(t, f, 1)
	assert.Equal(t, "missing", f[0].Problem)
	_, err = stack.EnsureRoute(g)
	require.NoError(t, err)
	assert.Equal(t, []string{"lan0", "up0"}, w.uplinkSet(t))
}
