package main

import (
	"bytes"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

func runCLI(args ...string) (code int, out, errOut string) {
	var o, e bytes.Buffer
	code = run(args, strings.NewReader(""), &o, &e)
	return code, o.String(), e.String()
}

func TestHelpListsEveryCommand(t *testing.T) {
	code, out, _ := runCLI("help")
	assert.Equal(t, exitOK, code)
	for _, c := range commands() {
		if c.hidden {
			assert.NotContains(t, out, "  "+c.name+" ")
			continue
		}
		assert.Contains(t, out, "  "+c.name+" ")
		hcode, hout, _ := runCLI("help", c.name)
		assert.Equal(t, exitOK, hcode)
		assert.Contains(t, hout, "usage: drill "+c.synopsis)
	}
}

func TestUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"wrold"}, exitUsage, `did you mean "world"`},
		{[]string{"help", "verison"}, exitUsage, `did you mean "version"`},
		{[]string{"world"}, exitUsage, "usage: drill world up"},
		{[]string{"world", "sideways"}, exitUsage, "unknown subcommand"},
		{[]string{"world", "sideways"}, exitUsage, "(up, down, status, image, check)"},
		{[]string{"completion", "tcsh"}, exitUsage, `no completion for shell "tcsh": one of bash, zsh, fish`},
		{[]string{"completion"}, exitUsage, "completion needs a shell"},
		{[]string{"world", "up", "--bridge-netfiter"}, exitUsage, "flag provided but not defined"},
		{[]string{"world", "status", "extra"}, exitUsage, `unexpected argument "extra"`},
		{[]string{"world", "serve"}, exitUsage, "--state is required"},
		{[]string{"world", "incus-user"}, exitUsage, "--state is required"},
		{[]string{"run", "--canary", "1.1.1.1:443"}, exitUsage, "--canary goes with --host"},
		{[]string{"run", "--claim", "C-NOPE"}, exitUsage, `"C-NOPE" matches no claim`},
		{[]string{"run", "--mutate", "gravity"}, exitUsage, `no mutation "gravity"`},
	} {
		code, out, errOut := runCLI(tc.args...)
		assert.Equal(t, tc.code, code, "%v", tc.args)
		assert.Contains(t, out+errOut, tc.want, "%v", tc.args)
	}
}

func TestVersion(t *testing.T) {
	code, out, _ := runCLI("version")
	assert.Equal(t, exitOK, code)
	assert.Equal(t, "drill dev\n", out)
}

// world's synopsis and usage name every subcommand that is shown; help
// shows a command's options from its flags.
func TestWorldAndOptionsHelp(t *testing.T) {
	var world command
	for _, c := range commands() {
		if c.name == "world" {
			world = c
		}
	}
	_, usage, _ := runCLI("world", "--help")
	for _, sc := range world.sub {
		if sc.hidden {
			assert.NotContains(t, world.synopsis, sc.name)
			assert.NotContains(t, usage, "drill world "+sc.name)
			continue
		}
		assert.Contains(t, world.synopsis, sc.name)
		assert.Contains(t, usage, "drill "+sc.synopsis+"\n")
	}
	code, out, _ := runCLI("help", "run")
	assert.Equal(t, exitOK, code)
	assert.Contains(t, out, "Options:\n")
	assert.Contains(t, out, "-canary")
	for _, m := range mutationNames() {
		assert.Contains(t, out, m, "--mutate's help names every mutation")
	}
}

func TestBuildVersion(t *testing.T) {
	info := func(settings ...debug.BuildSetting) func() (*debug.BuildInfo, bool) {
		return func() (*debug.BuildInfo, bool) { return &debug.BuildInfo{Settings: settings}, true }
	}
	rev := debug.BuildSetting{Key: "vcs.revision", Value: "0123456789abcdef0123456789abcdef01234567"}
	for _, tc := range []struct {
		name, set string
		read      func() (*debug.BuildInfo, bool)
		want      string
	}{
		{"set at build time", "v1.2.0-3-g0123456-dirty", info(rev), "v1.2.0-3-g0123456-dirty"},
		{"go build, clean tree", "dev", info(rev, debug.BuildSetting{Key: "vcs.modified", Value: "false"}), "0123456789ab"},
		{"go build, dirty tree", "dev", info(rev, debug.BuildSetting{Key: "vcs.modified", Value: "true"}), "0123456789ab-dirty"},
		{"no vcs stamp", "dev", info(), "dev"},
		{"no build info", "dev", func() (*debug.BuildInfo, bool) { return nil, false }, "dev"},
	} {
		assert.Equal(t, tc.want, buildVersion(tc.set, tc.read), tc.name)
	}
}
