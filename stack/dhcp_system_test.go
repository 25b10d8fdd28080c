package stack_test

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/box-isolation/box/stack/stacktest"

	"github.com/box-isolation/box/stack/boxes"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/drill/image"
	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/model"
	"github.com/box-isolation/box/stack/nft"
)

// L-DHCP's fixed addresses: a box minted before box stored them is given
// the one it leases, and a clone and a restored box get their own.

// TestSystemDHCPConversion: a box minted before box stored addresses
// (here: made on the stack as it was, with no fixed address and the
// bridge's DHCP open to all) keeps its address and its traffic across
// setup-host, which gives it that address as its fixed one before the
// bridge's DHCP answers known clients only; it keeps it across its
// renewal too.
func TestSystemDHCPConversion(t *testing.T) {
	ctx, h, st := worldHost(t)
	_, err := h.Ensure(ctx)
	require.NoError(t, err)
	// The stack as it was: no DHCP lines.
	n, etag, err := h.Incus.Networks().Get(ctx, model.Current.Network)
	require.NoError(t, err)
	old := n.Config["raw.dnsmasq"]
	for _, l := range []string{"dhcp-ignore=tag:!known\n", "dhcp-ignore-clid\n"} {
		old = strings.Replace(old, l, "", 1)
	}
	n.Config["raw.dnsmasq"] = old
	require.NoError(t, h.Incus.Networks().Update(ctx, model.Current.Network, incus.NetworkPut{Description: n.Description, Config: n.Config}, etag))
	// A box as box minted it then: the profile's NIC, a dynamic lease.
	name := stacktest.Name(t, "t-dhcp-old-")
	t.Cleanup(func() { _ = boxes.NewManager(h).Remove(context.Background(), name) })
	fp, err := image.Ensure(ctx, h.Incus, image.DefaultAlias, image.Options{})
	require.NoError(t, err)
	require.NoError(t, h.Incus.Instances().Create(ctx, incus.InstancesPost{Name: name, Type: model.TypeContainer,
		Config: map[string]string{model.Current.Tag: "1"}, Profiles: []string{model.Current.Profile},
		Source: incus.InstanceSource{Type: "image", Fingerprint: fp.Fingerprint}, Start: true}))
	// Waited for as Incus sees it: box's own wait refreshes the pins,
	// which gives a box without a fixed address one (this test is of
	// setup-host's).
	ip, err := h.Incus.Instances().WaitAddress(ctx, name, netip.MustParsePrefix(n.Config["ipv4.address"]).Masked(), 30*time.Second)
	require.NoError(t, err)
	box := boxAt(t, ctx, h, name, ip)
	inst, _, err := h.Incus.Instances().Get(ctx, name)
	require.NoError(t, err)
	require.Empty(t, inst.ExpandedDevices["eth0"]["ipv4.address"], "minted with no fixed address")
	// The pins as they were: the lease's address.
	_, nc := nftIn(t, st)
	port := inst.Config["volatile.eth0.host_name"]
	_, err = nft.SetPins(nc, []string{port}, []nft.Pin{{Port: port, MAC: box.mac, Addrs: []netip.Addr{box.ip}}})
	require.NoError(t, err)
	require.Contains(t, box.greet(t), "BOXWORLD canary")
	v, err := h.Verify(ctx)
	require.NoError(t, err)
	var dhcp []string
	for _, f := range v.Findings {
		if f.Layer == model.LayerDHCP {
			dhcp = append(dhcp, f.String())
		}
	}
	assert.Len(t, dhcp, 2, "doctor names the missing DHCP lines and the box without a fixed address: %v", dhcp)

	rep, err := h.Ensure(ctx)
	require.NoError(t, err)
	var changes []string
	for _, c := range rep.Changes {
		changes = append(changes, c.String())
	}
	assert.Contains(t, changes, "updated box "+name+": fixed address "+box.ip.String(), "the address it leased")
	inst, _, err = h.Incus.Instances().Get(ctx, name)
	require.NoError(t, err)
	assert.Equal(t, box.ip.String(), inst.ExpandedDevices["eth0"]["ipv4.address"])
	n, _, err = h.Incus.Networks().Get(ctx, model.Current.Network)
	require.NoError(t, err)
	assert.Contains(t, n.Config["raw.dnsmasq"], "dhcp-ignore=tag:!known\ndhcp-ignore-clid\n")
	assert.Contains(t, box.greet(t), "BOXWORLD canary", "its traffic goes on across the switch")
	assert.Equal(t, box.ip, box.renew(t), "it keeps its address when it renews")
	assert.Contains(t, box.greet(t), "BOXWORLD canary", "and its traffic")
	v, err = h.Verify(ctx)
	require.NoError(t, err)
	for _, f := range v.Findings {
		assert.True(t, f.Advisory, "converged: %s", f)
	}
	require.NotNil(t, v.Pool)
	t.Logf("%s", v.Pool)
	assert.Equal(t, 253, v.Pool.Size)
}

// TestSystemDHCPFixedAddresses: a minted box, its clone, and a box
// restored to a snapshot its clone carried each get a fixed address of
// their own, and the bridge's DHCP (known clients only) gives each its
// own; Verify finds every box on the stack.
func TestSystemDHCPFixedAddresses(t *testing.T) {
	ctx, h, _ := worldHost(t)
	_, err := h.Ensure(ctx)
	require.NoError(t, err)
	a := mintDHCPBox(t, ctx, h, "t-dhcp-a-")
	fixed := func(name string) netip.Addr {
		inst, _, err := h.Incus.Instances().Get(ctx, name)
		require.NoError(t, err)
		ad, _ := netip.ParseAddr(inst.ExpandedDevices["eth0"]["ipv4.address"])
		return ad
	}
	assert.Equal(t, a.ip, fixed(a.name), "a minted box holds the address box stored for it")
	require.NoError(t, boxes.NewManager(h).Stop(ctx, a.name, false))
	_, err = boxes.NewManager(h).Snapshot(ctx, a.name, "s1")
	require.NoError(t, err)
	require.NoError(t, boxes.NewManager(h).Start(ctx, a.name))

	clone := stacktest.Name(t, "t-dhcp-c-")
	t.Cleanup(func() { _ = boxes.NewManager(h).Remove(context.Background(), clone) })
	_, err = boxes.NewManager(h).Clone(ctx, a.name, "", clone)
	require.NoError(t, err)
	c := openDHCPBox(t, ctx, h, clone)
	assert.Equal(t, c.ip, fixed(clone), "the clone holds its own stored address")
	assert.NotEqual(t, a.ip, c.ip)
	assert.Contains(t, c.greet(t), "BOXWORLD canary")

	// The clone's copy of s1 holds a's address: restored, the clone gets
	// its own again.
	require.NoError(t, boxes.NewManager(h).Stop(ctx, clone, false))
	require.NoError(t, boxes.NewManager(h).Restore(ctx, clone, "s1"))
	require.NoError(t, boxes.NewManager(h).Start(ctx, clone))
	c = openDHCPBox(t, ctx, h, clone)
	assert.NotEqual(t, a.ip, fixed(clone), "not its source's")
	assert.Equal(t, fixed(clone), c.ip, "it leases the address it holds")
	assert.Contains(t, c.greet(t), "BOXWORLD canary")
	a = openDHCPBox(t, ctx, h, a.name)
	assert.Equal(t, fixed(a.name), a.ip, "a keeps its own")
	assert.Contains(t, a.greet(t), "BOXWORLD canary")

	v, err := h.Verify(ctx)
	require.NoError(t, err)
	for _, f := range v.Findings {
		assert.True(t, f.Advisory, "%s", f)
	}
}
