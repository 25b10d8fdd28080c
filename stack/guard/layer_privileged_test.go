package guard

import (
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/box-isolation/box/internal/nstest"
	"github.com/box-isolation/box/internal/testenv/tier"
	"github.com/box-isolation/box/stack/hostns"
	"github.com/box-isolation/box/stack/model"
)

// guardObjects are the findings' objects, sorted as found.
func guardObjects(fs []model.Finding) []string {
	var out []string
	for _, f := range fs {
		out = append(out, f.Object+": "+f.Problem)
	}
	return out
}

// TestPrivilegedGuardLayer, in a throwaway namespace (bridge boxnet at
// 10.99.0.1/24, an uplink up0 with the default route, a link old0 that
// was one): Verify names each hook without box's build; Ensure attaches
// both programs and then has nothing to do; an uplink's program left on
// old0 is taken off; another build on the bridge (what another tool or an
// older box attached) and a deleted qdisc are named and put right;
// teardown's removal leaves no guard anywhere.
func TestPrivilegedGuardLayer(t *testing.T) {
	tier.Root(t)
	ns := nstest.New(t, "boxgl-"+nstest.RunID()+"-host")
	h := ns.Netlink(t)
	ns.AddBridge(t, model.Current.Network)
	ns.LinkUp(t, model.Current.Network)
	ns.AddAddr(t, model.Current.Network, "10.99.0.1/24")
	for _, name := range []string{"up0", "old0"} { // veth pairs: this kernel may have no dummy links
		require.NoError(t, h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: name + "p"}))
		ns.LinkUp(t, name+"p")
		ns.LinkUp(t, name)
	}
	ns.AddAddr(t, "up0", "192.0.2.2/24")
	up := ns.Link(t, "up0")
	_, def, _ := net.ParseCIDR("0.0.0.0/0")
	require.NoError(t, h.RouteAdd(&netlink.Route{LinkIndex: up.Attrs().Index, Dst: def, Gw: net.ParseIP("192.0.2.1")}))

	g, err := hostns.Open(ns.Name)
	require.NoError(t, err)
	defer g.Close()
	p := netip.MustParsePrefix("10.99.0.1/24")
	verify := func() []string {
		t.Helper()
		f, absent, err := Verify(g, p)
		require.NoError(t, err)
		assert.Empty(t, absent)
		return guardObjects(f)
	}
	assert.Equal(t, []string{"guard boxnet ingress: no guard attached", "guard up0 egress: no guard attached"}, verify())

	ch, err := Ensure(g)
	require.NoError(t, err)
	require.Len(t, ch, 2, "%v", ch)
	assert.Equal(t, "guard boxnet ingress", ch[0].Object)
	assert.Contains(t, ch[0].Detail, "attached box_guard (program id ")
	assert.Equal(t, "guard up0 egress", ch[1].Object)
	assert.Empty(t, verify())
	ch, err = Ensure(g)
	require.NoError(t, err)
	assert.Empty(t, ch, "box's build in place: nothing to do")
	hooks, err := Hooks(g)
	require.NoError(t, err)
	var bt unix.Timespec
	require.NoError(t, unix.ClockGettime(unix.CLOCK_BOOTTIME, &bt))
	for _, hook := range []string{"boxnet ingress", "up0 egress"} {
		h, ok := hooks[hook]
		assert.True(t, ok, "%s is read: %v", hook, hooks)
		assert.InDelta(t, time.Duration(bt.Nano()).Seconds(), h.Loaded.Seconds(), 10, "%s was loaded just now, on the boot-time clock", hook)
	}

	// The default route moved away from old0, which kept its program.
	b, err := buildGuard(p)
	require.NoError(t, err)
	_, err = Attach(h, "old0", b.uplink)
	require.NoError(t, err)
	ch, err = Ensure(g)
	require.NoError(t, err)
	require.Len(t, ch, 1)
	assert.Equal(t, model.Change{Object: "guard old0 egress", Action: "removed", Detail: "no default route leaves by it any more"}, ch[0])
	found, err := Find(h, "old0")
	require.NoError(t, err)
	assert.Empty(t, found)

	// Another build on the bridge: one for another gateway.
	other, err := Build(Config{Subnet: p.Masked(), Gateway: netip.MustParseAddr("10.99.0.2")})
	require.NoError(t, err)
	_, err = Attach(h, model.Current.Network, other)
	require.NoError(t, err)
	got := verify()
	require.Len(t, got, 1)
	assert.Regexp(t, `^guard boxnet ingress: program id \d+ with tag [0-9a-f]+ attached, not box's build for this bridge \(tag `+b.bridgeTag+`\)$`, got[0])
	_, err = Ensure(g)
	require.NoError(t, err)
	assert.Empty(t, verify())

	// Another tool deletes the clsact qdisc (tc qdisc del dev boxnet clsact).
	br := ns.Link(t, model.Current.Network)
	require.NoError(t, h.QdiscDel(&netlink.GenericQdisc{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: br.Attrs().Index, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT}, QdiscType: "clsact"}))
	assert.Equal(t, []string{"guard boxnet ingress: no guard attached"}, verify())
	ch, err = Ensure(g)
	require.NoError(t, err)
	assert.Len(t, ch, 1)
	assert.Empty(t, verify())

	removed, err := Remove(g)
	require.NoError(t, err)
	var objs []string
	for _, c := range removed {
		objs = append(objs, c.Object)
	}
	assert.Equal(t, "guard boxnet ingress,guard up0 egress", strings.Join(objs, ","))
	assert.Equal(t, []string{"guard boxnet ingress: no guard attached", "guard up0 egress: no guard attached"}, verify())
}

// No bridge, or a bridge with no address yet (at boot, before Incus), is
// nothing to attach to.
func TestPrivilegedGuardLayerNoBridge(t *testing.T) {
	tier.Root(t)
	ns := nstest.New(t, "boxgn-"+nstest.RunID()+"-host")
	g, err := hostns.Open(ns.Name)
	require.NoError(t, err)
	defer g.Close()
	ch, err := Ensure(g)
	require.NoError(t, err)
	assert.Empty(t, ch)
	ns.AddBridge(t, model.Current.Network)
	ch, err = Ensure(g)
	require.NoError(t, err)
	assert.Empty(t, ch)
}
