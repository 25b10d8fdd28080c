package probes

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/internal/dhcpmsg"
)

// TestPrivilegedDHCPProbes sends the DHCP forging probes from a, as a box
// would, to a DHCP server's port on the host: every message arrives,
// from a's own MAC, whole and naming whom the probe says.
func TestPrivilegedDHCPProbes(t *testing.T) {
	w := newSpoofWorld(t)
	var conn *net.UDPConn
	require.NoError(t, w.br.Run(func() (err error) {
		conn, err = net.ListenUDP("udp4", &net.UDPAddr{Port: 67})
		return err
	}))
	t.Cleanup(func() { conn.Close() })
	received := func(n int) (from []netip.Addr, msgs []dhcpmsg.Message) {
		t.Helper()
		buf := make([]byte, 2048)
		require.NoError(t, conn.SetReadDeadline(time.Now().Add(time.Second)))
		for range n {
			k, peer, err := conn.ReadFromUDPAddrPort(buf)
			require.NoError(t, err)
			m, err := dhcpmsg.Parse(buf[:k])
			require.NoError(t, err)
			from = append(from, peer.Addr().Unmap())
			msgs = append(msgs, m)
		}
		require.NoError(t, conn.SetReadDeadline(time.Now().Add(100*time.Millisecond)))
		_, _, err := conn.ReadFromUDPAddrPort(buf)
		require.Error(t, err, "nothing more arrived")
		return from, msgs
	}

	// A release naming b, from a's own address, to the host.
	o := probeIn(t, w.a, ProbeSpec{ID: "rel", Kind: KindDHCPForge, Via: w.subnet, DHCP: DHCPRelease, ClientHW: w.bMAC.String(),
		Target: w.bIP, ServerID: w.hostIP, DstMAC: w.hostMAC.String(), DeadlineMS: probeDeadlineMS})
	t.Logf("release: %s %s %s", o.Outcome, o.Reason, o.Evidence.Request)
	require.Equal(t, Silent, o.Outcome, o.Reason)
	require.Equal(t, spoofSends, o.Evidence.Sent)
	assert.Equal(t, w.aMAC.String(), o.Evidence.MAC)
	from, msgs := received(spoofSends)
	for i, m := range msgs {
		assert.Equal(t, w.aIP, from[i], "from a's own address")
		assert.Equal(t, dhcpmsg.Release, m.Type)
		assert.Equal(t, []byte(w.bMAC), m.CHAddr, "naming b")
		assert.Equal(t, w.bIP, m.CIAddr)
	}

	// A discover for a's own MAC as IEEE 802, from 0.0.0.0 to everyone.
	o = probeIn(t, w.a, ProbeSpec{ID: "ht", Kind: KindDHCPForge, Via: w.subnet, DHCP: DHCPDiscover, HType: 6, DeadlineMS: probeDeadlineMS})
	require.Equal(t, Silent, o.Outcome, o.Reason)
	from, msgs = received(spoofSends)
	assert.Equal(t, netip.IPv4Unspecified(), from[0])
	assert.Equal(t, byte(6), msgs[0].HType)
	assert.Equal(t, []byte(w.aMAC), msgs[0].CHAddr)

	// A flood of 8 made-up clients, each with a discover and a request.
	o = probeIn(t, w.a, ProbeSpec{ID: "fl", Kind: KindDHCPFlood, Via: w.subnet, Count: 8, HWPrefix: "0a:b0:c5",
		Target: netip.MustParseAddr("10.202.0.100"), DeadlineMS: probeDeadlineMS})
	t.Logf("flood: %s %s", o.Outcome, o.Reason)
	require.Equal(t, Silent, o.Outcome, o.Reason)
	require.Equal(t, 16, o.Evidence.Sent)
	_, msgs = received(16)
	clients := map[string]bool{}
	for _, m := range msgs {
		clients[net.HardwareAddr(m.CHAddr).String()] = true
	}
	assert.Len(t, clients, 8, "8 made-up clients")
	assert.True(t, clients["0a:b0:c5:00:00:07"])
}
