package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/drill"
	"github.com/box-isolation/box/drill/gate/gatetest"
	"github.com/box-isolation/box/drill/report"
	"github.com/box-isolation/box/internal/syncbuf"
)

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

// Recording stores the report, appends the row, and warns when the row
// can never let a release ship.
func TestRecordRun(t *testing.T) {
	for _, tc := range []struct {
		name, version, mode string
		warn                string
	}{
		{"clean host run", "e51ae38", "host", ""},
		{"dirty build", "e51ae38-dirty", "host", "built from a tree with changes"},
		{"unstamped build", "dev", "host", `version "dev" names no commit`},
		{"world run", "e51ae38", "world", "a world-mode run"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "RUNS.md")
			rep := gatetest.HostPass("a1b2c3", tc.version)
			rep.Environment.Mode = tc.mode
			var errw syncbuf.Buffer
			require.NoError(t, recordRun(stdio{err: &errw}, path, rep))
			m := regexp.MustCompile(`recorded (\S+) line (\d+): report drills/a1b2c3.json sha256 ([0-9a-f]{64})`).FindStringSubmatch(errw.String())
			require.NotNil(t, m, errw.String())
			assert.Equal(t, path, m[1])
			data, err := os.ReadFile(path)
			require.NoError(t, err)
			n, _ := strconv.Atoi(m[2])
			lines := strings.Split(string(data), "\n")
			require.Greater(t, len(lines), n)
			assert.True(t, strings.HasPrefix(lines[n-1], "| 2025-06-01 | "+tc.version+" | "+tc.mode+" |"), "line %d is the row: %q", n, lines[n-1])
			assert.True(t, strings.HasSuffix(lines[n-1], " | "+m[3]+" |"), "the row carries the hash said")
			if tc.warn == "" {
				assert.NotContains(t, errw.String(), "never let a release ship")
			} else {
				assert.Contains(t, errw.String(), "never let a release ship: ")
				assert.Contains(t, errw.String(), tc.warn)
			}
			checks, err := report.Verify(path)
			require.NoError(t, err)
			require.Len(t, checks, 1)
			assert.True(t, checks[0].OK(), "%v", checks[0].Problems)
			assert.Equal(t, tc.version, checks[0].Cells["commit"])
			assert.Equal(t, tc.mode, checks[0].Cells["mode"])
			stored, err := os.ReadFile(filepath.Join(filepath.Dir(path), "drills", "a1b2c3.json"))
			require.NoError(t, err)
			assert.Contains(t, string(stored), `"version": "`+tc.version+`"`)
		})
	}
}

// runIn runs the CLI with its own writers.
func runIn(args ...string) (code int, out, errOut string) {
	var o, e syncbuf.Buffer
	code = run(args, strings.NewReader(""), &o, &e)
	return code, o.String(), e.String()
}

func TestRecordVerifyCLI(t *testing.T) {
	path := filepath.Join(t.TempDir(), "RUNS.md")
	first := gatetest.Record(t, path, gatetest.HostPass("a1b2c3", "e51ae38"))
	second := gatetest.Record(t, path, gatetest.HostPass("d4e5f6", "e51ae38"))

	code, out, errOut := runIn("record", "verify", path)
	assert.Equal(t, exitOK, code, errOut)
	assert.Contains(t, out, fmt.Sprintf("ok   %s line %d (run a1b2c3, commit e51ae38): report drills/a1b2c3.json sha256 %s", path, first.Line, first.SHA256))
	assert.Contains(t, out, path+": 2 rows, 2 match their reports, 0 do not")
	assert.Empty(t, errOut)

	// One byte of the second report changed: that row fails, by name.
	file := filepath.Join(filepath.Dir(path), second.Report)
	data, err := os.ReadFile(file)
	require.NoError(t, err)
	data = []byte(strings.Replace(string(data), `"exit_code": 0`, `"exit_code": 1`, 1))
	require.NoError(t, os.WriteFile(file, data, 0o644))
	code, out, errOut = runIn("record", "verify", path)
	assert.Equal(t, exitMismatch, code)
	row := fmt.Sprintf("FAIL %s line %d (run d4e5f6, commit e51ae38): ", path, second.Line)
	assert.Contains(t, out, row+"its report drills/d4e5f6.json has SHA-256 ")
	assert.Contains(t, out, row+`exit: the row says "0", its report "1"`)
	assert.Contains(t, out, "ok   "+path+" line "+strconv.Itoa(first.Line))
	assert.Contains(t, errOut, "1 of 2 rows of "+path+" do not match their reports under drills/")

	// --json: the same, for scripts.
	code, out, _ = runIn("record", "verify", "--json", path)
	assert.Equal(t, exitMismatch, code)
	var got struct {
		Runs string `json:"runs"`
		OK   bool   `json:"ok"`
		Rows []struct {
			Line     int               `json:"line"`
			Cells    map[string]string `json:"cells"`
			SHA256   string            `json:"report_sha256"`
			Problems []string          `json:"problems"`
		} `json:"rows"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &got), out)
	assert.Equal(t, path, got.Runs)
	assert.False(t, got.OK)
	require.Len(t, got.Rows, 2)
	assert.Empty(t, got.Rows[0].Problems)
	assert.Equal(t, first.SHA256, got.Rows[0].SHA256)
	assert.Equal(t, "a1b2c3", strings.TrimSuffix(filepath.Base(got.Rows[0].Cells["report"]), ".json"))
	assert.Len(t, got.Rows[1].Problems, 2)
	assert.Equal(t, second.Line, got.Rows[1].Line)

	// The report removed.
	require.NoError(t, os.Remove(file))
	code, out, _ = runIn("record", "verify", path)
	assert.Equal(t, exitMismatch, code)
	assert.Contains(t, out, row+"its report drills/d4e5f6.json is missing")
}

func TestRecordVerifyDefaultsAndUsage(t *testing.T) {
	// The repository's own RUNS.md verifies (it is the default path).
	t.Chdir(filepath.Join("..", ".."))
	code, out, errOut := runIn("record", "verify")
	assert.Equal(t, exitOK, code, errOut)
	assert.Contains(t, out, "RUNS.md: ")

	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"record"}, exitUsage, "usage: drill record verify"},
		{[]string{"record", "sideways"}, exitUsage, `unknown subcommand "sideways"`},
		{[]string{"record", "verify", "a", "b"}, exitUsage, `unexpected argument "b"`},
		{[]string{"record", "verify", filepath.Join(t.TempDir(), "none.md")}, exitUsage, "no such file"},
	} {
		code, out, errOut := runIn(tc.args...)
		assert.Equal(t, tc.code, code, "%v", tc.args)
		assert.Contains(t, out+errOut, tc.want, "%v", tc.args)
	}
}

func TestRecordGateCLI(t *testing.T) {
	gatetest.Need(t, "git")
	dir := gatetest.NewRepo(t, map[string]string{"main.go": "package main\n"})
	x := gatetest.Git(t, dir, "rev-parse", "HEAD")
	t.Chdir(dir)

	// No record: refused, with what to do.
	gatetest.Record(t, "RUNS.md", gatetest.HostPass("a1b2c3", x[:7]+"-dirty"))
	gatetest.Commit(t, dir, "a dirty run")
	code, out, errOut := runIn("record", "gate")
	assert.Equal(t, exitMismatch, code)
	assert.Empty(t, out, "nothing on stdout: no proof")
	assert.Contains(t, errOut, "drill record gate: HEAD "+gatetest.Git(t, dir, "rev-parse", "HEAD")+" may not be released:")
	assert.Contains(t, errOut, "RUNS.md line ")
	assert.Contains(t, errOut, "built from a tree with changes")
	assert.Contains(t, errOut, "to release: on a real Incus host")

	// A passing host run of HEAD's code: the proof on stdout.
	rec := gatetest.Record(t, "RUNS.md", gatetest.HostPass("d4e5f6", x[:7]))
	gatetest.Commit(t, dir, "a host run")
	code, out, errOut = runIn("record", "gate", "RUNS.md")
	assert.Equal(t, exitOK, code, errOut)
	assert.Contains(t, out, fmt.Sprintf("may be released: RUNS.md line %d records\n", rec.Line))
	assert.Contains(t, out, fmt.Sprintf("drill run d4e5f6 on host incus-7 at 2025-06-01T12:00:00Z: %d of %d claims passed, exit 0\n", len(drill.Catalogue)-1, len(drill.Catalogue)))
	assert.Contains(t, out, "not run on a host, proven in the hermetic world by make test: C-ALLOW (it needs")
	assert.Contains(t, out, "(commit "+x+")")
	assert.Contains(t, out, "report drills/d4e5f6.json sha256 "+rec.SHA256)

	code, out, _ = runIn("record", "gate", "--json")
	assert.Equal(t, exitOK, code)
	var d struct {
		Head  string `json:"head"`
		Proof struct {
			Line   int    `json:"line"`
			Commit string `json:"commit"`
			SHA256 string `json:"sha256"`
		} `json:"proof"`
		Refused []struct {
			Line int `json:"line"`
		} `json:"refused"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &d), out)
	assert.Equal(t, rec.Line, d.Proof.Line)
	assert.Equal(t, x, d.Proof.Commit)
	assert.Equal(t, rec.SHA256, d.Proof.SHA256)
	assert.Empty(t, d.Refused, "the newest row decided")

	// Outside a repository: a tool error.
	t.Chdir(t.TempDir())
	code, _, errOut = runIn("record", "gate")
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, errOut, "release gate: finding the repository")
}

// TestListSaysHostModes: drill list names the claims a host runs only on
// request or never, with why, as the gate and --record rely on.
func TestListSaysHostModes(t *testing.T) {
	code, out, errOut := runIn("list")
	require.Equal(t, exitOK, code, errOut)
	never := drill.NeverIn(drill.ModeHost)
	require.NotEmpty(t, never)
	for _, c := range drill.Catalogue {
		note := c.ModeNote(drill.ModeHost)
		if _, ok := never[c.ID]; ok {
			assert.Contains(t, note, "never in host mode")
		}
		if note != "" {
			assert.Contains(t, out, "           "+note+"\n", "%s", c.ID)
		}
	}
	assert.Contains(t, out, "or recorded (--record)", "an opt-in claim is named")
}
