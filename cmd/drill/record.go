package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

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
