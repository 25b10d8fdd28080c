package boxes

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/incus/incustest"
	"github.com/box-isolation/box/stack/model"
)

// A VM clone gets a machine-id of its own: its disk cannot be written
// before it boots, so box has Incus write it, through an instance template
// rendered from the clone's own UUID at its first start after the copy.
func TestVMCloneGetsAFreshMachineID(t *testing.T) {
	f, h := newClusterFake(t)
	f.Clustered = false
	f.Add("src", "", "Stopped", "")
	f.Insts["src"].Type = model.TypeVM
	var md incus.ImageMetadata
	require.NoError(t, json.Unmarshal([]byte(`{"architecture":"x86_64","properties":{"os":"debian"},"templates":{"/etc/hostname":{"when":["create","copy"],"template":"hostname.tpl"}}}`), &md))
	var tpl []byte
	f.Srv.Handle("POST /1.0/instances/{name}/metadata/templates", func(w http.ResponseWriter, r *http.Request) {
		tpl, _ = io.ReadAll(r.Body)
		incustest.Sync(w, nil)
	})
	f.Srv.Handle("GET /1.0/instances/{name}/metadata", func(w http.ResponseWriter, r *http.Request) {
		incustest.SyncETag(w, `"m1"`, md)
	})
	f.Srv.Handle("PUT /1.0/instances/{name}/metadata", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("If-Match") != `"m1"` {
			incustest.Error(w, http.StatusPreconditionFailed, "stale")
			return
		}
		assert.NoError(t, json.NewDecoder(r.Body).Decode(&md))
		incustest.Sync(w, nil)
	})

	_, err := (&Manager{host: h}).Clone(context.Background(), "src", "", "c")
	require.NoError(t, err)

	assert.Empty(t, f.Srv.Find(http.MethodPost, "/1.0/instances/c/files"), "a VM's files cannot be written before it runs")
	tplPosts := f.Srv.Find(http.MethodPost, "/1.0/instances/c/metadata/templates")
	require.Len(t, tplPosts, 1)
	assert.Equal(t, MachineIDTemplate, tplPosts[0].Query.Get("path"))
	assert.Equal(t, "application/octet-stream", tplPosts[0].Header.Get("Content-Type"))
	assert.Equal(t, `{{ config_get("volatile.uuid", "")|cut:"-" }}`+"\n", string(tpl), "the clone's own UUID, as systemd would make it of the VM's")
	assert.Equal(t, &incus.ImageTemplate{When: []string{"copy"}, Template: MachineIDTemplate, Properties: map[string]string{}}, md.Templates["/etc/machine-id"])
	assert.Equal(t, "hostname.tpl", md.Templates["/etc/hostname"].Template, "the image's own templates stay")
	assert.Equal(t, "debian", md.Properties["os"])
	assert.Equal(t, "copy", f.Inst(t, "c").Config["volatile.apply_template"], "the copy's templates run at its first start")
	assert.Equal(t, "Running", f.Inst(t, "c").Status)

	// All of it before the first start.
	var order []string
	for _, r := range f.Srv.Requests() {
		switch {
		case r.Method == http.MethodPut && r.Path == "/1.0/instances/c/metadata":
			order = append(order, "template")
		case r.Method == http.MethodPut && r.Path == "/1.0/instances/c/state" && strings.Contains(string(r.Body), "start"):
			order = append(order, "start")
		}
	}
	assert.Equal(t, []string{"template", "start"}, order)
}

// A container clone's machine-id is written into its disk before it
// starts, as before.
func TestContainerCloneGetsAFreshMachineID(t *testing.T) {
	f, h := newClusterFake(t)
	f.Clustered = false
	f.Add("src", "", "Stopped", "")
	_, err := (&Manager{host: h}).Clone(context.Background(), "src", "", "c")
	require.NoError(t, err)
	files := f.Srv.Find(http.MethodPost, "/1.0/instances/c/files")
	require.Len(t, files, 1)
	assert.Equal(t, "/etc/machine-id", files[0].Query.Get("path"))
	assert.Regexp(t, `^[0-9a-f]{32}\n$`, string(files[0].Body))
	assert.Empty(t, f.Srv.Find(http.MethodPut, "/1.0/instances/c/metadata"))
}
