package stack_test

import (
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/box-isolation/box/stack/stacktest/worldtest"

	"github.com/google/nftables"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"

	"github.com/box-isolation/box/drill/image"
	"github.com/box-isolation/box/fixtures/world"
	"github.com/box-isolation/box/stack/boxes"
	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/model"
	"github.com/box-isolation/box/stack/stacktest"
)

func TestSystemDriftIsFoundAndHealed(t *testing.T) {
	ctx, h, st := worldtest.Host(t)
	_, err := h.Ensure(ctx)
	require.NoError(t, err)
	box := stacktest.Name(t, "t-drift-")
	_, err = boxes.NewManager(h).Mint(ctx, boxes.MintRequest{Name: box, Image: image.DefaultAlias})
	require.NoError(t, err)
	_, err = h.Addresses().Wait(ctx, box, 30*time.Second)
	require.NoError(t, err)

	// Five drifts, one per layer.
	conn, _ := worldtest.NFT(t, st)
	conn.DelTable(&nftables.Table{Family: nftables.TableFamilyBridge, Name: "box"})
	require.NoError(t, conn.Flush(), "deleting the bridge drop table")
	conn.DelTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: "box_route"})
	require.NoError(t, conn.Flush(), "deleting the route table")

	p, etag, err := h.Incus.Profile(ctx, "box-net")
	require.NoError(t, err)
	p.Devices["eth0"]["security.port_isolation"] = "false"
	require.NoError(t, h.Incus.UpdateProfile(ctx, "box-net", *p, etag))

	n, etag, err := h.Incus.Networks().Get(ctx, "boxnet")
	require.NoError(t, err)
	n.Config["dns.mode"] = "managed"
	require.NoError(t, h.Incus.Networks().Update(ctx, "boxnet", incus.NetworkPut{Description: n.Description, Config: n.Config}, etag))

	nl := hostNetlink(t, st)
	br, err := nl.LinkByName("boxnet")
	require.NoError(t, err)
	require.NoError(t, world.Do(st.Names.HostNS, func() error {
		return os.WriteFile("/proc/sys/net/ipv6/conf/boxnet/disable_ipv6", []byte("0"), 0o644)
	}))
	v6 := &netlink.Addr{IPNet: &net.IPNet{IP: net.ParseIP("2001:db8:b0::1"), Mask: net.CIDRMask(64, 128)}}
	require.NoError(t, nl.AddrAdd(br, v6))

	v, err := h.Verify(ctx)
	require.NoError(t, err)
	layers := map[model.LayerID]bool{}
	for _, f := range v.Findings {
		layers[f.Layer] = true
		assert.NotEmpty(t, f.Fix, "finding %s names its fix", f)
		t.Logf("finding: %s", f)
	}
	for _, l := range []model.LayerID{model.LayerBridgeDrop, model.LayerPortIso, model.LayerDNS, model.LayerV6, model.LayerRoute} {
		assert.True(t, layers[l], "Verify names the %s drift", l)
	}

	rep, err := h.Ensure(ctx)
	require.NoError(t, err)
	var changed []string
	for _, c := range rep.Changes {
		changed = append(changed, c.String())
	}
	all := strings.Join(changed, "\n")
	t.Logf("repairs:\n%s", all)
	// Incus rebuilds the bridge when dns.mode changes, which may itself
	// take the stray address away; what matters is that it is gone.
	for _, want := range []string{"security.port_isolation", "dns.mode", "bridge box", "inet box_route"} {
		assert.Contains(t, all, want)
	}
	addrs, err := nl.AddrList(br, netlink.FAMILY_V6)
	require.NoError(t, err)
	for _, a := range addrs {
		assert.False(t, a.IP.Equal(v6.IP), "the IPv6 address is still on boxnet")
	}
	v, err = h.Verify(ctx)
	require.NoError(t, err)
	assert.Empty(t, v.Findings, "clean after the repair")
}
