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
