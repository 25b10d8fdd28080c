package daemon

import (
	"context"
	"net/netip"
	"path/filepath"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/box-isolation/box/internal/nstest"
	"github.com/box-isolation/box/internal/syncbuf"
	"github.com/box-isolation/box/internal/testenv/tier"
	"github.com/box-isolation/box/stack"
	"github.com/box-isolation/box/stack/nft"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestPrivilegedBootFromSavedFile is the boot in a throwaway namespace:
// box's tables load from the saved file with no Incus (the Host has no
// client: a call would panic) and no bridge yet; the watcher is ready
// before the bridge exists; then "Incus" makes the bridge and plugs a
// box's port in, and the port is in the bridge drop's set from its link
// event alone.
func TestPrivilegedBootFromSavedFile(t *testing.T) {
	tier.Root(t)
	ns := nstest.New(t, "boxboot-"+nstest.RunID()+"-host")
	path := filepath.Join(t.TempDir(), "firewall.json")
	h := &stack.Host{NetNS: ns.Name, Boot: stack.BootFiles{FirewallFile: path}, Lock: stack.SetupLock{Path: filepath.Join(t.TempDir(), "setup.lock")}}
	ctx := context.Background()

	_, err := h.EnsureBoot(ctx)
	require.ErrorContains(t, err, "run box setup-host once")

	require.NoError(t, h.BootFiles().SaveFirewall(func(s *stack.SavedFirewall) { s.Gateway = netip.MustParseAddr("10.99.0.1") }))
	rep, err := h.EnsureBoot(ctx)
	require.NoError(t, err)
	t.Logf("boot: %v; %v", rep.Changes, rep.Notes)
	cfg := nft.Config{NetNS: int(ns.Handle), Gateway: netip.MustParseAddr("10.99.0.1")}
	inet, bridge, err := nft.Present(cfg)
	require.NoError(t, err)
	assert.True(t, inet && bridge, "inet box and bridge box loaded before the bridge exists")
	pins, err := nft.PinsPresent(cfg)
	require.NoError(t, err)
	assert.True(t, pins, "the pin table too")
	again, err := h.EnsureBoot(ctx)
	require.NoError(t, err)
	for _, c := range again.Changes {
		assert.NotEqual(t, "nft", c.Object, "a second boot load changes no table: %v", c)
	}

	var ready atomic.Int32
	w := &watchWorld{ns: ns, log: &syncbuf.Buffer{}, h: ns.Netlink(t), host: h}
	o := defaultWatchOptions()
	o.ready = func() { ready.Add(1) }
	w.watch(t, o)
	assert.EqualValues(t, 1, ready.Load(), "ready after the first sync, with no bridge yet")

	ns.AddBridge(t, "boxnet")
	ns.LinkUp(t, "boxnet")
	l := w.veth(t, "vboot")
	start := time.Now()
	w.enslave(t, l)
	require.Eventually(t, func() bool { return slices.Contains(w.portSet(t), "vboot") }, 5*time.Second, time.Millisecond,
		"the port never joined the bridge drop's set; the watcher said:\n%s", w.log.String())
	t.Logf("port in the bridge drop's set %s after it joined the bridge", time.Since(start).Round(100*time.Microsecond))
	assert.True(t, w.isolated(t, "vboot"), "and isolated")
	assert.EqualValues(t, 1, ready.Load(), "ready is said once")
}
