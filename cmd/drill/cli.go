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
	"runtime/debug"
	"strings"
	"syscall"

	"github.com/box-isolation/box/internal/clidoc"
	"github.com/box-isolation/box/internal/suggest"
)

// Exit codes (docs/claims.md, "Verdicts and exit codes").
const (
	exitOK    = 0
	exitUsage = 2
)

// version is set at build time with -ldflags "-X main.version=..." (the
// Makefile: git describe, -dirty for a tree with changes).
// (-X only sets a variable initialised to a constant, hence init.)
var version = "dev"

func init() { version = buildVersion(version, debug.ReadBuildInfo) }

// buildVersion is the version a build reports: the one set at build time,
// or else the commit the go tool stamped into the binary (-dirty when its
// tree had changes), so that a recorded run names its commit even from a
// plain go build.
func buildVersion(set string, read func() (*debug.BuildInfo, bool)) string {
	if set != "dev" {
		return set
	}
	info, ok := read()
	if !ok {
		return set
	}
	var rev string
	modified := false
	for _, kv := range info.Settings {
		switch kv.Key {
		case "vcs.revision":
			rev = kv.Value
		case "vcs.modified":
			modified = kv.Value == "true"
		}
	}
	if len(rev) < 12 {
		return set
	}
	if modified {
		return rev[:12] + "-dirty"
	}
	return rev[:12]
}

// stdio is where a command reads and writes; tests pass buffers.
type stdio struct {
	in       io.Reader
	out, err io.Writer
}

// runner runs a command whose flags are parsed, with its positional
// arguments.
type runner func(ctx context.Context, s stdio, args []string) int

// command is one row of the command table: dispatch, help, the man page
// and the shell completions all come from it.
type command struct {
	name     string
	synopsis string // without "drill "
	help     string
	// maxArgs bounds the positional arguments.
	maxArgs int
	// hidden commands run but are not shown: world serve runs under world
	// up, man is for the packages.
	hidden bool
	// sub are the subcommands (world up, down...); a command with them
	// runs none of its own.
	sub []command
	// setup registers the command's flags and returns what runs it.
	setup func(fs *flag.FlagSet) runner
	// arg and values say what the first positional argument is, and
	// flagValues the values a flag takes, for the completions.
	arg        clidoc.Arg
	values     []string
	flagValues map[string][]string
}

func commands() []command {
	return []command{
		{name: "run", synopsis: runSynopsis, help: "run the drill: mint probe boxes, fire every probe, judge every claim", setup: setupRun,
			flagValues: map[string][]string{"claim": claimIDs(), "skip": claimIDs(), "mutate": mutationNames()}},
		{name: "list", synopsis: "list [--json]", help: "list the isolation claims the drill proves", setup: setupList},
		{name: "image", synopsis: "image [--alias A] [--json]", help: "import the probe image into this host's Incus (built here from busybox-static; nothing is downloaded)", setup: setupImage},
		{name: "agent", synopsis: "agent [--plan FILE]", help: "run a probe plan (inside a box; JSON in, JSON out)", setup: setupAgent},
		{name: "report", synopsis: reportSynopsis, help: "render a recorded JSON report (drill run --json) again: html, matrix, junit, text or json", maxArgs: 3, setup: setupReport,
			arg: clidoc.ArgValues, values: []string{"html", "matrix", "junit", "text", "json"}},
		{name: "record", synopsis: "record verify|gate [--json] [RUNS.md]", help: "check RUNS.md's rows against their reports under drills/ (verify), or whether HEAD may be released (gate)", sub: recordCommands()},
		{name: "world", synopsis: "world up|down|status|image|check [options]", help: "build, inspect or tear down the hermetic world (namespaces, incusd, probe image)", sub: worldCommands()},
		{name: "completion", synopsis: "completion bash|zsh|fish", help: "print a shell completion script (the packages install them)",
			maxArgs: 1, setup: setupCompletion, arg: clidoc.ArgValues, values: clidoc.Shells},
		{name: "man", synopsis: "man", help: "print drill's man page (roff)", hidden: true, setup: setupMan},
		{name: "version", synopsis: "version", help: "print drill's version", setup: setupVersion},
		{name: "help", synopsis: "help [COMMAND]", help: "show the commands, or one command's usage and options",
			maxArgs: 1, setup: setupHelp, arg: clidoc.ArgCommand},
	}
}

func run(args []string, in io.Reader, out, errw io.Writer) int {
	s := stdio{in: in, out: out, err: errw}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" {
		printHelp(s.out)
		return exitOK
	}
	for _, c := range commands() {
		if c.name == args[0] {
			return dispatch(ctx, s, c, c.name, args[1:])
		}
	}
	fmt.Fprintf(s.err, "drill: unknown command %q%s\nRun 'drill help' for the list.\n", args[0], didYouMean(args[0]))
	return exitUsage
}

// dispatch runs c (path is how it was called: "world up"): a command with
// subcommands picks one; any other parses its flags and runs.
func dispatch(ctx context.Context, s stdio, c command, path string, args []string) int {
	if len(c.sub) > 0 {
		if len(args) == 0 || args[0] == "--help" || args[0] == "-h" {
			subUsage(s.out, c)
			if len(args) == 0 {
				return exitUsage
			}
			return exitOK
		}
		for _, sc := range c.sub {
			if sc.name == args[0] {
				return dispatch(ctx, s, sc, path+" "+sc.name, args[1:])
			}
		}
		fmt.Fprintf(s.err, "drill %s: unknown subcommand %q (%s)\n", path, args[0], strings.Join(names(c.sub), ", "))
		return exitUsage
	}
	fs := newFlags(s, path, c.synopsis)
	act := c.setup(fs)
	if code, ok := parse(fs, args, c.maxArgs); !ok {
		return code
	}
	return act(ctx, s, fs.Args())
}

// names lists the commands that are shown.
func names(cs []command) []string {
	var out []string
	for _, c := range cs {
		if !c.hidden {
			out = append(out, c.name)
		}
	}
	return out
}

func subUsage(w io.Writer, c command) {
	pre := "usage:"
	for _, sc := range c.sub {
		if !sc.hidden {
			fmt.Fprintf(w, "%s drill %s\n", pre, sc.synopsis)
			pre = "      "
		}
	}
}

func printHelp(w io.Writer) {
	fmt.Fprintln(w, "drill: prove box's network isolation with raw probes from inside boxes.")
	fmt.Fprintln(w, "\nCommands:")
	for _, c := range commands() {
		if !c.hidden {
			fmt.Fprintf(w, "  %-11s %s\n", c.name, c.help)
		}
	}
	fmt.Fprintln(w, "\nRun 'drill help COMMAND' or 'drill COMMAND --help' for a command's options.")
}

func setupHelp(fs *flag.FlagSet) runner {
	return func(_ context.Context, s stdio, args []string) int {
		if len(args) == 0 {
			printHelp(s.out)
			return exitOK
		}
		for _, c := range commands() {
			if c.name == args[0] {
				fmt.Fprintf(s.out, "usage: drill %s\n\n%s\n", c.synopsis, c.help)
				if len(c.sub) > 0 {
					fmt.Fprintln(s.out)
					subUsage(s.out, c)
					return exitOK
				}
				fs := flag.NewFlagSet(c.name, flag.ContinueOnError)
				c.setup(fs)
				n := 0
				fs.VisitAll(func(*flag.Flag) { n++ })
				if n > 0 {
					fmt.Fprintln(s.out, "\nOptions:")
					fs.SetOutput(s.out)
					fs.PrintDefaults()
				}
				return exitOK
			}
		}
		fmt.Fprintf(s.err, "drill: no command %q%s\n", args[0], didYouMean(args[0]))
		return exitUsage
	}
}

func setupVersion(fs *flag.FlagSet) runner {
	return func(_ context.Context, s stdio, _ []string) int {
		fmt.Fprintf(s.out, "drill %s\n", version)
		return exitOK
	}
}

// didYouMean suggests the closest command name for a typo.
func didYouMean(typo string) string {
	return suggest.DidYouMean(typo, names(commands()))
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
// (docs/claims.md, "Verdicts and exit codes", keeps 1 for a violated claim).
func fail(s stdio, err error) int {
	fmt.Fprintf(s.err, "drill: %v\n", err)
	return exitUsage
}
