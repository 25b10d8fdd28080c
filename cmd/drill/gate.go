package main

import (
	"context"
	"flag"
	"fmt"
	"io"

	"github.com/box-isolation/box/drill"
	"github.com/box-isolation/box/drill/gate"
)

// howToRecord says how to make the row a release needs.
const howToRecord = "on a real Incus host, build HEAD from a clean checkout (make build), run `bin/drill run --host --canary ADDR:PORT --record RUNS.md`, commit RUNS.md and drills/, and try again"

func setupRecordGate(fs *flag.FlagSet) runner {
	asJSON := fs.Bool("json", false, "print the decision as JSON")
	return func(ctx context.Context, s stdio, args []string) int {
		return recordGate(ctx, s, *asJSON, args)
	}
}

func recordGate(ctx context.Context, s stdio, asJSON bool, args []string) int {
	o := gate.Options{Repo: ".", Claims: catalogueIDs(), HostCannot: map[string]string{}}
	for id, why := range drill.NeverIn(drill.ModeHost) {
		o.HostCannot[string(id)] = why
	}
	if len(args) == 1 {
		o.Runs = args[0]
	}
	d, err := gate.Check(ctx, o)
	if err != nil {
		return fail(s, fmt.Errorf("release gate: %w", err))
	}
	emit(s, asJSON, d, func(w io.Writer) {
		if d.OK() {
			p := d.Proof
			fmt.Fprintf(w, "HEAD %s may be released: %s line %d records\n", d.Head, d.Runs, p.Line)
			fmt.Fprintf(w, "drill run %s on host %s at %s: %d of %d claims passed, exit 0\n", p.RunID, p.Host, p.Started, p.Claims-len(p.NotRun), p.Claims)
			for _, n := range p.NotRun {
				fmt.Fprintf(w, "not run on a host, proven in the hermetic world by make test: %s\n", n)
			}
			fmt.Fprintf(w, "drill %s (commit %s), kernel %s, incus %s, %s boxes\n", p.Version, p.Commit, p.Kernel, p.Incus, p.Instance)
			fmt.Fprintf(w, "report %s sha256 %s\n", p.Report, p.SHA256)
		}
	})
	if d.OK() {
		return exitOK
	}
	fmt.Fprintf(s.err, "drill record gate: HEAD %s may not be released:\n", d.Head)
	for _, b := range d.Blockers {
		fmt.Fprintf(s.err, "  %s\n", b)
	}
	if d.Proof == nil {
		if len(d.Refused) == 0 {
			fmt.Fprintf(s.err, "  %s records no drill run\n", d.Runs)
		}
		const shown = 10
		for i, r := range d.Refused {
			if i == shown {
				fmt.Fprintf(s.err, "  (%d older rows not shown; --json lists them)\n", len(d.Refused)-shown)
				break
			}
			fmt.Fprintf(s.err, "  %s:\n", r.Row)
			for _, why := range r.Reasons {
				fmt.Fprintf(s.err, "    %s\n", why)
			}
		}
		fmt.Fprintf(s.err, "to release: %s\n", howToRecord)
	}
	return exitMismatch
}

func catalogueIDs() []string {
	var ids []string
	for _, c := range drill.Catalogue {
		ids = append(ids, string(c.ID))
	}
	return ids
}
