package main

import (
	"context"
	"flag"
	"os"

	"github.com/box-isolation/box/probes"
)

// drill agent: the in-box agent, the same binary pushed into every probe
// box and run in the world's namespaces.

// setupAgent is the in-box agent: a JSON plan in (stdin or --plan FILE),
// JSON observations out, within the plan's deadline.
func setupAgent(fs *flag.FlagSet) runner {
	planPath := fs.String("plan", "", "read the plan from FILE instead of stdin (exec has no stdin)")
	return func(ctx context.Context, s stdio, _ []string) int {
		in := s.in
		if *planPath != "" {
			f, err := os.Open(*planPath)
			if err != nil {
				return fail(s, err)
			}
			defer f.Close()
			in = f
		}
		if err := probes.RunAgent(ctx, in, s.out); err != nil {
			return fail(s, err)
		}
		return exitOK
	}
}
