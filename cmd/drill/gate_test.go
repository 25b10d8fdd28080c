package main

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/drill"
	"github.com/box-isolation/box/drill/gate/gatetest"
)

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
