package stack

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/incus/incustest"
	"github.com/box-isolation/box/stack/model"
)

// A record's write starts from the bridge its caller read: unchanged
// since, one write and no read; changed (its etag is stale), the bridge is
// read again and nothing another writer put there is lost; a stale read
// that already holds the record is never taken for the bridge's word.
func TestRecordOnTheCallersRead(t *testing.T) {
	var mu sync.Mutex
	cfg := map[string]string{"ipv4.address": "10.88.0.1/24"}
	gen := 1
	hangUp := false
	etag := func() string { return fmt.Sprintf(`"e%d"`, gen) }
	srv := incustest.New(t)
	srv.Handle("GET /1.0/networks/boxnet", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		incustest.SyncETag(w, etag(), map[string]any{"name": "boxnet", "config": cfg})
	})
	srv.Handle("PUT /1.0/networks/boxnet", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		if r.Header.Get("If-Match") != etag() {
			if hangUp {
				// As incusd does with a large body: it refuses the etag
				// on the header and the connection closes under the
				// client's write.
				conn, _, err := w.(http.Hijacker).Hijack()
				require.NoError(t, err)
				conn.Close()
				return
			}
			incustest.Error(w, http.StatusPreconditionFailed, "ETag doesn't match")
			return
		}
		var put incus.NetworkPut
		require.NoError(t, json.NewDecoder(r.Body).Decode(&put))
		cfg, gen = put.Config, gen+1
		incustest.Sync(w, nil)
	})
	h := &Host{Incus: incus.New(srv.Socket())}
	ctx := context.Background()
	read := func() BridgeRead {
		n, e, err := h.Incus.Networks().Get(ctx, model.Current.Network)
		require.NoError(t, err)
		return BridgeRead{Network: n, ETag: e}
	}
	calls := func(since int) (out []string) {
		for _, r := range srv.Requests()[since:] {
			out = append(out, r.Method)
		}
		return out
	}
	open := model.Policy{}

	fresh := read()
	n := len(srv.Requests())
	require.NoError(t, h.Policies().RecordOn(ctx, fresh, "default", "a", open))
	assert.Equal(t, []string{"PUT"}, calls(n), "unchanged since the caller's read: written at once")

	// Another writer records b after the caller read the bridge.
	stale := read()
	require.NoError(t, h.Policies().Record(ctx, "default", "b", open))
	n = len(srv.Requests())
	require.NoError(t, h.Policies().RecordOn(ctx, stale, "default", "c", open))
	assert.Equal(t, []string{"PUT", "GET", "PUT"}, calls(n), "a stale read: refused, read again, written")
	for _, b := range []string{"a", "b", "c"} {
		_, ok, err := h.Policies().Recorded(ctx, "default", b)
		require.NoError(t, err)
		assert.True(t, ok, "%s's record is there", b)
	}

	// The same, with the connection closed under the write.
	stale = read()
	require.NoError(t, h.Policies().Record(ctx, "default", "d", open))
	hangUp = true
	n = len(srv.Requests())
	require.NoError(t, h.Policies().RecordOn(ctx, stale, "default", "e", open))
	hangUp = false
	assert.Equal(t, []string{"PUT", "GET", "PUT"}, calls(n), "a write that failed on a stale read: read again, written")
	_, ok, err := h.Policies().Recorded(ctx, "default", "e")
	require.NoError(t, err)
	assert.True(t, ok, "e's record is there")

	// The caller's read holds c's record; another writer forgot it since.
	stale = read()
	require.NoError(t, h.Policies().Forget(ctx, "default", "c"))
	require.NoError(t, h.Policies().RecordOn(ctx, stale, "default", "c", open))
	_, ok, err = h.Policies().Recorded(ctx, "default", "c")
	require.NoError(t, err)
	assert.True(t, ok, "recorded again: the stale read that held it was not trusted")
}
