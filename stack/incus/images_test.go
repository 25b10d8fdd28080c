package incus_test

import (
	"context"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/incus/incustest"
)

// gatedReader yields nothing until gate is closed, then content: a rootfs
// that the server can only receive if the client streams.
type gatedReader struct {
	gate <-chan struct{}
	r    io.Reader
}

func (g *gatedReader) Read(p []byte) (int, error) {
	<-g.gate
	return g.r.Read(p)
}

func TestImportImage(t *testing.T) {
	srv, c := newFake(t)
	const fp = "aabbccddeeff00112233445566778899aabbccddeeff00112233445566778899"
	gotMetadata := make(chan struct{})
	parts := map[string]string{}
	srv.Handle("POST /1.0/images", func(w http.ResponseWriter, r *http.Request) {
		mt, params, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
		if err != nil || mt != "multipart/form-data" {
			incustest.Error(w, http.StatusBadRequest, "not multipart: "+r.Header.Get("Content-Type"))
			return
		}
		mr := multipart.NewReader(r.Body, params["boundary"])
		for {
			p, err := mr.NextPart()
			if err == io.EOF {
				break
			}
			if err != nil {
				incustest.Error(w, http.StatusBadRequest, err.Error())
				return
			}
			b, _ := io.ReadAll(p)
			parts[p.FormName()] = string(b)
			if p.FormName() == "metadata" {
				close(gotMetadata)
			}
		}
		srv.Async(w, incustest.Op{Description: "Downloading image", Metadata: map[string]any{"fingerprint": fp, "size": 123}})
	})
	srv.Handle("POST /1.0/images/aliases", func(w http.ResponseWriter, r *http.Request) {
		incustest.Sync(w, nil)
	})

	rootfs := &gatedReader{gate: gotMetadata, r: strings.NewReader(strings.Repeat("R", 1<<20))}
	got, err := c.Images().Import(testCtx(t), strings.NewReader("META"), rootfs, "box/debian", "box/default")
	require.NoError(t, err)
	assert.Equal(t, fp, got)
	assert.Equal(t, "META", parts["metadata"])
	assert.Len(t, parts["rootfs"], 1<<20)
	assert.Len(t, parts, 2)

	aliases := srv.Find("POST", "/1.0/images/aliases")
	require.Len(t, aliases, 2)
	assert.Equal(t, map[string]any{"name": "box/debian", "target": fp, "description": ""}, jsonBody(t, aliases[0]))
	assert.Equal(t, "box/default", jsonBody(t, aliases[1])["name"])
}

func TestImportImageFailures(t *testing.T) {
	t.Run("server refuses before reading the body", func(t *testing.T) {
		srv, c := newFake(t)
		srv.Handle("POST /1.0/images", func(w http.ResponseWriter, r *http.Request) {
			incustest.Error(w, http.StatusForbidden, "Not authorized")
		})
		// An endless rootfs: the upload must still end.
		endless := io.MultiReader(strings.NewReader("x"), neverEnding('x'))
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err := c.Images().Import(ctx, strings.NewReader("META"), endless)
		require.Error(t, err)
		assert.NotErrorIs(t, err, context.DeadlineExceeded)
	})
	t.Run("operation fails: image exists", func(t *testing.T) {
		srv, c := newFake(t)
		srv.Handle("POST /1.0/images", func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			srv.Async(w, incustest.Op{Err: "Image with same fingerprint already exists"})
		})
		_, err := c.Images().Import(testCtx(t), strings.NewReader("M"), strings.NewReader("R"), "a")
		assert.True(t, incus.IsAlreadyExists(err))
		assert.Empty(t, srv.Find("POST", "/1.0/images/aliases"))
	})
	t.Run("no fingerprint", func(t *testing.T) {
		srv, c := newFake(t)
		srv.Handle("POST /1.0/images", func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			srv.Async(w, incustest.Op{})
		})
		_, err := c.Images().Import(testCtx(t), strings.NewReader("M"), strings.NewReader("R"))
		var me *incus.MalformedError
		require.ErrorAs(t, err, &me)
	})
}

type neverEnding byte

func (b neverEnding) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = byte(b)
	}
	return len(p), nil
}

func TestImages(t *testing.T) {
	srv, c := newFake(t)
	img := map[string]any{
		"fingerprint": "abc", "filename": "box.tar.xz", "type": "container", "architecture": "x86_64",
		"size": 1234, "public": false, "uploaded_at": "2026-01-01T00:00:00Z",
		"aliases":    []map[string]string{{"name": "box/debian", "description": ""}},
		"properties": map[string]string{"os": "debian"},
	}
	srv.Handle("GET /1.0/images", func(w http.ResponseWriter, r *http.Request) { incustest.Sync(w, []any{img}) })
	srv.Handle("GET /1.0/images/{fp}", func(w http.ResponseWriter, r *http.Request) { incustest.Sync(w, img) })
	srv.Handle("GET /1.0/images/aliases/{name...}", func(w http.ResponseWriter, r *http.Request) {
		incustest.Sync(w, map[string]any{"name": r.PathValue("name"), "target": "abc", "type": "container", "description": "d"})
	})
	srv.Handle("DELETE /1.0/images/aliases/{name...}", func(w http.ResponseWriter, r *http.Request) { incustest.Sync(w, nil) })
	srv.Handle("DELETE /1.0/images/{fp}", func(w http.ResponseWriter, r *http.Request) {
		srv.Async(w, incustest.Op{Description: "Deleting image"})
	})
	ctx := testCtx(t)

	list, err := c.Images().List(ctx)
	require.NoError(t, err)
	require.Len(t, list, 1)
	assert.Equal(t, "box/debian", list[0].Aliases[0].Name)
	assert.Equal(t, int64(1234), list[0].Size)

	one, err := c.Images().Get(ctx, "abc")
	require.NoError(t, err)
	assert.Equal(t, "debian", one.Properties["os"])

	alias, err := c.Images().Alias(ctx, "box/debian")
	require.NoError(t, err)
	assert.Equal(t, incus.ImageAlias{Name: "box/debian", Target: "abc", Type: "container", Description: "d"}, *alias)
	assert.Len(t, srv.Find("GET", "/1.0/images/aliases/box/debian"), 1, "the alias's slash is escaped, not a path")

	require.NoError(t, c.Images().DeleteAlias(ctx, "box/debian"))
	require.NoError(t, c.Images().Delete(ctx, "abc"))
	assert.Len(t, srv.Find("DELETE", "/1.0/images/abc"), 1)
}

func TestPublishImage(t *testing.T) {
	srv, c := newFake(t)
	const fp = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"
	refuse := false
	srv.Handle("POST /1.0/images", func(w http.ResponseWriter, r *http.Request) {
		if refuse {
			srv.Async(w, incustest.Op{Description: "Creating image", Err: "Cannot export a running instance as an image"})
			return
		}
		srv.Async(w, incustest.Op{Description: "Creating image", Metadata: map[string]any{"fingerprint": fp}})
	})
	got, err := c.Images().Publish(testCtx(t), incus.ImagePublish{Instance: "builder", Compression: "none", Properties: map[string]string{"user.box.template": "claude"}})
	require.NoError(t, err)
	assert.Equal(t, fp, got)
	reqs := srv.Find("POST", "/1.0/images")
	require.Len(t, reqs, 1)
	assert.Equal(t, map[string]any{
		"source":                map[string]any{"type": "instance", "name": "builder"},
		"properties":            map[string]any{"user.box.template": "claude"},
		"public":                false,
		"compression_algorithm": "none",
	}, jsonBody(t, reqs[0]))

	_, err = c.Images().Publish(testCtx(t), incus.ImagePublish{Instance: "builder", Snapshot: "s1"})
	require.NoError(t, err)
	reqs = srv.Find("POST", "/1.0/images")
	assert.Equal(t, map[string]any{"type": "snapshot", "name": "builder/s1"}, jsonBody(t, reqs[1])["source"], "a snapshot is published as instance/snapshot")

	refuse = true
	_, err = c.Images().Publish(testCtx(t), incus.ImagePublish{Instance: "builder"})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "publishing builder as an image: ")
	assert.Contains(t, err.Error(), "cannot export a running instance")
}

// Export streams a unified image's tarball as incusd sends it; a missing
// image is incusd's error, and a split image (multipart) is refused.
func TestExportImage(t *testing.T) {
	srv, c := newFake(t)
	srv.Handle("GET /1.0/images/{fp}/export", func(w http.ResponseWriter, r *http.Request) {
		switch r.PathValue("fp") {
		case "unified":
			w.Header().Set("Content-Type", "application/octet-stream")
			_, _ = io.WriteString(w, "the tarball")
		case "split":
			w.Header().Set("Content-Type", "multipart/form-data; boundary=x")
			_, _ = io.WriteString(w, "--x--")
		default:
			incustest.Error(w, http.StatusNotFound, "Image not found")
		}
	})
	rc, err := c.Images().Export(context.Background(), "unified")
	require.NoError(t, err)
	b, err := io.ReadAll(rc)
	require.NoError(t, err)
	require.NoError(t, rc.Close())
	assert.Equal(t, "the tarball", string(b))

	_, err = c.Images().Export(context.Background(), "gone")
	assert.True(t, incus.IsNotFound(err), "%v", err)
	_, err = c.Images().Export(context.Background(), "split")
	assert.ErrorContains(t, err, "a split image")
}
