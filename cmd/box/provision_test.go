package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/stack"
	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/incus/incustest"
	"github.com/box-isolation/box/templates"
)

// provisionFake is incusd with one box whose files the test sets, and
// whose exec answers `tail` of cloud-init's log.
type provisionFake struct {
	srv   *incustest.Server
	mu    sync.Mutex
	files map[string][]string // path -> what each read answers, the last one repeated
	reads map[string]int
}

func newProvisionFake(t *testing.T, files map[string][]string) (*provisionFake, *call, *bytes.Buffer, *bytes.Buffer) {
	t.Helper()
	f := &provisionFake{srv: incustest.New(t), files: files, reads: map[string]int{}}
	f.srv.Handle("GET /1.0/instances/{name}/files", func(w http.ResponseWriter, r *http.Request) {
		p := r.URL.Query().Get("path")
		f.mu.Lock()
		answers, ok := f.files[p]
		n := f.reads[p]
		f.reads[p]++
		f.mu.Unlock()
		if !ok {
			incustest.Error(w, http.StatusNotFound, "not found")
			return
		}
		w.Header().Set("X-Incus-type", "file")
		io.WriteString(w, answers[min(n, len(answers)-1)]) //nolint:errcheck
	})
	f.srv.Handle("POST /1.0/instances/{name}/exec", func(w http.ResponseWriter, r *http.Request) {
		var req struct{ Command []string }
		_ = json.NewDecoder(r.Body).Decode(&req)
		assert.Equal(t, []string{"tail", "-n", "15", cloudInitLog}, req.Command)
		f.srv.Async(w, incustest.Op{Description: "Executing command", Metadata: map[string]any{
			"return": 0, "output": map[string]any{"1": "/1.0/instances/work/logs/exec-output/out", "2": "/1.0/instances/work/logs/exec-output/err"}}})
	})
	f.srv.Handle("GET /1.0/instances/{name}/logs/exec-output/{file}", func(w http.ResponseWriter, r *http.Request) {
		if r.PathValue("file") == "out" {
			io.WriteString(w, "E: Unable to locate package nodejs\n/var/lib/cloud/instance/scripts/runcmd: npm: not found\n") //nolint:errcheck
		}
	})
	f.srv.Handle("DELETE /1.0/instances/{name}/logs/exec-output/{file}", func(w http.ResponseWriter, r *http.Request) { incustest.Sync(w, nil) })
	var out, errb bytes.Buffer
	a := &app{ctx: context.Background(), out: &out, err: &errb, getenv: func(k string) string {
		return map[string]string{"INCUS_SOCKET": f.srv.Socket(), "BOX_NETNS": "box-unit-test-absent"}[k]
	}}
	return f, &call{app: a}, &out, &errb
}

// A failed provisioning is reported with the marker's reason and the
// end of cloud-init's log, and the box is kept for a look inside; --json
// prints the result all the same, saying why.
func TestProvisioningFailedKeepsTheBox(t *testing.T) {
	for _, asJSON := range []bool{false, true} {
		f, c, out, errb := newProvisionFake(t, map[string][]string{
			"/usr/bin/cloud-init":  {"#!/usr/bin/python3\n"},
			templates.FailedMarker: {"agent command claude is not in /usr/local/bin (npm install -g @anthropic-ai/claude-code failed?); see /var/log/cloud-init-output.log\n"},
		})
		r := &newResult{Box: &stack.Box{Name: "work", Type: "container", Status: "Running"}, Address: "10.88.0.5"}
		p, err := c.waitProvisioned(incus.New(f.srv.Socket()), "work")
		require.Error(t, err)
		assert.Empty(t, p)
		err = c.notProvisioned(r, asJSON, err)
		require.Error(t, err)
		msg := err.Error()
		assert.Contains(t, msg, "minted work, but provisioning failed: agent command claude is not in /usr/local/bin")
		assert.Contains(t, msg, "work is kept, running, as it failed: look inside with box shell work")
		assert.Contains(t, msg, "box rm work --force")
		assert.Contains(t, errb.String(), "  | /var/lib/cloud/instance/scripts/runcmd: npm: not found\n", "the end of cloud-init's log")
		assert.Empty(t, f.srv.Find(http.MethodDelete, "/1.0/instances/work"), "the box is kept")
		if !asJSON {
			assert.Empty(t, out.String())
			continue
		}
		var got newResult
		require.NoError(t, json.Unmarshal(out.Bytes(), &got), out.String())
		assert.Equal(t, "work", got.Box.Name)
		assert.True(t, strings.HasPrefix(got.Provisioned, "failed: agent command claude is not in /usr/local/bin"), got.Provisioned)
	}
}

// An empty marker is no marker (a clone's inherited ones are emptied
// before it boots): box waits on for the box's own.
func TestEmptyMarkerIsNoMarker(t *testing.T) {
	f, c, _, _ := newProvisionFake(t, map[string][]string{
		"/usr/bin/cloud-init":  {"#!/usr/bin/python3\n"},
		templates.ReadyMarker:  {"", "claude\n"},
		templates.FailedMarker: {""},
	})
	p, err := c.waitProvisioned(incus.New(f.srv.Socket()), "work")
	require.NoError(t, err)
	assert.Equal(t, "ready", p)
	assert.Equal(t, 2, f.reads[templates.ReadyMarker], "the empty one was read and waited past")
}

func TestFmtSeconds(t *testing.T) {
	for in, want := range map[float64]string{2.3: "2.3s", 0.7: "700ms", 62.6: "1m2.6s", 0: "0s"} {
		assert.Equal(t, want, fmtSeconds(in), "%v", in)
	}
}
