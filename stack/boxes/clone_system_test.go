package boxes_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/box-isolation/box/stack/stacktest/worldtest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/drill/image"
	"github.com/box-isolation/box/internal/testenv"
	"github.com/box-isolation/box/stack"
	"github.com/box-isolation/box/stack/boxes"
	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/model"
	"github.com/box-isolation/box/stack/stacktest"
)

// TestSystemMachineIDTemplate proves on this machine's incusd the template
// a VM clone gets its machine-id from (VMs cannot run here): Incus takes
// it, and renders the instance's own UUID into /etc/machine-id at the
// first start after a copy, and, as for an import, at the next start of
// an instance that is no fresh copy. In a container Incus writes it itself;
// in a VM its agent would (not proven here).
func TestSystemMachineIDTemplate(t *testing.T) {
	_, c := testenv.Incus(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	_, err := image.Ensure(ctx, c, image.DefaultAlias, image.Options{})
	require.NoError(t, err)
	src, dst := stacktest.Name(t, "t-mid-"), stacktest.Name(t, "t-mid-")
	for _, n := range []string{src, dst} {
		t.Cleanup(func() {
			_ = c.Instances().SetState(context.Background(), n, "stop", 0, true)
			_ = c.Instances().Delete(context.Background(), n)
		})
	}
	// No network: the template is all this is about.
	require.NoError(t, c.Instances().Create(ctx, incus.InstancesPost{Name: src, Type: "container", Profiles: []string{},
		Devices: map[string]map[string]string{"root": {"type": "disk", "path": "/", "pool": "default"}},
		Source:  incus.InstanceSource{Type: "image", Alias: image.DefaultAlias}}))
	require.NoError(t, c.Instances().Create(ctx, incus.InstancesPost{Name: dst, Type: "container", Profiles: []string{},
		Source: incus.InstanceSource{Type: "copy", Source: src}}))
	h := &stack.Host{Incus: c}

	ownID := func(name string) (uuid, mid string) {
		t.Helper()
		require.NoError(t, c.Instances().SetState(ctx, name, "start", 0, false))
		inst, _, err := c.Instances().Get(ctx, name)
		require.NoError(t, err)
		b, err := c.Instances().PullFile(ctx, name, "/etc/machine-id")
		require.NoError(t, err)
		require.NoError(t, c.Instances().SetState(ctx, name, "stop", 0, true))
		return inst.Config["volatile.uuid"], strings.TrimSpace(string(b))
	}

	require.NoError(t, boxes.MachineIDTemplateOf(h)(ctx, dst))
	md, _, err := c.Instances().Metadata(ctx, dst)
	require.NoError(t, err)
	assert.Equal(t, []string{"copy"}, md.Templates["/etc/machine-id"].When)
	uuid, mid := ownID(dst)
	require.NotEmpty(t, uuid)
	assert.Equal(t, strings.ReplaceAll(uuid, "-", ""), mid, "the copy's machine-id is its own UUID")

	// src has started once (its create templates ran): like an import, no
	// copy is pending; the template still runs at its next start.
	// (The probe image's init makes up a machine-id when it has none.)
	srcUUID, before := ownID(src)
	require.NoError(t, boxes.MachineIDTemplateOf(h)(ctx, src))
	_, after := ownID(src)
	assert.Equal(t, strings.ReplaceAll(srcUUID, "-", ""), after)
	assert.NotEqual(t, before, after)
	assert.NotEqual(t, mid, after, "source and copy differ")
}

func TestSystemCloneGetsItsOwnIdentity(t *testing.T) {
	ctx, h, _ := worldtest.Host(t)
	_, err := h.Ensure(ctx)
	require.NoError(t, err)
	src, dst := stacktest.Name(t, "t-src-"), stacktest.Name(t, "t-clone-")
	_, err = boxes.NewManager(h).Mint(ctx, boxes.MintRequest{Name: src, Image: image.DefaultAlias, Stamps: map[string]string{model.StampTemplate: "blank"}})
	require.NoError(t, err)
	srcIP, err := h.Addresses().Wait(ctx, src, 30*time.Second)
	require.NoError(t, err)

	res, err := boxes.NewManager(h).Clone(ctx, src, "", dst)
	require.NoError(t, err)
	t.Logf("clone of a running box: source stopped for the copy: %v", res.SourceStopped)
	dstIP, err := h.Addresses().Wait(ctx, dst, 30*time.Second)
	require.NoError(t, err)
	srcIP, err = h.Addresses().Wait(ctx, src, 30*time.Second) // it may have restarted
	require.NoError(t, err)
	assert.NotEqual(t, srcIP, dstIP, "two boxes, one IP breaks everything")

	a, _, err := h.Incus.Instances().Get(ctx, src)
	require.NoError(t, err)
	b, _, err := h.Incus.Instances().Get(ctx, dst)
	require.NoError(t, err)
	assert.NotEqual(t, a.Config["volatile.eth0.hwaddr"], b.Config["volatile.eth0.hwaddr"])
	assert.NotEmpty(t, b.Config["volatile.eth0.hwaddr"])
	ma, err := h.Incus.Instances().PullFile(ctx, src, "/etc/machine-id")
	require.NoError(t, err)
	mb, err := h.Incus.Instances().PullFile(ctx, dst, "/etc/machine-id")
	require.NoError(t, err)
	assert.NotEqual(t, strings.TrimSpace(string(ma)), strings.TrimSpace(string(mb)))
	assert.Len(t, strings.TrimSpace(string(mb)), 32)

	info, err := stack.Info(ctx, h.Incus, dst)
	require.NoError(t, err)
	assert.Equal(t, "clone of "+src, info.Stamps[model.StampOrigin])
	assert.Equal(t, "blank", info.Stamps[model.StampTemplate], "lineage kept")
	assert.NotEqual(t, a.Config[model.StampMinted], "", "source stamped")
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

	_, err := boxes.NewManager(h).Mint(ctx, boxes.MintRequest{Name: src, Image: image.DefaultAlias, Target: first, CPU: "1"})
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
	// The operator raises the source's CPUs after the snapshot: the
	// snapshot's clone takes the source's current policy.
	cur, etag, err := h.Incus.Instances().Get(ctx, src)
	require.NoError(t, err)
	put := cur.Writable()
	put.Config["limits.cpu"] = "2"
	require.NoError(t, h.Incus.Instances().Update(ctx, src, put, etag))
	cl, err := boxes.NewManager(h).CloneTo(ctx, src, "s1", placed, "")
	require.NoError(t, err)
	assert.Equal(t, []string{"limits.cpu: 1 -> 2"}, cl.Policy.Differs, "the snapshot held 1 CPU")
	b, inst := fixedAddress(t, ctx, h, placed)
	assert.Equal(t, "2", inst.Config["limits.cpu"], "the clone of the snapshot has the source's current CPUs")
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
	rec, recorded, err := h.Policies().Recorded(ctx, "", toM2)
	require.NoError(t, err)
	require.True(t, recorded, "the clone's policy is recorded")
	mv, err := boxes.NewManager(h).Move(ctx, toM2, third)
	require.NoError(t, err)
	moved, _, err := h.Incus.Instances().Get(ctx, toM2)
	require.NoError(t, err)
	assert.True(t, model.PolicyOf(moved.Config, moved.Devices).Equal(rec), "the move keeps the box's policy: %v", model.PolicyOf(moved.Config, moved.Devices).Diff(rec))
	after, recorded, err := h.Policies().Recorded(ctx, "", toM2)
	require.NoError(t, err)
	assert.True(t, recorded && after.Equal(rec), "and its record")
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
