package drill

import (
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"

	"github.com/box-isolation/box/internal/nstest"
	"github.com/box-isolation/box/internal/testenv/tier"
)

// The watch sees an entry that existed before it started, and a change to
// it while it runs: an entry rewritten to another MAC is what C-SPOOF
// judges a poisoned host by.
func TestNeighWatchSeesEntriesAndChanges(t *testing.T) {
	tier.Root(t)
	ns := nstest.New(t, "boxdrl-"+nstest.RunID()+"-nw")
	ns.AddBridge(t, "boxnet")
	ns.AddAddr(t, "boxnet", "10.88.0.1/24")
	ns.LinkUp(t, "boxnet")
	h := ns.Netlink(t)
	br := ns.Link(t, "boxnet")
	ip := net.ParseIP("10.88.0.11")
	b, _ := net.ParseMAC("10:66:6a:00:00:0b")
	a, _ := net.ParseMAC("10:66:6a:00:00:0a")
	set := func(mac net.HardwareAddr) {
		require.NoError(t, h.NeighSet(&netlink.Neigh{LinkIndex: br.Attrs().Index, Family: netlink.FAMILY_V4, State: netlink.NUD_STALE, IP: ip, HardwareAddr: mac}))
	}
	set(b)
	w, err := watchNeighbours(ns.Name, "boxnet")
	require.NoError(t, err)
	want := netip.MustParseAddr("10.88.0.11")
	at := func(events []neighEvent, mac string) bool {
		return slices.ContainsFunc(events, func(e neighEvent) bool { return !e.FDB && e.IP == want && e.MAC == mac })
	}
	// Each step waits for the watch to have recorded the last one, not
	// for a fixed time: the change is made after the dump is read.
	seen := func(mac string) bool {
		w.mu.Lock()
		defer w.mu.Unlock()
		return at(w.events, mac)
	}
	require.Eventually(t, func() bool { return seen(b.String()) }, 10*time.Second, 5*time.Millisecond, "the entry held before the watch")
	set(a)
	require.Eventually(t, func() bool { return seen(a.String()) }, 10*time.Second, 5*time.Millisecond, "the entry rewritten during it")
	events, err := w.stop()
	require.NoError(t, err)
	assert.True(t, at(events, b.String()), "stop returns what the watch saw: %v", events)
	assert.True(t, at(events, a.String()), "stop returns what the watch saw: %v", events)
}
