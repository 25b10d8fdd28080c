package stack

import (
	"context"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/stack/btrfs/btrfstest"
	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/incus/incustest"
	"github.com/box-isolation/box/stack/model"
)

// TestAccountingFinding: doctor's finding and Mint's note for a btrfs
// pool whose kernel stopped counting, from incusd's PID (GET /1.0) and
// the pool's driver; nothing for another driver, a clustered server, or
// a pool that counts.
func TestAccountingFinding(t *testing.T) {
	for _, tc := range []struct {
		name, driver, inconsistent string
		clustered                  bool
		want                       bool
	}{
		{name: "not counting", driver: "btrfs", inconsistent: "1", want: true},
		{name: "counting", driver: "btrfs", inconsistent: "0"},
		{name: "zfs", driver: "zfs", inconsistent: "1"},
		{name: "a cluster's member", driver: "btrfs", inconsistent: "1", clustered: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			btrfstest.FakeKernel(t, btrfstest.IncusMounts, map[string]string{"aaaa/devices/loop3": "", "aaaa/qgroups/inconsistent": tc.inconsistent})
			srv := incustest.New(t)
			srv.Handle("GET /1.0", func(w http.ResponseWriter, r *http.Request) {
				incustest.Sync(w, map[string]any{"environment": map[string]any{"server_pid": 42, "server_clustered": tc.clustered}})
			})
			srv.Handle("/1.0/storage-pools/default", func(w http.ResponseWriter, r *http.Request) {
				incustest.Sync(w, incus.StoragePool{Name: "default", Driver: tc.driver})
			})
			h := &Host{Incus: incus.New(srv.Socket())}
			v := &Verification{}
			h.Storage().finding(context.Background(), v)
			note := h.Storage().AccountingNote(context.Background(), "64MiB")
			assert.Empty(t, v.Notes)
			if !tc.want {
				assert.Empty(t, v.Findings)
				assert.Empty(t, note)
				return
			}
			require.Len(t, v.Findings, 1)
			f := v.Findings[0]
			assert.Equal(t, model.LayerFleet, f.Layer)
			assert.Equal(t, "storage pool default", f.Object)
			assert.Contains(t, f.Problem, "the kernel counts no box's writes until a rescan")
			assert.Contains(t, note, "no disk limit: pool default's btrfs quota accounting is inconsistent")
			assert.Empty(t, h.Storage().AccountingNote(context.Background(), ""), "no size asked, nothing to say")
		})
	}
}
