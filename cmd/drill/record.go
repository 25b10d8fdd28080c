package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/box-isolation/box/drill"
	"github.com/box-isolation/box/drill/report"
)

// exitMismatch is record's answer when a row does not hold (or HEAD may
// not ship): 1, as a violated claim is for run.
const exitMismatch = 1

// recordCommands are record's subcommands.
func recordCommands() []command {
	return []command{
		{name: "verify", synopsis: "record verify [--json] [RUNS.md]", help: "check every row of RUNS.md against its report under drills/", maxArgs: 1, setup: setupRecordVerify},
		{name: "gate", synopsis: "record gate [--json] [RUNS.md]", help: "say whether HEAD may be released: a passing --host run of its code, recorded", maxArgs: 1, setup: setupRecordGate},
	}
}

// verifyReport is `record verify --json`.
type verifyReport struct {
	Runs string            `json:"runs"`
	OK   bool              `json:"ok"`
	Rows []report.RowCheck `json:"rows"`
}

func setupRecordVerify(fs *flag.FlagSet) runner {
	asJSON := fs.Bool("json", false, "print every row's check as JSON")
	return func(_ context.Context, s stdio, args []string) int {
		return recordVerify(s, *asJSON, args)
	}
}

func recordVerify(s stdio, asJSON bool, args []string) int {
	path := "RUNS.md"
	if len(args) == 1 {
		path = args[0]
	}
	checks, err := report.Verify(path)
	if errors.Is(err, os.ErrNotExist) {
		return fail(s, fmt.Errorf("verifying the record: %w (name the RUNS.md to check; drill run --record creates one)", err))
	}
	if err != nil {
		return fail(s, fmt.Errorf("verifying the record: %w", err))
	}
	bad := 0
	for _, c := range checks {
		if !c.OK() {
			bad++
		}
	}
	emit(s, asJSON, verifyReport{Runs: path, OK: bad == 0, Rows: checks}, func(w io.Writer) {
		for _, c := range checks {
			if c.OK() {
				fmt.Fprintf(w, "ok   %s: report %s sha256 %s\n", c.Name(path), c.Cells["report"], c.SHA256)
				continue
			}
			for _, p := range c.Problems {
				fmt.Fprintf(w, "FAIL %s: %s\n", c.Name(path), p)
			}
		}
		fmt.Fprintf(w, "%s: %d rows, %d match their reports, %d do not\n", path, len(checks), len(checks)-bad, bad)
	})
	if bad > 0 {
		fmt.Fprintf(s.err, "drill record verify: %d of %d rows of %s do not match their reports under %s/: restore what changed (git log -p -- %s %s/), or record a new run\n",
			bad, len(checks), path, report.ReportsDir, path, report.ReportsDir)
		return exitMismatch
	}
	return exitOK
}

// recordRun records a finished run into RUNS.md and says where, and what
// the release gate will make of a build that names no clean commit.
func recordRun(s stdio, path string, rep *drill.Report) error {
	rec, err := report.Record(path, rep)
	if err != nil {
		return err
	}
	fmt.Fprintf(s.err, "drill: recorded %s line %d: report %s sha256 %s (commit both)\n", path, rec.Line, rec.Report, rec.SHA256)
	if why := versionProblem(rep.Version); why != "" {
		fmt.Fprintf(s.err, "drill: this row can never let a release ship: %s\n", why)
	}
	if rep.Environment.Mode != "host" {
		fmt.Fprintf(s.err, "drill: this row can never let a release ship: a %s-mode run (only a --host run on a real Incus host can)\n", rep.Environment.Mode)
	}
	return nil
}

// versionProblem says why a build's version cannot name the clean commit
// it was built from, or "".
func versionProblem(v string) string {
	switch {
	case v == "" || v == "dev":
		return fmt.Sprintf("version %q names no commit (build with make build)", v)
	case strings.HasSuffix(v, "-dirty"):
		return fmt.Sprintf("version %s was built from a tree with changes (build from a clean checkout)", v)
	}
	return ""
}
