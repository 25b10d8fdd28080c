package stack_test

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/box-isolation/box/stack/stacktest/worldtest"

	"github.com/google/nftables"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netns"

	"github.com/box-isolation/box/drill/image"
	"github.com/box-isolation/box/fixtures/world"
	"github.com/box-isolation/box/stack"
	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/nft"
	"github.com/box-isolation/box/stack/stacktest"
)

func TestSystemMigrateLegacyBox(t *testing.T) {
	ctx, h, st := worldtest.Host(t)
	c := h.Incus
	// A legacy stack and a legacy box on it.
	require.NoError(t, c.Networks().Create(ctx, incus.NetworksPost{Name: "claudenet", Type: "bridge", Config: map[string]string{
		"ipv4.address": "10.87.0.1/24", "ipv4.nat": "true", "ipv6.address": "none",
	}}))
	require.NoError(t, c.CreateProfile(ctx, incus.Profile{Name: "claude-dev", Devices: map[string]map[string]string{
		"eth0": {"type": "nic", "network": "claudenet", "name": "eth0"},
		"root": {"type": "disk", "path": "/", "pool": "default"},
	}}))
	// The legacy firewall script's own nft table.
	conn, _ := worldtest.NFT(t, st)
	conn.AddTable(&nftables.Table{Family: nftables.TableFamilyBridge, Name: "claudebox"})
	require.NoError(t, conn.Flush())
	name := stacktest.Name(t, "t-legacy-")
	require.NoError(t, c.Instances().Create(ctx, incus.InstancesPost{
		Name: name, Type: "container", Start: true, Profiles: []string{"claude-dev"},
		Config: map[string]string{"user.claudebox": "1"},
		Source: incus.InstanceSource{Type: "image", Alias: image.DefaultAlias},
	}))
	require.NoError(t, c.Instances().PushFile(ctx, name, "/root/keep", strings.NewReader("written before the move\n"), 0o600, 0, 0))

	boxes, err := stack.Boxes(ctx, h.Incus)
	require.NoError(t, err)
	require.Len(t, boxes, 1)
	assert.Equal(t, "legacy", boxes[0].Generation)

	changes, err := h.Migrate(ctx, stack.MigrateRequest{AllBoxes: true})
	require.NoError(t, err)
	require.Len(t, changes, 1)

	inst, _, err := c.Instances().Get(ctx, name)
	require.NoError(t, err)
	assert.Equal(t, []string{"box-net"}, inst.Profiles)
	assert.Equal(t, "1", inst.Config["user.box"])
	assert.Equal(t, "1", inst.Config["user.claudebox"], "the legacy tag is honoured, not removed")
	got, err := c.Instances().PullFile(ctx, name, "/root/keep")
	require.NoError(t, err)
	assert.Equal(t, "written before the move\n", string(got))
	ip, err := h.Addresses().Wait(ctx, name, 30*time.Second)
	require.NoError(t, err)
	assert.True(t, netip.MustParsePrefix("10.88.0.0/24").Contains(ip), "a boxnet address: %s", ip)

	v, err := h.Verify(ctx)
	require.NoError(t, err)
	var legacy []string
	for _, f := range v.Findings {
		legacy = append(legacy, f.Object)
	}
	assert.Contains(t, legacy, "nft table bridge claudebox", "Verify names the legacy firewall")

	changes, err = h.Migrate(ctx, stack.MigrateRequest{RetireLegacy: true})
	require.NoError(t, err)
	assert.Len(t, changes, 3, "profile, network and the legacy nft table retired: %v", changes)
	_, legacyBridge, err := nft.Present(nft.Config{Table: "claudebox", Bridge: "claudenet", NetNS: nftNS(t, st)})
	require.NoError(t, err)
	assert.False(t, legacyBridge, "the legacy nft table is gone")
	for _, o := range objects(t, ctx, c) {
		assert.NotContains(t, o, "claude", "legacy object left: %s", o)
	}
}

func nftNS(t *testing.T, st *world.State) int {
	t.Helper()
	ns, err := netns.GetFromName(st.Names.HostNS)
	require.NoError(t, err)
	t.Cleanup(func() { ns.Close() })
	return int(ns)
}
