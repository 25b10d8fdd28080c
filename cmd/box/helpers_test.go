package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
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
}

func (r runner) run(t *testing.T, args ...string) result {
	t.Helper()
	var o, e bytes.Buffer
	var res result
	a := &app{
		ctx: context.Background(), in: strings.NewReader(r.stdin), out: &o, err: &e,
		getenv:   func(k string) string { return r.env[k] },
		stdinTTY: r.tty,
		handover: func(argv0 string, argv, env []string) error {
			res.handedOver = append([]string{}, argv...)
			res.env = env
			return nil
		},
		lookPath: func(name string) (string, error) { return "/usr/bin/" + name, nil },
		environ:  func() []string { return []string{"PATH=/usr/bin"} },
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
