package stack_test

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/box-isolation/box/stack/stacktest"

	"github.com/google/nftables"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
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

// The stack on a cluster runs against the cluster world (testenv.Cluster):
// hosts[0] is member 1 (box setup-host, reading the others through their
// namespaces), hosts[1:] the other members (box setup-host --member-only
// on each, with its own socket and namespace).

func clusterHosts(t *testing.T) (context.Context, []*stack.Host, *world.State) {
	t.Helper()
	st := testenv.Cluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	t.Cleanup(cancel)
	opts := model.Options{DNS: []netip.Addr{world.Resolver}}
	var hosts []*stack.Host
	for i, m := range st.Members {
		h := &stack.Host{Incus: incus.New(m.IncusSocket), NetNS: m.Name, Options: opts}
		if i == 0 {
			h.Members.NetNS = st.MemberNetNS()
		} else {
			h.Members.Only = true
		}
		hosts = append(hosts, h)
	}
	bare := func() {
		_, err := hosts[0].Teardown(context.Background(), true)
		require.NoError(t, err, "tearing the stack down")
		for _, m := range st.Members {
			assert.Empty(t, nftTables(t, m.Name), "member %s keeps nft tables of box's", m.Name)
		}
	}
	bare()
	t.Cleanup(bare)
	return ctx, hosts, st
}

// nftTables lists the tables of box's in a member's namespace.
func nftTables(t *testing.T, ns string) []string {
	t.Helper()
	h, err := netns.GetFromName(ns)
	require.NoError(t, err)
	defer h.Close()
	conn, err := nftables.New(nftables.WithNetNSFd(int(h)))
	require.NoError(t, err)
	defer conn.CloseLasting()
	ts, err := conn.ListTables()
	require.NoError(t, err)
	var out []string
	for _, tb := range ts {
		if strings.HasPrefix(tb.Name, model.Current.NFTTable) {
			out = append(out, tb.Name)
		}
	}
	return out
}

func changesOf(rep *stack.Report) string {
	var out []string
	for _, c := range rep.Changes {
		out = append(out, c.String())
	}
	return strings.Join(out, "\n")
}

func membersByName(ms []stack.MemberLayers) map[string]stack.MemberLayers {
	out := map[string]stack.MemberLayers{}
	for _, m := range ms {
		out[m.Member] = m
	}
	return out
}

func TestSystemClusterStack(t *testing.T) {
	ctx, hosts, st := clusterHosts(t)
	names := make([]string, len(st.Members))
	for i, m := range st.Members {
		names[i] = m.Name
	}
	m1, m2, m3 := names[0], names[1], names[2]

	// Member 1 makes the cluster's objects and its own layers, and reads
	// the others: not converged yet.
	rep, err := hosts[0].Ensure(ctx)
	require.NoError(t, err)
	all := changesOf(rep)
	t.Logf("member 1's first ensure:\n%s\nnotes: %v", all, rep.Notes)
	for _, want := range []string{"created acl box-isolate", "created network boxnet", "created profile box-net", "nft"} {
		assert.Contains(t, all, want)
	}
	byName := membersByName(rep.Members)
	require.Len(t, byName, len(names), "one entry per member: %+v", rep.Members)
	assert.Equal(t, stack.MemberConverged, byName[m1].State)
	assert.True(t, byName[m1].Local)
	for _, m := range names[1:] {
		assert.Equal(t, stack.MemberFindings, byName[m].State, "member %s has no nft tables yet", m)
		assert.NotEmpty(t, byName[m].Findings)
	}
	slices := map[string]netip.Prefix{}
	for _, m := range names {
		p, err := netip.ParsePrefix(byName[m].Slice)
		require.NoError(t, err, "member %s has a slice", m)
		assert.True(t, rep.Subnet.Subnet.Contains(p.Addr()), "member %s's slice %s is in %s", m, p, rep.Subnet.Subnet)
		for other, q := range slices {
			assert.False(t, p.Overlaps(q), "members %s and %s share addresses", m, other)
		}
		slices[m] = p
	}

	// Every other member converges its own layers, and only those.
	for i, h := range hosts[1:] {
		rep, err := h.Ensure(ctx)
		require.NoError(t, err, "member-only ensure on %s", names[i+1])
		all := changesOf(rep)
		assert.Contains(t, all, "nft", "member %s's nft tables", names[i+1])
		assert.NotContains(t, all, "network boxnet", "a member-only run leaves the cluster's objects alone")
		assert.NotContains(t, all, "profile", "a member-only run leaves the cluster's objects alone")
	}
	for _, m := range names {
		assert.NotEmpty(t, nftTables(t, m), "member %s has box's nft tables", m)
	}

	// A second run of each changes nothing.
	for i, h := range hosts {
		rep, err := h.Ensure(ctx)
		require.NoError(t, err)
		assert.Empty(t, rep.Changes, "a second ensure on %s changes nothing", names[i])
		if i == 0 {
			for _, ml := range rep.Members {
				assert.Contains(t, []string{stack.MemberConverged, stack.MemberClean}, ml.State, "member %s: %v", ml.Member, ml.Findings)
			}
		}
	}
	v, err := hosts[0].Verify(ctx)
	require.NoError(t, err)
	assert.Empty(t, v.Findings)
	require.Len(t, v.Members, len(names))
	for _, ml := range v.Members {
		assert.Equal(t, stack.MemberClean, ml.State, "member %s", ml.Member)
	}
	require.NotNil(t, v.Cluster)
	assert.Equal(t, m1, v.Cluster.Local)

	// Member 2 loses its inet table: Verify names member 2, and only it.
	require.NoError(t, world.Do(m2, func() error {
		conn, err := nftables.New()
		if err != nil {
			return err
		}
		conn.DelTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: model.Current.NFTTable})
		return conn.Flush()
	}), "deleting member 2's inet table")
	v, err = hosts[0].Verify(ctx)
	require.NoError(t, err)
	require.NotEmpty(t, v.Findings, "Verify misses member 2's missing table")
	for _, f := range v.Findings {
		t.Logf("finding: %s", f)
		assert.Equal(t, m2, f.Member, "finding %s", f)
		for _, other := range []string{m1, m3} {
			assert.NotContains(t, f.String(), other, "a finding about member 2 names %s", other)
		}
	}
	byName = membersByName(v.Members)
	assert.Equal(t, stack.MemberFindings, byName[m2].State)
	assert.Equal(t, stack.MemberClean, byName[m1].State)
	assert.Equal(t, stack.MemberClean, byName[m3].State)

	// Member 1's ensure is not member 2's: it says so and leaves it.
	rep, err = hosts[0].Ensure(ctx)
	require.NoError(t, err)
	assert.Empty(t, rep.Changes)
	byName = membersByName(rep.Members)
	assert.Equal(t, stack.MemberFindings, byName[m2].State, "member 1's report says member 2's layers are not in place")
	assert.NotEmpty(t, byName[m2].Findings)
	inet, _, err := nft.Present(nftConfigIn(t, m2))
	require.NoError(t, err)
	assert.False(t, inet, "member 1's ensure put member 2's table back")

	// Member 2's own member-only run does.
	rep, err = hosts[1].Ensure(ctx)
	require.NoError(t, err)
	assert.Contains(t, changesOf(rep), "nft")
	inet, _, err = nft.Present(nftConfigIn(t, m2))
	require.NoError(t, err)
	assert.True(t, inet, "member 2's table is back")
	v, err = hosts[0].Verify(ctx)
	require.NoError(t, err)
	assert.Empty(t, v.Findings)
}

// nftConfigIn addresses the stack's tables in a member's namespace.
func nftConfigIn(t *testing.T, ns string) nft.Config {
	t.Helper()
	h, err := netns.GetFromName(ns)
	require.NoError(t, err)
	t.Cleanup(func() { h.Close() })
	return nft.Config{Table: model.Current.NFTTable, Bridge: model.Current.Network, NetNS: int(h)}
}

// TestSystemClusterStackBoxes: a box minted on member 2 gets a fixed
// address from member 2's slice, Verify stays clean, and Teardown with
// the boxes removes it and the stack from every member.
func TestSystemClusterStackBoxes(t *testing.T) {
	ctx, hosts, st := clusterHosts(t)
	_, err := image.Ensure(ctx, hosts[0].Incus, image.DefaultAlias, image.Options{})
	require.NoError(t, err)
	for _, h := range hosts {
		_, err := h.Ensure(ctx)
		require.NoError(t, err)
	}
	m2 := st.Members[1].Name
	box := stacktest.Name(t, "cb-")
	_, err = boxes.NewManager(hosts[0]).Mint(ctx, boxes.MintRequest{Name: box, Image: image.DefaultAlias, Target: m2})
	require.NoError(t, err)
	inst, _, err := hosts[0].Incus.Instances().Get(ctx, box)
	require.NoError(t, err)
	assert.Equal(t, m2, inst.Location)
	addr, err := netip.ParseAddr(inst.ExpandedDevices["eth0"]["ipv4.address"])
	require.NoError(t, err, "the box has a fixed address")
	n, _, err := hosts[0].Incus.Networks().Get(ctx, model.Current.Network)
	require.NoError(t, err)
	slice := netip.MustParsePrefix(n.Config["user.box.slice."+m2])
	assert.True(t, slice.Contains(addr), "%s is in member 2's slice %s", addr, slice)
	got, err := hosts[0].Addresses().Wait(ctx, box, time.Minute)
	require.NoError(t, err)
	assert.Equal(t, addr, got, "member 2's dnsmasq leases it its fixed address")

	v, err := hosts[0].Verify(ctx)
	require.NoError(t, err)
	for _, f := range v.Findings {
		t.Errorf("finding: %s", f)
	}

	changes, err := hosts[0].Teardown(ctx, true)
	require.NoError(t, err)
	var done []string
	for _, c := range changes {
		done = append(done, c.String())
	}
	t.Logf("teardown:\n%s", strings.Join(done, "\n"))
	assert.Contains(t, done, "removed box "+box)
	_, _, err = hosts[0].Incus.Instances().Get(ctx, box)
	assert.True(t, incus.IsNotFound(err), "the box is gone: %v", err)
	assert.Empty(t, objects(t, ctx, hosts[0].Incus))
	for _, m := range st.Members {
		assert.Empty(t, nftTables(t, m.Name), "member %s keeps nft tables of box's", m.Name)
	}
	changes, err = hosts[0].Teardown(ctx, true)
	require.NoError(t, err)
	assert.Empty(t, changes, "a second teardown is a no-op")
}
