package stack_test

import (
	"context"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/box-isolation/box/stack/stacktest"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/box-isolation/box/drill/image"
	"github.com/box-isolation/box/fixtures/world"
	"github.com/box-isolation/box/internal/testenv"
	"github.com/box-isolation/box/stack"
	"github.com/box-isolation/box/stack/boxes"
	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/model"
	"github.com/box-isolation/box/stack/nft"
)

// The system tier runs against the hermetic world's incusd and host
// namespace. Each test starts from a bare stack and leaves one.

func worldHost(t *testing.T) (context.Context, *stack.Host, *world.State) {
	t.Helper()
	st, c := testenv.Incus(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	_, err := image.Ensure(ctx, c, image.DefaultAlias, image.Options{})
	require.NoError(t, err)
	h := &stack.Host{Incus: c, NetNS: st.Names.HostNS, Options: model.Options{DNS: []netip.Addr{world.Resolver}}}
	bare := func() {
		_, err := h.Teardown(context.Background(), true)
		require.NoError(t, err, "tearing the stack down")
	}
	bare()
	t.Cleanup(bare)
	return ctx, h, st
}

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

func nftIn(t *testing.T, st *world.State) (*nftables.Conn, nft.Config) {
	t.Helper()
	ns, err := netns.GetFromName(st.Names.HostNS)
	require.NoError(t, err)
	t.Cleanup(func() { ns.Close() })
	conn, err := nftables.New(nftables.WithNetNSFd(int(ns)))
	require.NoError(t, err)
	return conn, nft.Config{Table: "box", Bridge: "boxnet", NetNS: int(ns)}
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
	ctx, h, st := worldHost(t)
	_, ncfg := nftIn(t, st)

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
	changes, err = h.Teardown(ctx, false)
	require.NoError(t, err)
	assert.Empty(t, changes, "a second teardown is a no-op")
}

func TestSystemDriftIsFoundAndHealed(t *testing.T) {
	ctx, h, st := worldHost(t)
	_, err := h.Ensure(ctx)
	require.NoError(t, err)
	box := stacktest.Name(t, "t-drift-")
	_, err = boxes.NewManager(h).Mint(ctx, boxes.MintRequest{Name: box, Image: image.DefaultAlias})
	require.NoError(t, err)
	_, err = h.Addresses().Wait(ctx, box, 30*time.Second)
	require.NoError(t, err)

	// Five drifts, one per layer.
	conn, _ := nftIn(t, st)
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

func TestSystemSubnetChoice(t *testing.T) {
	ctx, h, st := worldHost(t)
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

func TestSystemMigrateLegacyBox(t *testing.T) {
	ctx, h, st := worldHost(t)
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
	conn, _ := nftIn(t, st)
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

// TestSystemFirewallOnly is what the boot unit runs: with both nft tables
// gone and a port's isolation off, as after a reboot, it restores them and
// touches no Incus object.
func TestSystemFirewallOnly(t *testing.T) {
	ctx, h, st := worldHost(t)
	_, err := h.Ensure(ctx)
	require.NoError(t, err)
	box := stacktest.Name(t, "t-fw-")
	_, err = boxes.NewManager(h).Mint(ctx, boxes.MintRequest{Name: box, Image: image.DefaultAlias})
	require.NoError(t, err)
	// Its lease taken (and pinned), as box new and the drill wait for.
	_, err = h.Addresses().Wait(ctx, box, 30*time.Second)
	require.NoError(t, err)
	_, ncfg := nftIn(t, st)
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

func nftNS(t *testing.T, st *world.State) int {
	t.Helper()
	ns, err := netns.GetFromName(st.Names.HostNS)
	require.NoError(t, err)
	t.Cleanup(func() { ns.Close() })
	return int(ns)
}

// TestSystemDockerForwardDrop: a Docker-style FORWARD drop policy in the
// host namespace is found by Verify and announced by Ensure, with the
// commands that let boxes out, and nothing of Docker's is changed.
func TestSystemDockerForwardDrop(t *testing.T) {
	ctx, h, st := worldHost(t)
	conn, _ := nftIn(t, st)
	filter := conn.AddTable(&nftables.Table{Family: nftables.TableFamilyIPv4, Name: "filter"})
	drop := nftables.ChainPolicyDrop
	conn.AddChain(&nftables.Chain{Name: "FORWARD", Table: filter, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &drop})
	conn.AddChain(&nftables.Chain{Name: "DOCKER-USER", Table: filter})
	require.NoError(t, conn.Flush())
	t.Cleanup(func() {
		conn.DelTable(filter)
		conn.Flush() //nolint:errcheck
	})

	rep, err := h.Ensure(ctx)
	require.NoError(t, err)
	notes := strings.Join(rep.Notes, "\n")
	assert.Contains(t, notes, "table ip filter chain FORWARD (policy drop) set by docker")
	assert.Contains(t, notes, "iptables -I DOCKER-USER -i boxnet -j ACCEPT")
	v, err := h.Verify(ctx)
	require.NoError(t, err)
	found := false
	for _, f := range v.Findings {
		if strings.Contains(f.Object, "chain FORWARD") {
			found = true
			assert.Equal(t, model.LayerNAT, f.Layer)
		}
	}
	assert.True(t, found, "Verify names the blocker: %v", v.Findings)
	chains, err := conn.ListChainsOfTableFamily(nftables.TableFamilyIPv4)
	require.NoError(t, err)
	assert.Len(t, chains, 2, "Docker's chains are untouched")

	// The operator lets boxnet through in DOCKER-USER: no more finding.
	var user *nftables.Chain
	for _, ch := range chains {
		if ch.Name == "DOCKER-USER" {
			user = ch
		}
	}
	require.NotNil(t, user)
	conn.AddRule(&nftables.Rule{Table: filter, Chain: user, Exprs: []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte("boxnet\x00")},
		&expr.Verdict{Kind: expr.VerdictAccept},
	}})
	require.NoError(t, conn.Flush())
	v, err = h.Verify(ctx)
	require.NoError(t, err)
	for _, f := range v.Findings {
		assert.NotContains(t, f.Object, "chain FORWARD", "boxnet is let through now")
	}
}
