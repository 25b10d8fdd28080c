// Package gatetest helps test the release gate without running the drill:
// a fabricated report of the drill's true shape (drill.Report, every
// claim of the catalogue) and temporary git repositories.
package gatetest

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/box-isolation/box/drill"
	"github.com/box-isolation/box/drill/report"
	"github.com/box-isolation/box/drill/verdicts"
	"github.com/box-isolation/box/internal/testenv/tier"
	"github.com/box-isolation/box/stack/model"
)

// Started is when the fabricated runs started.
var Started = time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)

// HostPass is a whole recorded host-mode run of the given drill build in
// which every claim a host can run passed and those it cannot were
// skipped, saying why: what drill.Run returns on a real host where
// isolation holds.
func HostPass(runID, version string) *drill.Report {
	rep := &drill.Report{
		SchemaVersion: drill.SchemaVersion,
		RunID:         runID,
		Version:       version,
		Started:       Started,
		DurationMS:    41250,
		Environment: drill.Environment{Mode: "host", Hostname: "incus-7", Kernel: "6.1.0-28-amd64", IncusVersion: "6.0.4",
			InstanceType: "container", BoxNewType: "container"},
		Stack: drill.StackFacts{Ensured: true, Changes: []model.Change{}, Subnet: "10.88.0.0/24", Gateway: "10.88.0.1", BridgeMode: "port-set",
			Layers: map[model.LayerID]string{}, Findings: nil},
		Boxes: []drill.BoxEnd{
			{Place: drill.PlaceA, Instance: "drill-" + runID + "-a", IP: netip.MustParseAddr("10.88.0.11")},
			{Place: drill.PlaceB, Instance: "drill-" + runID + "-b", IP: netip.MustParseAddr("10.88.0.12")},
			{Place: drill.PlaceC, Instance: "drill-" + runID + "-c", IP: netip.MustParseAddr("10.88.0.13")},
		},
		Mutations: []string{}, MutationResults: []drill.MutationResult{}, Problems: []string{}, Notes: []string{},
	}
	for _, l := range drill.Layers() {
		rep.Stack.Layers[l] = "present"
	}
	for i, c := range drill.Catalogue {
		id := fmt.Sprintf("p%03d", i+1)
		rep.Claims = append(rep.Claims, drill.ClaimResult{Claim: c.Reported(), Verdict: drill.Pass, Results: []verdicts.Result{{
			ID: id, Claim: c.ID, Channel: drill.ChannelStack, From: drill.PlaceVerify, Target: "the stack", Expect: drill.ExpectPresent,
			Verdict:  drill.Pass,
			Observed: "present",
			Evidence: "Verify found every layer " + string(c.ID) + " rests on as desired",
		}}})
	}
	rep.Summary = drill.Summary{Passed: len(rep.Claims), Probes: len(rep.Claims), ProbePhaseMS: 5100, MSPerProbe: 5100 / float64(len(rep.Claims))}
	for id, why := range drill.NeverIn(drill.ModeHost) {
		Set(rep, string(id), drill.Skipped)
		for i := range rep.Claims {
			if rep.Claims[i].ID == id {
				rep.Claims[i].Reason = "not run in host mode: " + why
			}
		}
	}
	return rep
}

// Set gives one claim a verdict and recounts the summary and exit code
// as drill.Run does (fail wins, then inconclusive).
func Set(rep *drill.Report, id string, v drill.Verdict) {
	for i := range rep.Claims {
		if string(rep.Claims[i].ID) == id {
			rep.Claims[i].Verdict = v
			for j := range rep.Claims[i].Results {
				rep.Claims[i].Results[j].Verdict = v
			}
			if v == drill.Skipped {
				rep.Claims[i].Reason = "not selected"
				rep.Claims[i].Results = []verdicts.Result{}
			}
		}
	}
	rep.Summary.Passed, rep.Summary.Failed, rep.Summary.Inconclusive, rep.Summary.Skipped = 0, 0, 0, 0
	for _, c := range rep.Claims {
		switch c.Verdict {
		case drill.Pass:
			rep.Summary.Passed++
		case drill.Fail:
			rep.Summary.Failed++
		case drill.Inconclusive:
			rep.Summary.Inconclusive++
		case drill.Skipped:
			rep.Summary.Skipped++
		}
	}
	switch {
	case rep.Summary.Failed > 0:
		rep.ExitCode = drill.ExitViolated
	case rep.Summary.Inconclusive > 0:
		rep.ExitCode = drill.ExitInconclusive
	default:
		rep.ExitCode = drill.ExitOK
	}
}

// Record records rep into the RUNS.md at path with the drill's own code.
func Record(t testing.TB, path string, rep *drill.Report) report.Recorded {
	t.Helper()
	rec, err := report.Record(path, rep)
	if err != nil {
		t.Fatalf("recording the run: %v", err)
	}
	return rec
}

// Need skips a test (fails it under BOX_REQUIRE_TIERS=1) when a tool
// the release gate runs is not installed.
func Need(t testing.TB, tools ...string) {
	t.Helper()
	debian := map[string]string{"go": "golang-go"}
	for _, tool := range tools {
		pkg := debian[tool]
		if pkg == "" {
			pkg = tool // git, make
		}
		tier.Tool(t, tool, pkg)
	}
}

// Env is the environment for git and make in a test: no user or system
// git configuration, a fixed identity, and no make flags from a make the
// tests may run under.
func Env() []string {
	env := []string{}
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, "GIT_") || name == "MAKEFLAGS" || name == "MFLAGS" || name == "MAKELEVEL" {
			continue
		}
		env = append(env, kv)
	}
	return append(env, "GIT_CONFIG_GLOBAL="+os.DevNull, "GIT_CONFIG_NOSYSTEM=1",
		"GIT_AUTHOR_NAME=gate test", "GIT_AUTHOR_EMAIL=gate@example.invalid",
		"GIT_COMMITTER_NAME=gate test", "GIT_COMMITTER_EMAIL=gate@example.invalid")
}

// Git runs git in dir and returns its output, trimmed; it fails the test
// if git does.
func Git(t testing.TB, dir string, args ...string) string {
	t.Helper()
	c := exec.Command("git", append([]string{"-C", dir}, args...)...)
	c.Env = Env()
	out, err := c.CombinedOutput()
	if err != nil {
		t.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}

// NewRepo makes a git repository in a temporary directory, with files (path -> content) committed, and returns it.
func NewRepo(t testing.TB, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	Git(t, dir, "init", "-q", "-b", "main")
	WriteFiles(t, dir, files)
	Commit(t, dir, "the code")
	return dir
}

// WriteFiles writes files (path -> content) under dir.
func WriteFiles(t testing.TB, dir string, files map[string]string) {
	t.Helper()
	for p, content := range files {
		full := filepath.Join(dir, filepath.FromSlash(p))
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// Commit commits everything in dir and returns the new HEAD.
func Commit(t testing.TB, dir, msg string) string {
	t.Helper()
	Git(t, dir, "add", "-A")
	Git(t, dir, "commit", "-q", "-m", msg)
	return Git(t, dir, "rev-parse", "HEAD")
}

// Header is the RUNS.md at path without its rows: everything up to the
// table's separator line.
func Header(t testing.TB, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s := string(data)
	i := strings.Index(s, "\n| --- |")
	if i < 0 {
		t.Fatalf("%s has no table", path)
	}
	j := strings.Index(s[i+1:], "\n")
	if j < 0 {
		return s + "\n"
	}
	return s[:i+1+j+1]
}
