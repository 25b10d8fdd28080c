package main

import (
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/box-isolation/box/internal/clidoc"
	"github.com/box-isolation/box/internal/suggest"
)

// boxNeed is a command's precondition on its first argument.
type boxNeed int

const (
	noBox      boxNeed = iota
	anyBox             // the first argument is a box, resolved through the tag
	stoppedBox         // ... and it must be stopped
)

// action runs a parsed, checked call.
type action func(*call) error

// command is one row of the command table: dispatch, `box help`,
// `box help CMD` and `CMD --help` are all rendered from it.
type command struct {
	name     string
	synopsis string
	help     string
	box      boxNeed
	// confirm, when set, marks the command destructive: the question asked
	// on a terminal (%s is the first argument); it gains --force, and
	// without a terminal and without --force it refuses with exit 2.
	confirm string
	// minArgs and maxArgs bound the positional arguments (-1: no bound).
	minArgs, maxArgs int
	// dashdash: the command takes arguments after "--".
	dashdash bool
	// hostLayer commands act on the host itself (nft, its bridge, units,
	// local users, its loopback): they refuse a remote.
	hostLayer bool
	// hidden commands run but are not shown (help, man page, completions):
	// man is for the packages.
	hidden bool
	// For the completions: arg is what the first argument is when it is
	// not a box (box says when it is); boxFlags are the flags whose value
	// is a box; flagValues the values a flag takes.
	arg        clidoc.Arg
	values     []string
	boxFlags   []string
	flagValues map[string]func() []string
	// setup registers the command's options and returns its action.
	setup func(fs *flag.FlagSet) action
}

// commands is the command table. Order is the order of `box help`.
func commands() []command {
	return []command{
		{name: "new", synopsis: "new --name N [--template T] [--from SRC[/SNAP]] [--cpu C] [--memory M] [--disk D] [--vm|--container] [--image I] [--egress open|allow:FILE] [--target M] [--nesting] [--json]",
			help:    "mint a box from a template (default blank), or clone one from a box or its snapshot",
			maxArgs: 0, setup: setupNew, boxFlags: []string{"from"}, flagValues: map[string]func() []string{"template": templateNames}},
		{name: "templates", synopsis: "templates [--json] | templates build [T...] [--refresh] [--json] | templates warm T [N] [--json]",
			help:    "list the templates a box can be minted from, with the image each is built into once per host (current, stale or none); build builds them (root), --refresh again though current; warm keeps N standby boxes of T that box new takes (root)",
			maxArgs: -1, setup: setupTemplates, arg: clidoc.ArgValues, values: []string{"build", "warm"}},
		{name: "list", synopsis: "list [--json]", help: "list your boxes with their stamps",
			maxArgs: 0, setup: setupList},
		{name: "status", hostLayer: true, synopsis: "status [--json]", help: "the host's isolation stack in one line, then your boxes as list shows them",
			maxArgs: 0, setup: setupStatus},
		{name: "info", synopsis: "info N [--json]", help: "show a box: status, addresses, stamps, snapshots",
			box: anyBox, minArgs: 1, maxArgs: 1, setup: setupInfo},
		{name: "shell", synopsis: "shell N", help: "open a login shell in a box as its template's user",
			box: anyBox, minArgs: 1, maxArgs: 1, setup: setupShell},
		{name: "exec", synopsis: "exec N -- CMD [ARGS...]", help: "run a command in a box as its template's user, without a terminal; exits with the command's code",
			box: anyBox, minArgs: 1, maxArgs: -1, dashdash: true, setup: setupExec},
		{name: "tmux", synopsis: "tmux N [SESSION]", help: "attach to (or start) a tmux session in a box as its template's user",
			box: anyBox, minArgs: 1, maxArgs: 2, setup: setupTmux},
		{name: "snapshot", synopsis: "snapshot N [LABEL]", help: "take a snapshot of a box (stop it first where the host cannot freeze a running box)",
			box: anyBox, minArgs: 1, maxArgs: 2, setup: setupSnapshot},
		{name: "restore", synopsis: "restore N SNAP [--with-policy] [--force] [--json]", help: "roll a box back to a snapshot, losing what changed since on its disk; it keeps its current policy (allowlist, limits, nesting, doors) unless --with-policy",
			box: anyBox, confirm: "restore %s to a snapshot, losing every change since?", minArgs: 2, maxArgs: 2, setup: setupRestore},
		{name: "rename", synopsis: "rename N NEW", help: "rename a stopped box (its snapshots follow)",
			box: stoppedBox, minArgs: 2, maxArgs: 2, setup: setupRename},
		{name: "move", synopsis: "move N --target MEMBER [--json]", help: "on an Incus cluster: move a stopped box to another member (its address, snapshots and stamps go with it)",
			box: anyBox, minArgs: 1, maxArgs: 1, setup: setupMove},
		{name: "down", synopsis: "down N [--force]", help: "stop a box (cleanly within a minute; --force kills it at once)",
			box: anyBox, minArgs: 1, maxArgs: 1, setup: setupDown},
		{name: "start", synopsis: "start N", help: "start a stopped box",
			box: anyBox, minArgs: 1, maxArgs: 1, setup: setupStart},
		{name: "rm", synopsis: "rm N [--force]", help: "remove a box and its snapshots",
			box: anyBox, confirm: "remove box %s and all its snapshots?", minArgs: 1, maxArgs: 1, setup: setupRm},
		{name: "egress", hostLayer: true, synopsis: "egress N open | allow NAME... | show [--json] | log [--since DUR] [--json]", help: "show or change what a box may reach: open (the internet), or only the names allowed (NAME, or *.NAME for the names under it); log shows what was refused and why",
			box: anyBox, minArgs: 1, maxArgs: -1, setup: setupEgress},
		{name: "expose", hostLayer: true, synopsis: "expose N PORT [HOSTPORT] [--listen 127.0.0.1|::1] [--tcp|--unix] [--json] | expose N --list [--json] | expose N --remove PORT",
			help: "open a door from the host's loopback (or a unix socket, yours only) to a TCP port in a box; --list, --remove",
			box:  anyBox, minArgs: 1, maxArgs: 3, setup: setupExpose},
		{name: "export", synopsis: "export N [FILE] [--force] [--json]",
			help: "write a box with its snapshots and stamps to one file (Incus's backup format, N.tar.gz by default); a running box is stopped for it and started again",
			box:  anyBox, minArgs: 1, maxArgs: 2, setup: setupExport},
		{name: "import", synopsis: "import FILE [--name NEW] [--json]",
			help:    "make a box of a file box export wrote (new MAC and machine-id); refuses, with the reasons, one that is not a box's or would be off the stack",
			minArgs: 1, maxArgs: 1, setup: setupImport},
		{name: "incus", synopsis: "incus N -- ARGS...", help: "escape hatch: run the incus CLI on a box (name appended, or put where {} stands)",
			box: anyBox, minArgs: 1, maxArgs: -1, dashdash: true, setup: setupIncus},
		{name: "doctor", hostLayer: true, synopsis: "doctor [--fix] [--json]", help: "check the host's isolation stack against what it should be; --fix converges it",
			maxArgs: 0, setup: setupDoctor},
		{name: "setup-host", hostLayer: true, synopsis: "setup-host [--json] [--firewall-only | --boot | --member-only]", help: "build (or converge) the isolation stack on this host",
			maxArgs: 0, setup: setupSetupHost},
		{name: "guard-and-serve", hostLayer: true, synopsis: "guard-and-serve [--take-over]",
			help:    "box's daemon: guard the stack (keep boxnet's ports isolated, in the bridge drop's port set and pinned as boxes come and go; put box's nft tables and Incus's back after another tool flushes them; keep the route table current) and serve allowlisted boxes (their resolver and proxy: they resolve nothing while it is down), until SIGINT or SIGTERM (the unit box-guard-and-serve.service runs it)",
			maxArgs: 0, setup: setupGuardAndServe},
		{name: "watch-ports", hostLayer: true, synopsis: "watch-ports", hidden: true,
			help:    "guard-and-serve's old name (say so, then run it)",
			maxArgs: 0, setup: setupWatchPorts},
		{name: "teardown-host", hostLayer: true, synopsis: "teardown-host [--force] [--purge-incus] [--yes] [--json]", help: "remove the isolation stack (both generations); refuses while boxes exist unless --force",
			maxArgs: 0, setup: setupTeardownHost},
		{name: "grant", hostLayer: true, synopsis: "grant USER [--group G] [--json]", help: "give a local user boxes of their own through incus-user: their project narrowed to boxnet only (admin)",
			minArgs: 1, maxArgs: 1, setup: setupGrant},
		{name: "revoke", hostLayer: true, synopsis: "revoke USER [--purge] [--group G] [--json]", help: "take a user's tier away (boxes kept); --purge ends their sessions, then deletes their project, boxes, bridge and certificate (admin)",
			minArgs: 1, maxArgs: 1, setup: setupRevoke},
		{name: "migrate-host", hostLayer: true, synopsis: "migrate-host --box N | --all-boxes | --retire-legacy [--json]", help: "move boxes off the legacy stack (claudenet), then retire it",
			maxArgs: 0, setup: setupMigrateHost, boxFlags: []string{"box"}},
		{name: "remote", synopsis: "remote add NAME TOKEN [--addr https://HOST:PORT] [--json] | remote list [--json]",
			help:    "add another Incus as a remote with the trust token its admin gave (incus config trust add NAME there), or list the remotes; box --remote NAME COMMAND (or BOX_REMOTE) then drives it",
			minArgs: 1, maxArgs: 3, setup: setupRemote, arg: clidoc.ArgValues, values: []string{"add", "list"}},
		{name: "completion", synopsis: "completion bash|zsh|fish", help: "print a shell completion script (the packages install them)",
			minArgs: 1, maxArgs: 1, setup: setupCompletion, arg: clidoc.ArgValues, values: clidoc.Shells},
		{name: "man", synopsis: "man", help: "print box's man page (roff)", hidden: true,
			maxArgs: 0, setup: setupMan},
		{name: "version", synopsis: "version [--json]", help: "print box's version",
			maxArgs: 0, setup: setupVersion},
		{name: "help", synopsis: "help [COMMAND]", help: "show the commands, or one command's usage",
			maxArgs: 1, setup: setupHelp, arg: clidoc.ArgCommand},
	}
}

func lookup(name string) *command {
	for _, c := range commands() {
		if c.name == name {
			return &c
		}
	}
	return nil
}

func (a *app) printHelp(w io.Writer) {
	fmt.Fprintln(w, "box: trust-less, network-isolated Incus boxes for coding agents.")
	fmt.Fprintln(w, "\nusage: box [--remote NAME] COMMAND [ARGS] [options]")
	fmt.Fprintln(w, "\nCommands:")
	for _, c := range commands() {
		if !c.hidden {
			fmt.Fprintf(w, "  %-14s %s\n", c.name, c.help)
		}
	}
	fmt.Fprintln(w, "\nRun 'box help COMMAND' or 'box COMMAND --help' for a command's options.")
	fmt.Fprintln(w, "Exit codes: 0 ok, 1 it went wrong, 2 you asked wrong.")
	fmt.Fprintln(w, "Environment: BOX_REMOTE, INCUS_SOCKET, INCUS_DIR, BOX_NETNS, BOX_MEMBER_NETNS, BOX_SUBNET, BOX_DNS,")
	fmt.Fprintln(w, "BOX_POOL, BOX_IMAGE, BOX_CPU, BOX_MEMORY, BOX_DISK. Output is plain text; --json where offered.")
}

// commandHelp renders one command's usage, preconditions and options from
// its row.
func (a *app) commandHelp(w io.Writer, c *command) {
	fmt.Fprintf(w, "usage: box %s\n\n%s\n", c.synopsis, c.help)
	var pre []string
	switch c.box {
	case anyBox:
		pre = append(pre, "N must be a box that box minted (an instance without the user.box tag is refused)")
	case stoppedBox:
		pre = append(pre, "N must be a box that box minted, and stopped (box down N)")
	}
	if c.hostLayer {
		pre = append(pre, "acts on this host: refuses --remote (run it on the remote's host)")
	}
	if c.confirm != "" {
		pre = append(pre, "destructive: asks on a terminal; without one, refuses unless --force")
	}
	if len(pre) > 0 {
		fmt.Fprintln(w, "\nPreconditions:")
		for _, p := range pre {
			fmt.Fprintf(w, "  %s\n", p)
		}
	}
	fs := c.flags()
	first := true
	fs.VisitAll(func(f *flag.Flag) {
		if first {
			fmt.Fprintln(w, "\nOptions:")
			first = false
		}
		arg := ""
		if b, ok := f.Value.(interface{ IsBoolFlag() bool }); !ok || !b.IsBoolFlag() {
			arg = " " + strings.ToUpper(f.Name[:1])
		}
		def := ""
		if f.DefValue != "" && f.DefValue != "false" {
			def = fmt.Sprintf(" (default %s)", f.DefValue)
		}
		fmt.Fprintf(w, "  --%-18s %s%s\n", f.Name+arg, f.Usage, def)
	})
}

// flags is the command's flag set as dispatch builds it, for help and
// the documentation.
func (c *command) flags() *flag.FlagSet {
	fs := flag.NewFlagSet(c.name, flag.ContinueOnError)
	c.setup(fs)
	if c.confirm != "" {
		fs.Bool("force", false, "do it without asking")
	}
	return fs
}

func setupHelp(fs *flag.FlagSet) action {
	return func(c *call) error {
		if len(c.args) == 0 {
			c.printHelp(c.out)
			return nil
		}
		cmd := lookup(c.args[0])
		if cmd == nil {
			return usagef("no command %q%s; run 'box help' for the list", c.args[0], didYouMean(c.args[0]))
		}
		c.commandHelp(c.out, cmd)
		return nil
	}
}

func setupVersion(fs *flag.FlagSet) action {
	asJSON := fs.Bool("json", false, "print JSON")
	return func(c *call) error {
		if *asJSON {
			return c.printJSON(map[string]string{"version": version})
		}
		fmt.Fprintf(c.out, "box %s\n", version)
		return nil
	}
}

// didYouMean suggests the closest command name for a typo.
func didYouMean(typo string) string {
	var names []string
	for _, c := range commands() {
		if !c.hidden {
			names = append(names, c.name)
		}
	}
	return suggest.DidYouMean(typo, names)
}
