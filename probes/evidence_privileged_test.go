package probes

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"
)

// TestPrivilegedControlProvesWitness: a control probe's frames reach the
// peer's witness across the bridge and count as controls, never as
// matches; with the bridge dropping port-to-port frames the same witness
// sees none, which is how a dead or cut-off witness shows.
func TestPrivilegedControlProvesWitness(t *testing.T) {
	w := newBridgeWorld(t)
	for _, drop := range []bool{false, true} {
		t.Run(fmt.Sprintf("drop=%v", drop), func(t *testing.T) {
			w.setDrop(t, drop)
			nonce := NewNonce()
			// It looks for another nonce: a's own IPv6 chatter (MLD, DAD)
			// would match its MAC. TestWitnessCountsControls covers a
			// control frame from a matched MAC.
			wit := startWitness(t, w.b, WitnessSpec{ID: "w", Via: w.subnet, WindowMS: 10000,
				Nonces: []string{NewNonce()}, Control: nonce})
			o := probeIn(t, w.a, ProbeSpec{ID: "ctl", Kind: KindControl, Via: w.subnet, Nonce: nonce,
				DstMAC: w.bMAC.String(), DeadlineMS: 1000})
			seen := wit.Stop()
			we := seen.Evidence.Witness
			t.Logf("control: %s %s; witness: %s, %d control(s), %d match(es)", o.Outcome, o.Reason, seen.Outcome, we.Controls, we.Count)
			require.Equal(t, Reached, o.Outcome, o.Reason)
			require.GreaterOrEqual(t, o.Evidence.Sent, 2, "several frames per window")
			require.Zero(t, we.Count, "a control frame is never a match")
			if drop {
				require.Zero(t, we.Controls, "no control crosses a dropping bridge")
			} else {
				require.Equal(t, o.Evidence.Sent, we.Controls, "every control frame arrived")
				require.False(t, we.ControlLast.IsZero())
			}
		})
	}
}

// TestPrivilegedPinNeighbors: a pinned peer needs no ARP: a probe to it
// leaves at once as IPv4, and with the bridge dropping it the peer's
// witness sees the IPv4 packet never arrive (not an ARP request); the pin
// is removed afterwards.
func TestPrivilegedPinNeighbors(t *testing.T) {
	w := newBridgeWorld(t)
	w.setDrop(t, true)
	var undo func() []NeighborState
	var states []NeighborState
	require.NoError(t, w.a.Run(func() error {
		states, undo = PinNeighbors([]NeighborSpec{{Via: w.subnet, Address: w.bIP, MAC: w.bMAC.String()}})
		return nil
	}))
	require.Len(t, states, 1)
	require.True(t, states[0].Pinned, states[0].Error)
	neighState := func() int {
		st := -1
		require.NoError(t, w.a.Run(func() error {
			ns, err := netlink.NeighList(0, netlink.FAMILY_V4)
			for _, n := range ns {
				if a, ok := netip.AddrFromSlice(n.IP); ok && a.Unmap() == w.bIP {
					st = n.State
				}
			}
			return err
		}))
		return st
	}
	require.Equal(t, netlink.NUD_PERMANENT, neighState())

	nonce := NewNonce()
	wit := startWitness(t, w.b, WitnessSpec{ID: "w", Via: w.subnet, WindowMS: 10000, SrcMACs: []string{w.aMAC.String()}})
	o := probeIn(t, w.a, ProbeSpec{ID: "u", Kind: KindUDP, Target: w.bIP, Port: 7001, Nonce: nonce, Via: w.subnet, DeadlineMS: 1000})
	seen := wit.Stop()
	require.Equal(t, Silent, o.Outcome, "the datagram left (no local unreachable) and was dropped: %s", o.Reason)
	require.Zero(t, seen.Evidence.Witness.Count)
	require.Equal(t, netlink.NUD_PERMANENT, neighState(), "no ARP replaced the pin")

	var after []NeighborState
	require.NoError(t, w.a.Run(func() error { after = undo(); return nil }))
	require.True(t, after[0].Removed, after[0].Error)
	require.Equal(t, -1, neighState(), "the pin is gone")
}

// TestPrivilegedWitnessWindowFromTheStart: a witness armed well before
// its plan's start (longer than its window) still captures from its
// start for its whole window: a control sent after the start, past the
// window counted from the arming, is seen. A window counted from the
// arming would have ended before the start and read as silence.
func TestPrivilegedWitnessWindowFromTheStart(t *testing.T) {
	w := newBridgeWorld(t)
	nonce := NewNonce()
	var wit *Witness
	require.NoError(t, w.b.Run(func() (err error) {
		wit, err = armWitness(WitnessSpec{ID: "w", Via: w.subnet, WindowMS: 300, Nonces: []string{NewNonce()}, Control: nonce})
		return err
	}))
	t.Cleanup(func() { wit.Stop() })
	time.Sleep(500 * time.Millisecond) // the arming's lead, past the window
	start := time.Now()
	wit.begin(start)
	done := make(chan Observation, 1)
	go func() { done <- wit.Wait(context.Background()) }()
	o := probeIn(t, w.a, ProbeSpec{ID: "ctl", Kind: KindControl, Via: w.subnet, Nonce: nonce, DstMAC: w.bMAC.String(), DeadlineMS: 200})
	seen := <-done
	require.Equal(t, Reached, o.Outcome, o.Reason)
	require.GreaterOrEqual(t, time.Since(start), 250*time.Millisecond, "the witness's window ran from its start, not from its arming")
	require.Positive(t, seen.Evidence.Witness.Controls, "the witness captured the control sent after its start: %s", seen.Reason)
}
