package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/box-isolation/box/drill/report"
)

const recordSynopsis = `record verify [--json] [RUNS.md]
       drill record gate [--json] [RUNS.md]`

// exitMismatch is record's answer when a row does not hold (or HEAD may
// not ship): 1, as a violated claim is for run.
const exitMismatch = 1

func runRecord(ctx context.Context, s stdio, args []string) int {
	if len(args) == 0 || args[0] == "--help" || args[0] == "-h" {
		fmt.Fprintf(s.out, "usage: drill %s\n", recordSynopsis)
		if len(args) == 0 {
			return exitUsage
		}
		return exitOK
	}
	sub := map[string]func(context.Context, stdio, []string) int{"verify": recordVerify, "gate": recordGate}
	fn, ok := sub[args[0]]
	if !ok {
		fmt.Fprintf(s.err, "drill record: unknown subcommand %q (verify, gate)\n", args[0])
		return exitUsage
	}
	return fn(ctx, s, args[1:])
}

// verifyReport is `record verify --json`.
type verifyReport struct {
	Runs string            `json:"runs"`
	OK   bool              `json:"ok"`
	Rows []report.RowCheck `json:"rows"`
}

func recordVerify(_ context.Context, s stdio, args []string) int {
	fs := newFlags(s, "record verify", "record verify [--json] [RUNS.md]")
	asJSON := fs.Bool("json", false, "print every row's check as JSON")
	if code, ok := parse(fs, args, 1); !ok {
		return code
	}
	path := "RUNS.md"
	if fs.NArg() == 1 {
		path = fs.Arg(0)
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
	emit(s, *asJSON, verifyReport{Runs: path, OK: bad == 0, Rows: checks}, func(w io.Writer) {
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
