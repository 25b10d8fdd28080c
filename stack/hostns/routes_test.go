package hostns

import (
	"net"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"
)

func TestIsDefault(t *testing.T) {
	cidr := func(s string) *net.IPNet {
		_, n, err := net.ParseCIDR(s)
		require.NoError(t, err)
		return n
	}
	for _, tc := range []struct {
		dst  *net.IPNet
		want bool
	}{
		{nil, true},
		{cidr("0.0.0.0/0"), true},
		{cidr("0.0.0.0/1"), true},   // a full tunnel's pair
		{cidr("128.0.0.0/1"), true}, // the other half
		{cidr("0.0.0.0/2"), false},
		{cidr("198.18.40.0/24"), false},
		{cidr("10.0.0.0/8"), false},
	} {
		assert.Equal(t, tc.want, IsDefault(netlink.Route{Dst: tc.dst}), "%v", tc.dst)
	}
}
