package nft

import (
	"encoding/hex"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestElemCodec(t *testing.T) {
	for _, tc := range []struct {
		typ, text string
		hex       string
	}{
		{"ifname", "vA", "76410000000000000000000000000000"},
		// Each field padded to whole 32-bit words, as nft lays them out.
		{"ifname . ether_addr", "vA . 02:00:00:00:00:0a", "76410000000000000000000000000000" + "02000000000a" + "0000"},
		{"ifname . ipv4_addr", "vA . 10.88.0.10", "76410000000000000000000000000000" + "0a58000a"},
	} {
		key, err := encodeElem(tc.typ, tc.text)
		assert.NoError(t, err, tc.text)
		assert.Equal(t, tc.hex, hex.EncodeToString(key), tc.text)
		assert.Len(t, key, int(setTypes[tc.typ].Bytes), "key length is the set type's")
		back, ok := decodeElem(tc.typ, key)
		assert.True(t, ok)
		assert.Equal(t, tc.text, back)
	}
	for _, bad := range [][2]string{{"ifname . ipv4_addr", "vA"}, {"ifname . ipv4_addr", "vA . ::1"}, {"ifname . ether_addr", "vA . 10.0.0.1"}, {"inet_service", "22"}} {
		_, err := encodeElem(bad[0], bad[1])
		assert.Error(t, err, bad[1])
	}
	_, ok := decodeElem("ifname . ipv4_addr", make([]byte, 16))
	assert.False(t, ok, "a short key is not an element")
	_, ok = decodeElem("ifname", make([]byte, 20))
	assert.False(t, ok, "a long key is not an element")
}
