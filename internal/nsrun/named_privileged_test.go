package nsrun_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/box-isolation/box/internal/nsrun"
	"github.com/box-isolation/box/internal/testenv/tier"
)

// coveredChild marks the copy of this test binary that runs inside a mount
// namespace of its own, where /run/netns is a tmpfs nobody else sees.
const coveredChild = "BOX_NSRUN_COVERED_CHILD"

// TestDeleteCovered makes the state `ip netns add` leaves behind on a host
// where names were made before it (it bind-mounts /run/netns onto itself,
// copying them on top) and then unmounts the copy of one, the way a
// teardown does: the first mount stays hidden under the new /run/netns,
// umount says EINVAL and unlink EBUSY, and the name could never be deleted
// or made again. Delete must remove it and leave the other name alone.
// All of it happens in a throwaway mount namespace (unshare -m).
func TestDeleteCovered(t *testing.T) {
	if os.Getenv(coveredChild) == "" {
		tier.Root(t)
		unshare := tier.Tool(t, "unshare", "util-linux")
		exe, err := os.Executable()
		require.NoError(t, err)
		cmd := exec.Command(unshare, "--mount", "--propagation", "private", exe, "-test.run=^TestDeleteCovered$", "-test.v")
		cmd.Env = append(os.Environ(), coveredChild+"=1")
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "the child in a mount namespace of its own:\n%s", out)
		require.Contains(t, string(out), "--- PASS: TestDeleteCovered", "the child ran the test:\n%s", out)
		return
	}
	require.NoError(t, os.MkdirAll(nsrun.Dir, 0o755))
	require.NoError(t, unix.Mount("tmpfs", nsrun.Dir, "tmpfs", 0, "size=1m"))
	require.NoError(t, nsrun.Create("boxnsrun-kept"))
	require.NoError(t, nsrun.Create("boxnsrun-covered"))
	// What `ip netns add` does when /run/netns is not a mount point of its own.
	require.NoError(t, unix.Mount(nsrun.Dir, nsrun.Dir, "", unix.MS_BIND|unix.MS_REC, ""))
	covered := filepath.Join(nsrun.Dir, "boxnsrun-covered")
	require.NoError(t, unix.Unmount(covered, 0), "the copy on top")
	require.ErrorIs(t, unix.Unmount(covered, 0), unix.EINVAL, "the first mount is out of umount's reach")
	require.ErrorIs(t, unix.Unlink(covered), unix.EBUSY, "and the file out of unlink's")

	require.NoError(t, nsrun.Delete("boxnsrun-covered"))
	require.False(t, nsrun.Exists("boxnsrun-covered"))
	mounts, err := os.ReadFile("/proc/self/mountinfo")
	require.NoError(t, err)
	require.NotContains(t, string(mounts), "boxnsrun-covered", "no mount of the name is left, hidden or not")
	require.True(t, strings.Contains(string(mounts), "/boxnsrun-kept "), "the other name is still mounted:\n%s", mounts)
	require.NoError(t, nsrun.Create("boxnsrun-covered"), "the name can be made again")
	require.NoError(t, nsrun.Delete("boxnsrun-covered"))
	require.NoError(t, nsrun.Delete("boxnsrun-kept"))
}
