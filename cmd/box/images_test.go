package main

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/incus/incustest"
)

// incusd 6.0.4's failure (measured in the world) when the image server is
// unreachable and it never fetched the image.
const unreachable = `Failed getting remote image info: Failed getting image: Failed parsing stream: Get "https://203.0.113.30:8443/streams/v1/index.json": Unable to connect to: 203.0.113.30:8443 ([dial tcp 203.0.113.30:8443: connect: connection refused])`

// pulling runs box new against a fake incusd that reports a download's
// progress while it creates the box, then fails as incusd does when the
// image server is unreachable (the create stops there: nothing past the
// daemon is touched). It returns the result and the create request.
func pulling(t *testing.T, r runner, args ...string) (result, incus.InstancesPost) {
	t.Helper()
	srv := incustest.New(t)
	srv.Drivers("lxc")
	withStack(srv)
	srv.Handle("GET /1.0/instances/{name}", func(w http.ResponseWriter, r *http.Request) {
		incustest.Error(w, http.StatusNotFound, "Instance not found")
	})
	srv.Handle("GET /1.0/instances", func(w http.ResponseWriter, r *http.Request) {
		incustest.Sync(w, []any{})
	})
	srv.Handle("POST /1.0/instances", func(w http.ResponseWriter, r *http.Request) {
		id := srv.Async(w, incustest.Op{Description: "Creating instance", Hold: true, Err: unreachable})
		go func() {
			// Each line stays until box has read the operation after it.
			for _, p := range []string{"rootfs: 45% (12.34MB/s)", "rootfs: 90% (12.34MB/s)"} {
				n := len(srv.Find(http.MethodGet, "/1.0/operations/"+id))
				srv.SetMetadata(id, map[string]any{incus.DownloadProgress: p})
				for len(srv.Find(http.MethodGet, "/1.0/operations/"+id)) < n+2 {
					time.Sleep(10 * time.Millisecond)
				}
			}
			srv.Release(id)
		}()
	})
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "config.yml"), []byte("remotes:\n  images:\n    addr: https://203.0.113.30:8443\n    protocol: simplestreams\n    public: true\n"), 0o644))
	res := r.with("INCUS_SOCKET", srv.Socket(), "BOX_NETNS", "box-unit-test-absent", "INCUS_CONF", dir,
		"BOX_TEMPLATE_IMAGES", filepath.Join(dir, "template-images.json")).
		run(t, append([]string{"new", "--name", "work"}, args...)...)
	posts := srv.Find(http.MethodPost, "/1.0/instances")
	require.Len(t, posts, 1)
	var req incus.InstancesPost
	require.NoError(t, json.Unmarshal(posts[0].Body, &req))
	return res, req
}

// The first box new of a template on a host mints the builder of the
// template's image from the template's images: image, which Incus pulls
// through the server the incus CLI's remotes name; box shows the download
// and the build's step on a terminal (not with --json; a pipe gets the
// steps as lines), and, when the server cannot be reached, says which and
// the offline way.
func TestNewPullsTheTemplatesImage(t *testing.T) {
	for _, tc := range []struct {
		name     string
		r        runner
		args     []string
		progress bool
	}{
		{"on a terminal", offline.withErrTTY(), nil, true},
		{"--json on a terminal", offline.withErrTTY(), []string{"--json"}, false},
		{"not on a terminal", offline, nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, req := pulling(t, tc.r, tc.args...)
			assert.Equal(t, incus.InstanceSource{Type: "image", Mode: "pull", Server: "https://203.0.113.30:8443", Protocol: "simplestreams", Alias: "debian/12/cloud"}, req.Source)
			assert.Equal(t, "https://203.0.113.30:8443", req.Config["user.box.image_server"])
			assert.Equal(t, exitFailed, res.code)
			assert.True(t, strings.HasPrefix(req.Name, "box-build-blank-"), "the builder: %s", req.Name)
			assert.Equal(t, "blank", req.Config["user.box.builder"])
			assert.Contains(t, res.err, "box: building template blank's image: minting "+req.Name+": incusd could not get images:debian/12/cloud from the image server https://203.0.113.30:8443, and has no copy of it")
			assert.Contains(t, res.err, "connection refused")
			assert.Contains(t, res.err, "import an image file (incus image import FILE --alias NAME) and mint with --image NAME")
			for _, p := range []string{"rootfs: 45% (12.34MB/s)", "rootfs: 90% (12.34MB/s)"} {
				line := "minting " + req.Name + " from images:debian/12/cloud: " + p
				if tc.progress {
					assert.Contains(t, res.err, line)
				} else {
					assert.NotContains(t, res.err, line)
				}
			}
			step := "building template blank's image: minting the builder " + req.Name
			switch {
			case tc.progress:
				assert.Contains(t, res.err, "\r\033[K"+step)
			case slices.Contains(tc.args, "--json"):
				assert.NotContains(t, res.err, step)
			default:
				assert.Contains(t, res.err, "box: "+step+" from images:debian/12/cloud\n")
			}
			if !tc.progress {
				assert.NotContains(t, res.err, "\r", "nothing drawn")
			}
		})
	}
}

// --image REMOTE:ALIAS names a remote of the incus CLI's; one it does not
// know is refused before anything is made.
func TestNewImageFromAnUnknownRemote(t *testing.T) {
	srv := incustest.New(t)
	srv.Drivers("lxc")
	withStack(srv)
	srv.Handle("GET /1.0/instances/{name}", func(w http.ResponseWriter, r *http.Request) {
		incustest.Error(w, http.StatusNotFound, "Instance not found")
	})
	res := offline.with("INCUS_SOCKET", srv.Socket(), "BOX_NETNS", "box-unit-test-absent", "INCUS_CONF", t.TempDir()).
		run(t, "new", "--name", "work", "--image", "mirror:debian/12")
	assert.Equal(t, exitFailed, res.code)
	assert.Contains(t, res.err, "no remote named mirror (the incus CLI's remotes here: images, local;")
	assert.Empty(t, srv.Find(http.MethodPost, "/1.0/instances"))
}
