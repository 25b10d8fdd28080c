package main

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/stack/boxes"
	"github.com/box-isolation/box/stack/incus/incustest"
	"github.com/box-isolation/box/stack/model"
	"github.com/box-isolation/box/stack/stacktest"
	"github.com/box-isolation/box/templates"
)

// minting runs box new against a fake incusd that reports driver and
// refuses to create the instance, and returns what box asked it to create.
// The refusal keeps the test short of anything past the daemon (the host's
// firewall), and is what box new then reports.
func minting(t *testing.T, driver string, env []string, args ...string) (result, map[string]any) {
	t.Helper()
	srv := incustest.New(t)
	srv.Drivers(driver)
	srv.Handle("GET /1.0/instances/{name}", func(w http.ResponseWriter, r *http.Request) {
		incustest.Error(w, http.StatusNotFound, "Instance not found")
	})
	srv.Handle("GET /1.0/images/aliases/{name...}", func(w http.ResponseWriter, r *http.Request) {
		incustest.Sync(w, map[string]any{"name": r.PathValue("name"), "target": "f00dfeed"})
	})
	srv.Handle("POST /1.0/instances", func(w http.ResponseWriter, r *http.Request) {
		srv.Async(w, incustest.Op{Description: "Creating instance", Err: "the fake creates nothing"})
	})
	withStack(srv)
	// BOX_NETNS names no namespace: should anything reach for the host's
	// network, it fails instead of touching this machine's.
	r := offline.with(append([]string{"INCUS_SOCKET", srv.Socket(), "BOX_NETNS", "box-unit-test-absent",
		"BOX_TEMPLATE_IMAGES", withTemplateImage(t, srv, templates.Default, testImageFingerprint)}, env...)...).
		run(t, append([]string{"new", "--name", "work"}, args...)...)
	require.Equal(t, exitFailed, r.code, "the fake refuses the instance")
	assert.Contains(t, r.err, "the fake creates nothing")
	posts := srv.Find(http.MethodPost, "/1.0/instances")
	require.Len(t, posts, 1)
	var body map[string]any
	require.NoError(t, json.Unmarshal(posts[0].Body, &body))
	if body["type"] == "container" {
		assert.Equal(t, map[string]any{"type": "image", "fingerprint": testImageFingerprint}, body["source"], "a copy of the template's image, by fingerprint")
	} else {
		assert.Equal(t, "pull", body["source"].(map[string]any)["mode"], "a VM is provisioned in itself: the template's image is a container's")
	}
	return r, body
}

// testImageFingerprint is the fake's template image.
const testImageFingerprint = "5eed5eed00000000000000000000000000000000000000000000000000000000"

// withTemplateImage writes a record in which template's image is fp,
// current, and makes the fake serve that image; it returns the record's
// path (BOX_TEMPLATE_IMAGES).
func withTemplateImage(t *testing.T, srv *incustest.Server, template, fp string) string {
	t.Helper()
	tm, err := templates.Get(template)
	require.NoError(t, err)
	hash, err := tm.Hash()
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "template-images.json")
	b, err := json.Marshal(map[string]boxes.TemplateImage{template: {Template: template, Fingerprint: fp, Hash: hash, Base: tm.Image, Built: time.Now()}})
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(path, b, 0o644))
	srv.Handle("GET /1.0/images/"+fp, func(w http.ResponseWriter, r *http.Request) {
		incustest.Sync(w, map[string]any{"fingerprint": fp, "properties": map[string]string{"user.box.template": template}})
	})
	return path
}

// withStack makes the fake serve the stack's bridge (which takes box's
// records of its boxes' policies) and profile.
func withStack(srv *incustest.Server) {
	stacktest.ServeStaticBridge(srv, map[string]string{"ipv4.address": "10.88.0.1/24"})
	srv.Handle("GET /1.0/profiles", stacktest.ProfileList)
}

// TestNewWithoutTheStack: box new on a host with incusd but no stack says
// to run setup-host; with no incusd it says the daemon is not there.
func TestNewWithoutTheStack(t *testing.T) {
	srv := incustest.New(t)
	srv.Drivers("lxc")
	srv.Handle("GET /1.0/instances/{name}", func(w http.ResponseWriter, r *http.Request) {
		incustest.Error(w, http.StatusNotFound, "Instance not found")
	})
	r := offline.with("INCUS_SOCKET", srv.Socket(), "BOX_NETNS", "box-unit-test-absent").run(t, "new", "--name", "work", "--container")
	assert.Equal(t, exitFailed, r.code)
	assert.Contains(t, r.err, "there is no isolation stack on this host (network boxnet is missing): run `box setup-host` first")
	assert.Empty(t, srv.Find(http.MethodPost, "/1.0/instances"), "nothing is created")

	r = offline.with("INCUS_SOCKET", t.TempDir()+"/no.socket", "BOX_NETNS", "box-unit-test-absent").run(t, "new", "--name", "work", "--container")
	assert.Equal(t, exitFailed, r.code)
	assert.Contains(t, r.err, "cannot reach incusd", "a dead daemon is not a missing stack")
	assert.NotContains(t, r.err, "setup-host")
}

func config(t *testing.T, body map[string]any) map[string]any {
	t.Helper()
	c, ok := body["config"].(map[string]any)
	require.True(t, ok, "config in %v", body)
	return c
}

// TestNewPicksTheType: box new makes a VM where the server can run one, a
// container where it cannot, and what the operator asks for regardless.
func TestNewPicksTheType(t *testing.T) {
	for _, tc := range []struct {
		name, driver string
		args         []string
		want         string
		says         string // on stderr; empty: nothing about the type
	}{
		{"a host that can run VMs", "lxc | qemu", nil, "virtual-machine", "box: this host can run VMs: making a virtual machine (--container for a container)\n"},
		{"a host that cannot", "lxc", nil, "container", "box: this host cannot run VMs (incus drivers: lxc): making a container\n"},
		{"--container on a VM host", "lxc | qemu", []string{"--container"}, "container", ""},
		{"--vm on a container host", "lxc", []string{"--vm"}, "virtual-machine", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, body := minting(t, tc.driver, nil, tc.args...)
			assert.Equal(t, tc.want, body["type"])
			assert.Equal(t, tc.want, config(t, body)["user.box.type"], "the type stamp")
			if tc.says != "" {
				assert.Contains(t, r.err, tc.says)
			} else {
				assert.NotContains(t, r.err, "run VMs")
			}
		})
	}
}

// TestNewResources: the limits box new asks incusd for, none leaving one
// unset (template blank: 2 CPU, 4GiB memory, 20GiB disk).
func TestNewResources(t *testing.T) {
	for _, tc := range []struct {
		name      string
		env, args []string
		cpu, mem  any // nil: no limit set
		disk      any // the root disk's size; nil: no root device
	}{
		{"the template's", nil, nil, "2", "4GiB", "20GiB"},
		{"the environment's", []string{"BOX_CPU", "3", "BOX_MEMORY", "none"}, nil, "3", nil, "20GiB"},
		{"flags beat the environment", []string{"BOX_MEMORY", "none", "BOX_DISK", "30GiB"}, []string{"--memory", "1GiB", "--disk", "none"}, "2", "1GiB", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, body := minting(t, "lxc", tc.env, tc.args...)
			cfg := config(t, body)
			assert.Equal(t, tc.cpu, cfg["limits.cpu"])
			assert.Equal(t, tc.mem, cfg["limits.memory"])
			var size any
			if devs, _ := body["devices"].(map[string]any); devs != nil {
				if root, _ := devs["root"].(map[string]any); root != nil {
					size = root["size"]
				}
			}
			assert.Equal(t, tc.disk, size)
		})
	}
}

// --nesting asks incusd for the nesting keys on the instance itself;
// without it none is sent; --nesting=false is no nesting too; a clone
// keeps its source's and refuses the flag.
func TestNewNesting(t *testing.T) {
	_, body := minting(t, "lxc", nil, "--nesting")
	cfg := config(t, body)
	for k, v := range model.NestingConfig() {
		assert.Equal(t, v, cfg[k], k)
	}
	for _, args := range [][]string{nil, {"--nesting=false"}} {
		_, body = minting(t, "lxc", nil, args...)
		for k := range config(t, body) {
			assert.False(t, strings.HasPrefix(k, "security."), "%v sent %s", args, k)
		}
	}
	r := offline.run(t, "new", "--name", "c", "--from", "src", "--nesting")
	assert.Equal(t, exitUsage, r.code)
	assert.Contains(t, r.err, "--nesting (a clone keeps its source's) cannot be used with --from")
}

// A template's nesting: true is what box new asks for, unless --nesting
// says otherwise.
func TestNestingPrecedence(t *testing.T) {
	nests := &templates.Template{Nesting: true}
	plain := &templates.Template{}
	assert.True(t, (&newOpts{}).wantNesting(nests))
	assert.False(t, (&newOpts{}).wantNesting(plain))
	assert.True(t, (&newOpts{nesting: true, nestingSet: true}).wantNesting(plain))
	assert.False(t, (&newOpts{nesting: false, nestingSet: true}).wantNesting(nests))
}
