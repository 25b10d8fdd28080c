package guard

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
)

// Build takes IPv4 addresses only.
func TestBuild(t *testing.T) {
	subnet := netip.MustParsePrefix("10.88.0.0/24")
	_, err := Build(Config{Subnet: subnet, Gateway: netip.MustParseAddr("10.88.0.1"), Resolver: netip.MustParseAddr("192.0.0.8")})
	assert.NoError(t, err)
	_, err = Build(Config{Subnet: netip.MustParsePrefix("fd00::/64"), Gateway: netip.MustParseAddr("fd00::1")})
	assert.Error(t, err, "IPv4 only")
	_, err = Build(Config{Subnet: subnet, Gateway: netip.MustParseAddr("10.89.0.1")})
	assert.Error(t, err, "the gateway in the subnet")
	_, err = Build(Config{Subnet: subnet, Gateway: netip.MustParseAddr("10.88.0.1"), Resolver: netip.MustParseAddr("fd00::53")})
	assert.Error(t, err, "IPv4 only")
	_, err = Build(Config{})
	assert.Error(t, err)
}

func TestForbidden(t *testing.T) {
	for _, a := range []string{"0.1.2.3", "10.88.0.1", "100.64.0.1", "127.0.0.1", "169.254.1.1", "172.31.255.1", "192.0.0.8", "192.168.20.2", "198.19.0.1", "224.0.0.251", "239.255.255.250", "255.255.255.255"} {
		assert.True(t, Forbidden(netip.MustParseAddr(a)), a)
	}
	for _, a := range []string{"1.1.1.1", "100.128.0.1", "172.32.0.1", "192.0.2.7", "198.51.100.1", "203.0.113.10", "223.255.255.255"} {
		assert.False(t, Forbidden(netip.MustParseAddr(a)), a)
	}
}

func TestReasonNames(t *testing.T) {
	assert.Len(t, reasonNames, int(numReasons))
	assert.Equal(t, "drop_route", DropRoute.String())
}
