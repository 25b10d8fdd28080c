package model

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestFreeAddress(t *testing.T) {
	gw := netip.MustParsePrefix("10.88.0.1/24")
	a := netip.MustParseAddr
	got, ok := FreeAddress(gw.Masked(), gw, nil)
	assert.True(t, ok)
	assert.Equal(t, a("10.88.0.2"), got, "not the network's address, not the gateway's")
	got, ok = FreeAddress(gw.Masked(), gw, map[netip.Addr]bool{a("10.88.0.2"): true, a("10.88.0.3"): true})
	assert.True(t, ok)
	assert.Equal(t, a("10.88.0.4"), got, "not one in use")
	// A member's slice at the subnet's end: never the broadcast address.
	slice := netip.MustParsePrefix("10.88.0.252/30")
	got, ok = FreeAddress(slice, gw, map[netip.Addr]bool{a("10.88.0.252"): true, a("10.88.0.253"): true, a("10.88.0.254"): true})
	assert.False(t, ok, "got %s", got)
	assert.Equal(t, a("10.88.0.255"), LastOf(gw))
}
