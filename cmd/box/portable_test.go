package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/stack/incus/incustest"
)

// exporting serves a stopped box "work" whose backup exports as tarball
// (or fails when tarball is nil), and returns box aimed at it.
func exporting(t *testing.T, tarball []byte) (*incustest.Server, runner) {
	t.Helper()
	srv := incustest.New(t)
	withStack(srv)
	srv.Handle("GET /1.0/instances/{name}", func(w http.ResponseWriter, r *http.Request) {
		if r.PathValue("name") != "work" {
			incustest.Error(w, http.StatusNotFound, "Instance not found")
			return
		}
		incustest.Sync(w, map[string]any{"name": "work", "status": "Stopped", "type": "container", "config": map[string]string{"user.box": "1"}})
	})
	srv.Handle("GET /1.0/instances/{name}/snapshots", func(w http.ResponseWriter, r *http.Request) {
		incustest.Sync(w, []map[string]any{{"name": "s1"}})
	})
	srv.Handle("POST /1.0/instances/{name}/backups", func(w http.ResponseWriter, r *http.Request) {
		srv.Async(w, incustest.Op{Description: "Backing up instance"})
	})
	srv.Handle("GET /1.0/instances/{name}/backups/{backup}/export", func(w http.ResponseWriter, r *http.Request) {
		if tarball == nil {
			// Half a file, then the connection drops.
			w.Header().Set("Content-Length", "1000")
			_, _ = w.Write([]byte("half"))
			return
		}
		_, _ = w.Write(tarball)
	})
	srv.Handle("DELETE /1.0/instances/{name}/backups/{backup}", func(w http.ResponseWriter, r *http.Request) {
		srv.Async(w, incustest.Op{Description: "Removing backup"})
	})
	return srv, offline.with("INCUS_SOCKET", srv.Socket(), "BOX_NETNS", "box-unit-test-absent")
}

// inDir runs f with the working directory set to dir.
func inDir(t *testing.T, dir string, f func()) {
	t.Helper()
	old, err := os.Getwd()
	require.NoError(t, err)
	require.NoError(t, os.Chdir(dir))
	defer func() { require.NoError(t, os.Chdir(old)) }()
	f()
}

func entries(t *testing.T, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(dir)
	require.NoError(t, err)
	var out []string
	for _, e := range es {
		out = append(out, e.Name())
	}
	return out
}

func TestExportWritesTheFileWholeOrNotAtAll(t *testing.T) {
	srv, r := exporting(t, []byte("the tarball"))
	dir := t.TempDir()
	inDir(t, dir, func() {
		res := r.run(t, "export", "work")
		require.Equal(t, exitOK, res.code, res.err)
		assert.Contains(t, res.out, "work exported to work.tar.gz: 11 bytes, 1 snapshots (s1), in ")
		assert.NotContains(t, res.err, "was running", "a stopped box is not touched")
	})
	b, err := os.ReadFile(filepath.Join(dir, "work.tar.gz"))
	require.NoError(t, err)
	assert.Equal(t, "the tarball", string(b))
	st, err := os.Stat(filepath.Join(dir, "work.tar.gz"))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), st.Mode().Perm(), "the box's whole disk is its owner's only")
	assert.Equal(t, []string{"work.tar.gz"}, entries(t, dir), "no temporary file is left")

	// An existing file is not overwritten without --force; nothing is asked
	// of incusd.
	before := len(srv.Find(http.MethodPost, "/1.0/instances/work/backups"))
	file := filepath.Join(dir, "work.tar.gz")
	require.NoError(t, os.WriteFile(file, []byte("precious"), 0o644))
	res := r.run(t, "export", "work", file)
	assert.Equal(t, exitFailed, res.code)
	assert.Contains(t, res.err, file+" exists: pass --force to overwrite it")
	b, _ = os.ReadFile(file)
	assert.Equal(t, "precious", string(b))
	assert.Len(t, srv.Find(http.MethodPost, "/1.0/instances/work/backups"), before, "no backup was made")

	res = r.run(t, "export", "work", file, "--force")
	require.Equal(t, exitOK, res.code, res.err)
	b, _ = os.ReadFile(file)
	assert.Equal(t, "the tarball", string(b))
	assert.Equal(t, []string{"work.tar.gz"}, entries(t, dir))

	res = r.run(t, "export", "work", dir)
	assert.Equal(t, exitFailed, res.code)
	assert.Contains(t, res.err, "is a directory: name the file")
}

func TestExportThatFailsLeavesNothing(t *testing.T) {
	srv, r := exporting(t, nil)
	dir := t.TempDir()
	file := filepath.Join(dir, "w.tar.gz")
	res := r.run(t, "export", "work", file)
	assert.Equal(t, exitFailed, res.code)
	assert.Contains(t, res.err, "exporting work")
	assert.Empty(t, entries(t, dir), "neither the file nor a temporary one")
	var deleted []string
	for _, r := range srv.Requests() {
		if r.Method == http.MethodDelete {
			deleted = append(deleted, r.Path)
		}
	}
	require.Len(t, deleted, 1, "incusd's copy is deleted all the same")
	assert.Regexp(t, `^/1.0/instances/work/backups/box-export-\d+$`, deleted[0])
}

func TestImportRefusesAFileThatIsNotABox(t *testing.T) {
	srv := incustest.New(t)
	withStack(srv)
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	for name, body := range map[string]string{
		"backup/index.yaml":            "name: db\ntype: container\npool: default\n",
		"backup/container/backup.yaml": "container:\n  name: db\n  config:\n    user.other: \"1\"\n  profiles: [box-net]\n",
	} {
		require.NoError(t, tw.WriteHeader(&tar.Header{Name: name, Mode: 0o400, Size: int64(len(body)), Typeflag: tar.TypeReg}))
		_, _ = io.WriteString(tw, body)
	}
	require.NoError(t, tw.Close())
	require.NoError(t, zw.Close())
	file := filepath.Join(t.TempDir(), "db.tar.gz")
	require.NoError(t, os.WriteFile(file, buf.Bytes(), 0o600))

	res := offline.with("INCUS_SOCKET", srv.Socket(), "BOX_NETNS", "box-unit-test-absent").run(t, "import", file)
	assert.Equal(t, exitFailed, res.code)
	assert.Contains(t, res.err, "box: refusing to import "+file+" (nothing was created):\n  it is not a box: its config has no user.box=1 tag")
	for _, r := range srv.Requests() {
		assert.Equal(t, http.MethodGet, r.Method, "%s %s", r.Method, r.Path)
	}
}
