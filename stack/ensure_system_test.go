package stack_test

import (
	"context"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/box-isolation/box/stack/stacktest/worldtest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/box-isolation/box/drill/image"
	"github.com/box-isolation/box/fixtures/world"
	"github.com/box-isolation/box/stack/boxes"
	"github.com/box-isolation/box/stack/guard"
	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/model"
	"github.com/box-isolation/box/stack/nft"
	"github.com/box-isolation/box/stack/stacktest"
)

// The system tier runs against the hermetic world's incusd and host
// namespace. Each test starts from a bare stack and leaves one.

func hostNetlink(t *testing.T, st *world.State) *netlink.Handle {
	t.Helper()
	ns, err := netns.GetFromName(st.Names.HostNS)
	require.NoError(t, err)
	t.Cleanup(func() { ns.Close() })
	h, err := netlink.NewHandleAt(ns)
	require.NoError(t, err)
	t.Cleanup(h.Close)
	return h
}

func objects(t *testing.T, ctx context.Context, c *incus.Client) []string {
	t.Helper()
	var out []string
	for _, gen := range []model.Generation{model.Current, model.Legacy} {
		if _, _, err := c.Networks().Get(ctx, gen.Network); err == nil {
			out = append(out, "network "+gen.Network)
		}
		if _, _, err := c.Profile(ctx, gen.Profile); err == nil {
			out = append(out, "profile "+gen.Profile)
		}
		if _, _, err := c.Networks().ACL(ctx, gen.ACL); err == nil {
			out = append(out, "acl "+gen.ACL)
		}
	}
	return out
}

func TestSystemEnsureVerifyTeardown(t *testing.T) {
	ctx, h, st := worldtest.Host(t)
	_, ncfg := worldtest.NFT(t, st)

	rep, err := h.Ensure(ctx)
	require.NoError(t, err)
	var objs []string
	for _, c := range rep.Changes {
		objs = append(objs, c.String())
	}
	joined := strings.Join(objs, "\n")
	for _, want := range []string{"created acl box-isolate", "created network boxnet", "created profile box-net"} {
		assert.Contains(t, joined, want)
	}
	assert.Contains(t, joined, "nft", "the nft tables were applied")
	assert.Equal(t, "10.88.0.0/24", rep.Subnet.Subnet.String())
	t.Logf("first ensure: %d changes, bridge mode %s, notes %v", len(rep.Changes), rep.BridgeMode, rep.Notes)

	again, err := h.Ensure(ctx)
	require.NoError(t, err)
	assert.Empty(t, again.Changes, "a second Ensure changes nothing")

	v, err := h.Verify(ctx)
	require.NoError(t, err)
	assert.Empty(t, v.Findings)
	assert.NotZero(t, v.DnsmasqPID, "a dnsmasq process serves boxnet")

	changes, err := h.Teardown(ctx, false)
	require.NoError(t, err)
	assert.NotEmpty(t, changes)
	assert.Empty(t, objects(t, ctx, h.Incus), "no object of either generation is left in Incus")
	inet, bridge, err := nft.Present(ncfg)
	require.NoError(t, err)
	assert.False(t, inet || bridge, "no nft table is left")
	onUplink, err := guard.Find(hostNetlink(t, st), st.Names.Uplink)
	require.NoError(t, err)
	assert.Empty(t, onUplink, "no guard is left on the uplink (the bridge's went with the bridge)")
	changes, err = h.Teardown(ctx, false)
	require.NoError(t, err)
	assert.Empty(t, changes, "a second teardown is a no-op")
}

func TestSystemSubnetChoice(t *testing.T) {
	ctx, h, st := worldtest.Host(t)
	nl := hostNetlink(t, st)
	// Something in the world claims 10.88.0.0/24: a connected route.
	// (A veth pair: this kernel has no dummy links.)
	claimer := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "bxclaim"}, PeerName: "bxclaim-p"}
	require.NoError(t, nl.LinkAdd(claimer))
	t.Cleanup(func() { nl.LinkDel(claimer) }) //nolint:errcheck
	require.NoError(t, nl.AddrAdd(claimer, &netlink.Addr{IPNet: &net.IPNet{IP: net.ParseIP("10.88.0.200").To4(), Mask: net.CIDRMask(24, 32)}}))
	require.NoError(t, nl.LinkSetUp(claimer))

	rep, err := h.Ensure(ctx)
	require.NoError(t, err)
	assert.Equal(t, "10.89.0.0/24", rep.Subnet.Subnet.String())
	assert.True(t, rep.Subnet.Auto)
	assert.Contains(t, strings.Join(rep.Notes, "\n"), "10.88.0.0/24 is claimed by", "the pick is announced")
	_, err = h.Teardown(ctx, false)
	require.NoError(t, err)

	pinned := *h
	pinned.Options.Subnet = netip.MustParsePrefix("10.88.0.0/24")
	_, err = pinned.Ensure(ctx)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "BOX_SUBNET=10.88.0.0/24 is already claimed by")
	assert.Contains(t, err.Error(), "bxclaim")
	assert.Empty(t, objects(t, ctx, h.Incus), "a refused Ensure creates nothing")
}

// TestSystemFirewallOnly is what the boot unit runs: with both nft tables
// gone and a port's isolation off, as after a reboot, it restores them and
// touches no Incus object.
func TestSystemFirewallOnly(t *testing.T) {
	ctx, h, st := worldtest.Host(t)
	_, err := h.Ensure(ctx)
	require.NoError(t, err)
	box := stacktest.Name(t, "t-fw-")
	_, err = boxes.NewManager(h).Mint(ctx, boxes.MintRequest{Name: box, Image: image.DefaultAlias})
	require.NoError(t, err)
	// Its lease taken (and pinned), as box new and the drill wait for.
	_, err = h.Addresses().Wait(ctx, box, 30*time.Second)
	require.NoError(t, err)
	_, ncfg := worldtest.NFT(t, st)
	_, err = nft.Delete(ncfg)
	require.NoError(t, err)
	nl := hostNetlink(t, st)
	br, err := nl.LinkByName("boxnet")
	require.NoError(t, err)
	links, err := nl.LinkList()
	require.NoError(t, err)
	for _, l := range links {
		if l.Attrs().MasterIndex == br.Attrs().Index {
			require.NoError(t, nl.LinkSetIsolated(l, false))
		}
	}
	netBefore, _, err := h.Incus.Networks().Get(ctx, "boxnet")
	require.NoError(t, err)

	rep, err := h.EnsureFirewall(ctx)
	require.NoError(t, err)
	assert.NotEmpty(t, rep.Changes)
	v, err := h.Verify(ctx)
	require.NoError(t, err)
	assert.Empty(t, v.Findings, "clean after the firewall-only run")
	netAfter, _, err := h.Incus.Networks().Get(ctx, "boxnet")
	require.NoError(t, err)
	assert.Equal(t, netBefore.Config, netAfter.Config, "no Incus object touched")

	again, err := h.EnsureFirewall(ctx)
	require.NoError(t, err)
	assert.Empty(t, again.Changes)
}
