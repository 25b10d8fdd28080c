package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/drill"
	"github.com/box-isolation/box/drill/report"
	"github.com/box-isolation/box/drill/verdicts"
)

// sampleJSON is a small recorded report.
func sampleJSON(t *testing.T, version int) string {
	t.Helper()
	c, ok := drill.ClaimByID("C-SIBLING")
	require.True(t, ok)
	rep := drill.Report{SchemaVersion: version, RunID: "0a1b2c", Version: "e51ae38", Environment: drill.Environment{Mode: "world"},
		Claims: []drill.ClaimResult{{Claim: c.Reported(), Verdict: drill.Fail, Results: []verdicts.Result{{
			ID: "p007", Claim: "C-SIBLING", Channel: "tcp", From: drill.PlaceA, Target: "box-b 10.88.0.12", TargetKey: string(drill.PlaceB), Expect: drill.ExpectBlocked,
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
