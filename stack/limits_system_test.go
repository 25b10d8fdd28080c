package stack_test

import (
	"context"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/drill/image"
	"github.com/box-isolation/box/stack"
	"github.com/box-isolation/box/stack/incus"
)

// TestSystemLimitsHold: a box minted with limits cannot outgrow them: a
// fork bomb in it stops at its process limit, a disk fill at its root
// disk's size (the world's pool is btrfs), a memory hog is killed at its
// memory limit; box says nothing of a limit it could not apply. On a dir
// pool on this machine's ext4 (no project quotas) the disk size is not
// enforced, and box says so when it mints. Numbers: docs/measurements.md,
// "The kernel boundary".
func TestSystemLimitsHold(t *testing.T) {
	ctx, h, _ := worldHost(t)
	_, err := h.Ensure(ctx)
	require.NoError(t, err)
	box := uniq(t, "t-lim-")
	t.Cleanup(func() { _ = h.Remove(context.Background(), box) })
	b, err := h.Mint(ctx, stack.MintRequest{Name: box, Image: image.DefaultAlias,
		Processes: "64", CPUAllowance: "20ms/100ms", Memory: "128MiB", Disk: "128MiB"})
	require.NoError(t, err)
	assert.Empty(t, b.Notes, "every limit applied")
	inst, _, err := h.Incus.Instance(ctx, box)
	require.NoError(t, err)
	assert.Equal(t, "64", inst.Config["limits.processes"])
	assert.Equal(t, "20ms/100ms", inst.Config["limits.cpu.allowance"])

	sh := func(script string) incus.ExecResult {
		t.Helper()
		res, err := h.Incus.Exec(ctx, box, incus.ExecRequest{Command: []string{"sh", "-c", script}})
		require.NoError(t, err)
		return *res
	}

	// A fork bomb with a cap of its own (200): it stops at the limit.
	res := sh(`i=0; while [ $i -lt 200 ]; do sleep 60 & if [ $? -ne 0 ]; then break; fi; i=$((i+1)); done; echo started $i; kill $(jobs -p) 2>/dev/null; wait 2>/dev/null; true`)
	out := string(res.Stdout) + string(res.Stderr)
	m := regexp.MustCompile(`started (\d+)`).FindStringSubmatch(out)
	require.NotNil(t, m, out)
	started, _ := strconv.Atoi(m[1])
	t.Logf("fork bomb: %d processes started under limits.processes=64: %s", started, strings.TrimSpace(out))
	assert.Less(t, started, 64, "the process limit stopped it")
	assert.Contains(t, out, "can't fork")

	// A disk fill with a cap of its own (300 MiB): it stops at the size.
	res = sh(`dd if=/dev/urandom of=/fill bs=1M count=300 2>&1; sync; ls -l /fill; rm -f /fill`)
	out = string(res.Stdout) + string(res.Stderr)
	m = regexp.MustCompile(`(\d+)\+\d+ records out`).FindStringSubmatch(out)
	require.NotNil(t, m, out)
	written, _ := strconv.Atoi(m[1])
	t.Logf("disk fill: %d MiB written to a 128MiB root disk: %s", written, strings.TrimSpace(out))
	assert.Less(t, written, 136, "the root disk's size stopped it")
	assert.Contains(t, out, "quota exceeded")

	// A memory hog with a cap of its own (a string doubled to 512 MiB): the
	// OOM killer ends it.
	res = sh(`awk 'BEGIN{s="x"; for(i=0;i<29;i++){s=s s}; print length(s)}'; echo rc=$?`)
	out = string(res.Stdout) + string(res.Stderr)
	t.Logf("memory hog: %s", strings.TrimSpace(out))
	assert.Contains(t, out, "rc=137", "killed (SIGKILL) at the memory limit, not its 512 MiB")

	// A sibling beside it, minted while it was held, is untouched.
	sib := uniq(t, "t-lim-")
	t.Cleanup(func() { _ = h.Remove(context.Background(), sib) })
	_, err = h.Mint(ctx, stack.MintRequest{Name: sib, Image: image.DefaultAlias})
	require.NoError(t, err)
	_, err = h.WaitAddress(ctx, sib, 30*time.Second)
	require.NoError(t, err)

	// A dir pool on this machine's ext4 skips the size, and box says so.
	const dirPool = "t-lim-dir"
	require.NoError(t, h.Incus.CreateStoragePool(ctx, incus.StoragePool{Name: dirPool, Driver: "dir"}))
	t.Cleanup(func() { _ = h.Incus.DeleteStoragePool(context.Background(), dirPool) })
	onDir := *h
	onDir.Options.Pool = dirPool
	dirBox := uniq(t, "t-lim-")
	t.Cleanup(func() { _ = h.Remove(context.Background(), dirBox) })
	b, err = onDir.Mint(ctx, stack.MintRequest{Name: dirBox, Image: image.DefaultAlias, Disk: "128MiB"})
	require.NoError(t, err)
	require.Len(t, b.Notes, 1, "%v", b.Notes)
	assert.Contains(t, b.Notes[0], "no disk limit: pool "+dirPool+" (dir) did not enforce the root disk's size 128MiB")
	t.Cleanup(func() { _ = onDir.Remove(context.Background(), dirBox) })
}
