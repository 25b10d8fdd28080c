package boxes

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/stack"
	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/incus/incustest"
	"github.com/box-isolation/box/stack/model"
	"github.com/box-isolation/box/stack/stacktest"
)

// boundaryOps is every stack operation that takes a box by name.
var boundaryOps = []struct {
	name string
	call func(ctx context.Context, h *stack.Host, box string) error
}{
	{"start", func(ctx context.Context, h *stack.Host, b string) error { return (&Manager{host: h}).Start(ctx, b) }},
	{"stop", func(ctx context.Context, h *stack.Host, b string) error {
		return (&Manager{host: h}).Stop(ctx, b, true)
	}},
	{"rename", func(ctx context.Context, h *stack.Host, b string) error {
		return (&Manager{host: h}).Rename(ctx, b, b+"-new")
	}},
	{"move", func(ctx context.Context, h *stack.Host, b string) error {
		_, err := (&Manager{host: h}).Move(ctx, b, "m2")
		return err
	}},
	{"snapshot", func(ctx context.Context, h *stack.Host, b string) error {
		_, err := (&Manager{host: h}).Snapshot(ctx, b, "s")
		return err
	}},
	{"snapshots", func(ctx context.Context, h *stack.Host, b string) error {
		_, err := (&Manager{host: h}).Snapshots(ctx, b)
		return err
	}},
	{"restore", func(ctx context.Context, h *stack.Host, b string) error {
		_, err := (&Manager{host: h}).Restore(ctx, b, "s", false)
		return err
	}},
	{"remove", func(ctx context.Context, h *stack.Host, b string) error { return (&Manager{host: h}).Remove(ctx, b) }},
	{"clone", func(ctx context.Context, h *stack.Host, b string) error {
		_, err := (&Manager{host: h}).Clone(ctx, b, "", b+"-copy")
		return err
	}},
	{"info", func(ctx context.Context, h *stack.Host, b string) error {
		_, err := stack.Info(ctx, h.Incus, b)
		return err
	}},
	{"expose", func(ctx context.Context, h *stack.Host, b string) error {
		_, err := (&Doors{host: h}).Expose(ctx, b, model.DoorSpec{Port: 80, Kind: model.DoorTCP})
		return err
	}},
	{"doors", func(ctx context.Context, h *stack.Host, b string) error {
		_, err := (&Doors{host: h}).ListDoors(ctx, b)
		return err
	}},
	{"unexpose", func(ctx context.Context, h *stack.Host, b string) error {
		return (&Doors{host: h}).Unexpose(ctx, b, 80)
	}},
	{"export", func(ctx context.Context, h *stack.Host, b string) error {
		_, err := (&Manager{host: h}).Export(ctx, b, io.Discard)
		return err
	}},
	{"migrate", func(ctx context.Context, h *stack.Host, b string) error {
		_, err := h.Migrate(ctx, stack.MigrateRequest{Box: b})
		return err
	}},
}

// TestBoundaryUnit: against a fake incusd, every operation on an untagged
// instance is refused with the reason, and nothing but reads reaches the
// daemon.
func TestBoundaryUnit(t *testing.T) {
	for _, op := range boundaryOps {
		t.Run(op.name, func(t *testing.T) {
			srv := incustest.New(t)
			srv.Handle("GET /1.0/instances/{name}", func(w http.ResponseWriter, r *http.Request) {
				if r.PathValue("name") != "stranger" {
					incustest.Error(w, http.StatusNotFound, "Instance not found")
					return
				}
				incustest.SyncETag(w, `"e1"`, map[string]any{"name": "stranger", "status": "Running", "config": map[string]string{"user.other": "1"}})
			})
			h := &stack.Host{Incus: incus.New(srv.Socket())}
			err := op.call(context.Background(), h, "stranger")
			var nab *stack.NotABoxError
			require.True(t, errors.As(err, &nab), "%s on an untagged instance: %v", op.name, err)
			assert.Contains(t, err.Error(), "user.box=1")
			for _, r := range srv.Requests() {
				assert.Equal(t, http.MethodGet, r.Method, "%s sent %s %s to an instance it did not mint", op.name, r.Method, r.Path)
			}

			err = op.call(context.Background(), h, "nobody")
			var nsb *stack.NoSuchBoxError
			assert.True(t, errors.As(err, &nsb), "%s on a missing instance: %v", op.name, err)
		})
	}
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
	_, err := (&Manager{host: h}).Restore(context.Background(), "c", "s1", false)
	require.NoError(t, err)
	a := model.FixedAddressOf(f.Inst(t, "c"))
	stacktest.InSlice(t, "m3", a)
	assert.NotEqual(t, "10.88.0.64", a.String(), "not src's address, which src still has")
	assert.Equal(t, "10.88.0.64", model.FixedAddressOf(f.Inst(t, "src")).String())

	f.Snaps["c"] = snap("10.88.0.97")
	_, err = (&Manager{host: h}).Restore(context.Background(), "c", "s1", false)
	require.NoError(t, err)
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
	_, err := (&Manager{host: h}).Restore(context.Background(), "b", "s1", false)
	require.NoError(t, err)
	assert.Equal(t, "10.88.0.9", model.FixedAddressOf(f.Inst(t, "b")).String())
}

// RemoveAll removes every box it is given side by side, a box already
// gone is no error, and the records of those removed go in one write of
// the bridge (one per box before: beside a full bridge each read and
// rewrote the whole of it).
func TestRemoveAllForgetsInOneWrite(t *testing.T) {
	f, h := newClusterFake(t)
	ctx := context.Background()
	for i, n := range []string{"a", "b", "c", "keep"} {
		f.Add(n, "m1", "Running", fmt.Sprintf("10.88.0.%d", 33+i))
		require.NoError(t, h.Policies().Record(ctx, "default", n, model.Policy{}))
	}
	before := len(f.Srv.Requests())
	require.NoError(t, (&Manager{host: h}).RemoveAll(ctx, []string{"a", "b", "gone", "c"}, time.Second))
	f.Mu.Lock()
	assert.Equal(t, []string{"keep"}, slices.Sorted(maps.Keys(f.Insts)))
	f.Mu.Unlock()
	var puts int
	for _, r := range f.Srv.Requests()[before:] {
		if r.Method == http.MethodPut && r.Path == "/1.0/networks/boxnet" {
			puts++
		}
	}
	assert.Equal(t, 1, puts, "one write of the bridge for three records")
	for _, n := range []string{"a", "b", "c"} {
		_, ok, err := h.Policies().Recorded(ctx, "default", n)
		require.NoError(t, err)
		assert.False(t, ok, "%s's record is gone with it", n)
	}
	_, ok, err := h.Policies().Recorded(ctx, "default", "keep")
	require.NoError(t, err)
	assert.True(t, ok, "the box left keeps its record")
}
