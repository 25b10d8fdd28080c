package main

import (
	"flag"
	"fmt"
	"regexp"
	"strings"

	"github.com/box-isolation/box/stack/model"
)

// Hand-overs: shell, tmux and the escape hatch end by replacing box with
// the incus CLI, which owns the terminal from there on.

func setupShell(fs *flag.FlagSet) action {
	return func(c *call) error {
		if err := c.mustRun(); err != nil {
			return err
		}
		return c.handoverIncus("exec", c.incusTarget(), "--", "su", "-l", c.loginUser())
	}
}

func setupTmux(fs *flag.FlagSet) action {
	return func(c *call) error {
		if err := c.mustRun(); err != nil {
			return err
		}
		session := "main"
		if len(c.args) > 1 {
			session = c.args[1]
		}
		if !sessionName.MatchString(session) {
			return usagef("tmux: session name %q: use letters, digits, '-' and '_'", session)
		}
		return c.handoverIncus("exec", c.incusTarget(), "--", "su", "-l", c.loginUser(), "-c", "tmux new-session -A -s "+session)
	}
}

// loginUser is the template's user, or root for a box minted before the
// stamp existed.
func (c *call) loginUser() string {
	if u := c.box.Stamps[model.StampUser]; u != "" {
		return u
	}
	return "root"
}

func (c *call) mustRun() error {
	if c.box.Status != "Running" {
		return fmt.Errorf("%s is %s: start it first (box start %s)", c.name(), strings.ToLower(c.box.Status), c.name())
	}
	return nil
}

func setupIncus(fs *flag.FlagSet) action {
	return func(c *call) error {
		args := append(c.args[1:], c.rest...)
		if len(args) == 0 {
			return usagef("incus: which incus command? box incus %s -- ARGS (e.g. box incus %s -- config show)", c.name(), c.name())
		}
		argv := hatchArgs(args, c.incusTarget())
		if w := touchesStack(argv); w != "" {
			fmt.Fprintf(c.err, "box: WARNING: these arguments touch %s: they can move %s off the isolation stack; run box doctor afterwards\n", w, c.name())
		}
		return c.handoverIncus(argv...)
	}
}

// hatchArgs puts the box's name where {} stands, or appends it.
func hatchArgs(args []string, name string) []string {
	out := make([]string, len(args))
	put := false
	for i, a := range args {
		if strings.Contains(a, "{}") {
			a = strings.ReplaceAll(a, "{}", name)
			put = true
		}
		out[i] = a
	}
	if !put {
		out = append(out, name)
	}
	return out
}

// touchesStack names what in the arguments can move a box off the
// isolation stack: a profile, a network, a device or a security.* key.
func touchesStack(args []string) string {
	var hits []string
	add := func(s string) {
		for _, h := range hits {
			if h == s {
				return
			}
		}
		hits = append(hits, s)
	}
	// `file push -p` makes parent directories; elsewhere -p names a profile.
	fileCmd := len(args) > 0 && args[0] == "file"
	for _, a := range args {
		l := strings.ToLower(a)
		switch {
		case l == "profile" || l == "profiles" || strings.HasPrefix(l, "--profile"):
			add("a profile")
		case l == "network" || l == "networks" || strings.HasPrefix(l, "--network"):
			add("a network")
		case l == "device" || l == "devices" || strings.HasPrefix(l, "--device"):
			add("a device")
		case (l == "-p" || strings.HasPrefix(l, "-p=")) && !fileCmd:
			add("a profile")
		case l == "copy" || l == "cp":
			add("a copy, which inherits the tag and the machine identity (use box new --from)")
		case l == "-n":
			add("a network")
		case l == "edit":
			add("the whole configuration (config edit)")
		case l == "move" || l == "rebuild":
			add("the instance itself (" + l + ")")
		}
		if strings.Contains(l, "security.") {
			add("a security.* key")
		}
		if strings.HasPrefix(l, "raw.") || strings.Contains(l, " raw.") {
			add("a raw.* key")
		}
	}
	return strings.Join(hits, ", ")
}

// handoverIncus echoes the incus command line and replaces box with it.
// The CLI talks to the server and project box resolved the box on: the
// remote is in the box's name (incusTarget), the project is explicit, and
// on this machine INCUS_SOCKET is the socket box used (incus-user's for a
// granted user, who cannot open incusd's).
func (c *call) handoverIncus(args ...string) error {
	h, err := c.host()
	if err != nil {
		return err
	}
	path, err := c.lookPath("incus")
	if err != nil {
		return fmt.Errorf("the incus CLI is needed for this (install the incus-client package): %w", err)
	}
	project := h.Incus.ProjectName()
	if project == "" {
		project = "default"
	}
	argv := append([]string{"incus", "--project", project}, args...)
	fmt.Fprintf(c.err, "+ %s\n", shellQuote(argv))
	env := c.environ()
	if c.remote == "" {
		// Replaced, not appended: with the key twice, the CLI (Go) reads
		// the first, the caller's, which for a granted user is incusd's
		// socket they cannot open.
		env = setEnv(env, "INCUS_SOCKET", h.Incus.Socket())
	}
	if err := c.handover(path, argv, env); err != nil {
		return fmt.Errorf("running %s: %w", path, err)
	}
	return nil
}

// setEnv is env with key set to value, once.
func setEnv(env []string, key, value string) []string {
	out := make([]string, 0, len(env)+1)
	for _, kv := range env {
		if !strings.HasPrefix(kv, key+"=") {
			out = append(out, kv)
		}
	}
	return append(out, key+"="+value)
}

// shellQuote renders argv as one could paste it into a shell.
func shellQuote(argv []string) string {
	out := make([]string, len(argv))
	for i, a := range argv {
		if a != "" && !strings.ContainsAny(a, " \t\n'\"\\$`;&|<>*?()[]{}!#~") {
			out[i] = a
			continue
		}
		out[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
	}
	return strings.Join(out, " ")
}

// sessionName is what a tmux session may be called here: it lands in a
// shell command line inside the box.
var sessionName = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)
