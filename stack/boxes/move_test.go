package boxes

import (
	"context"
	"encoding/json"
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
