package boxes

import (
	"cmp"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/netip"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/incus/incustest"
	"github.com/box-isolation/box/stack/model"
	"github.com/box-isolation/box/stack/stacktest"
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

// A clone on a cluster gets a fixed address of its own member's slice,
// never its source's: the copy request carries the source's whole
// definition (Incus copies across members only so), its NIC without the
// address.
func TestCloneOnAClusterGetsItsOwnAddress(t *testing.T) {
	for _, tc := range []struct {
		name, target, place, snap, member string
		srcStatus                         string
		coldCopy                          bool
	}{
		{name: "to another member", target: "m3", member: "m3", srcStatus: "Stopped"},
		{name: "placed by incus beside its source", place: "m1", member: "m1", srcStatus: "Stopped"},
		{name: "from a snapshot", target: "m2", snap: "s1", member: "m2", srcStatus: "Stopped"},
		{name: "running source, to another member", target: "m3", member: "m3", srcStatus: "Running", coldCopy: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, h := newClusterFake(t)
			f.Place = cmp.Or(tc.place, "m2")
			f.Add("src", "m1", tc.srcStatus, "10.88.0.32")
			f.Snaps["src"] = []incus.Instance{{Name: "s1", Architecture: "x86_64", Profiles: []string{"box-net"},
				Config:  map[string]string{model.Current.Tag: "1", model.StampTemplate: "older"},
				Devices: map[string]map[string]string{"eth0": model.FixedNIC(netip.MustParseAddr("10.88.0.32")), "root": {"type": "disk", "path": "/", "pool": "default", "size": "20GiB"}}}}
			res, err := (&Manager{host: h}).CloneTo(context.Background(), "src", tc.snap, "c", tc.target)
			require.NoError(t, err)
			assert.Equal(t, tc.coldCopy, res.SourceStopped)
			assert.Equal(t, tc.member, res.Box.Member)

			c := f.Inst(t, "c")
			assert.Equal(t, "Running", c.Status)
			a := model.FixedAddressOf(c)
			stacktest.InSlice(t, tc.member, a)
			assert.NotEqual(t, "10.88.0.32", a.String(), "not its source's address")
			assert.Equal(t, "10.88.0.32", model.FixedAddressOf(f.Inst(t, "src")).String(), "the source keeps its own")
			assert.Equal(t, tc.srcStatus, f.Inst(t, "src").Status)
			assert.Equal(t, "20GiB", c.Devices["root"]["size"], "the source's other devices come along")
			if tc.snap != "" {
				assert.Equal(t, "older", c.Config[model.StampTemplate], "the snapshot's definition")
			}

			creates := f.Srv.Find(http.MethodPost, "/1.0/instances")
			last := creates[len(creates)-1]
			assert.Equal(t, tc.target, last.Query.Get("target"))
			var sent incus.InstancesPost
			require.NoError(t, json.Unmarshal(last.Body, &sent))
			assert.Equal(t, "x86_64", sent.Architecture)
			assert.Equal(t, model.BoxNIC(), sent.Devices["eth0"], "the copy's NIC asks for no address")
			for k := range sent.Config {
				assert.False(t, strings.HasPrefix(k, "volatile."), "the source's %s stays the source's", k)
			}
			assert.Equal(t, "copy", sent.Source.Type)
			assert.Equal(t, strings.TrimSuffix("src/"+tc.snap, "/"), sent.Source.Source)
		})
	}
}

// Off a cluster a clone is a plain copy, and --target is refused.
// Off a cluster a clone is a plain copy, which carries its source's
// fixed address: the clone gets its own.
func TestCloneOffAClusterIsAPlainCopy(t *testing.T) {
	f, h := newClusterFake(t)
	f.Clustered = false
	f.Add("src", "", "Stopped", "10.88.0.2")
	_, err := (&Manager{host: h}).CloneTo(context.Background(), "src", "", "c", "m2")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "--target m2: this incusd is not a cluster member")
	_, err = (&Manager{host: h}).Clone(context.Background(), "src", "", "c")
	require.NoError(t, err)
	var sent incus.InstancesPost
	require.NoError(t, json.Unmarshal(f.Srv.Find(http.MethodPost, "/1.0/instances")[0].Body, &sent))
	assert.Nil(t, sent.Devices)
	assert.Empty(t, sent.Architecture)
	assert.Equal(t, "10.88.0.3", model.FixedAddressOf(f.Inst(t, "c")).String(), "its own, not its source's")
	assert.Equal(t, "10.88.0.2", model.FixedAddressOf(f.Inst(t, "src")).String())
}
