package incus_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/incus/incustest"
)

// A pull from an image server is asked for with every field Incus's API
// takes for one, and nothing of a copy's.
func TestCreateFromAnImageServer(t *testing.T) {
	srv, c := newFake(t)
	srv.Handle("POST /1.0/instances", func(w http.ResponseWriter, r *http.Request) {
		srv.Async(w, incustest.Op{Description: "Creating instance"})
	})
	src := incus.InstanceSource{Type: "image", Mode: "pull", Server: "https://203.0.113.30:8443", Protocol: "simplestreams",
		Alias: "debian/12/cloud", Certificate: "PEM"}
	require.NoError(t, c.Instances().Create(testCtx(t), incus.InstancesPost{Name: "b", Type: "container", Source: src}))
	var body struct {
		Source map[string]any `json:"source"`
	}
	require.NoError(t, json.Unmarshal(srv.Find(http.MethodPost, "/1.0/instances")[0].Body, &body))
	assert.Equal(t, map[string]any{"type": "image", "mode": "pull", "server": "https://203.0.113.30:8443",
		"protocol": "simplestreams", "alias": "debian/12/cloud", "certificate": "PEM"}, body.Source)
}

func TestProgressText(t *testing.T) {
	for _, tc := range []struct {
		meta map[string]any
		want string
	}{
		{nil, ""},
		{map[string]any{"progress": map[string]any{"stage": "x"}}, ""},
		{map[string]any{"download_progress": "rootfs: 45% (12.34MB/s)"}, "rootfs: 45% (12.34MB/s)"},
		// The download's line stays once it is done: the later stage wins.
		{map[string]any{"download_progress": "rootfs: 100% (12.34MB/s)", "create_instance_from_image_unpack_progress": "Unpacking image: 50%"}, "Unpacking image: 50%"},
	} {
		assert.Equal(t, tc.want, incus.ProgressText(tc.meta), "%v", tc.meta)
	}
}

// While the create runs its progress is told, each new line once, and
// nothing after the create has returned.
func TestCreateInstanceWithProgress(t *testing.T) {
	srv, c := newFake(t)
	lines := []string{"metadata: 100% (2.00MB/s)", "rootfs: 10% (5.00MB/s)", "rootfs: 100% (6.00MB/s)", "Unpacking image: 40%"}
	seen := make(chan string)
	srv.Handle("POST /1.0/instances", func(w http.ResponseWriter, r *http.Request) {
		id := srv.Async(w, incustest.Op{Description: "Creating instance", Hold: true})
		go func() {
			meta := map[string]any{}
			for _, l := range lines {
				if strings.HasPrefix(l, "Unpacking") {
					meta["create_instance_from_image_unpack_progress"] = l
				} else {
					meta[incus.DownloadProgress] = l
				}
				srv.SetMetadata(id, meta)
				<-seen
				meta = map[string]any{incus.DownloadProgress: meta[incus.DownloadProgress], "create_instance_from_image_unpack_progress": meta["create_instance_from_image_unpack_progress"]}
			}
			srv.Release(id)
		}()
	})
	var got []string
	err := c.Instances().CreateWithProgress(testCtx(t), incus.InstancesPost{Name: "b"}, func(s string) {
		got = append(got, s)
		seen <- s
	})
	require.NoError(t, err)
	assert.Equal(t, lines, got)
}

func TestInstanceMetadataAndTemplates(t *testing.T) {
	srv, c := newFake(t)
	srv.Handle("GET /1.0/instances/{name}/metadata", func(w http.ResponseWriter, r *http.Request) {
		incustest.SyncETag(w, `"m1"`, map[string]any{"architecture": "x86_64", "creation_date": 1767225600,
			"properties": map[string]string{"os": "debian"},
			"templates":  map[string]any{"/etc/hostname": map[string]any{"when": []string{"create", "copy"}, "template": "hostname.tpl"}}})
	})
	srv.Handle("PUT /1.0/instances/{name}/metadata", func(w http.ResponseWriter, r *http.Request) { incustest.Sync(w, nil) })
	var tpl string
	srv.Handle("POST /1.0/instances/{name}/metadata/templates", func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		tpl = string(b)
		incustest.Sync(w, nil)
	})
	md, etag, err := c.Instances().Metadata(testCtx(t), "b")
	require.NoError(t, err)
	assert.Equal(t, `"m1"`, etag)
	assert.Equal(t, int64(1767225600), md.CreationDate)
	assert.Equal(t, []string{"create", "copy"}, md.Templates["/etc/hostname"].When)

	md.Templates["/etc/x"] = &incus.ImageTemplate{When: []string{"copy"}, Template: "x.tpl"}
	require.NoError(t, c.Instances().UpdateMetadata(testCtx(t), "b", *md, etag))
	put := srv.Find(http.MethodPut, "/1.0/instances/b/metadata")
	require.Len(t, put, 1)
	assert.Equal(t, `"m1"`, put[0].Header.Get("If-Match"))
	var sent incus.ImageMetadata
	require.NoError(t, json.Unmarshal(put[0].Body, &sent))
	assert.Equal(t, *md, sent)

	require.NoError(t, c.Instances().PutTemplate(testCtx(t), "b", "x.tpl", strings.NewReader("hello\n")))
	post := srv.Find(http.MethodPost, "/1.0/instances/b/metadata/templates")
	require.Len(t, post, 1)
	assert.Equal(t, "x.tpl", post[0].Query.Get("path"))
	assert.Equal(t, "application/octet-stream", post[0].Header.Get("Content-Type"))
	assert.Equal(t, "hello\n", tpl)
}
