package stack

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/incus/incustest"
	"github.com/box-isolation/box/stack/model"
)

// fakeKernel lays out incusd's mountinfo (pid 42) and /sys/fs/btrfs under
// a temp dir and points procDir and sysDir at it.
func fakeKernel(t *testing.T, mountinfo string, fs map[string]string) {
	t.Helper()
	root := t.TempDir()
	oldProc, oldSys := procDir, sysDir
	procDir, sysDir = filepath.Join(root, "proc"), filepath.Join(root, "sys")
	t.Cleanup(func() { procDir, sysDir = oldProc, oldSys })
	require.NoError(t, os.MkdirAll(filepath.Join(procDir, "42"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(procDir, "42", "mountinfo"), []byte(mountinfo), 0o644))
	for name, content := range fs {
		p := filepath.Join(sysDir, "fs", "btrfs", name)
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		if strings.HasSuffix(name, "/") {
			require.NoError(t, os.MkdirAll(p, 0o755))
			continue
		}
		require.NoError(t, os.WriteFile(p, []byte(content), 0o644))
	}
}

const incusMounts = `24 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
76 48 0:43 / /var/lib/incus/storage-pools/default rw,relatime - btrfs /dev/loop3 rw,discard=async,space_cache=v2,user_subvol_rm_allowed,subvolid=5,subvol=/
77 48 0:44 / /var/lib/incus/storage-pools/my\040pool rw,relatime - btrfs /dev/vdb rw,subvolid=5,subvol=/
78 48 8:1 /srv/d /var/lib/incus/storage-pools/d rw,relatime - ext4 /dev/sda1 rw
`

func TestReadPoolAcct(t *testing.T) {
	fakeKernel(t, incusMounts, map[string]string{
		"aaaa/devices/loop3":        "",
		"aaaa/qgroups/inconsistent": "1\n",
		"aaaa/qgroups/enabled":      "1\n",
		"bbbb/devices/vdb":          "",
		"bbbb/qgroups/inconsistent": "0\n",
		"bbbb/qgroups/enabled":      "1\n",
		"cccc/devices/loop9":        "",
		"cccc/qgroups/inconsistent": "1\n",
	})
	a, err := readPoolAcct(42, "default")
	require.NoError(t, err)
	assert.Equal(t, "/var/lib/incus/storage-pools/default", a.mount)
	assert.Equal(t, filepath.Join(sysDir, "fs", "btrfs", "aaaa"), a.sysfs, "the file system is found by its device, not by the first one listed")
	assert.Equal(t, filepath.Join(procDir, "42", "root"), a.root)
	assert.True(t, a.enabled)
	assert.True(t, a.inconsistent)
	assert.Contains(t, a.problem(), "aaaa/qgroups/inconsistent is 1")
	assert.Contains(t, a.fixCommand(), "btrfs quota rescan -w "+filepath.Join(procDir, "42", "root", "var/lib/incus/storage-pools/default"))

	a, err = readPoolAcct(42, "my pool")
	require.NoError(t, err, "a mount point with a space is read (mountinfo escapes it)")
	assert.True(t, a.enabled)
	assert.False(t, a.inconsistent)

	_, err = readPoolAcct(42, "d")
	assert.ErrorIs(t, err, errNotBtrfs, "an ext4 (dir) pool has no qgroups")
	_, err = readPoolAcct(42, "nope")
	assert.ErrorIs(t, err, errNotBtrfs)
	_, err = readPoolAcct(43, "default")
	assert.ErrorContains(t, err, "reading incusd's mounts")
}

func TestReadPoolAcctQuotasOff(t *testing.T) {
	fakeKernel(t, incusMounts, map[string]string{"aaaa/devices/loop3": "", "aaaa/features/": ""})
	a, err := readPoolAcct(42, "default")
	require.NoError(t, err)
	assert.False(t, a.enabled, "no qgroups directory: quotas are off, no size is a limit yet")
	assert.False(t, a.inconsistent)

	fakeKernel(t, incusMounts, map[string]string{"aaaa/devices/loop3": "", "aaaa/qgroups/inconsistent": "1", "aaaa/qgroups/enabled": "0"})
	a, err = readPoolAcct(42, "default")
	require.NoError(t, err)
	assert.False(t, a.inconsistent, "disabled quotas count nothing and limit nothing")
}

func TestReadPoolAcctNoFileSystem(t *testing.T) {
	fakeKernel(t, incusMounts, map[string]string{"aaaa/devices/loop4": ""})
	_, err := readPoolAcct(42, "default")
	assert.ErrorContains(t, err, "finding the btrfs file system of /var/lib/incus/storage-pools/default (on /dev/loop3)")
}

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
			fakeKernel(t, incusMounts, map[string]string{"aaaa/devices/loop3": "", "aaaa/qgroups/inconsistent": tc.inconsistent})
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
