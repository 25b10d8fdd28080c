package probes

import (
	"net"
	"net/netip"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestAddrsByIndexIsTheNetPackages: the one dump of addresses holds, for
// every interface here, what the net package's per-interface dump has.
func TestAddrsByIndexIsTheNetPackages(t *testing.T) {
	all, err := addrsByIndex()
	require.NoError(t, err)
	ifs, err := net.Interfaces()
	require.NoError(t, err)
	seen := 0
	for i := range ifs {
		want := interfaceAddrs(&ifs[i])
		got := all[ifs[i].Index]
		slices.SortFunc(want, netip.Prefix.Compare)
		slices.SortFunc(got, netip.Prefix.Compare)
		assert.Equal(t, want, got, "interface %s", ifs[i].Name)
		seen += len(want)
	}
	require.Positive(t, seen, "this namespace has addresses to compare (loopback's at least)")
}
