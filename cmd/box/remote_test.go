package main

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/stack/incus/incustest"
)

// TestHostVerbsRefuseARemote: every verb that acts on the host itself
// refuses --remote and BOX_REMOTE before reaching any Incus, and says to
// run it on that host.
func TestHostVerbsRefuseARemote(t *testing.T) {
	var host []string
	for _, c := range commands() {
		if c.hostLayer {
			host = append(host, c.name)
		}
	}
	assert.Subset(t, host, []string{"setup-host", "doctor", "guard-and-serve", "watch-ports", "teardown-host", "grant", "revoke", "migrate-host", "expose", "egress"})
	for _, name := range host {
		args := []string{name}
		switch name {
		case "grant", "revoke":
			args = append(args, "alice")
		case "egress":
			args = append(args, "work", "show")
		case "expose":
			args = append(args, "work", "--list")
		}
		for _, r := range []struct {
			run  runner
			args []string
		}{
			{offline, append([]string{"--remote", "far"}, args...)},
			{offline, append([]string{"--remote=far"}, args...)},
			{offline.with("BOX_REMOTE", "far"), args},
		} {
			res := r.run.run(t, r.args...)
			assert.Equal(t, exitUsage, res.code, "%v", r.args)
			assert.Contains(t, res.err, "remote far's host is another machine: run box "+name+" on that host, without --remote", "%v", r.args)
			assert.NotContains(t, res.err, "cannot reach", "refused before any Incus")
		}
	}
	// "local" is this machine: the verb goes on (and meets no incusd).
	res := offline.with("BOX_REMOTE", "local").run(t, "doctor")
	assert.NotContains(t, res.err, "another machine")
	assert.Contains(t, res.err, "cannot reach incusd at /nonexistent/box-test.socket")
}

func TestRemoteOption(t *testing.T) {
	res := offline.run(t, "--remote")
	assert.Equal(t, exitUsage, res.code)
	assert.Contains(t, res.err, "which remote?")
	res = offline.run(t, "--remote", "list")
	assert.Equal(t, exitUsage, res.code, "the option's value is not the command")

	// A remote the CLI's config does not name.
	dir := t.TempDir()
	res = offline.with("INCUS_CONF", dir).run(t, "--remote", "far", "list")
	assert.Equal(t, exitUsage, res.code)
	assert.Contains(t, res.err, "no remote named far in "+dir+"/config.yml (box remote add far TOKEN adds one")

	res = offline.with("INCUS_CONF", dir).run(t, "remote", "add", "far", "not-a-token")
	assert.Equal(t, exitUsage, res.code)
	assert.Contains(t, res.err, "incus config trust add NAME prints one")

	res = offline.with("INCUS_CONF", dir).run(t, "remote", "list")
	assert.Equal(t, exitOK, res.code)
	assert.Contains(t, res.out, "local ")
	assert.Contains(t, res.out, "images ")
}

// TestHandoverNamesRemoteAndProject: shell, tmux and the escape hatch name
// the remote (local:) and the project, and give the CLI the socket box
// used, whatever the CLI's own default remote is.
func TestHandoverNamesRemoteAndProject(t *testing.T) {
	srv := incustest.New(t)
	srv.Handle("GET /1.0/instances/{name}", func(w http.ResponseWriter, r *http.Request) {
		if r.PathValue("name") != "work" {
			incustest.Error(w, http.StatusNotFound, "Instance not found")
			return
		}
		incustest.Sync(w, map[string]any{"name": "work", "status": "Running", "type": "container",
			"config": map[string]string{"user.box": "1", "user.box.user": "dev"}})
	})
	r := offline.with("INCUS_SOCKET", srv.Socket(), "BOX_NETNS", "box-unit-test-absent")
	for _, tc := range []struct{ args, want []string }{
		{[]string{"shell", "work"}, []string{"incus", "--project", "default", "exec", "local:work", "--", "su", "-l", "dev"}},
		{[]string{"tmux", "work", "s1"}, []string{"incus", "--project", "default", "exec", "local:work", "--", "su", "-l", "dev", "-c", "tmux new-session -A -s s1"}},
		{[]string{"incus", "work", "--", "config", "show"}, []string{"incus", "--project", "default", "config", "show", "local:work"}},
		{[]string{"incus", "work", "--", "file", "pull", "{}/etc/hostname", "-"}, []string{"incus", "--project", "default", "file", "pull", "local:work/etc/hostname", "-"}},
	} {
		res := r.run(t, tc.args...)
		require.Equal(t, exitOK, res.code, "%v: %s", tc.args, res.err)
		assert.Equal(t, tc.want, res.handedOver, "%v", tc.args)
		assert.Contains(t, res.env, "INCUS_SOCKET="+srv.Socket())
		assert.Contains(t, res.err, "+ "+shellQuote(tc.want))
	}
	// An instance box did not mint is refused before any handover.
	res := r.run(t, "shell", "other")
	assert.Equal(t, exitFailed, res.code)
	assert.Nil(t, res.handedOver)
}
