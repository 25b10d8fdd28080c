package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/fixtures/world"
	"github.com/box-isolation/box/internal/testenv"
	"github.com/box-isolation/box/probes"
	"github.com/box-isolation/box/stack"
	"github.com/box-isolation/box/stack/boxes"
	"github.com/box-isolation/box/stack/egress"
	"github.com/box-isolation/box/stack/hostns"
)

// canary is one of the world's canaries as a box names it.
type canary struct {
	name     string
	addr     netip.Addr
	greeting string // its own: the other canary's is not an answer
}

// worldCanaries are the world's two canaries as a box names them: the
// first, which the tests allowlist, and the other.
func worldCanaries(st *world.State) (first, other canary) {
	return canary{"canary.example.net", world.Canary, st.Greeting("canary")},
		canary{"other.example.net", world.Canary2, st.Greeting("canary2")}
}

// attempt is how one HTTP request from a box to a canary's port 80 ended:
// the first line the canary sent, and nc's exit status and words.
type attempt struct {
	line string
	nc   string
}

// connect has the box resolve c's name at its gateway (so an allowlist's
// set learns the answer), then send an HTTP request for c's name to c's
// port 80 (an allowlisted box's goes through box's egress proxy, which
// reads the Host) and read the first line. A box exec that failed, or a
// script that did not run to its end, proves nothing either way: the
// test fails there.
func connect(t *testing.T, r runner, box string, c canary) attempt {
	t.Helper()
	script := fmt.Sprintf(`nslookup %s 10.88.0.1 >/dev/null 2>&1
out=$(printf 'GET / HTTP/1.0\r\nHost: %s\r\n\r\n' | nc -w 2 %s 80 2>&1); rc=$?
printf 'nc-exit=%%d\n%%s\n' "$rc" "$out"`, c.name, c.name, c.addr)
	res := r.run(t, "exec", box, "--", "sh", "-c", script)
	require.Equal(t, exitOK, res.code, "box exec %s: %s", box, res.err)
	status, out, ok := strings.Cut(res.out, "\n")
	require.True(t, ok && strings.HasPrefix(status, "nc-exit="), "box exec %s did not run the attempt to its end: %q", box, res.out)
	first, _, _ := strings.Cut(strings.TrimSpace(out), "\n")
	return attempt{line: strings.TrimSpace(first), nc: strings.TrimPrefix(status, "nc-") + " " + strings.TrimSpace(out)}
}

// reaches reports whether the box's connection to c got c's greeting.
func reaches(t *testing.T, r runner, box string, c canary) bool {
	t.Helper()
	a := connect(t, r, box, c)
	t.Logf("%s -> %s (%s): %s", box, c.name, c.addr, a.nc)
	return a.line == c.greeting
}

// blocked asserts the box's request for c is refused by box's egress proxy
// (a 403 that says so, and why: the canary never answered), and shows its
// positive control first: the same box, at the same moment, gets
// control's greeting.
func blocked(t *testing.T, r runner, box string, c, control canary, msg string) {
	t.Helper()
	require.True(t, reaches(t, r, box, control), "positive control: %s reaches %s (%s)", box, control.name, msg)
	a := connect(t, r, box, c)
	assert.NotEqual(t, c.greeting, a.line, "%s: %s answered", msg, c.name)
	assert.Equal(t, "HTTP/1.1 403 Forbidden", a.line, "%s: refused by the proxy, not broken", msg)
	assert.Contains(t, a.nc, egress.HTTPRefusedHeader+": refused", "%s: the proxy's refusal", msg)
	assert.Contains(t, a.nc, "box egress: "+c.name+" is not on the allowlist", "%s: with its reason", msg)
	t.Logf("%s -> %s (%s): %s, while %s answers", box, c.name, c.addr, a.nc, control.name)
}

// TestSystemEgressAllowlist: a box minted under an allowlist reaches the
// allowed canary and not the other; opening it and allowlisting it again
// take effect by the time the command returns.
func TestSystemEgressAllowlist(t *testing.T) {
	r, c := worldBox(t)
	portWatcher(t, testenv.World(t), c)
	box := uniq(t)
	cleanup(t, c, box)
	allow := filepath.Join(t.TempDir(), "allow")
	require.NoError(t, os.WriteFile(allow, []byte("# the agent's one API\ncanary.example.net\n"), 0o644))

	res := r.run(t, "new", "--name", box, "--egress", "allow:"+allow)
	require.Equal(t, exitOK, res.code, res.err)
	t.Logf("box new --egress: %s", res.err)
	st := testenv.World(t)
	first, other := worldCanaries(st)
	assert.True(t, reaches(t, r, box, first), "the allowed canary, by its name")
	blocked(t, r, box, other, first, "not the other canary")

	show := r.run(t, "egress", box, "show", "--json")
	require.Equal(t, exitOK, show.code, show.err)
	var eg egressResult
	require.NoError(t, json.Unmarshal([]byte(show.out), &eg))
	assert.Equal(t, []string{"canary.example.net"}, eg.Names)
	assert.Contains(t, eg.Allowed, world.Canary.String(), "the resolver's answer is in the set")

	// Open: the very next connection goes through.
	t0 := time.Now()
	res = r.run(t, "egress", box, "open", "--json")
	require.Equal(t, exitOK, res.code, res.err)
	t.Logf("box egress open took %s", time.Since(t0))
	assert.True(t, reaches(t, r, box, other), "open: the other canary too, at once")

	// Back under the allowlist (it exists), at once.
	t0 = time.Now()
	res = r.run(t, "egress", box, "allow", "canary.example.net", "--json")
	took := time.Since(t0)
	require.Equal(t, exitOK, res.code, res.err)
	var ch boxes.EgressChange
	require.NoError(t, json.Unmarshal([]byte(res.out), &ch))
	t.Logf("box egress allow (existing policy) took %s; new policy: %v", took, ch.NewPolicy)
	assert.False(t, ch.NewPolicy, "the policy was there")
	blocked(t, r, box, other, first, "allowlisted again: the other canary is gone at once")

	// A new policy: from the command to the first allowed connection.
	t0 = time.Now()
	res = r.run(t, "egress", box, "allow", "other.example.net", "--json")
	require.Equal(t, exitOK, res.code, res.err)
	require.NoError(t, json.Unmarshal([]byte(res.out), &ch))
	assert.True(t, ch.NewPolicy)
	ok := reaches(t, r, box, other)
	t.Logf("new policy: command to first allowed connection %s", time.Since(t0))
	assert.True(t, ok, "the newly allowed canary")
	blocked(t, r, box, first, other, "and not the one no longer allowed")

	// A converge drops the policies no box names.
	res = r.run(t, "rm", "--force", box)
	require.Equal(t, exitOK, res.code, res.err)
	res = r.run(t, "doctor", "--fix")
	t.Logf("doctor --fix after the last allowlisted box: %s", res.out)
	assert.Contains(t, res.out, "no box names it")
}

// TestSystemEgressTunnel is the DNS tunnel an allowlist must not leave
// open: box-w, allowed only the canary's name, asks its gateway for names
// under a zone the world's witness nameserver is authoritative for (one
// under the allowed name, one beside it, one elsewhere). None of its
// queries may reach the witness, while the same questions from an open
// box do (the control: without it the witness's silence proves nothing).
func TestSystemEgressTunnel(t *testing.T) {
	r, c := worldBox(t)
	st := testenv.World(t)
	portWatcher(t, st, c)
	w, o := uniq(t), uniq(t)
	cleanup(t, c, w, o)
	allow := filepath.Join(t.TempDir(), "allow")
	require.NoError(t, os.WriteFile(allow, []byte("canary.example.net\n"), 0o644))
	res := r.run(t, "new", "--name", w, "--egress", "allow:"+allow)
	require.Equal(t, exitOK, res.code, res.err)
	res = r.run(t, "new", "--name", o)
	require.Equal(t, exitOK, res.code, res.err)

	since := time.Now()
	zones := []string{"canary.example.net", "other.example.net", "attacker.example"}
	ask := func(box string) map[string]string {
		names := map[string]string{}
		var script strings.Builder
		for _, z := range zones {
			n := probes.NewNonce() + "." + z
			names[z] = n
			fmt.Fprintf(&script, "nslookup %s 10.88.0.1; ", n)
		}
		res := r.run(t, "exec", box, "--", "sh", "-c", script.String())
		t.Logf("%s asked: %s", box, res.out)
		return names
	}
	tunnel, control := ask(w), ask(o)
	// The witness logs a query as it answers it; the answers are back.
	qs, err := world.ReadWitnessLog(world.WitnessLog(st.StateDir), since)
	require.NoError(t, err)
	heard := map[string]bool{}
	for _, q := range qs {
		heard[strings.TrimSuffix(q.Name, ".")] = true
	}
	for _, z := range zones {
		require.True(t, heard[control[z]], "the open box's %s reached the witness (its control): %v", control[z], qs)
		assert.False(t, heard[tunnel[z]], "%s, asked by the allowlisted box, reached the witness nameserver: a DNS tunnel", tunnel[z])
	}

	// Each refusal has its reason, for the operator.
	res = r.run(t, "egress", w, "log", "--json")
	require.Equal(t, exitOK, res.code, res.err)
	var refusals []egress.Refusal
	require.NoError(t, json.Unmarshal([]byte(res.out), &refusals))
	logged := map[string]string{}
	for _, x := range refusals {
		if x.Kind == "dns" {
			logged[strings.TrimSuffix(x.Name, ".")] = x.Reason
		}
	}
	for _, z := range zones {
		assert.Contains(t, logged[tunnel[z]], "not on the allowlist", "%s is in box egress %s log", tunnel[z], w)
	}
	res = r.run(t, "egress", o, "log")
	require.Equal(t, exitOK, res.code, res.err)
	assert.Empty(t, res.out, "the open box was refused nothing")
}

// TestSystemEgressClosed: with no egress service running, an allowlisted
// box resolves nothing and opens nothing on port 80, even to an address
// it is allowed; box doctor says why; back with the service, it works.
func TestSystemEgressClosed(t *testing.T) {
	r, c := worldBox(t)
	st := testenv.World(t)
	h := &stack.Host{Incus: c, NetNS: st.Names.HostNS}
	if _, running, err := hostns.DaemonRunning(h.NetNS); err != nil || running {
		t.Fatalf("a port watcher runs in %s (%v): this test runs the egress service itself", st.Names.HostNS, err)
	}
	serve := func() func() {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- egress.Serve(ctx, h.NetNS, io.Discard) }()
		deadline := time.Now().Add(5 * time.Second)
		for !egress.Serving(h.NetNS) {
			require.True(t, time.Now().Before(deadline), "the egress service did not answer within 5 s")
			time.Sleep(20 * time.Millisecond)
		}
		return func() { cancel(); require.NoError(t, <-done) }
	}
	w := uniq(t)
	cleanup(t, c, w)
	allow := filepath.Join(t.TempDir(), "allow")
	require.NoError(t, os.WriteFile(allow, []byte("canary.example.net\n"), 0o644))
	res := r.run(t, "new", "--name", w, "--egress", "allow:"+allow)
	require.Equal(t, exitOK, res.code, res.err)

	first, _ := worldCanaries(st)
	stop := serve()
	require.True(t, reaches(t, r, w, first), "with the service: the allowed canary")
	stop()
	require.False(t, egress.Serving(h.NetNS))

	res = r.run(t, "exec", w, "--", "sh", "-c", "nslookup canary.example.net 10.88.0.1")
	assert.NotEqual(t, exitOK, res.code, "no service: the box resolves nothing: %s", res.out)
	assert.NotContains(t, res.out, world.Canary.String())
	a := connect(t, r, w, first)
	assert.Equal(t, "exit=1 nc: timed out", a.nc, "no service: the allowed canary's address is closed on port 80 (no proxy takes it: dropped)")
	doc := r.run(t, "doctor")
	assert.Contains(t, doc.out+doc.err, "no egress service answers here", "doctor says so")

	defer serve()()
	assert.True(t, reaches(t, r, w, first), "the service back: the canary again")
}
