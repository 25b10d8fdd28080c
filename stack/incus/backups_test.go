package incus_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/incus/incustest"
)

// backupsFake keeps backups as incusd does: made by an operation, exported
// as a raw stream, deleted by another operation.
func backupsFake(t *testing.T) (*incustest.Server, *incus.Client, map[string][]byte) {
	t.Helper()
	srv, c := newFake(t)
	stored := map[string][]byte{}
	srv.Handle("POST /1.0/instances/{name}/backups", func(w http.ResponseWriter, r *http.Request) {
		var req struct{ Name string }
		_ = json.NewDecoder(r.Body).Decode(&req)
		stored[r.PathValue("name")+"/"+req.Name] = []byte("tarball of " + r.PathValue("name"))
		srv.Async(w, incustest.Op{Description: "Backing up instance"})
	})
	srv.Handle("GET /1.0/instances/{name}/backups/{backup}/export", func(w http.ResponseWriter, r *http.Request) {
		b, ok := stored[r.PathValue("name")+"/"+r.PathValue("backup")]
		if !ok {
			incustest.Error(w, http.StatusNotFound, "Instance backup not found")
			return
		}
		w.Header().Set("Content-Type", "application/octet-stream")
		_, _ = w.Write(b)
	})
	srv.Handle("DELETE /1.0/instances/{name}/backups/{backup}", func(w http.ResponseWriter, r *http.Request) {
		delete(stored, r.PathValue("name")+"/"+r.PathValue("backup"))
		srv.Async(w, incustest.Op{Description: "Removing instance backup"})
	})
	return srv, c, stored
}

func TestBackupRoundTrip(t *testing.T) {
	srv, c, stored := backupsFake(t)
	ctx := testCtx(t)
	expires := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	require.NoError(t, c.Instances().CreateBackup(ctx, "b1", incus.BackupsPost{Name: "x", ExpiresAt: expires, CompressionAlgorithm: "gzip"}))
	posts := srv.Find("POST", "/1.0/instances/b1/backups")
	require.Len(t, posts, 1)
	body := jsonBody(t, posts[0])
	assert.Equal(t, false, body["instance_only"], "snapshots included, said out loud")
	assert.Equal(t, false, body["optimized_storage"], "a plain tarball, said out loud")
	assert.Equal(t, "gzip", body["compression_algorithm"])
	assert.Equal(t, "2030-01-02T03:04:05Z", body["expires_at"])

	var out bytes.Buffer
	n, err := c.Instances().ExportBackup(ctx, "b1", "x", &out)
	require.NoError(t, err)
	assert.Equal(t, "tarball of b1", out.String())
	assert.Equal(t, int64(out.Len()), n)

	require.NoError(t, c.Instances().DeleteBackup(ctx, "b1", "x"))
	assert.Empty(t, stored)

	_, err = c.Instances().ExportBackup(ctx, "b1", "x", io.Discard)
	assert.True(t, incus.IsNotFound(err), "%v", err)
	assert.Contains(t, err.Error(), "exporting backup x of instance b1")
}

func TestCreateBackupWithoutExpiry(t *testing.T) {
	srv, c, _ := backupsFake(t)
	require.NoError(t, c.Instances().CreateBackup(testCtx(t), "b1", incus.BackupsPost{Name: "y"}))
	body := jsonBody(t, srv.Find("POST", "/1.0/instances/b1/backups")[0])
	assert.NotContains(t, body, "expires_at", "no expiry is the server's never, not year 1")
	assert.Error(t, c.Instances().CreateBackup(testCtx(t), "b1", incus.BackupsPost{}), "a backup needs a name to be fetched by")
}

func TestCreateBackupFails(t *testing.T) {
	srv, c := newFake(t)
	srv.Handle("POST /1.0/instances/{name}/backups", func(w http.ResponseWriter, r *http.Request) {
		srv.Async(w, incustest.Op{Description: "Backing up instance", Err: "Failed to create backup: no space left on device"})
	})
	err := c.Instances().CreateBackup(testCtx(t), "b1", incus.BackupsPost{Name: "x"})
	var oe *incus.OperationError
	require.ErrorAs(t, err, &oe)
	assert.Contains(t, err.Error(), "backing up instance b1")
	assert.Contains(t, err.Error(), "no space left on device")
}

func TestImportBackup(t *testing.T) {
	srv, c := newFake(t)
	var got []byte
	srv.Handle("POST /1.0/instances", func(w http.ResponseWriter, r *http.Request) {
		got, _ = io.ReadAll(r.Body)
		if r.Header.Get("Content-Type") != "application/octet-stream" {
			incustest.Error(w, http.StatusBadRequest, "Invalid JSON")
			return
		}
		srv.Async(w, incustest.Op{Description: "Creating instance"})
	})
	tarball := strings.Repeat("x", 3<<20) // more than the fake records
	// A plain io.Reader: streamed, whatever its size.
	err := c.Instances().ImportBackup(testCtx(t), "new", io.MultiReader(strings.NewReader(tarball)), "default")
	require.NoError(t, err)
	assert.Equal(t, tarball, string(got), "the body is the tarball, whole")
	req := srv.Find("POST", "/1.0/instances")[0]
	assert.Equal(t, "new", req.Header.Get("X-Incus-name"))
	assert.Equal(t, "default", req.Header.Get("X-Incus-pool"))

	require.NoError(t, c.Instances().ImportBackup(testCtx(t), "other", strings.NewReader("t"), ""))
	assert.Empty(t, srv.Find("POST", "/1.0/instances")[1].Header.Values("X-Incus-pool"), "no pool: the backup's own")
	assert.Error(t, c.Instances().ImportBackup(testCtx(t), "", strings.NewReader("t"), ""))
}

func TestImportBackupFails(t *testing.T) {
	srv, c := newFake(t)
	srv.Handle("POST /1.0/instances", func(w http.ResponseWriter, r *http.Request) {
		srv.Async(w, incustest.Op{Description: "Creating instance", Err: "Failed importing backup: Failed loading profiles (nosuch) for instance: Profile not found"})
	})
	err := c.Instances().ImportBackup(testCtx(t), "new", strings.NewReader("t"), "")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "importing instance new from a backup")
	assert.Contains(t, err.Error(), "Profile not found", "incus's reason, as it gave it")
}
