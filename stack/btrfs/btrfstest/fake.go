// Package btrfstest lays out a fake kernel's view of incusd's btrfs pools
// for tests of package btrfs and of its users.
package btrfstest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/stack/btrfs"
)

// FakeKernel lays out incusd's mountinfo (pid 42) and /sys/fs/btrfs under
// a temp dir and points btrfs.ProcDir and btrfs.SysDir at it.
func FakeKernel(t *testing.T, mountinfo string, fs map[string]string) {
	t.Helper()
	root := t.TempDir()
	oldProc, oldSys := btrfs.ProcDir, btrfs.SysDir
	btrfs.ProcDir, btrfs.SysDir = filepath.Join(root, "proc"), filepath.Join(root, "sys")
	t.Cleanup(func() { btrfs.ProcDir, btrfs.SysDir = oldProc, oldSys })
	require.NoError(t, os.MkdirAll(filepath.Join(btrfs.ProcDir, "42"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(btrfs.ProcDir, "42", "mountinfo"), []byte(mountinfo), 0o644))
	for name, content := range fs {
		p := filepath.Join(btrfs.SysDir, "fs", "btrfs", name)
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		if strings.HasSuffix(name, "/") {
			require.NoError(t, os.MkdirAll(p, 0o755))
			continue
		}
		require.NoError(t, os.WriteFile(p, []byte(content), 0o644))
	}
}

// IncusMounts are incusd's mounts: two btrfs pools, one ext4 (a dir pool).
const IncusMounts = `24 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
76 48 0:43 / /var/lib/incus/storage-pools/default rw,relatime - btrfs /dev/loop3 rw,discard=async,space_cache=v2,user_subvol_rm_allowed,subvolid=5,subvol=/
77 48 0:44 / /var/lib/incus/storage-pools/my\040pool rw,relatime - btrfs /dev/vdb rw,subvolid=5,subvol=/
78 48 8:1 /srv/d /var/lib/incus/storage-pools/d rw,relatime - ext4 /dev/sda1 rw
`
