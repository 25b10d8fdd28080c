package daemon_test

import (
	"context"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/box-isolation/box/stack/stacktest/worldtest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/drill/image"
	"github.com/box-isolation/box/internal/syncbuf"
	"github.com/box-isolation/box/stack/boxes"
	"github.com/box-isolation/box/stack/daemon"
	"github.com/box-isolation/box/stack/guard"
	"github.com/box-isolation/box/stack/hostns"
	"github.com/box-isolation/box/stack/nft"
	"github.com/box-isolation/box/stack/stacktest"
)

// TestSystemHealAfterFlush: with boxes up and the watcher running, another
// tool's `nft flush ruleset` in the host's namespace is healed with no
// command by hand, twenty times: box's tables and Incus's come back and
// Verify is clean again; another tool's deletion of the guard's qdisc
// is healed too. The times are logged (docs/heal.md), not asserted. A
// restart of the watcher leaves the tables in place, and a teardown-host
// under the running watcher stays torn down.
func TestSystemHealAfterFlush(t *testing.T) {
	ctx, h, st := worldtest.Host(t)
	_, err := h.Ensure(ctx)
	require.NoError(t, err)
	for i := range 2 {
		name := stacktest.Name(t, fmt.Sprintf("t-heal%d-", i))
		_, err := boxes.NewManager(h).Mint(ctx, boxes.MintRequest{Name: name, Image: image.DefaultAlias})
		require.NoError(t, err)
		_, err = h.Addresses().Wait(ctx, name, 30*time.Second)
		require.NoError(t, err)
	}
	_, running, err := hostns.DaemonRunning(h.NetNS)
	require.NoError(t, err)
	require.False(t, running, "no port watcher may run in the world before this test")

	log := &syncbuf.Buffer{}
	start := func() func() {
		wctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func(log *syncbuf.Buffer) { done <- daemon.Run(wctx, h, log, 0) }(log)
		require.Eventually(t, func() bool { _, r, err := hostns.DaemonRunning(h.NetNS); return err == nil && r }, 10*time.Second, 10*time.Millisecond)
		stopped := false
		return func() {
			if !stopped {
				stopped = true
				cancel()
				assert.NoError(t, <-done)
			}
		}
	}
	stop := start()
	t.Cleanup(func() { stop(); t.Logf("the watcher said (last run):\n%s", log.String()) })

	_, cfg := worldtest.NFT(t, st)
	boxBack := func() bool {
		inet, bridge, err := nft.Present(cfg)
		pins, perr := nft.PinsPresent(cfg)
		route, rerr := nft.RoutePresent(cfg)
		return err == nil && perr == nil && rerr == nil && inet && bridge && pins && route
	}
	incusBack := func() bool {
		chains, present, err := nft.IncusChains(cfg)
		return err == nil && present && chains["acl.boxnet"] >= 7 && chains["aclin.boxnet"] > 0 &&
			chains["aclout.boxnet"] > 0 && chains["aclfwd.boxnet"] >= 2 && chains["pstrt.boxnet"] > 0
	}
	clean := func() bool {
		v, err := h.Verify(ctx)
		return err == nil && v.Clean()
	}
	require.Eventually(t, clean, 30*time.Second, 50*time.Millisecond, "clean before the first flush")

	const flushes = 20
	var boxTimes, incusTimes []time.Duration
	for i := range flushes {
		t0 := time.Now()
		out, err := exec.Command("ip", "netns", "exec", st.Names.HostNS, "nft", "flush", "ruleset").CombinedOutput()
		require.NoError(t, err, "nft flush ruleset: %s", out)
		var boxAt, incusAt time.Duration
		for boxAt == 0 || incusAt == 0 {
			require.Less(t, time.Since(t0), time.Minute, "flush %d: box's tables back: %v, Incus's: %v", i, boxAt != 0, incusAt != 0)
			if boxAt == 0 && boxBack() {
				boxAt = time.Since(t0)
			}
			if incusAt == 0 && incusBack() {
				incusAt = time.Since(t0)
			}
			time.Sleep(time.Millisecond)
		}
		boxTimes, incusTimes = append(boxTimes, boxAt), append(incusTimes, incusAt)
		require.Eventually(t, clean, time.Minute, 50*time.Millisecond, "flush %d: Verify clean again with no command by hand", i)
	}
	t.Logf("%d flushes, from the flush's start: box's tables back median %s max %s; Incus's median %s max %s",
		flushes, median(boxTimes), slices.Max(boxTimes), median(incusTimes), slices.Max(incusTimes))
	assert.Contains(t, log.String(), "by nft (pid", "the watcher logged who flushed")
	t.Logf("the watcher said:\n%s", log.String())

	// The guard's qdisc deleted by another tool (no nft event at all): the
	// healer hears tc's and puts the guard back.
	g, err := hostns.Open(st.Names.HostNS)
	require.NoError(t, err)
	defer g.Close()
	guardBack := func() bool {
		found, err := guard.Find(g.Netlink, "boxnet")
		return err == nil && len(found) == 1
	}
	require.True(t, guardBack(), "the guard is attached")
	var guardTimes []time.Duration
	for i := range 5 {
		t0 := time.Now()
		out, err := exec.Command("ip", "netns", "exec", st.Names.HostNS, "tc", "qdisc", "del", "dev", "boxnet", "clsact").CombinedOutput()
		require.NoError(t, err, "tc qdisc del: %s", out)
		require.Eventually(t, guardBack, 10*time.Second, time.Millisecond, "deletion %d: the healer put the guard back", i)
		guardTimes = append(guardTimes, time.Since(t0))
	}
	t.Logf("the guard's qdisc deleted 5 times: back after median %s, max %s", median(guardTimes), slices.Max(guardTimes))
	require.Eventually(t, clean, time.Minute, 50*time.Millisecond, "Verify clean after the guard's deletions")

	// A restart of the watcher: the tables stay, and it finds nothing to do.
	stop()
	assert.True(t, boxBack() && incusBack(), "the tables outlive the watcher")
	log = &syncbuf.Buffer{}
	stop = start()
	require.Eventually(t, func() bool { return strings.Contains(log.String(), "watching the ports") }, 10*time.Second, 10*time.Millisecond)
	assert.True(t, clean(), "clean after the restart")
	assert.NotContains(t, log.String(), "put back", "nothing to put back after a restart")

	// A deliberate teardown under the running watcher stays torn down.
	_, err = h.Teardown(ctx, true)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return strings.Contains(log.String(), "heal: not healing") }, 10*time.Second, 10*time.Millisecond,
		"the healer saw the teardown")
	inet, bridge, err := nft.Present(cfg)
	require.NoError(t, err)
	assert.False(t, inet || bridge, "box's tables stay gone after teardown-host")
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}
