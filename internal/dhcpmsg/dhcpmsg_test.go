package dhcpmsg

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A release as RFC 2131 has a client send it: ciaddr its address, chaddr
// its hardware address, the server identifier; every field where a server
// reads it.
func TestReleaseBytes(t *testing.T) {
	m := Message{Type: Release, HType: HTypeEthernet, CHAddr: []byte{0x10, 0x66, 0x6a, 0, 0, 0x0b}, Xid: 0x0b0c5001,
		CIAddr: netip.MustParseAddr("10.88.0.12"), SName: "nonce", Options: []Option{Addr(OptServerID, netip.MustParseAddr("10.88.0.1"))}}
	b, err := m.Marshal()
	require.NoError(t, err)
	require.Len(t, b, 236+4+3+6+1)
	assert.Equal(t, []byte{1, 1, 6, 0, 0x0b, 0x0c, 0x50, 0x01}, b[0:8], "op, htype, hlen, hops, xid")
	assert.Equal(t, []byte{10, 88, 0, 12}, b[12:16], "ciaddr")
	assert.Equal(t, []byte{0x10, 0x66, 0x6a, 0, 0, 0x0b, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, b[28:44], "chaddr, padded to 16")
	assert.Equal(t, "nonce", string(b[44:49]), "sname")
	assert.Equal(t, []byte{99, 130, 83, 99, 53, 1, 7, 54, 4, 10, 88, 0, 1, 255}, b[236:], "cookie, type, server id, end")
	got, err := Parse(b)
	require.NoError(t, err)
	assert.Equal(t, m, got)
}

func TestOtherHardware(t *testing.T) {
	long := []byte{0x10, 0x66, 0x6a, 0, 0, 0x0a, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	b, err := Message{Type: Discover, HType: HTypeIEEE802, CHAddr: long, Broadcast: true, Options: []Option{{Code: OptRapidCommit}}}.Marshal()
	require.NoError(t, err)
	assert.Equal(t, []byte{1, 6, 16}, b[0:3])
	assert.Equal(t, []byte{0x80, 0}, b[10:12], "the broadcast flag")
	assert.Equal(t, long, b[28:44])
	assert.Equal(t, []byte{53, 1, 1, 80, 0, 255}, b[240:])
	_, err = Message{Type: Discover, CHAddr: make([]byte, 17)}.Marshal()
	assert.Error(t, err)
	_, err = Message{Type: Discover}.Marshal()
	assert.Error(t, err)
	_, err = Parse(b[:100])
	assert.Error(t, err)
}
