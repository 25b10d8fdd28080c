package btrfs_test

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/stack/btrfs"
	"github.com/box-isolation/box/stack/btrfs/btrfstest"
)

func TestReadPoolAcct(t *testing.T) {
	btrfstest.FakeKernel(t, btrfstest.IncusMounts, map[string]string{
		"aaaa/devices/loop3":        "",
		"aaaa/qgroups/inconsistent": "1\n",
		"aaaa/qgroups/enabled":      "1\n",
		"bbbb/devices/vdb":          "",
		"bbbb/qgroups/inconsistent": "0\n",
		"bbbb/qgroups/enabled":      "1\n",
		"cccc/devices/loop9":        "",
		"cccc/qgroups/inconsistent": "1\n",
	})
	a, err := btrfs.Read(42, "default")
	require.NoError(t, err)
	assert.Equal(t, "/var/lib/incus/storage-pools/default", a.Mount)
	assert.Equal(t, filepath.Join(btrfs.SysDir, "fs", "btrfs", "aaaa"), a.SysFS, "the file system is found by its device, not by the first one listed")
	assert.Equal(t, filepath.Join(btrfs.ProcDir, "42", "root"), a.Root)
	assert.True(t, a.Enabled)
	assert.True(t, a.Inconsistent)
	assert.Contains(t, a.Problem(), "aaaa/qgroups/inconsistent is 1")
	assert.Contains(t, a.FixCommand(), "btrfs quota rescan -w "+filepath.Join(btrfs.ProcDir, "42", "root", "var/lib/incus/storage-pools/default"))

	a, err = btrfs.Read(42, "my pool")
	require.NoError(t, err, "a mount point with a space is read (mountinfo escapes it)")
	assert.True(t, a.Enabled)
	assert.False(t, a.Inconsistent)

	_, err = btrfs.Read(42, "d")
	assert.ErrorIs(t, err, btrfs.ErrNotBtrfs, "an ext4 (dir) pool has no qgroups")
	_, err = btrfs.Read(42, "nope")
	assert.ErrorIs(t, err, btrfs.ErrNotBtrfs)
	_, err = btrfs.Read(43, "default")
	assert.ErrorContains(t, err, "reading incusd's mounts")
}

func TestReadPoolAcctQuotasOff(t *testing.T) {
	btrfstest.FakeKernel(t, btrfstest.IncusMounts, map[string]string{"aaaa/devices/loop3": "", "aaaa/features/": ""})
	a, err := btrfs.Read(42, "default")
	require.NoError(t, err)
	assert.False(t, a.Enabled, "no qgroups directory: quotas are off, no size is a limit yet")
	assert.False(t, a.Inconsistent)

	btrfstest.FakeKernel(t, btrfstest.IncusMounts, map[string]string{"aaaa/devices/loop3": "", "aaaa/qgroups/inconsistent": "1", "aaaa/qgroups/enabled": "0"})
	a, err = btrfs.Read(42, "default")
	require.NoError(t, err)
	assert.False(t, a.Inconsistent, "disabled quotas count nothing and limit nothing")
}

func TestReadPoolAcctNoFileSystem(t *testing.T) {
	btrfstest.FakeKernel(t, btrfstest.IncusMounts, map[string]string{"aaaa/devices/loop4": ""})
	_, err := btrfs.Read(42, "default")
	assert.ErrorContains(t, err, "finding the btrfs file system of /var/lib/incus/storage-pools/default (on /dev/loop3)")
}
