package stack_test

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/box-isolation/box/stack/stacktest"

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

// The cluster system tier runs against a cluster world (testenv.Cluster):
// BOX_CLUSTER_STATE=/run/box-world/NAME/state.json go test ./stack -run
// TestSystemCluster. Each test converges the stack on every member (the
// stack stays: it is the cluster world's, and Ensure is idempotent) and
// removes every box it made; their names start with ca-.

// clusterWorld is the cluster world's stack, converged on every member:
// the host as box sees it from the first member (reading the others'
// layers through their namespaces), and the world.
func clusterWorld(t *testing.T) (context.Context, *stack.Host, *world.State) {
	t.Helper()
	st := testenv.Cluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	c := incus.New(st.IncusSocket)
	_, err := image.Ensure(ctx, c, image.DefaultAlias, image.Options{})
	require.NoError(t, err)
	opts := model.Options{DNS: []netip.Addr{world.Resolver}}
	h := &stack.Host{Incus: c, NetNS: st.Names.HostNS, Options: opts, Members: stack.Membership{NetNS: st.MemberNetNS()}}
	_, err = h.Ensure(ctx)
	require.NoError(t, err)
	for _, m := range st.Members[1:] {
		_, err := (&stack.Host{Incus: incus.New(m.IncusSocket), NetNS: m.Name, Options: opts, Members: stack.Membership{Only: true}}).Ensure(ctx)
		require.NoError(t, err, "member %s", m.Name)
	}
	return ctx, h, st
}

// removeAtEnd removes boxes when the test ends, through box (so their
// ports leave every member's sets), whatever state they are in.
func removeAtEnd(t *testing.T, h *stack.Host, names ...string) {
	t.Helper()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		for _, n := range names {
			var nsb *stack.NoSuchBoxError
			if err := boxes.NewManager(h).Remove(ctx, n); err != nil && !errors.As(err, &nsb) {
				t.Errorf("removing %s: %v", n, err)
			}
		}
	})
}

// memberSlices reads the members' address slices from the bridge.
func memberSlices(t *testing.T, ctx context.Context, h *stack.Host) map[string]netip.Prefix {
	t.Helper()
	n, _, err := h.Incus.Networks().Get(ctx, model.Current.Network)
	require.NoError(t, err)
	out := map[string]netip.Prefix{}
	for k, v := range n.Config {
		if m, ok := strings.CutPrefix(k, "user.box.slice."); ok {
			out[m] = netip.MustParsePrefix(v)
		}
	}
	return out
}

// fixedAddress is the fixed address of a box's NIC.
func fixedAddress(t *testing.T, ctx context.Context, h *stack.Host, name string) (netip.Addr, *incus.Instance) {
	t.Helper()
	inst, _, err := h.Incus.Instances().Get(ctx, name)
	require.NoError(t, err)
	a, err := netip.ParseAddr(inst.ExpandedDevices["eth0"]["ipv4.address"])
	require.NoError(t, err, "%s has a fixed address", name)
	return a, inst
}

// memberPorts lists a member's ports on boxnet and the bridge drop's port
// set there.
func memberPorts(t *testing.T, member string) (ports, set []string) {
	t.Helper()
	ns, err := netns.GetFromName(member)
	require.NoError(t, err)
	defer ns.Close()
	nh, err := netlink.NewHandleAt(ns)
	require.NoError(t, err)
	defer nh.Close()
	br, err := nh.LinkByName(model.Current.Network)
	require.NoError(t, err)
	links, err := nh.LinkList()
	require.NoError(t, err)
	for _, l := range links {
		if l.Attrs().MasterIndex == br.Attrs().Index {
			ports = append(ports, l.Attrs().Name)
		}
	}
	set, _, err = nft.PortSetMembers(nft.Config{Table: model.Current.NFTTable, Bridge: model.Current.Network, NetNS: int(ns)})
	require.NoError(t, err)
	return ports, set
}

// assertClean asserts Verify finds nothing, having read every member.
func assertClean(t *testing.T, ctx context.Context, h *stack.Host) {
	t.Helper()
	v, err := h.Verify(ctx)
	require.NoError(t, err)
	for _, f := range v.Findings {
		// Advisory: a lease that outlived its instance, which goes at its
		// expiry (L-DHCP), is no layer gone.
		assert.True(t, f.Advisory, "%s", f)
	}
	for _, m := range v.Members {
		assert.Equal(t, stack.MemberClean, m.State, "member %s's layers were read and are clean", m.Member)
	}
}

// A box minted on each member gets a fixed address of that member's
// slice, no two alike; it is placed there, leases that address, runs
// commands and stops and starts from the member box runs on; removed, it
// leaves no port on its member.
func TestSystemClusterMintOnEveryMember(t *testing.T) {
	ctx, h, st := clusterWorld(t)
	sl := memberSlices(t, ctx, h)
	var names []string
	for range st.Members {
		names = append(names, stacktest.Name(t, "ca-mint-"))
	}
	removeAtEnd(t, h, names...)

	seen := map[netip.Addr]string{}
	for i, m := range st.Members {
		start := time.Now()
		b, err := boxes.NewManager(h).Mint(ctx, boxes.MintRequest{Name: names[i], Image: image.DefaultAlias, Target: m.Name})
		require.NoError(t, err, "minting on %s", m.Name)
		t.Logf("minted %s on %s in %s", names[i], m.Name, time.Since(start).Round(time.Millisecond))
		assert.Equal(t, m.Name, b.Member)
		a, inst := fixedAddress(t, ctx, h, names[i])
		assert.Equal(t, m.Name, inst.Location)
		assert.True(t, sl[m.Name].Contains(a), "%s is in %s's slice %s", a, m.Name, sl[m.Name])
		assert.NotContains(t, seen, a, "no two boxes share an address")
		seen[a] = names[i]
		got, err := h.Addresses().Wait(ctx, names[i], 30*time.Second)
		require.NoError(t, err)
		assert.Equal(t, a, got, "it leases its fixed address")
	}
	assertClean(t, ctx, h)

	// A box on another member: exec, down and start from here.
	remote := names[2]
	res, err := h.Incus.Instances().Exec(ctx, remote, incus.ExecRequest{Command: []string{"hostname"}})
	require.NoError(t, err)
	assert.Equal(t, remote, strings.TrimSpace(string(res.Stdout)), "the command ran in the box on %s", st.Members[2].Name)
	a, inst := fixedAddress(t, ctx, h, remote)
	port := inst.Config["volatile.eth0.host_name"]
	require.NoError(t, boxes.NewManager(h).Stop(ctx, remote, false))
	_, set := memberPorts(t, st.Members[2].Name)
	assert.NotContains(t, set, port, "down takes its port out of %s's port set", st.Members[2].Name)
	require.NoError(t, boxes.NewManager(h).Start(ctx, remote))
	got, err := h.Addresses().Wait(ctx, remote, 30*time.Second)
	require.NoError(t, err)
	assert.Equal(t, a, got, "the same address after a restart")
	assertClean(t, ctx, h)

	// rm of a box on another member takes its port out of that member's
	// bridge and port set.
	_, inst = fixedAddress(t, ctx, h, remote)
	port = inst.Config["volatile.eth0.host_name"]
	require.NotEmpty(t, port)
	ports, set := memberPorts(t, st.Members[2].Name)
	require.Contains(t, ports, port)
	require.Contains(t, set, port)
	require.NoError(t, boxes.NewManager(h).Remove(ctx, remote))
	ports, set = memberPorts(t, st.Members[2].Name)
	assert.NotContains(t, ports, port, "no port left on %s's bridge", st.Members[2].Name)
	assert.NotContains(t, set, port, "nor in its port set")
	assertClean(t, ctx, h)
}

// A clone gets an address of its own member's slice, wherever it goes; a
// move keeps a box's address, and the box is on the stack on its new
// member.
func TestSystemClusterCloneAndMove(t *testing.T) {
	ctx, h, st := clusterWorld(t)
	sl := memberSlices(t, ctx, h)
	src, toM2, placed := stacktest.Name(t, "ca-src-"), stacktest.Name(t, "ca-clone-"), stacktest.Name(t, "ca-clone-")
	removeAtEnd(t, h, src, toM2, placed)
	first, second, third := st.Members[0].Name, st.Members[1].Name, st.Members[2].Name

	_, err := boxes.NewManager(h).Mint(ctx, boxes.MintRequest{Name: src, Image: image.DefaultAlias, Target: first})
	require.NoError(t, err)
	srcAddr, _ := fixedAddress(t, ctx, h, src)

	start := time.Now()
	res, err := boxes.NewManager(h).CloneTo(ctx, src, "", toM2, second)
	require.NoError(t, err)
	t.Logf("cloned a running box to another member in %s (source stopped for it: %v)", time.Since(start).Round(time.Millisecond), res.SourceStopped)
	assert.Equal(t, second, res.Box.Member)
	a, _ := fixedAddress(t, ctx, h, toM2)
	assert.True(t, sl[second].Contains(a), "%s is in %s's slice", a, second)
	got, err := h.Addresses().Wait(ctx, toM2, 30*time.Second)
	require.NoError(t, err)
	assert.Equal(t, a, got)
	srcNow, _ := fixedAddress(t, ctx, h, src)
	assert.Equal(t, srcAddr, srcNow, "the source keeps its address")

	// From a snapshot (of a stopped box: this host cannot freeze one),
	// where Incus places it.
	require.NoError(t, boxes.NewManager(h).Stop(ctx, src, false))
	_, err = boxes.NewManager(h).Snapshot(ctx, src, "s1")
	require.NoError(t, err)
	require.NoError(t, boxes.NewManager(h).Start(ctx, src))
	_, err = boxes.NewManager(h).CloneTo(ctx, src, "s1", placed, "")
	require.NoError(t, err)
	b, inst := fixedAddress(t, ctx, h, placed)
	t.Logf("a clone of a snapshot placed by Incus landed on %s with %s", inst.Location, b)
	assert.True(t, sl[inst.Location].Contains(b), "%s is in %s's slice", b, inst.Location)
	assert.NotEqual(t, srcAddr, b)
	assert.NotEqual(t, a, b)
	assertClean(t, ctx, h)

	// The move: refused while it runs, then it keeps its address.
	_, err = boxes.NewManager(h).Move(ctx, toM2, third)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "stop it first (box down "+toM2+")")
	require.NoError(t, boxes.NewManager(h).Stop(ctx, toM2, false))
	start = time.Now()
	mv, err := boxes.NewManager(h).Move(ctx, toM2, third)
	require.NoError(t, err)
	t.Logf("moved a stopped box from %s to %s in %s", mv.From, mv.To, time.Since(start).Round(time.Millisecond))
	assert.Equal(t, second, mv.From)
	assert.Equal(t, third, mv.Box.Member)
	assert.Equal(t, a.String(), mv.Address)
	// The member it left keeps no DHCP state of it (Incus's move alone
	// leaves both): a box given the address there later gets it.
	left := st.Members[1].IncusDir
	_, err = os.Stat(filepath.Join(left, "networks", model.Current.Network, "dnsmasq.hosts", toM2+".eth0"))
	assert.True(t, os.IsNotExist(err), "no dnsmasq.hosts entry left on %s: %v", second, err)
	leases, err := os.ReadFile(filepath.Join(left, "networks", model.Current.Network, "dnsmasq.leases"))
	require.NoError(t, err)
	assert.NotContains(t, string(leases), " "+a.String()+" ", "no lease left on %s", second)
	require.NoError(t, boxes.NewManager(h).Start(ctx, toM2))
	got, err = h.Addresses().Wait(ctx, toM2, 30*time.Second)
	require.NoError(t, err)
	assert.Equal(t, a, got, "the address it had on %s", second)
	assertClean(t, ctx, h)
	_, inst = fixedAddress(t, ctx, h, toM2)
	ports, set := memberPorts(t, third)
	assert.Contains(t, ports, inst.Config["volatile.eth0.host_name"], "its port is on %s's bridge", third)
	assert.Contains(t, set, inst.Config["volatile.eth0.host_name"], "and in its port set")
	boxes, censusErr, err := h.BoxesOnStack(ctx)
	require.NoError(t, err)
	require.NoError(t, censusErr)
	i := slices.IndexFunc(boxes, func(b stack.Box) bool { return b.Name == toM2 })
	require.GreaterOrEqual(t, i, 0)
	require.NotNil(t, boxes[i].OnStack)
	assert.True(t, *boxes[i].OnStack, "on the stack: %v", boxes[i].OffStack)
}

// An import lands on the member box runs on and gets an address of its
// slice, also beside its source, whose address its file carries.
func TestSystemClusterImportBesideItsSource(t *testing.T) {
	ctx, h, st := clusterWorld(t)
	sl := memberSlices(t, ctx, h)
	src, imp := stacktest.Name(t, "ca-exp-"), stacktest.Name(t, "ca-imp-")
	removeAtEnd(t, h, src, imp)
	_, err := boxes.NewManager(h).Mint(ctx, boxes.MintRequest{Name: src, Image: image.DefaultAlias, Target: st.Members[0].Name})
	require.NoError(t, err)
	srcAddr, _ := fixedAddress(t, ctx, h, src)

	file := filepath.Join(t.TempDir(), src+".tar.gz")
	w, err := os.Create(file)
	require.NoError(t, err)
	_, err = boxes.NewManager(h).Export(ctx, src, w)
	require.NoError(t, err)
	require.NoError(t, w.Close())
	start := time.Now()
	res, err := boxes.NewManager(h).Import(ctx, file, imp)
	require.NoError(t, err)
	t.Logf("imported beside its source in %s, on %s", time.Since(start).Round(time.Millisecond), res.Box.Member)
	a, inst := fixedAddress(t, ctx, h, imp)
	assert.True(t, sl[inst.Location].Contains(a), "%s is in %s's slice", a, inst.Location)
	assert.NotEqual(t, srcAddr, a, "not its source's")
	got, err := h.Addresses().Wait(ctx, imp, 30*time.Second)
	require.NoError(t, err)
	assert.Equal(t, a, got)
	srcGot, err := h.Addresses().Wait(ctx, src, 30*time.Second)
	require.NoError(t, err)
	assert.Equal(t, srcAddr, srcGot, "its source runs on with its own")
	assertClean(t, ctx, h)
}
