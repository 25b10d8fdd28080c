// Package worldtest is the stack's system tests' support in the hermetic
// world: a bare stack on the world's incusd (Host), the host namespace's
// nftables (NFT), and the disk accounting's readings. Tests of stack,
// stack/boxes and stack/daemon share it.
package worldtest

import (
	"context"
	"fmt"
	"net/netip"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netns"

	"github.com/box-isolation/box/drill/image"
	"github.com/box-isolation/box/fixtures/world"
	"github.com/box-isolation/box/internal/testenv"
	"github.com/box-isolation/box/stack"
	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/model"
	"github.com/box-isolation/box/stack/nft"
)

// Host is a Host on the world's incusd and host namespace, with the probe
// image imported and the stack torn down before and after the test: each
// test starts from a bare stack and leaves one.
func Host(t *testing.T) (context.Context, *stack.Host, *world.State) {
	t.Helper()
	st, c := testenv.Incus(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	_, err := image.Ensure(ctx, c, image.DefaultAlias, image.Options{})
	require.NoError(t, err)
	h := &stack.Host{Incus: c, NetNS: st.Names.HostNS, Options: model.Options{DNS: []netip.Addr{world.Resolver}}}
	bare := func() {
		_, err := h.Teardown(context.Background(), true)
		require.NoError(t, err, "tearing the stack down")
	}
	bare()
	t.Cleanup(bare)
	return ctx, h, st
}

// NFT is a netlink connection to nftables in the world's host namespace,
// and the config of box's tables there.
func NFT(t *testing.T, st *world.State) (*nftables.Conn, nft.Config) {
	t.Helper()
	ns, err := netns.GetFromName(st.Names.HostNS)
	require.NoError(t, err)
	t.Cleanup(func() { ns.Close() })
	conn, err := nftables.New(nftables.WithNetNSFd(int(ns)))
	require.NoError(t, err)
	return conn, nft.Config{Table: "box", Bridge: "boxnet", NetNS: int(ns)}
}

// EnsureCounting waits for the kernel's cleaner to finish the
// subvolumes deleted before (earlier tests' boxes: one it finishes later
// can mark the pool's accounting inconsistent in the middle of a test,
// seen under load as a fill running past its size), then ensures the
// stack, and says so when that rescanned the pool's accounting: something
// before the test had stopped the kernel counting, and what the kernel
// logged says what.
func EnsureCounting(ctx context.Context, t *testing.T, h *stack.Host, st *world.State) {
	t.Helper()
	pool := filepath.Join(st.IncusDir, "storage-pools", "default")
	out, err := exec.Command("nsenter", "-t", strconv.Itoa(st.IncusdPID), "-m", "--", "btrfs", "subvolume", "sync", pool).CombinedOutput()
	require.NoError(t, err, "btrfs subvolume sync %s: %s", pool, out)
	rep, err := h.Ensure(ctx)
	require.NoError(t, err)
	for _, c := range rep.Changes {
		if strings.HasPrefix(c.Object, "storage pool") {
			t.Logf("the pool's accounting was inconsistent before this test (%s); the kernel said: %s", c.Detail, KernelQgroupLog())
		}
	}
}

// DDMiB is how many MiB dd (bs=1M) says it wrote, from an exec's output.
func DDMiB(t *testing.T, res *incus.ExecResult) int {
	t.Helper()
	out := string(res.Stdout) + string(res.Stderr)
	m := regexp.MustCompile(`(\d+)\+\d+ records out`).FindStringSubmatch(out)
	require.NotNil(t, m, "exit %d: %q", res.ExitCode, out)
	n, _ := strconv.Atoi(m[1])
	return n
}

// KernelQgroupLog is what the kernel logged of quota groups (dmesg).
func KernelQgroupLog() string {
	out, err := exec.Command("dmesg").CombinedOutput()
	if err != nil {
		return fmt.Sprintf("dmesg: %v", err)
	}
	var lines []string
	for l := range strings.SplitSeq(string(out), "\n") {
		if strings.Contains(l, "qgroup") {
			lines = append(lines, strings.TrimSpace(l))
		}
	}
	return strings.Join(lines, "; ")
}
