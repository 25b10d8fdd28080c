package boxes_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/box-isolation/box/stack/model"
	"github.com/box-isolation/box/stack/stacktest/worldtest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/drill/image"
	"github.com/box-isolation/box/stack/boxes"
	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/stacktest"
)

// TestSystemLimitsHold: a box minted with limits cannot outgrow them: a
// fork bomb in it stops at its process limit, a disk fill at its root
// disk's size (the world's pool is btrfs), a memory hog is killed at its
// memory limit; box says nothing of a limit it could not apply. On a dir
// pool on this machine's ext4 (no project quotas) the disk size is not
// enforced, and box says so when it mints. Numbers: docs/measurements.md,
// "The kernel boundary".
func TestSystemLimitsHold(t *testing.T) {
	ctx, h, st := worldtest.Host(t)
	worldtest.EnsureCounting(ctx, t, h, st)
	box := stacktest.Name(t, "t-lim-")
	t.Cleanup(func() { _ = boxes.NewManager(h).Remove(context.Background(), box) })
	b, err := boxes.NewManager(h).Mint(ctx, boxes.MintRequest{Name: box, Image: image.DefaultAlias,
		Processes: "64", CPUAllowance: "20ms/100ms", Memory: "128MiB", Disk: "128MiB"})
	require.NoError(t, err)
	assert.Empty(t, b.Notes, "every limit applied")
	inst, _, err := h.Incus.Instances().Get(ctx, box)
	require.NoError(t, err)
	assert.Equal(t, "64", inst.Config["limits.processes"])
	assert.Equal(t, "20ms/100ms", inst.Config["limits.cpu.allowance"])

	sh := func(script string) incus.ExecResult {
		t.Helper()
		res, err := h.Incus.Instances().Exec(ctx, box, incus.ExecRequest{Command: []string{"sh", "-c", script}})
		require.NoError(t, err)
		return *res
	}

	// A fork bomb with a cap of its own (200), of processes that end by
	// themselves: the shell dies at the first fork refused, and until its
	// sleepers end the box is full (an exec into it fails then too).
	res := sh(`i=0; while [ $i -lt 200 ]; do sleep 5 & i=$((i+1)); echo $i; done`)
	out := strings.TrimSpace(string(res.Stdout))
	lines := strings.Split(out, "\n")
	started, _ := strconv.Atoi(lines[len(lines)-1])
	t.Logf("fork bomb: %d processes started under limits.processes=64: %s", started, strings.TrimSpace(string(res.Stderr)))
	assert.Less(t, started, 64, "the process limit stopped it")
	assert.Contains(t, string(res.Stderr), "can't fork")
	require.Eventually(t, func() bool {
		r, err := h.Incus.Instances().Exec(ctx, box, incus.ExecRequest{Command: []string{"sh", "-c", `ps | grep -v grep | grep -q "sleep 5" && exit 1; exit 0`}})
		return err == nil && r.ExitCode == 0
	}, 30*time.Second, time.Second, "the box takes processes again once its sleepers end")

	// A disk fill with a cap of its own (300 MiB): it stops at the size.
	// Its words go to the box's memory first: Incus records an exec's
	// output on the box's volume, and a full quota would take them (seen
	// here: an empty output, exit 0), until a sync after the removal
	// gives the space back.
	var written int
	for try := 1; ; try++ {
		sh(`dd if=/dev/urandom of=/fill bs=1M count=300 >/tmp/fill.out 2>&1; ls -l /fill >>/tmp/fill.out; rm -f /fill; sync`)
		res = sh(`cat /tmp/fill.out`)
		out = string(res.Stdout) + string(res.Stderr)
		written = worldtest.DDMiB(t, &res)
		// A size holds only while the kernel counts: a pool whose
		// accounting went inconsistent during the fill (another
		// subvolume's deletion finishing late) proves nothing either way,
		// and is rescanned and filled again, once.
		v, err := h.Verify(ctx)
		require.NoError(t, err)
		inconsistent := slices.ContainsFunc(v.Findings, func(f model.Finding) bool { return strings.HasPrefix(f.Object, "storage pool") })
		if !inconsistent || try == 2 {
			break
		}
		t.Logf("disk fill %d: %d MiB written while the pool's accounting went inconsistent (the kernel said: %s); rescanned, again", try, written, worldtest.KernelQgroupLog())
		worldtest.EnsureCounting(ctx, t, h, st)
	}
	t.Logf("disk fill: %d MiB written to a 128MiB root disk: %s", written, strings.TrimSpace(out))
	if !assert.Less(t, written, 136, "the root disk's size stopped it") {
		// Seen twice in clean-clone runs, after the drill's tests: the
		// kernel had stopped counting (TestSystemDiskAccounting). What the
		// pool's quota groups and the kernel said.
		t.Logf("the pool's quota groups: %s; the kernel said: %s", poolQuotaGroups(st.IncusdPID, st.IncusDir), worldtest.KernelQgroupLog())
	}
	assert.Contains(t, out, "quota exceeded")

	// A memory hog with a cap of its own (a string doubled to 512 MiB): the
	// OOM killer ends it.
	res = sh(`awk 'BEGIN{s="x"; for(i=0;i<29;i++){s=s s}; print length(s)}'; echo rc=$?`)
	out = string(res.Stdout) + string(res.Stderr)
	t.Logf("memory hog: %s", strings.TrimSpace(out))
	assert.Contains(t, out, "rc=137", "killed (SIGKILL) at the memory limit, not its 512 MiB")

	// A sibling beside it, minted while it was held, is untouched.
	sib := stacktest.Name(t, "t-lim-")
	t.Cleanup(func() { _ = boxes.NewManager(h).Remove(context.Background(), sib) })
	_, err = boxes.NewManager(h).Mint(ctx, boxes.MintRequest{Name: sib, Image: image.DefaultAlias})
	require.NoError(t, err)
	_, err = h.Addresses().Wait(ctx, sib, 30*time.Second)
	require.NoError(t, err)

	// A dir pool on this machine's ext4 skips the size, and box says so.
	const dirPool = "t-lim-dir"
	require.NoError(t, h.Incus.Storage().CreatePool(ctx, incus.StoragePool{Name: dirPool, Driver: "dir"}))
	t.Cleanup(func() { _ = h.Incus.Storage().DeletePool(context.Background(), dirPool) })
	onDir := *h
	onDir.Options.Pool = dirPool
	dirBox := stacktest.Name(t, "t-lim-")
	t.Cleanup(func() { _ = boxes.NewManager(h).Remove(context.Background(), dirBox) })
	b, err = boxes.NewManager(&onDir).Mint(ctx, boxes.MintRequest{Name: dirBox, Image: image.DefaultAlias, Disk: "128MiB"})
	require.NoError(t, err)
	require.Len(t, b.Notes, 1, "%v", b.Notes)
	assert.Contains(t, b.Notes[0], "no disk limit: pool "+dirPool+" (dir) did not enforce the root disk's size 128MiB")
	t.Cleanup(func() { _ = boxes.NewManager(&onDir).Remove(context.Background(), dirBox) })
}

// poolQuotaGroups is what the btrfs quota groups of the world's pool say
// (its mount lives in incusd's mount namespace), with the kernel's flags
// for each btrfs file system (qgroups/inconsistent, drop_subtree_threshold).
func poolQuotaGroups(incusd int, incusDir string) string {
	pool := filepath.Join(incusDir, "storage-pools", "default")
	out, err := exec.Command("nsenter", "-t", strconv.Itoa(incusd), "-m", "--", "btrfs", "qgroup", "show", "-re", "--raw", pool).CombinedOutput()
	var b strings.Builder
	fmt.Fprintf(&b, "%s (err %v)", out, err)
	flags, _ := filepath.Glob("/sys/fs/btrfs/*/qgroups/*")
	for _, f := range flags {
		if base := filepath.Base(f); base == "inconsistent" || base == "drop_subtree_threshold" || base == "mode" {
			v, _ := os.ReadFile(f)
			fmt.Fprintf(&b, "; %s=%s", strings.TrimPrefix(f, "/sys/fs/btrfs/"), strings.TrimSpace(string(v)))
		}
	}
	return b.String()
}

// ensureCounting, ddMiB and kernelQgroupLog are the stack's system-tier
// helpers (stack/diskacct_system_test.go), as a test package's helpers are
// its own.
