package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/drill"
	"github.com/box-isolation/box/drill/report"
	"github.com/box-isolation/box/internal/testenv/tier"
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

// Host mode never aims at the machine's own namespace where a world is;
// aimed at a namespace (a namespace world's host), it may run.
func TestHostModeGuard(t *testing.T) {
	assert.NoError(t, hostModeGuard("", ""), "a real host with no world")
	err := hostModeGuard("network namespace boxw-host", "")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "BOX_NETNS")
	netnsDir = t.TempDir()
	t.Cleanup(func() { netnsDir = "/run/netns" })
	assert.Error(t, hostModeGuard("network namespace boxw-host", "bxr-host"), "a namespace that does not exist")
	require.NoError(t, os.WriteFile(filepath.Join(netnsDir, "bxr-host"), nil, 0o644))
	assert.NoError(t, hostModeGuard("network namespace boxw-host", "bxr-host"), "aimed at a namespace world's host namespace")
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

// The man page and the completions come from the table: every command
// shown, and its subcommands, have an entry; hidden ones have none.
func TestManAndCompletion(t *testing.T) {
	code, page, _ := runCLI("man")
	require.Equal(t, exitOK, code)
	assert.Contains(t, page, ".TH DRILL 1 ")
	roff := func(s string) string { return strings.ReplaceAll(s, "-", `\-`) }
	for _, c := range commands() {
		entry := "\n.B drill " + roff(c.synopsis) + "\n"
		if c.hidden {
			assert.NotContains(t, page, "\n.B drill "+c.name)
			continue
		}
		assert.Contains(t, page, entry)
		for _, sc := range c.sub {
			if !sc.hidden {
				assert.Contains(t, page, "\n.B drill "+roff(sc.synopsis)+"\n")
			}
		}
	}
	assert.NotContains(t, page, "world serve")
	assert.NotContains(t, page, "world incus-user")
	assert.Contains(t, page, ".BI \\-\\-canary \" CANARY\"\n")

	for _, sh := range []string{"bash", "zsh", "fish"} {
		code, out, errOut := runCLI("completion", sh)
		require.Equal(t, exitOK, code, errOut)
		assert.Contains(t, out, "completion for drill")
		assert.Contains(t, out, "C-SIBLING", "claim ids complete for --claim")
		assert.NotContains(t, out, "serve")
	}
}

// drill's bash completion, sourced in bash as on TAB: subcommands,
// their flags, and the values --mutate and --claim take.
func TestBashCompletion(t *testing.T) {
	bash := tier.Tool(t, "bash", "bash")
	code, script, _ := runCLI("completion", "bash")
	require.Equal(t, exitOK, code)
	file := filepath.Join(t.TempDir(), "drill.bash")
	require.NoError(t, os.WriteFile(file, []byte(script), 0o644))
	for _, tc := range []struct {
		words string
		want  []string
	}{
		{"drill w", []string{"world"}},
		{"drill world ", []string{"up", "down", "status", "image", "check"}},
		{"drill world up --n", []string{"--name", "--no-incus"}},
		{"drill run --mutate p", []string{"pinning", "port-isolation", "privileged"}},
		{"drill run --claim C-SI", []string{"C-SIBLING"}},
		{"drill run --json --skip C-E", []string{"C-EGRESS", "C-EXPOSE"}},
		{"drill help wo", []string{"world"}},
		{"drill ma", nil},
	} {
		// The word being completed comes in as $2 (it may be empty).
		words := strings.Split(tc.words, " ")
		last := words[len(words)-1]
		src := `source "$1" || exit 9
COMP_WORDS=(` + strings.Join(words[:len(words)-1], " ") + ` "$2")
COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
_drill
printf '%s\n' "${COMPREPLY[@]}"`
		out, err := exec.Command(bash, "--norc", "--noprofile", "-c", src, "bash", file, last).CombinedOutput()
		require.NoError(t, err, "%s", out)
		got := strings.Fields(string(out))
		if len(got) == 0 {
			got = nil
		}
		assert.Equal(t, tc.want, got, tc.words)
	}
}

// sampleJSON is a small recorded report.
func sampleJSON(t *testing.T, version int) string {
	t.Helper()
	c, ok := drill.ClaimByID("C-SIBLING")
	require.True(t, ok)
	rep := drill.Report{SchemaVersion: version, RunID: "0a1b2c", Version: "e51ae38", Environment: drill.Environment{Mode: "world"},
		Claims: []drill.ClaimResult{{Claim: c, Verdict: drill.Fail, Results: []drill.Result{{
			Action:  drill.Action{ID: "p007", Claim: "C-SIBLING", Channel: "tcp", From: drill.PlaceA, Target: "box-b 10.88.0.12", TargetKey: string(drill.PlaceB), Expect: drill.ExpectBlocked},
			Verdict: drill.Fail, Observed: "silent", Evidence: "the target saw the traffic arrive <b>",
		}}}},
		Summary: drill.Summary{Failed: 1}, ExitCode: drill.ExitViolated}
	var b bytes.Buffer
	require.NoError(t, report.JSON(&b, &rep))
	path := filepath.Join(t.TempDir(), "report.json")
	require.NoError(t, os.WriteFile(path, b.Bytes(), 0o644))
	return path
}

func TestReport(t *testing.T) {
	in := sampleJSON(t, drill.SchemaVersion)
	out := filepath.Join(t.TempDir(), "report.html")
	code, stdout, stderr := runCLI("report", "html", in, out)
	require.Equal(t, exitOK, code, stderr)
	assert.Empty(t, stdout)
	page, err := os.ReadFile(out)
	require.NoError(t, err)
	assert.Contains(t, string(page), "<!DOCTYPE html>")
	assert.Contains(t, string(page), "C-SIBLING")
	assert.Contains(t, string(page), "arrive &lt;b&gt;")
	assert.Contains(t, string(page), `href="#r-p007"`, "the matrix marks the probe")

	for format, want := range map[string]string{"text": "C-SIBLING  tcp", "matrix": "<svg", "junit": "<testsuites", "json": `"run_id": "0a1b2c"`} {
		code, stdout, stderr = runCLI("report", format, in)
		assert.Equal(t, exitOK, code, stderr)
		assert.Contains(t, stdout, want, format)
	}
	// From stdin too.
	data, err := os.ReadFile(in)
	require.NoError(t, err)
	var o, e bytes.Buffer
	assert.Equal(t, exitOK, run([]string{"report", "text", "-"}, bytes.NewReader(data), &o, &e), e.String())
	assert.Contains(t, o.String(), "C-SIBLING")
}

func TestReportErrors(t *testing.T) {
	dir := t.TempDir()
	notReport := filepath.Join(dir, "other.json")
	require.NoError(t, os.WriteFile(notReport, []byte(`{"name": "x"}`), 0o644))
	garbage := filepath.Join(dir, "garbage.json")
	require.NoError(t, os.WriteFile(garbage, []byte(`<html>`), 0o644))
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"report"}, "usage: drill report"},
		{[]string{"report", "html"}, "usage: drill report"},
		{[]string{"report", "htlm", "r.json"}, `unknown format "htlm" (did you mean "html"?); the formats are html, json`},
		{[]string{"report", "html", filepath.Join(dir, "missing.json")}, "reading the report: open"},
		{[]string{"report", "html", garbage}, "want the JSON of drill run --json"},
		{[]string{"report", "html", notReport}, "is not a drill report: it has no schema_version"},
		{[]string{"report", "html", sampleJSON(t, drill.SchemaVersion+1)}, "newer than this drill's"},
		{[]string{"report", "html", sampleJSON(t, 1), filepath.Join(dir, "no", "such", "dir.html")}, "no such file or directory"},
		{[]string{"report", "html", "a", "b", "c"}, `unexpected argument "c"`},
	} {
		code, out, errOut := runCLI(tc.args...)
		assert.Equal(t, exitUsage, code, "%v", tc.args)
		assert.Contains(t, out+errOut, tc.want, "%v", tc.args)
		for _, line := range strings.Split(strings.TrimSpace(errOut), "\n") {
			if msg, ok := strings.CutPrefix(line, "drill: "); ok && msg != "" {
				assert.Equal(t, strings.ToLower(msg[:1]), msg[:1], "errors start lowercase: %q", line)
			}
		}
	}
}
