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

// TestPurgeIncusRemovesOnlyTheProbeImage: --purge-incus takes the probe
// images box's drill imported and leaves every other image alone.
func TestPurgeIncusRemovesOnlyTheProbeImage(t *testing.T) {
	srv := incustest.New(t)
	srv.Handle("GET /1.0/images", func(w http.ResponseWriter, r *http.Request) {
		incustest.Sync(w, []map[string]any{
			{"fingerprint": "aaaaaaaaaaaaaaaa", "properties": map[string]string{"description": "box probe image (busybox-static, box-probe/2+x)"}},
			{"fingerprint": "bbbbbbbbbbbbbbbb", "properties": map[string]string{"description": "Debian bookworm amd64"}},
		})
	})
	srv.Handle("DELETE /1.0/images/{fp}", func(w http.ResponseWriter, r *http.Request) {
		srv.Async(w, incustest.Op{Description: "Deleting image"})
	})
	h := &Host{Incus: incus.New(srv.Socket())}
	changes, err := PurgeIncus(context.Background(), h.Incus)
	require.NoError(t, err)
	require.Len(t, changes, 1)
	assert.Equal(t, "image aaaaaaaaaaaa", changes[0].Object)
	dels := srv.Find(http.MethodDelete, "/1.0/images/aaaaaaaaaaaaaaaa")
	assert.Len(t, dels, 1, "the probe image is deleted")
	assert.Empty(t, srv.Find(http.MethodDelete, "/1.0/images/bbbbbbbbbbbbbbbb"), "another image is not")
}
