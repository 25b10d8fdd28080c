package boxes

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"

	"github.com/box-isolation/box/stack"
	"github.com/box-isolation/box/stack/model"
	"github.com/box-isolation/box/stack/stacktest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/incus/incustest"
)

func TestDiskQuota(t *testing.T) {
	for _, d := range []string{"zfs", "btrfs", "lvm", "ceph"} {
		ok, how := DiskQuota(d)
		assert.True(t, ok, d)
		assert.NotEmpty(t, how, d)
	}
	ok, how := DiskQuota("dir")
	assert.False(t, ok, "a dir pool's driver alone does not say")
	assert.Contains(t, how, "project quotas")
	ok, _ = DiskQuota("cephfs")
	assert.False(t, ok, "not a pool for root disks")
}

func TestWithLimits(t *testing.T) {
	cfg := map[string]string{}
	withLimits(cfg, MintRequest{Processes: "2048", CPUAllowance: "50%", IsolatedIDMap: true})
	assert.Equal(t, map[string]string{"limits.processes": "2048", "limits.cpu.allowance": "50%", "security.idmap.isolated": "true"}, cfg)
	cfg = map[string]string{}
	withLimits(cfg, MintRequest{})
	assert.Empty(t, cfg, "nothing asked, nothing set")
	// What box sets, the census allows.
	inst := stacktest.FleetInst("lim", func(i *incus.Instance) {
		withLimits(i.Config, MintRequest{Processes: "2048", CPUAllowance: "50%", IsolatedIDMap: true})
	})
	assert.True(t, model.JudgeDefinition("boxnet", &inst).OnStack())
}

// TestDiskLimitNote: a root disk size the pool does not enforce is said,
// judged by the pool's driver and, for dir, by whether Incus measures the
// box's root volume (it does only through a project quota).
func TestDiskLimitNote(t *testing.T) {
	for _, tc := range []struct {
		name, driver string
		disk         map[string]incus.InstanceDisk
		size         string
		want         string
	}{
		{name: "btrfs enforces", driver: "btrfs", size: "20GiB"},
		{name: "dir with a project quota", driver: "dir", size: "20GiB", disk: map[string]incus.InstanceDisk{"root": {Usage: 4096}}},
		{name: "dir without", driver: "dir", size: "20GiB", want: "no disk limit: pool default (dir) did not enforce the root disk's size 20GiB"},
		{name: "no size asked", driver: "dir"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := incustest.New(t)
			srv.Handle("/1.0/storage-pools/default", func(w http.ResponseWriter, r *http.Request) {
				_ = json.NewEncoder(w).Encode(map[string]any{"type": "sync", "status_code": 200, "metadata": incus.StoragePool{Name: "default", Driver: tc.driver}})
			})
			srv.Handle("/1.0/instances/b/state", func(w http.ResponseWriter, r *http.Request) {
				_ = json.NewEncoder(w).Encode(map[string]any{"type": "sync", "status_code": 200, "metadata": incus.InstanceState{Status: "Running", Disk: tc.disk}})
			})
			h := &stack.Host{Incus: incus.New(srv.Socket())}
			got := (&Manager{host: h}).diskLimitNote(context.Background(), MintRequest{Name: "b", Disk: tc.size})
			if tc.want == "" {
				require.Empty(t, got)
				return
			}
			require.Contains(t, got, tc.want)
			assert.Contains(t, got, "btrfs")
		})
	}
}
