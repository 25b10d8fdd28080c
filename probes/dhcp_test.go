package probes

import (
	"encoding/binary"
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/internal/dhcpmsg"
)

var (
	ownMAC  = net.HardwareAddr{0x10, 0x66, 0x6a, 0, 0, 0x0a}
	ownAddr = netip.MustParseAddr("10.88.0.10")
	boxnet  = netip.MustParsePrefix("10.88.0.10/24")
)

// decodeFrame reads back the IPv4 packet a DHCP probe writes: both
// checksums right, UDP from 68 to 67, and the message it carries.
func decodeFrame(t *testing.T, f dhcpFrame) (src, dst netip.Addr, m dhcpmsg.Message) {
	t.Helper()
	p := f.packet
	require.GreaterOrEqual(t, len(p), 28)
	assert.Equal(t, byte(0x45), p[0])
	assert.Equal(t, len(p), int(binary.BigEndian.Uint16(p[2:4])))
	assert.Equal(t, uint32(0xffff), foldSum(onesSum(0, p[:20])), "the IP header's checksum is right")
	assert.Equal(t, byte(17), p[9], "UDP")
	src, dst = netip.AddrFrom4([4]byte(p[12:16])), netip.AddrFrom4([4]byte(p[16:20]))
	u := p[20:]
	assert.Equal(t, uint16(68), binary.BigEndian.Uint16(u[0:2]))
	assert.Equal(t, uint16(67), binary.BigEndian.Uint16(u[2:4]))
	assert.Equal(t, len(u), int(binary.BigEndian.Uint16(u[4:6])))
	// The UDP checksum over the pseudo-header and the datagram is 0xffff.
	s4, d4 := src.As4(), dst.As4()
	sum := onesSum(onesSum(onesSum(0, s4[:]), d4[:]), u) + 17 + uint32(len(u))
	assert.Equal(t, uint32(0xffff), foldSum(sum), "the UDP checksum is right")
	m, err := dhcpmsg.Parse(u[8:])
	require.NoError(t, err)
	return src, dst, m
}

func TestDHCPForgeFrames(t *testing.T) {
	server, b := netip.MustParseAddr("10.88.0.1"), netip.MustParseAddr("10.88.0.11")
	bMAC := "10:66:6a:00:00:0b"
	for _, tc := range []struct {
		name     string
		spec     ProbeSpec
		src, dst string
		eth      string
		check    func(t *testing.T, m dhcpmsg.Message)
	}{
		{"a release naming box-b, from our own address, to the server", ProbeSpec{DHCP: DHCPRelease, ClientHW: bMAC, Target: b, ServerID: server, DstMAC: "02:00:00:00:00:01"},
			"10.88.0.10", "10.88.0.1", "02:00:00:00:00:01", func(t *testing.T, m dhcpmsg.Message) {
				assert.Equal(t, dhcpmsg.Release, m.Type)
				assert.Equal(t, bMAC, net.HardwareAddr(m.CHAddr).String(), "chaddr names box-b")
				assert.Equal(t, b, m.CIAddr, "ciaddr is box-b's address")
				id, ok := m.Option(dhcpmsg.OptServerID)
				require.True(t, ok)
				assert.Equal(t, server.AsSlice(), id)
			}},
		{"a decline naming box-b, broadcast from our own address", ProbeSpec{DHCP: DHCPDecline, ClientHW: bMAC, Target: b, ServerID: server},
			"10.88.0.10", "255.255.255.255", "ff:ff:ff:ff:ff:ff", func(t *testing.T, m dhcpmsg.Message) {
				assert.Equal(t, dhcpmsg.Decline, m.Type)
				assert.Equal(t, bMAC, net.HardwareAddr(m.CHAddr).String())
				req, ok := m.Option(dhcpmsg.OptRequestedIP)
				require.True(t, ok)
				assert.Equal(t, b.AsSlice(), req, "the requested address is box-b's")
				assert.False(t, m.CIAddr.IsValid())
			}},
		{"a discover for our own MAC as IEEE 802", ProbeSpec{DHCP: DHCPDiscover, HType: 6},
			"0.0.0.0", "255.255.255.255", "ff:ff:ff:ff:ff:ff", func(t *testing.T, m dhcpmsg.Message) {
				assert.Equal(t, dhcpmsg.Discover, m.Type)
				assert.Equal(t, byte(6), m.HType)
				assert.Equal(t, []byte(ownMAC), m.CHAddr, "our MAC when none is named")
				_, ok := m.Option(dhcpmsg.OptRapidCommit)
				assert.True(t, ok, "rapid commit")
				assert.True(t, m.Broadcast)
			}},
		{"a discover for our MAC and 10 bytes more", ProbeSpec{DHCP: DHCPDiscover, ClientHW: "10:66:6a:00:00:0a:b0:c5:01:02:03:04:05:06:07:08"},
			"0.0.0.0", "255.255.255.255", "ff:ff:ff:ff:ff:ff", func(t *testing.T, m dhcpmsg.Message) {
				assert.Equal(t, byte(1), m.HType)
				assert.Len(t, m.CHAddr, 16, "hlen 16")
			}},
		{"a discover with a client identifier of our own making", ProbeSpec{DHCP: DHCPDiscover, ClientID: "ff:b0:c5:00:00:01"},
			"0.0.0.0", "255.255.255.255", "ff:ff:ff:ff:ff:ff", func(t *testing.T, m dhcpmsg.Message) {
				id, ok := m.Option(dhcpmsg.OptClientID)
				require.True(t, ok)
				assert.Equal(t, []byte{0xff, 0xb0, 0xc5, 0, 0, 1}, id)
				assert.Equal(t, []byte(ownMAC), m.CHAddr)
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.spec.Kind, tc.spec.Via, tc.spec.ID, tc.spec.DeadlineMS = KindDHCPForge, boxnet, "p", 1500
			require.NoError(t, tc.spec.Validate())
			f, err := dhcpForgeFrame(&tc.spec, ownMAC, ownAddr, 7)
			require.NoError(t, err)
			src, dst, m := decodeFrame(t, f)
			assert.Equal(t, tc.src, src.String())
			assert.Equal(t, tc.dst, dst.String())
			assert.Equal(t, tc.eth, f.dst.String())
			assert.Equal(t, uint32(7), m.Xid)
			tc.check(t, m)
			assert.NotEmpty(t, f.what)
		})
	}
}

// A flood asks for a lease for each made-up client, twice: a discover
// with rapid commit, and a request for an address of its own.
func TestDHCPFloodFrames(t *testing.T) {
	spec := ProbeSpec{ID: "p", Kind: KindDHCPFlood, Via: boxnet, Count: 3, HWPrefix: "0a:b0:c5", Target: netip.MustParseAddr("10.88.0.253"), DeadlineMS: 1500}
	require.NoError(t, spec.Validate())
	fs, err := dhcpFloodFrames(&spec, ownMAC, 100)
	require.NoError(t, err)
	require.Len(t, fs, 5, "the last client's request would be for the broadcast address: none")
	var clients []string
	for i, f := range fs {
		src, dst, m := decodeFrame(t, f)
		assert.Equal(t, "0.0.0.0", src.String())
		assert.Equal(t, "255.255.255.255", dst.String())
		assert.Equal(t, uint32(100+i), m.Xid)
		if m.Type == dhcpmsg.Discover {
			clients = append(clients, net.HardwareAddr(m.CHAddr).String())
			_, ok := m.Option(dhcpmsg.OptRapidCommit)
			assert.True(t, ok)
			continue
		}
		require.Equal(t, dhcpmsg.Request, m.Type)
		req, _ := m.Option(dhcpmsg.OptRequestedIP)
		assert.Contains(t, []string{"10.88.0.253", "10.88.0.254"}, netip.AddrFrom4([4]byte(req)).String())
		assert.Equal(t, clients[len(clients)-1], net.HardwareAddr(m.CHAddr).String(), "the request is the last discover's client's")
	}
	assert.Equal(t, []string{"0a:b0:c5:00:00:00", "0a:b0:c5:00:00:01", "0a:b0:c5:00:00:02"}, clients)

	byID := ProbeSpec{ID: "p", Kind: KindDHCPFlood, Via: boxnet, Count: 2, ClientID: "ff:b0:c5", DeadlineMS: 1500}
	require.NoError(t, byID.Validate())
	fs, err = dhcpFloodFrames(&byID, ownMAC, 1)
	require.NoError(t, err)
	require.Len(t, fs, 2, "no requests without a target")
	for i, f := range fs {
		_, _, m := decodeFrame(t, f)
		assert.Equal(t, []byte(ownMAC), m.CHAddr, "our own hardware address")
		id, _ := m.Option(dhcpmsg.OptClientID)
		assert.Equal(t, []byte{0xff, 0xb0, 0xc5, 0, 0, byte(i)}, id)
	}
	assert.True(t, strings.HasPrefix(fs[0].what, "DHCPDISCOVER for client 10:66:6a:00:00:0a"), fs[0].what)
}
