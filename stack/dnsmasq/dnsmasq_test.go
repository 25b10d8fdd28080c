package dnsmasq

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseLeases(t *testing.T) {
	file := "1796182906 10:66:6a:51:cf:de 10.88.0.126 * *\n" +
		"1796182838 10:66:6a:FE:8a:5d 10.88.0.125 box-a 01:10:66:6a:fe:8a:5d\n" +
		"1796182840 06-10:66:6a:fe:8a:5d 10.88.0.130 * *\n" +
		"duid 00:01:00:01:2c:2a\n" +
		"1796182906 1234 fd42::5 * 00:01\n"
	ls, err := ParseLeases(strings.NewReader(file))
	require.NoError(t, err)
	require.Len(t, ls, 3, "IPv4 leases only")
	assert.Equal(t, Lease{Expires: time.Unix(1796182906, 0).UTC(), Hwaddr: "10:66:6a:51:cf:de", Address: netip.MustParseAddr("10.88.0.126")}, ls[0])
	assert.Equal(t, "10:66:6a:fe:8a:5d", ls[1].Hwaddr, "lower case, as net.HardwareAddr prints")
	assert.Equal(t, "01:10:66:6a:fe:8a:5d", ls[1].ClientID)
	assert.Equal(t, "06-10:66:6a:fe:8a:5d", ls[2].Hwaddr, "another hardware type, as dnsmasq writes it")
	_, err = ParseLeases(strings.NewReader("garbage\n"))
	assert.Error(t, err)

	lo, hi, ok := ParseRange("10.88.0.2,10.88.0.254,1h")
	require.True(t, ok)
	assert.Equal(t, 253, RangeSize(lo, hi))
	_, _, ok = ParseRange("::,constructor:boxnet,ra-only")
	assert.False(t, ok)
}

func TestLeaseClient(t *testing.T) {
	for field, want := range map[string]struct {
		htype byte
		hw    int
	}{
		"10:66:6a:00:00:0a":                               {1, 6},
		"06-10:66:6a:00:00:0a":                            {6, 6},
		"10:66:6a:00:00:0a:b0:c5:01:02:03:04:05:06:07:08": {1, 16},
	} {
		ht, hw, err := leaseClient(field)
		require.NoError(t, err, field)
		assert.Equal(t, want.htype, ht, field)
		assert.Len(t, hw, want.hw, field)
	}
	for _, bad := range []string{"1234", "zz:zz", "", "xx-10:66"} {
		_, _, err := leaseClient(bad)
		assert.Error(t, err, bad)
	}
}
