package boxes

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/incus/incustest"
	"github.com/box-isolation/box/stack/model"
	"github.com/box-isolation/box/templates"
)

// boxUserData is what box new gives a claude box.
func boxUserData(t *testing.T) string {
	t.Helper()
	tp, err := templates.Get("claude")
	require.NoError(t, err)
	ud, err := tp.UserData(templates.RenderOptions{BoxName: "src", BoxVersion: "v1"})
	require.NoError(t, err)
	return ud
}

// A container clone of a provisioned box is not provisioned again: its
// user-data becomes the clone's (user and checks only) and the ready
// marker it inherited is emptied in its disk, before its first start, so
// box new waits for the clone's own report.
func TestCloneIsNotProvisionedAgain(t *testing.T) {
	f, h := newClusterFake(t)
	f.Clustered = false
	f.Add("src", "", "Stopped", "")
	ud := boxUserData(t)
	f.Insts["src"].Config[keyUserData] = ud
	f.Srv.Handle("GET /1.0/instances/{name}/files", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("path") != templates.ReadyMarker {
			incustest.Error(w, http.StatusNotFound, "not found")
			return
		}
		w.Header().Set("X-Incus-type", "file")
		io.WriteString(w, "claude\n") //nolint:errcheck
	})

	res, err := (&Manager{host: h}).Clone(context.Background(), "src", "", "c")
	require.NoError(t, err)
	assert.Equal(t, ProvisionChecks, res.Provisioning)
	want, ok := templates.ForClone(ud, "c")
	require.True(t, ok)
	assert.Equal(t, want, f.Inst(t, "c").Config[keyUserData])
	assert.Equal(t, ud, f.Inst(t, "src").Config[keyUserData], "the source's stays its own")

	var pushed []string
	for _, r := range f.Srv.Find(http.MethodPost, "/1.0/instances/c/files") {
		p := r.Query.Get("path")
		pushed = append(pushed, p)
		if p == templates.ReadyMarker {
			assert.Empty(t, r.Body, "the inherited marker emptied")
		}
	}
	assert.Equal(t, []string{"/etc/machine-id", templates.ReadyMarker}, pushed, "the failed marker was not there: nothing made")

	// Before the first start, and the new user-data with it.
	var order []string
	for _, r := range f.Srv.Requests() {
		switch {
		case r.Method == http.MethodPut && r.Path == "/1.0/instances/c" && strings.Contains(string(r.Body), "Rendered by box for the clone"):
			// The fixed address's update carries it again.
			if !slices.Contains(order, "user-data") {
				order = append(order, "user-data")
			}
		case r.Method == http.MethodPost && r.Path == "/1.0/instances/c/files" && r.Query.Get("path") == templates.ReadyMarker:
			order = append(order, "marker")
		case r.Method == http.MethodPut && r.Path == "/1.0/instances/c/state" && strings.Contains(string(r.Body), "start"):
			order = append(order, "start")
		}
	}
	assert.Equal(t, []string{"user-data", "marker", "start"}, order)
}

// User-data box did not render is the operator's: the clone runs it again,
// and still its inherited markers are emptied (that user-data may write
// them too). A box without user-data is left as it was.
func TestCloneOfOtherUserData(t *testing.T) {
	f, h := newClusterFake(t)
	f.Clustered = false
	f.Add("src", "", "Stopped", "")
	f.Add("bare", "", "Stopped", "")
	f.Insts["src"].Config[keyUserData] = "#cloud-config\npackages: [vim]\n"
	f.Srv.Handle("GET /1.0/instances/{name}/files", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Incus-type", "file")
		io.WriteString(w, "x\n") //nolint:errcheck
	})
	res, err := (&Manager{host: h}).Clone(context.Background(), "src", "", "c")
	require.NoError(t, err)
	assert.Equal(t, ProvisionAgain, res.Provisioning)
	assert.Equal(t, "#cloud-config\npackages: [vim]\n", f.Inst(t, "c").Config[keyUserData])
	assert.Len(t, f.Srv.Find(http.MethodPost, "/1.0/instances/c/files"), 3, "machine-id and both markers")

	res, err = (&Manager{host: h}).Clone(context.Background(), "bare", "", "d")
	require.NoError(t, err)
	assert.Empty(t, res.Provisioning)
	assert.Len(t, f.Srv.Find(http.MethodPost, "/1.0/instances/d/files"), 1, "the machine-id only")
}

// A VM clone's markers are emptied by Incus at its first start, through
// a copy template beside the machine-id's and the image's own.
func TestVMCloneMarkersEmptiedByIncus(t *testing.T) {
	f, h := newClusterFake(t)
	f.Clustered = false
	f.Add("src", "", "Stopped", "")
	f.Insts["src"].Type = model.TypeVM
	f.Insts["src"].Config[keyUserData] = boxUserData(t)
	var md incus.ImageMetadata
	require.NoError(t, json.Unmarshal([]byte(`{"architecture":"x86_64","templates":{"/etc/hostname":{"when":["create","copy"],"template":"hostname.tpl"}}}`), &md))
	tpls := map[string]string{}
	f.Srv.Handle("POST /1.0/instances/{name}/metadata/templates", func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		tpls[r.URL.Query().Get("path")] = string(b)
		incustest.Sync(w, nil)
	})
	f.Srv.Handle("GET /1.0/instances/{name}/metadata", func(w http.ResponseWriter, r *http.Request) {
		incustest.SyncETag(w, `"m1"`, md)
	})
	f.Srv.Handle("PUT /1.0/instances/{name}/metadata", func(w http.ResponseWriter, r *http.Request) {
		assert.NoError(t, json.NewDecoder(r.Body).Decode(&md))
		incustest.Sync(w, nil)
	})

	res, err := (&Manager{host: h}).Clone(context.Background(), "src", "", "c")
	require.NoError(t, err)
	assert.Equal(t, ProvisionChecks, res.Provisioning)
	assert.Empty(t, f.Srv.Find(http.MethodPost, "/1.0/instances/c/files"), "a VM's files cannot be written before it runs")
	assert.Equal(t, map[string]string{MachineIDTemplate: machineIDTemplateText, emptyTemplate: ""}, tpls)
	for _, p := range []string{templates.ReadyMarker, templates.FailedMarker} {
		assert.Equal(t, &incus.ImageTemplate{When: []string{"copy"}, Template: emptyTemplate, Properties: map[string]string{}}, md.Templates[p], p)
	}
	assert.Equal(t, MachineIDTemplate, md.Templates["/etc/machine-id"].Template)
	assert.Equal(t, "hostname.tpl", md.Templates["/etc/hostname"].Template, "the image's own stay")
	assert.Equal(t, "copy", f.Inst(t, "c").Config["volatile.apply_template"])
}
