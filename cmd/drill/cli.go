package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/box-isolation/box/internal/suggest"
)

// Exit codes (SPEC section 5).
const (
	exitOK    = 0
	exitUsage = 2
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

// stdio is where a command reads and writes; tests pass buffers.
type stdio struct {
	in       io.Reader
	out, err io.Writer
}

// command is one row of the command table: help and dispatch both come
// from it.
type command struct {
	name     string
	synopsis string
	help     string
	run      func(ctx context.Context, io stdio, args []string) int
}

func commands() []command {
	return []command{
		{"run", runSynopsis, "run the drill: mint probe boxes, fire every probe, judge every claim", runRun},
		{"list", "list [--json]", "list the isolation claims the drill proves", runList},
		{"report", reportSynopsis, "render a recorded JSON report (drill run --json) again: as an HTML page, the SVG matrix, JUnit, the table or JSON; to OUT or stdout", runReport},
		{"agent", "agent [--plan FILE]", "run a probe plan (inside a box; JSON in, JSON out)", runAgent},
		{"world", "world up|down|status|check [options]", "build, inspect or tear down the hermetic world (namespaces, incusd, probe image)", runWorld},
		{"version", "version", "print drill's version", func(_ context.Context, s stdio, _ []string) int {
			fmt.Fprintf(s.out, "drill %s\n", version)
			return exitOK
		}},
	}
}

func run(args []string, in io.Reader, out, errw io.Writer) int {
	s := stdio{in: in, out: out, err: errw}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		if len(args) > 1 {
			return helpFor(s, args[1])
		}
		printHelp(s.out)
		return exitOK
	}
	for _, c := range commands() {
		if c.name == args[0] {
			return c.run(ctx, s, args[1:])
		}
	}
	fmt.Fprintf(s.err, "drill: unknown command %q%s\nRun 'drill help' for the list.\n", args[0], didYouMean(args[0]))
	return exitUsage
}

func printHelp(w io.Writer) {
	fmt.Fprintln(w, "drill: prove box's network isolation with raw probes from inside boxes.")
	fmt.Fprintln(w, "\nCommands:")
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-10s %s\n", c.name, c.help)
	}
	fmt.Fprintln(w, "\nRun 'drill help COMMAND' or 'drill COMMAND --help' for a command's options.")
}

func helpFor(s stdio, name string) int {
	for _, c := range commands() {
		if c.name == name {
			fmt.Fprintf(s.out, "usage: drill %s\n\n%s\n", c.synopsis, c.help)
			return exitOK
		}
	}
	fmt.Fprintf(s.err, "drill: no command %q%s\n", name, didYouMean(name))
	return exitUsage
}

// didYouMean suggests the closest command name for a typo.
func didYouMean(typo string) string {
	var names []string
	for _, c := range commands() {
		names = append(names, c.name)
	}
	return suggest.DidYouMean(typo, names)
}

// newFlags makes a flag set that reports to stderr and never exits.
func newFlags(s stdio, name, synopsis string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(s.err)
	fs.Usage = func() {
		fmt.Fprintf(s.err, "usage: drill %s\n", synopsis)
		fs.PrintDefaults()
	}
	return fs
}

// parse parses flags and refuses stray arguments; it returns the exit code
// to use when the caller should stop (help asked, or a usage error).
func parse(fs *flag.FlagSet, args []string, maxArgs int) (int, bool) {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK, false
		}
		return exitUsage, false
	}
	if fs.NArg() > maxArgs {
		fmt.Fprintf(fs.Output(), "drill %s: unexpected argument %q (see --help for what it takes)\n", fs.Name(), fs.Arg(maxArgs))
		return exitUsage, false
	}
	return 0, true
}

// emit prints v as JSON or through the text function.
func emit(s stdio, asJSON bool, v any, text func(io.Writer)) {
	if asJSON {
		enc := json.NewEncoder(s.out)
		enc.SetIndent("", "  ")
		enc.Encode(v) //nolint:errcheck
		return
	}
	text(s.out)
}

// fail prints an error and returns its exit code: 2, usage or tool error
// (SPEC section 5 keeps 1 for a violated claim).
func fail(s stdio, err error) int {
	fmt.Fprintf(s.err, "drill: %v\n", err)
	return exitUsage
}
