package stack

import (
	"context"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/incus/incustest"
)

// TestTierBridgeNames: incus-user's rule for a user's private bridge, at
// the 15-character edge and past it (uids of 8 digits and more).
func TestTierBridgeNames(t *testing.T) {
	for _, tc := range []struct {
		uid  uint32
		want string
	}{
		{1000, "incusbr-1000"},
		{1234567, "incusbr-1234567"}, // 15 characters: the longest the kernel takes
		{12345678, "user-12345678"},  // incusbr-12345678 would be 16
		{1500000001, "user-1500000001"},
		{4294967295, "user-4294967295"}, // the largest uid: still 15
	} {
		got := TierBridge(tc.uid)
		assert.Equal(t, tc.want, got, "uid %d", tc.uid)
		assert.LessOrEqual(t, len(got), maxIfaceName, "uid %d: %s is a name the kernel takes", tc.uid, got)
	}
}

// TestTiersNamesALongUIDsBridge: the census finds a long uid's private
// bridge under the name incus-user gives it, and its fix for root's
// leftover names the bridge the same way.
func TestTiersNamesALongUIDsBridge(t *testing.T) {
	const uid = 12345678
	srv := incustest.New(t)
	srv.Handle("GET /1.0/projects", func(w http.ResponseWriter, r *http.Request) {
		incustest.Sync(w, []map[string]any{
			{"name": "default", "config": map[string]string{}},
			{"name": "user-12345678", "config": map[string]string{"restricted.networks.access": "user-12345678"}},
		})
	})
	srv.Handle("GET /1.0/networks", func(w http.ResponseWriter, r *http.Request) {
		incustest.Sync(w, []map[string]any{{"name": "boxnet", "managed": true}, {"name": "user-12345678", "managed": true}})
	})
	srv.Handle("GET /1.0/instances", func(w http.ResponseWriter, r *http.Request) {
		incustest.Sync(w, []map[string]any{})
	})
	h := &Host{Incus: incus.New(srv.Socket()), Tier: TierConfig{UserSocket: t.TempDir() + "/unix.socket.user"}}
	tiers, err := h.Tiers(context.Background(), "")
	require.NoError(t, err)
	require.Len(t, tiers, 1)
	require.NotEmpty(t, tiers[0].Findings)
	assert.Contains(t, tiers[0].Findings[0].Problem, "private NAT bridge user-12345678",
		"the stock bridge of a long uid is seen under incus-user's name for it")
}
