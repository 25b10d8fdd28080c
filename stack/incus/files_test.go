package incus_test

import (
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/incus/incustest"
)

// filesFake stores pushed files the way incusd does, including its quirk:
// a body that is not application/octet-stream becomes an empty file.
func filesFake(t *testing.T) (*incustest.Server, *incus.Client, map[string]string) {
	t.Helper()
	srv, c := newFake(t)
	var mu sync.Mutex
	files := map[string]string{}
	srv.Handle("POST /1.0/instances/{name}/files", func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if r.Header.Get("Content-Type") != "application/octet-stream" {
			body = nil
		}
		mu.Lock()
		files[r.URL.Query().Get("path")] = string(body)
		mu.Unlock()
		incustest.Sync(w, nil)
	})
	srv.Handle("GET /1.0/instances/{name}/files", func(w http.ResponseWriter, r *http.Request) {
		p := r.URL.Query().Get("path")
		if p == "/etc" {
			w.Header().Set("X-Incus-type", "directory")
			incustest.Sync(w, []string{"passwd"})
			return
		}
		mu.Lock()
		content, ok := files[p]
		mu.Unlock()
		if !ok {
			incustest.Error(w, http.StatusNotFound, "Not found")
			return
		}
		w.Header().Set("X-Incus-type", "file")
		w.Header().Set("Content-Type", "application/octet-stream")
		_, _ = io.WriteString(w, content)
	})
	return srv, c, files
}

func TestPushPullFile(t *testing.T) {
	tests := []struct {
		name               string
		uid, gid           int
		mode               os.FileMode
		wantUID, wantGID   string
		wantMode, wantPath string
	}{
		{name: "owned by a user", uid: 1000, gid: 1000, mode: 0o755, wantUID: "1000", wantGID: "1000", wantMode: "0755", wantPath: "/usr/local/bin/tool"},
		{name: "owner left to incus", uid: -1, gid: -1, mode: 0o600, wantMode: "0600", wantPath: "/root/.profile"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv, c, _ := filesFake(t)
			ctx := testCtx(t)
			content := "#!/bin/sh\necho hi\n"
			// A plain io.Reader (no length) must stream, not be buffered.
			err := c.Instances().PushFile(ctx, "b1", tt.wantPath, io.MultiReader(strings.NewReader(content)), tt.mode, tt.uid, tt.gid)
			require.NoError(t, err)

			posts := srv.Find("POST", "/1.0/instances/b1/files")
			require.Len(t, posts, 1)
			h := posts[0].Header
			assert.Equal(t, "application/octet-stream", h.Get("Content-Type"))
			assert.Equal(t, "file", h.Get("X-Incus-type"))
			assert.Equal(t, tt.wantMode, h.Get("X-Incus-mode"))
			assert.Equal(t, tt.wantUID, h.Get("X-Incus-uid"))
			assert.Equal(t, tt.wantGID, h.Get("X-Incus-gid"))
			assert.Equal(t, "overwrite", h.Get("X-Incus-write"))
			assert.Equal(t, tt.wantPath, posts[0].Query.Get("path"))

			got, err := c.Instances().PullFile(ctx, "b1", tt.wantPath)
			require.NoError(t, err)
			assert.Equal(t, content, string(got), "the pushed content must arrive, not an empty file")
		})
	}
}

func TestPullFileErrors(t *testing.T) {
	_, c, _ := filesFake(t)
	_, err := c.Instances().PullFile(testCtx(t), "b1", "/nope")
	assert.True(t, incus.IsNotFound(err))
	assert.Contains(t, err.Error(), "pulling /nope from instance b1")

	_, err = c.Instances().PullFile(testCtx(t), "b1", "/etc")
	require.ErrorContains(t, err, "it is a directory")
}

func TestPushFileError(t *testing.T) {
	srv, c := newFake(t)
	srv.Handle("POST /1.0/instances/{name}/files", func(w http.ResponseWriter, r *http.Request) {
		incustest.Error(w, http.StatusBadRequest, "Instance is not running")
	})
	err := c.Instances().PushFile(testCtx(t), "b1", "/x", strings.NewReader("x"), 0o644, 0, 0)
	var se *incus.StatusError
	require.ErrorAs(t, err, &se)
	assert.Equal(t, 400, se.Code)
	assert.Equal(t, "pushing /x to instance b1: incus: POST /1.0/instances/b1/files: instance is not running (400)", err.Error())
}
