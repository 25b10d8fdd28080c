package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/drill/gate/gatetest"
	"github.com/box-isolation/box/drill/report"
	"github.com/box-isolation/box/internal/syncbuf"
)

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
