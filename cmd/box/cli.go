package main

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/box-isolation/box/stack"
	"github.com/box-isolation/box/stack/hostns"
	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/model"
)

// Exit codes (docs/box.md, "Commands").
const (
	exitOK     = 0
	exitFailed = 1 // it went wrong
	exitUsage  = 2 // you asked wrong
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

// app is everything a command touches outside itself; tests build one with
// buffers, an environment of their own and a handover that records.
type app struct {
	ctx    context.Context
	in     io.Reader
	out    io.Writer
	err    io.Writer
	getenv func(string) string
	// stdinTTY says whether a person can be asked (destructive verbs);
	// stderrTTY whether progress may be drawn; quiet (--json) draws none.
	stdinTTY, stderrTTY, quiet bool
	// handover replaces this process with another (syscall.Exec in
	// production): shell, tmux and the escape hatch end here.
	handover func(argv0 string, argv, env []string) error
	lookPath func(string) (string, error)
	environ  func() []string
	// remote is the incus CLI's remote box drives (box --remote NAME, or
	// BOX_REMOTE); "" and "local" are this machine's incusd.
	remote string
	// dial opens a remote's TCP connections (nil: net.Dialer); the
	// world's tests dial inside its namespaces.
	dial incus.DialFunc

	h *stack.Host // built on first use
}

func run(args []string, in io.Reader, out, errw io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	a := &app{
		ctx: ctx, in: in, out: out, err: errw,
		getenv:    os.Getenv,
		stdinTTY:  isTerminal(in),
		stderrTTY: isTerminal(errw),
		handover:  syscall.Exec,
		lookPath:  lookPath,
		environ:   os.Environ,
	}
	return a.run(args)
}

// isTerminal reports whether f is a terminal (a *os.File with termios).
func isTerminal(f any) bool {
	file, ok := f.(*os.File)
	if !ok {
		return false
	}
	_, err := unix.IoctlGetTermios(int(file.Fd()), unix.TCGETS)
	return err == nil
}

// lookPath finds a program on $PATH (os/exec would do, but it is the only
// thing box would import it for).
func lookPath(name string) (string, error) {
	for _, dir := range filepath.SplitList(os.Getenv("PATH")) {
		p := filepath.Join(dir, name)
		if st, err := os.Stat(p); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s not found on $PATH", name)
}

// usageError is the caller's mistake: exit code 2.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return usageError{fmt.Sprintf(format, args...)} }

// exitError carries an exit code without a message (exec passes its
// command's code through).
type exitError struct{ code int }

func (e exitError) Error() string { return fmt.Sprintf("exit %d", e.code) }

func (a *app) run(args []string) int {
	if len(args) == 0 {
		a.printHelp(a.out)
		return exitOK
	}
	rest, remote, err := globalRemote(args, a.getenv("BOX_REMOTE"))
	if err != nil {
		fmt.Fprintf(a.err, "box: %v\n", err)
		return exitUsage
	}
	if a.remote == "" {
		a.remote = remote
	}
	if a.remote == incus.LocalRemote {
		a.remote = ""
	}
	if len(rest) == 0 {
		fmt.Fprintf(a.err, "box: --remote %s: which command? (box --remote %s list)\n", remote, remote)
		return exitUsage
	}
	args = rest
	name := args[0]
	if name == "-h" || name == "--help" {
		name = "help"
	}
	if strings.HasPrefix(name, "-") {
		fmt.Fprintf(a.err, "box: %s: options come after the command (box COMMAND [options]); run 'box help' for the list\n", name)
		return exitUsage
	}
	c := lookup(name)
	if c == nil {
		fmt.Fprintf(a.err, "box: unknown command %q%s\nRun 'box help' for the list.\n", name, didYouMean(name))
		return exitUsage
	}
	return a.report(a.dispatch(c, args[1:]))
}

// globalRemote takes the one option that comes before the command,
// --remote NAME (or --remote=NAME), which beats $BOX_REMOTE.
func globalRemote(args []string, env string) (rest []string, remote string, err error) {
	remote = env
	if len(args) == 0 {
		return args, remote, nil
	}
	switch a := args[0]; {
	case a == "--remote" || a == "-remote":
		if len(args) < 2 || args[1] == "" || strings.HasPrefix(args[1], "-") {
			return nil, "", errors.New("--remote: which remote? (box --remote NAME COMMAND; box remote list shows them)")
		}
		return args[2:], args[1], nil
	case strings.HasPrefix(a, "--remote=") || strings.HasPrefix(a, "-remote="):
		_, v, _ := strings.Cut(a, "=")
		if v == "" {
			return nil, "", errors.New("--remote: which remote? (box --remote NAME COMMAND; box remote list shows them)")
		}
		return args[1:], v, nil
	}
	return args, remote, nil
}

// report prints an error once, here, and turns it into an exit code.
func (a *app) report(err error) int {
	if err == nil {
		return exitOK
	}
	var ee exitError
	if errors.As(err, &ee) {
		return ee.code
	}
	var ue usageError
	if errors.As(err, &ue) {
		fmt.Fprintf(a.err, "box: %v\n", err)
		return exitUsage
	}
	fmt.Fprintf(a.err, "box: %v\n", err)
	if incus.IsUnreachable(err) {
		fmt.Fprintln(a.err, "box: is incusd running, and may you open its socket? (INCUS_SOCKET or INCUS_DIR say where it is)")
	}
	return exitFailed
}

// call is one invocation of a command, after parsing and preconditions.
type call struct {
	*app
	cmd  *command
	args []string   // positional arguments; the box name first when the command takes one
	rest []string   // everything after "--"
	box  *stack.Box // the resolved box, when the command takes one
}

// name is the box's name.
func (c *call) name() string { return c.args[0] }

// dispatch parses a command's options, checks its preconditions from the
// table and runs its action.
func (a *app) dispatch(c *command, args []string) error {
	fs := flag.NewFlagSet(c.name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	act := c.setup(fs)
	var force *bool
	if c.confirm != "" {
		force = fs.Bool("force", false, "do it without asking")
	}
	pos, rest, err := parseInterspersed(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		a.commandHelp(a.out, c)
		return nil
	}
	if err != nil {
		return usagef("%s: %v (see box %s --help)", c.name, err, c.name)
	}
	if rest != nil && !c.dashdash {
		return usagef("%s takes no arguments after --", c.name)
	}
	if len(pos) < c.minArgs || (c.maxArgs >= 0 && len(pos) > c.maxArgs) {
		return usagef("%s: wrong number of arguments\nusage: box %s", c.name, c.synopsis)
	}
	if a.remote != "" && c.hostLayer {
		return usagef("%s acts on a host itself (nft, its bridge, units, local users), and remote %s's host is another machine: run box %s on that host, without --remote", c.name, a.remote, c.name)
	}
	cl := &call{app: a, cmd: c, args: pos, rest: rest}
	if c.box != noBox {
		h, err := a.host()
		if err != nil {
			return err
		}
		// The boundary: the name resolves through the ownership tag
		// before anything else happens.
		if cl.box, err = stack.Info(a.ctx, h.Incus, cl.name()); err != nil {
			return err
		}
		if c.box == stoppedBox && cl.box.Status != "Stopped" {
			return fmt.Errorf("%s is %s: stop it first (box down %s), then %s it", cl.name(), strings.ToLower(cl.box.Status), cl.name(), c.name)
		}
	}
	if c.confirm != "" && !*force {
		if err := a.confirm(fmt.Sprintf(c.confirm, pos[0]), "--force"); err != nil {
			return err
		}
	}
	return act(cl)
}

// parseInterspersed parses options wherever they stand among the
// positional arguments (options come after the command, before or after
// the box's name), up to a "--", after which everything is returned as
// rest. An unknown option is an error, never an argument. rest is nil
// when there was no "--".
func parseInterspersed(fs *flag.FlagSet, args []string) (pos, rest []string, err error) {
	if i := slices.Index(args, "--"); i >= 0 {
		rest = append([]string{}, args[i+1:]...)
		args = args[:i]
	}
	for {
		if err := fs.Parse(args); err != nil {
			return nil, nil, err
		}
		if fs.NArg() == 0 {
			return pos, rest, nil
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
}

// confirm asks a person on the terminal; without one, it refuses and names
// the flag that says yes.
func (a *app) confirm(question, yesFlag string) error {
	if !a.stdinTTY {
		return usagef("%s: there is no terminal to ask; pass %s to do it anyway", question, yesFlag)
	}
	fmt.Fprintf(a.err, "%s [y/N] ", question)
	line, _ := bufio.NewReader(a.in).ReadString('\n')
	switch strings.ToLower(strings.TrimSpace(line)) {
	case "y", "yes":
		return nil
	}
	return errors.New("not confirmed: nothing was changed")
}

// host builds the stack's view of this machine from the environment:
// INCUS_SOCKET / INCUS_DIR (as the incus CLI), BOX_NETNS (the network
// namespace incusd's bridges live in; empty is this process's own) and the
// stack's options (BOX_SUBNET, BOX_DNS, BOX_POOL).
func (a *app) host() (*stack.Host, error) {
	if a.h != nil {
		return a.h, nil
	}
	opts, err := model.OptionsFromEnv(a.getenv)
	if err != nil {
		return nil, usagef("%v", err)
	}
	if a.remote != "" {
		return a.remoteHost(opts)
	}
	h := &stack.Host{Incus: incus.New(a.socket()), NetNS: a.getenv("BOX_NETNS"), Options: opts, Progress: a.progressf,
		Tier:           stack.TierConfig{UserSocket: a.getenv("BOX_INCUS_USER_SOCKET"), Group: a.getenv("BOX_TIER_GROUP")},
		IncusConfigDir: incus.ConfigDir(a.getenv)}
	h.Lock.Notice = func(s string) { fmt.Fprintln(a.err, "box: "+s) }
	if h.Members.NetNS, err = stack.ParseMemberNetNS(a.getenv("BOX_MEMBER_NETNS")); err != nil {
		return nil, usagef("%v", err)
	}
	if tierSock, ok := a.tierSocket(); ok {
		// A granted user: incus-user's socket, their own project.
		h.Incus = incus.New(tierSock).Project(stack.TierProject(uint32(os.Geteuid())))
		h.Tier.Granted = true
	}
	if h.NetNS == "" {
		// A real host: the firewall is re-applied at boot by a unit that
		// runs this binary (Ensure checks that systemd is there).
		h.Boot.UnitDir = "/etc/systemd/system"
		h.Boot.FirewallFile = stack.DefaultFirewallFile
		h.Boot.SysctlFile = hostns.DefaultSysctlFile
		h.Boot.IncusDir = cmp.Or(a.getenv("INCUS_DIR"), "/var/lib/incus")
		if exe, err := os.Executable(); err == nil {
			h.Boot.Exe = exe
		}
	}
	a.h = h
	return h, nil
}

// remoteHost is the stack's view of a remote Incus: its API over HTTPS
// with the incus CLI's client certificate, in the remote's project, and
// no kernel of ours (its host layers are its host's).
func (a *app) remoteHost(opts model.Options) (*stack.Host, error) {
	dir := incus.ConfigDir(a.getenv)
	rs, err := incus.LoadRemotes(dir)
	if err != nil {
		return nil, err
	}
	r, ok := rs[a.remote]
	if !ok {
		return nil, usagef("no remote named %s in %s (box remote add %s TOKEN adds one; box remote list shows them)", a.remote, filepath.Join(dir, "config.yml"), a.remote)
	}
	c, err := r.Client(dir, a.dial)
	if err != nil {
		return nil, err
	}
	a.h = &stack.Host{Incus: c, Remote: a.remote, Options: opts, Progress: a.progressf, IncusConfigDir: dir}
	return a.h, nil
}

// tierSocket says whether box runs for a granted user: not root,
// incusd's socket closed to them and incus-user's there.
func (a *app) tierSocket() (string, bool) {
	if os.Geteuid() == 0 {
		return "", false
	}
	if syscall.Access(a.socket(), 2 /* W_OK */) == nil {
		return "", false
	}
	sock := a.getenv("BOX_INCUS_USER_SOCKET")
	if sock == "" {
		sock = filepath.Join(filepath.Dir(a.socket()), "unix.socket.user")
	}
	if _, err := os.Stat(sock); err != nil {
		return "", false
	}
	return sock, true
}

// socket is incusd's socket, honouring the variables the incus CLI does.
func (a *app) socket() string {
	if s := a.getenv("INCUS_SOCKET"); s != "" {
		return s
	}
	if d := a.getenv("INCUS_DIR"); d != "" {
		return filepath.Join(d, "unix.socket")
	}
	return "/var/lib/incus/unix.socket"
}

// printJSON writes v as indented JSON: the stable interface.
func (a *app) printJSON(v any) error {
	enc := json.NewEncoder(a.out)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// progressf says what box is waiting for, on a terminal only.
func (a *app) progressf(format string, args ...any) {
	if a.stderrTTY && !a.quiet {
		fmt.Fprintf(a.err, "\r\033[K"+format, args...)
	}
}

// progressDone ends a progress line.
func (a *app) progressDone() {
	if a.stderrTTY && !a.quiet {
		fmt.Fprint(a.err, "\r\033[K")
	}
}
