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
	time.Sleep(50 * time.Millisecond)
	set(a)
	time.Sleep(100 * time.Millisecond)
	events, err := w.stop()
	require.NoError(t, err)
	want := netip.MustParseAddr("10.88.0.11")
	at := func(mac string) bool {
		return slices.ContainsFunc(events, func(e neighEvent) bool { return !e.FDB && e.IP == want && e.MAC == mac })
	}
	assert.True(t, at(b.String()), "the entry held before the watch: %v", events)
	assert.True(t, at(a.String()), "the entry rewritten during it: %v", events)
}
