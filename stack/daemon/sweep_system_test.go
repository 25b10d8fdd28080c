package daemon_test

import (
	"context"
	"fmt"
	"os/exec"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/internal/syncbuf"
	"github.com/box-isolation/box/internal/testenv"
	"github.com/box-isolation/box/stack/daemon"
	"github.com/box-isolation/box/stack/hostns"
	"github.com/box-isolation/box/stack/model"
	"github.com/box-isolation/box/stack/nft"
	"github.com/box-isolation/box/stack/stacktest/worldtest"
)

// TestSystemNewPortNotBehindLeakSweep: a firewall converge (doctor --fix,
// the healer's after a flush) that finds a leaked veth pair waits a
// second before it removes it; a port that joins the bridge meanwhile is
// taken into the bridge drop's set by the watcher while the leaked pair
// is still there, not after the sweep. Seen at a machine's boot under
// load: the converge held the port set's lock through its sweep, and a
// new box's port stayed outside the set for 1.06 s.
func TestSystemNewPortNotBehindLeakSweep(t *testing.T) {
	ctx, h, st := worldtest.Host(t)
	_, err := h.Ensure(ctx)
	require.NoError(t, err)
	_, cfg := worldtest.NFT(t, st)
	if _, ok, err := nft.PortSetMembers(cfg); err != nil || !ok {
		testenv.Unavailable(t, fmt.Sprintf("the bridge drop's port set (this kernel's bridge drop has none: %v)", err))
	}
	g, err := hostns.Open(st.Names.HostNS)
	require.NoError(t, err)
	defer g.Close()
	gw, ok, err := g.IPv4Prefix("boxnet")
	require.NoError(t, err)
	require.True(t, ok, "boxnet has its address")

	log := &syncbuf.Buffer{}
	wctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- daemon.WatchPorts(wctx, h, log) }()
	t.Cleanup(func() {
		cancel()
		assert.NoError(t, <-done)
		t.Logf("the watcher said:\n%s", log.String())
	})
	require.Eventually(t, func() bool { _, r, err := hostns.DaemonRunning(h.NetNS); return err == nil && r }, 10*time.Second, 10*time.Millisecond)

	ipHost := func(args ...string) {
		t.Helper()
		out, err := exec.Command("ip", append([]string{"-n", st.Names.HostNS}, args...)...).CombinedOutput()
		require.NoError(t, err, "ip %v: %s", args, out)
	}
	inSet := func(port string) bool {
		ports, _, err := nft.PortSetMembers(cfg)
		return err == nil && slices.Contains(ports, port)
	}
	linkThere := func(name string) bool { _, err := g.Netlink.LinkByName(name); return err == nil }
	// A leaked pair: the port on the bridge, its other end down in the
	// host's namespace, no instance's.
	const leaked, fresh = "t-leak0", "t-new0"
	ipHost("link", "add", leaked, "type", "veth", "peer", "name", leaked+"p")
	t.Cleanup(func() { _ = exec.Command("ip", "-n", st.Names.HostNS, "link", "del", leaked).Run() })
	ipHost("link", "set", leaked, "master", "boxnet", "up")
	require.Eventually(t, func() bool { return inSet(leaked) }, 10*time.Second, 5*time.Millisecond, "the watcher took the leaked port in")

	applied := make(chan error, 1)
	go func() {
		res, err := h.ApplyFirewall(ctx, g, gw.Addr())
		if err == nil && !slices.ContainsFunc(res.Changes, func(c model.Change) bool { return c.Object == "bridge port "+leaked && c.Action == "removed" }) {
			err = fmt.Errorf("the converge did not sweep the leaked pair: %v", res.Changes)
		}
		applied <- err
	}()
	// Well inside the sweep's second of grace (the first look asks Incus
	// for its instances: tens of milliseconds).
	time.Sleep(300 * time.Millisecond)
	ipHost("link", "add", fresh, "type", "veth", "peer", "name", fresh+"p")
	t.Cleanup(func() { _ = exec.Command("ip", "-n", st.Names.HostNS, "link", "del", fresh).Run() })
	ipHost("link", "set", fresh+"p", "up")
	joined := time.Now()
	ipHost("link", "set", fresh, "master", "boxnet", "up")
	for !inSet(fresh) {
		require.Less(t, time.Since(joined), 10*time.Second, "the new port never entered the set")
		time.Sleep(time.Millisecond)
	}
	took := time.Since(joined)
	leakStill := linkThere(leaked)
	t.Logf("the new port entered the set %s after it joined; the leaked pair was still there: %v", took.Round(100*time.Microsecond), leakStill)
	assert.True(t, leakStill, "the new port waited for the converge's leak sweep to end (%s)", took)
	require.NoError(t, <-applied)
	assert.False(t, linkThere(leaked), "the sweep removed the leaked pair")
}
