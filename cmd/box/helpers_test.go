package main

import (
	"bytes"
	"context"
	"errors"
	"maps"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/box-isolation/box/stack/incus"
)

// result is one invocation of box, as a person at a shell would see it.
type result struct {
	code     int
	out, err string
	// handedOver is the argv box handed over to (shell, tmux, incus);
	// nil when it did not.
	handedOver []string
	env        []string
}

// runner invokes box in-process with an environment of its own: nothing
// from the test process's environment leaks in.
type runner struct {
	env   map[string]string
	stdin string
	tty   bool // pretend stdin is a terminal
	// errTTY pretends stderr is a terminal (progress is drawn there).
	errTTY bool
	// as, when set, runs box the way another local user does: exe in a
	// process of its own under these credentials (box decides from its
	// euid whether it acts as an admin or as a granted user).
	as  *syscall.Credential
	exe string
	// dial, when set, opens a remote's connections (inside the world).
	dial incus.DialFunc
}

// withErrTTY is r with stderr a terminal.
func (r runner) withErrTTY() runner {
	r.errTTY = true
	return r
}

// asUser is r running the binary exe under cred.
func (r runner) asUser(exe string, cred *syscall.Credential) runner {
	r.as, r.exe = cred, exe
	return r
}

func (r runner) run(t *testing.T, args ...string) result {
	t.Helper()
	if r.as != nil {
		return r.runAs(t, args...)
	}
	if _, ok := r.env["BOX_TEMPLATE_IMAGES"]; !ok {
		// A test not aimed at a world keeps its template images' record
		// (and the lock beside it) in a directory of its own, never the
		// host's /var/lib/box.
		r = r.with("BOX_TEMPLATE_IMAGES", filepath.Join(t.TempDir(), "template-images.json"))
	}
	var o, e bytes.Buffer
	var res result
	a := &app{
		ctx: context.Background(), in: strings.NewReader(r.stdin), out: &o, err: &e,
		getenv:   func(k string) string { return r.env[k] },
		stdinTTY: r.tty, stderrTTY: r.errTTY,
		handover: func(argv0 string, argv, env []string) error {
			res.handedOver = append([]string{}, argv...)
			res.env = env
			return nil
		},
		lookPath: func(name string) (string, error) { return "/usr/bin/" + name, nil },
		environ:  func() []string { return []string{"PATH=/usr/bin"} },
		dial:     r.dial,
	}
	res.code = a.run(args)
	res.out, res.err = o.String(), e.String()
	t.Logf("box %s -> %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), res.code, res.out, res.err)
	return res
}

func (r runner) with(kv ...string) runner {
	env := map[string]string{}
	for k, v := range r.env {
		env[k] = v
	}
	for i := 0; i+1 < len(kv); i += 2 {
		env[kv[i]] = kv[i+1]
	}
	r.env = env
	return r
}

// runAs runs box as r.as, in a process of its own (a handover is a real
// exec there, so it is not recorded).
func (r runner) runAs(t *testing.T, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, r.exe, args...)
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	for _, k := range slices.Sorted(maps.Keys(r.env)) {
		cmd.Env = append(cmd.Env, k+"="+r.env[k])
	}
	cmd.Stdin = strings.NewReader(r.stdin)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: r.as}
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	var res result
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee) && ee.Exited():
		res.code = ee.ExitCode()
	case err != nil:
		t.Fatalf("running box %s as uid %d: %v: %s", strings.Join(args, " "), r.as.Uid, err, e.String())
	}
	res.out, res.err = o.String(), e.String()
	t.Logf("box %s (as uid %d) -> %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), r.as.Uid, res.code, res.out, res.err)
	return res
}
