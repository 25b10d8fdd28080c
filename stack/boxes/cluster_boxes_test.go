package boxes

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/netip"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/stack"
	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/incus/incustest"
	"github.com/box-isolation/box/stack/model"
	"github.com/box-isolation/box/stack/stacktest"
)

func newClusterFake(t *testing.T) (*stacktest.ClusterFake, *stack.Host) {
	t.Helper()
	f := stacktest.NewClusterServer(t)
	return f, &stack.Host{Incus: incus.New(f.Srv.Socket()), NoKernel: true}
}

// A box on a cluster without a fixed address (minted before box gave
// them) gets one of its member's slice when it starts: the fix
// addressFindings names.
func TestStartGivesAFixedAddress(t *testing.T) {
	f, h := newClusterFake(t)
	f.Add("old", "m2", "Stopped", "")
	require.NoError(t, (&Manager{host: h}).Start(context.Background(), "old"))
	b := f.Inst(t, "old")
	assert.Equal(t, "Running", b.Status)
	stacktest.InSlice(t, "m2", model.FixedAddressOf(b))
}

// A clone on a cluster gets a fixed address of its own member's slice,
// never its source's: the copy request carries the source's whole
// definition (Incus copies across members only so), its NIC without the
// address.
func TestCloneOnAClusterGetsItsOwnAddress(t *testing.T) {
	for _, tc := range []struct {
		name, target, place, snap, member string
		srcStatus                         string
		coldCopy                          bool
	}{
		{name: "to another member", target: "m3", member: "m3", srcStatus: "Stopped"},
		{name: "placed by incus beside its source", place: "m1", member: "m1", srcStatus: "Stopped"},
		{name: "from a snapshot", target: "m2", snap: "s1", member: "m2", srcStatus: "Stopped"},
		{name: "running source, to another member", target: "m3", member: "m3", srcStatus: "Running", coldCopy: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, h := newClusterFake(t)
			f.Place = cmp.Or(tc.place, "m2")
			f.Add("src", "m1", tc.srcStatus, "10.88.0.32")
			f.Snaps["src"] = []incus.Instance{{Name: "s1", Architecture: "x86_64", Profiles: []string{"box-net"},
				Config:  map[string]string{model.Current.Tag: "1", model.StampTemplate: "older"},
				Devices: map[string]map[string]string{"eth0": model.FixedNIC(netip.MustParseAddr("10.88.0.32")), "root": {"type": "disk", "path": "/", "pool": "default", "size": "20GiB"}}}}
			res, err := (&Manager{host: h}).CloneTo(context.Background(), "src", tc.snap, "c", tc.target)
			require.NoError(t, err)
			assert.Equal(t, tc.coldCopy, res.SourceStopped)
			assert.Equal(t, tc.member, res.Box.Member)

			c := f.Inst(t, "c")
			assert.Equal(t, "Running", c.Status)
			a := model.FixedAddressOf(c)
			stacktest.InSlice(t, tc.member, a)
			assert.NotEqual(t, "10.88.0.32", a.String(), "not its source's address")
			assert.Equal(t, "10.88.0.32", model.FixedAddressOf(f.Inst(t, "src")).String(), "the source keeps its own")
			assert.Equal(t, tc.srcStatus, f.Inst(t, "src").Status)
			assert.Equal(t, "20GiB", c.Devices["root"]["size"], "the source's other devices come along")
			if tc.snap != "" {
				assert.Equal(t, "older", c.Config[model.StampTemplate], "the snapshot's definition")
			}

			creates := f.Srv.Find(http.MethodPost, "/1.0/instances")
			last := creates[len(creates)-1]
			assert.Equal(t, tc.target, last.Query.Get("target"))
			var sent incus.InstancesPost
			require.NoError(t, json.Unmarshal(last.Body, &sent))
			assert.Equal(t, "x86_64", sent.Architecture)
			assert.Equal(t, model.BoxNIC(), sent.Devices["eth0"], "the copy's NIC asks for no address")
			for k := range sent.Config {
				assert.False(t, strings.HasPrefix(k, "volatile."), "the source's %s stays the source's", k)
			}
			assert.Equal(t, "copy", sent.Source.Type)
			assert.Equal(t, strings.TrimSuffix("src/"+tc.snap, "/"), sent.Source.Source)
		})
	}
}

// Off a cluster a clone is a plain copy, and --target is refused.
// Off a cluster a clone is a plain copy, which carries its source's
// fixed address: the clone gets its own.
func TestCloneOffAClusterIsAPlainCopy(t *testing.T) {
	f, h := newClusterFake(t)
	f.Clustered = false
	f.Add("src", "", "Stopped", "10.88.0.2")
	_, err := (&Manager{host: h}).CloneTo(context.Background(), "src", "", "c", "m2")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "--target m2: this incusd is not a cluster member")
	_, err = (&Manager{host: h}).Clone(context.Background(), "src", "", "c")
	require.NoError(t, err)
	var sent incus.InstancesPost
	require.NoError(t, json.Unmarshal(f.Srv.Find(http.MethodPost, "/1.0/instances")[0].Body, &sent))
	assert.Nil(t, sent.Devices)
	assert.Empty(t, sent.Architecture)
	assert.Equal(t, "10.88.0.3", model.FixedAddressOf(f.Inst(t, "c")).String(), "its own, not its source's")
	assert.Equal(t, "10.88.0.2", model.FixedAddressOf(f.Inst(t, "src")).String())
}

func TestMoveKeepsTheAddress(t *testing.T) {
	f, h := newClusterFake(t)
	f.Add("b", "m1", "Stopped", "10.88.0.33")
	res, err := (&Manager{host: h}).Move(context.Background(), "b", "m3")
	require.NoError(t, err)
	assert.Equal(t, "m1", res.From)
	assert.Equal(t, "m3", res.To)
	assert.Equal(t, "10.88.0.33", res.Address)
	assert.Equal(t, "m3", res.Box.Member)
	b := f.Inst(t, "b")
	assert.Equal(t, "m3", b.Location)
	assert.Equal(t, "10.88.0.33", model.FixedAddressOf(b).String(), "its address goes with it: no member hands it out again")
	assert.Equal(t, "Stopped", b.Status, "moved, not started")
	assert.NotContains(t, b.Config, model.KeyMoving)

	// Its NIC loses its address on m1 before the move (so Incus clears its
	// DHCP state there), the address held under keyMoving meanwhile, and
	// gets it back on m3, as it was.
	var writes []incustest.Request
	for _, r := range f.Srv.Requests() {
		if r.Method != http.MethodGet && strings.HasPrefix(r.Path, "/1.0/instances/b") {
			writes = append(writes, r)
		}
	}
	require.Len(t, writes, 3)
	var leave, land incus.InstancePut
	require.NoError(t, json.Unmarshal(writes[0].Body, &leave))
	assert.Equal(t, http.MethodPut, writes[0].Method)
	assert.Equal(t, map[string]string{"type": "nic", "network": "boxnet", "name": model.TransitName, "security.port_isolation": "true"}, leave.Devices["eth0"],
		"on m1, a NIC without an address, renamed: a change Incus applies by removing the NIC")
	assert.Equal(t, "10.88.0.33", leave.Config[model.KeyMoving])
	assert.Equal(t, http.MethodPost, writes[1].Method)
	assert.Equal(t, "m3", writes[1].Query.Get("target"))
	require.NoError(t, json.Unmarshal(writes[2].Body, &land))
	assert.Equal(t, model.FixedNIC(netip.MustParseAddr("10.88.0.33")), land.Devices["eth0"])
	assert.NotContains(t, land.Config, model.KeyMoving)

	// Where it is already, nothing moves.
	res, err = (&Manager{host: h}).Move(context.Background(), "b", "m3")
	require.NoError(t, err)
	assert.Contains(t, res.Notes[0], "it is on m3 already")
	assert.Len(t, f.Srv.Find(http.MethodPost, "/1.0/instances/b"), 1)
}

// While a box moves, its address is its own: a box minted on the member
// it leaves does not get it.
func TestAMovingBoxKeepsItsAddress(t *testing.T) {
	f, h := newClusterFake(t)
	f.Add("b", "m1", "Stopped", "")
	f.Insts["b"].Config[model.KeyMoving] = "10.88.0.32"
	a, err := h.Addresses().For(context.Background(), "m1")
	require.NoError(t, err)
	assert.Equal(t, "10.88.0.33", a.String())

	// A move that stopped half-way: box start puts it back.
	require.NoError(t, (&Manager{host: h}).Start(context.Background(), "b"))
	b := f.Inst(t, "b")
	assert.Equal(t, "10.88.0.32", model.FixedAddressOf(b).String())
	assert.NotContains(t, b.Config, model.KeyMoving)
}

// A move Incus refuses leaves the box where it was, with its address.
func TestAFailedMoveGivesTheAddressBack(t *testing.T) {
	f, h := newClusterFake(t)
	f.Add("b", "m1", "Stopped", "10.88.0.33")
	f.MoveErr = "Failed migration on target: no space left"
	_, err := (&Manager{host: h}).Move(context.Background(), "b", "m2")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "no space left")
	b := f.Inst(t, "b")
	assert.Equal(t, "m1", b.Location)
	assert.Equal(t, "10.88.0.33", model.FixedAddressOf(b).String())
	assert.NotContains(t, b.Config, model.KeyMoving)
}

// A box minted before box gave boxes on a cluster a fixed address gets one
// of its new member's slice.
func TestMoveGivesAnAddressToABoxWithout(t *testing.T) {
	f, h := newClusterFake(t)
	f.Add("old", "m1", "Stopped", "")
	res, err := (&Manager{host: h}).Move(context.Background(), "old", "m2")
	require.NoError(t, err)
	stacktest.InSlice(t, "m2", netip.MustParseAddr(res.Address))
	assert.Equal(t, res.Address, model.FixedAddressOf(f.Inst(t, "old")).String())
	assert.Contains(t, res.Notes[0], "it had no fixed address")
}

func TestMoveRefuses(t *testing.T) {
	for _, tc := range []struct {
		name, box, status, member string
		standalone, noSlice       bool
		want                      string
	}{
		{name: "running", box: "b", status: "Running", member: "m2", want: "b is running: stop it first (box down b), then move it"},
		{name: "unknown member", box: "b", status: "Stopped", member: "m9", want: "no cluster member m9 (members: m1, m2, m3)"},
		{name: "no member", box: "b", status: "Stopped", want: "which member? (members: m1, m2, m3)"},
		{name: "standalone", box: "b", status: "Running", member: "m2", standalone: true, want: "this incusd is not a member of a cluster, so there is no member to move it to (box export and box import carry a box to another host)"},
		{name: "a member box has not set up", box: "b", status: "Stopped", member: "m4", noSlice: true, want: "member m4 has no address slice on boxnet"},
		{name: "no such box", box: "nobody", member: "m2", want: "no box named nobody"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, h := newClusterFake(t)
			f.Clustered = !tc.standalone
			if tc.noSlice {
				f.Members = append(f.Members, "m4")
			}
			f.Add("b", "m1", tc.status, "10.88.0.33")
			_, err := (&Manager{host: h}).Move(context.Background(), tc.box, tc.member)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
			assert.Empty(t, f.Srv.Find(http.MethodPost, "/1.0/instances/"+tc.box), "nothing was moved")
			assert.Equal(t, "m1", f.Insts["b"].Location)
		})
	}
}

// An import on a cluster lands on the member that received it and gets a
// fixed address of that member's slice before it starts, whatever address
// its file carries (here the one its source, on the same member, holds);
// off a cluster it gets one of the subnet (L-DHCP), never the file's.
func TestImportOnAClusterGetsAnAddressOfItsMember(t *testing.T) {
	for _, clustered := range []bool{true, false} {
		t.Run(fmt.Sprintf("clustered %v", clustered), func(t *testing.T) {
			f, h := newClusterFake(t)
			f.Clustered = clustered
			f.Add("work", "m1", "Running", "10.88.0.32")
			fixture := newBackupFixture()
			fixture.backup.Container.Devices["eth0"] = model.FixedNIC(netip.MustParseAddr("10.88.0.32"))
			f.ImportFile = func(name string) *incus.Instance {
				return &incus.Instance{Name: name, Type: "container", Status: "Stopped", Profiles: []string{"box-net"},
					Config:  map[string]string{model.Current.Tag: "1", "volatile.eth0.hwaddr": "10:66:6a:00:00:01"},
					Devices: map[string]map[string]string{"eth0": model.FixedNIC(netip.MustParseAddr("10.88.0.32"))}}
			}
			res, err := (&Manager{host: h}).Import(context.Background(), fixtureFile(t, fixture), "copy")
			require.NoError(t, err)
			c := f.Inst(t, "copy")
			assert.Equal(t, "Running", c.Status)
			if clustered {
				assert.Equal(t, "m1", res.Box.Member)
				a := model.FixedAddressOf(c)
				stacktest.InSlice(t, "m1", a)
				assert.NotEqual(t, "10.88.0.32", a.String(), "not the address in the file")
				return
			}
			a := model.FixedAddressOf(c)
			assert.True(t, a.IsValid(), "a fixed address of this host's")
			assert.NotEqual(t, "10.88.0.32", a.String(), "not the address in the file, which work holds")
			assert.Contains(t, strings.Join(res.Notes, "\n"), "its fixed address 10.88.0.32 was the host's it came from: it gets one of this host's")
		})
	}
}

// A restore brings back the address a snapshot holds: a clone's snapshot
// holds its source's, which the clone then asks for again on its own
// member. The restored box gets a fresh address of its member's slice;
// one that restores its own address keeps it.
func TestRestoreOnAClusterReaddressesATakenAddress(t *testing.T) {
	f, h := newClusterFake(t)
	f.Add("src", "m2", "Stopped", "10.88.0.64")
	f.Add("c", "m3", "Stopped", "10.88.0.96")
	snap := func(addr string) []incus.Instance {
		return []incus.Instance{{Name: "s1", Devices: map[string]map[string]string{"eth0": model.FixedNIC(netip.MustParseAddr(addr))}}}
	}
	f.Snaps["c"] = snap("10.88.0.64") // carried over from src
	require.NoError(t, (&Manager{host: h}).Restore(context.Background(), "c", "s1"))
	a := model.FixedAddressOf(f.Inst(t, "c"))
	stacktest.InSlice(t, "m3", a)
	assert.NotEqual(t, "10.88.0.64", a.String(), "not src's address, which src still has")
	assert.Equal(t, "10.88.0.64", model.FixedAddressOf(f.Inst(t, "src")).String())

	f.Snaps["c"] = snap("10.88.0.97")
	require.NoError(t, (&Manager{host: h}).Restore(context.Background(), "c", "s1"))
	assert.Equal(t, "10.88.0.97", model.FixedAddressOf(f.Inst(t, "c")).String(), "its own address, taken by nobody else, stays")
}

// A restore of a snapshot taken before box stored addresses brings back a
// NIC with none: it gets one (the one its MAC leases, if any).
func TestRestoreGivesAFixedAddress(t *testing.T) {
	f, h := newClusterFake(t)
	f.Clustered = false
	f.Add("b", "", "Stopped", "10.88.0.9")
	f.Snaps["b"] = []incus.Instance{{Name: "s1", Devices: map[string]map[string]string{}}}
	f.Leases = []incus.NetworkLease{{Hwaddr: "10:66:6a:00:00:01", Address: "10.88.0.9", Type: "dynamic"}}
	require.NoError(t, (&Manager{host: h}).Restore(context.Background(), "b", "s1"))
	assert.Equal(t, "10.88.0.9", model.FixedAddressOf(f.Inst(t, "b")).String())
}
