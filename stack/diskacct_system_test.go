package stack_test

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/box-isolation/box/stack/stacktest/worldtest"

	"github.com/box-isolation/box/stack/stacktest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/drill/image"
	"github.com/box-isolation/box/stack"
	"github.com/box-isolation/box/stack/boxes"
	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/model"
)

// TestSystemDiskAccounting: a box's root disk size on the world's btrfs
// pool is a qgroup limit, and it holds only while the kernel counts.
// Broken by hand the way an operator's backup tool might (a snapshot
// taken into a higher-level qgroup its source is not in: the kernel logs
// "qgroup marked inconsistent, qgroup inherit needs a rescan" and stops
// counting), a box writes past its size; box doctor names the pool, a
// box minted then says its size does not hold, doctor --fix rescans, and
// a fill stops at the size again.
func TestSystemDiskAccounting(t *testing.T) {
	ctx, h, st := worldtest.Host(t)
	worldtest.EnsureCounting(ctx, t, h, st)
	pool := filepath.Join(st.IncusDir, "storage-pools", "default")
	btrfs := func(args ...string) string {
		t.Helper()
		out, err := exec.Command("nsenter", append([]string{"-t", strconv.Itoa(st.IncusdPID), "-m", "--", "btrfs"}, args...)...).CombinedOutput()
		require.NoError(t, err, "btrfs %v: %s", args, out)
		return string(out)
	}
	// fill writes 96 MiB into the box's root disk and says how much went.
	// A fill whose own output file could not be made is tried again, for
	// up to 30 s: seen once under load, the kernel still counting a box at
	// its size right after a break or a rescan.
	fill := func(box string) (int, string) {
		t.Helper()
		var res *incus.ExecResult
		for start := time.Now(); ; time.Sleep(2 * time.Second) {
			var err error
			res, err = h.Incus.Instances().Exec(ctx, box, incus.ExecRequest{Command: []string{"sh", "-c",
				`dd if=/dev/urandom of=/fill bs=1M count=96 oflag=direct >/tmp/fill.out 2>&1; rm -f /fill; sync; cat /tmp/fill.out`}})
			require.NoError(t, err)
			if !strings.Contains(string(res.Stderr), "can't open '/tmp/fill.out'") || time.Since(start) > 30*time.Second {
				break
			}
			t.Logf("the fill in %s could not start (its output file could not be made: %s); again", box, strings.TrimSpace(string(res.Stderr)))
		}
		out := string(res.Stdout) + string(res.Stderr)
		return worldtest.DDMiB(t, res), out
	}
	mint := func() *stack.Box {
		t.Helper()
		name := stacktest.Name(t, "t-acct-")
		t.Cleanup(func() { _ = boxes.NewManager(h).Remove(context.Background(), name) })
		b, err := boxes.NewManager(h).Mint(ctx, boxes.MintRequest{Name: name, Image: image.DefaultAlias, Disk: "64MiB"})
		require.NoError(t, err)
		return b
	}

	// Whole: a fill stops at the size.
	good := mint()
	assert.Empty(t, good.Notes)
	n, out := fill(good.Name)
	t.Logf("counting: %d MiB written into a 64MiB root disk: %s", n, strings.TrimSpace(out))
	assert.Less(t, n, 64, "the size holds while the kernel counts")

	// The break, by hand: a qgroup of level 1, and a snapshot of the box's
	// volume taken into it.
	const group = "1/4242"
	snap := filepath.Join(pool, "t-acct-snap")
	btrfs("qgroup", "create", group, pool)
	btrfs("subvolume", "snapshot", "-i", group, filepath.Join(pool, "containers", good.Name), snap)
	t.Cleanup(func() {
		// The group goes once the snapshot is gone, which the kernel's
		// cleaner finishes later (sync waits for it).
		for _, args := range [][]string{{"subvolume", "delete", snap}, {"subvolume", "sync", pool}, {"qgroup", "destroy", group, pool}} {
			_ = exec.Command("nsenter", append([]string{"-t", strconv.Itoa(st.IncusdPID), "-m", "--", "btrfs"}, args...)...).Run()
		}
		_, _ = h.Ensure(context.Background())
	})

	v, err := h.Verify(ctx)
	require.NoError(t, err)
	f := findingOn(v, "storage pool default")
	require.NotNil(t, f, "doctor names the pool: %v", v.Findings)
	assert.Equal(t, model.LayerFleet, f.Layer)
	assert.Contains(t, f.Problem, "quota accounting is inconsistent")
	assert.Contains(t, f.Fix, "box doctor --fix")

	bad := mint()
	require.Len(t, bad.Notes, 1, "%v", bad.Notes)
	assert.Contains(t, bad.Notes[0], "no disk limit: pool default's btrfs quota accounting is inconsistent")
	n, out = fill(bad.Name)
	t.Logf("not counting: %d MiB written into a 64MiB root disk: %s", n, strings.TrimSpace(out))
	assert.Greater(t, n, 64, "the break is real: the size did not hold")

	// doctor --fix.
	rep, err := h.Ensure(ctx)
	require.NoError(t, err)
	var did []string
	for _, c := range rep.Changes {
		did = append(did, fmt.Sprintf("%s %s: %s", c.Object, c.Action, c.Detail))
	}
	assert.Contains(t, did, "storage pool default updated: btrfs quota rescan done: box root disk sizes hold again")
	v, err = h.Verify(ctx)
	require.NoError(t, err)
	assert.Nil(t, findingOn(v, "storage pool default"), "%v", v.Findings)
	n, out = fill(bad.Name)
	t.Logf("rescanned: %d MiB written into the same 64MiB root disk: %s", n, strings.TrimSpace(out))
	assert.Less(t, n, 64, "the size holds again")
	assert.Contains(t, out, "quota exceeded")
}

func findingOn(v *stack.Verification, object string) *model.Finding {
	for i := range v.Findings {
		if v.Findings[i].Object == object {
			return &v.Findings[i]
		}
	}
	return nil
}
