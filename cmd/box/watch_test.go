package main

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/box-isolation/box/internal/syncbuf"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"

	"github.com/box-isolation/box/internal/nstest"
	"github.com/box-isolation/box/internal/testenv"
	"github.com/box-isolation/box/stack/nft"
)

// TestPrivilegedGuardAndServeCommand runs `box guard-and-serve` against a
// throwaway namespace (BOX_NETNS; never the machine's own) holding a
// bridge boxnet and box's tables in port-set mode; then its old name,
// watch-ports, which says it was renamed and is refused beside it.
func TestPrivilegedGuardAndServeCommand(t *testing.T) {
	testenv.Root(t)
	ns := nstest.New(t, "boxpc-"+nstest.RunID()+"-host")
	ns.AddBridge(t, "boxnet")
	_, err := nft.Apply(nft.Config{NetNS: int(ns.Handle), Gateway: netip.MustParseAddr("10.99.0.1")}, nft.Capabilities{}, nil)
	require.NoError(t, err)
	env := map[string]string{"BOX_NETNS": ns.Name, "INCUS_SOCKET": "/nonexistent/box-test.socket"}
	start := func(ctx context.Context, verb string) (*syncbuf.Buffer, *syncbuf.Buffer, <-chan int) {
		out, errw := &syncbuf.Buffer{}, &syncbuf.Buffer{}
		a := &app{ctx: ctx, in: strings.NewReader(""), out: out, err: errw, getenv: func(k string) string { return env[k] }}
		code := make(chan int, 1)
		go func() { code <- a.run([]string{verb}) }()
		return out, errw, code
	}

	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	out, errw, code := start(ctx, "guard-and-serve")
	started := "watching the ports of bridge boxnet in network namespace " + ns.Name
	require.Eventually(t, func() bool { return strings.Contains(errw.String(), started) }, 5*time.Second, 5*time.Millisecond, "stderr: %s", errw.String())

	h := ns.Netlink(t)
	require.NoError(t, h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "vcmd"}, PeerName: "vcmdp"}))
	ns.SetMaster(t, "vcmd", "boxnet")
	require.Eventually(t, func() bool {
		pi, err := h.LinkGetProtinfo(ns.Link(t, "vcmd"))
		return err == nil && pi.Isolated
	}, 5*time.Second, 5*time.Millisecond, "the command's watcher isolates a port that joins")
	require.Eventually(t, func() bool {
		return strings.Contains(errw.String(), "vcmd: joined boxnet, isolated and in the port set ")
	}, 5*time.Second, 5*time.Millisecond, "progress goes to stderr: %s", errw.String())

	// A second daemon in the same namespace, by its old name, says it
	// was renamed, is refused, and says why.
	_, errw2, code2 := start(context.Background(), "watch-ports")
	select {
	case c := <-code2:
		assert.Equal(t, exitFailed, c)
		assert.Contains(t, errw2.String(), "box: watch-ports was renamed guard-and-serve")
		assert.Contains(t, errw2.String(), "box: guarding the stack: box's daemon (pid ")
		assert.Contains(t, errw2.String(), "already serves network namespace "+ns.Name)
	case <-time.After(5 * time.Second):
		t.Fatal("a second daemon did not give up within 5s")
	}

	// SIGINT or SIGTERM ends the context run() gives the command: that
	// stops it with exit 0.
	stop()
	select {
	case c := <-code:
		assert.Equal(t, exitOK, c, "stderr: %s", errw.String())
	case <-time.After(5 * time.Second):
		t.Fatal("watch-ports did not exit within 5s of its context ending")
	}
	assert.Empty(t, out.String(), "nothing on stdout: the log is diagnostics")
}
