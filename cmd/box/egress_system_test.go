package main

import (
	"encoding/json"
	"fmt"
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
	"github.com/box-isolation/box/stack"
)

// canary is one of the world's canaries as a box names it.
type canary struct {
	name     string
	addr     netip.Addr
	greeting string // its own: the other canary's is not an answer
}

// attempt is how one TCP connection from a box to a canary's port 80
// ended: the first line the canary sent, and nc's exit status and words.
type attempt struct {
	line string
	nc   string
}

// connect has the box resolve c's name at its gateway (so an allowlist's
// set learns the answer), then open a TCP connection to c's port 80 and
// read the first line. A box exec that failed, or a script that did not
// run to its end, proves nothing either way: the test fails there.
func connect(t *testing.T, r runner, box string, c canary) attempt {
	t.Helper()
	script := fmt.Sprintf(`nslookup %s 10.88.0.1 >/dev/null 2>&1
out=$(echo | nc -w 2 %s 80 2>&1); rc=$?
printf 'nc-exit=%%d\n%%s\n' "$rc" "$out"`, c.name, c.addr)
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

// blocked asserts the box's connection to c is dropped (nc times out: the
// egress table drops, it never rejects), and shows its positive control
// first: the same box, at the same moment, gets control's greeting.
func blocked(t *testing.T, r runner, box string, c, control canary, msg string) {
	t.Helper()
	require.True(t, reaches(t, r, box, control), "positive control: %s reaches %s (%s)", box, control.name, msg)
	a := connect(t, r, box, c)
	assert.NotEqual(t, c.greeting, a.line, "%s: %s answered", msg, c.name)
	assert.Equal(t, "exit=1 nc: timed out", a.nc, "%s: dropped, not refused or broken", msg)
	t.Logf("%s -> %s (%s): %s, while %s answers", box, c.name, c.addr, a.nc, control.name)
}

// TestSystemEgressAllowlist: a box minted under an allowlist reaches the
// allowed canary and not the other; opening it and allowlisting it again
// take effect by the time the command returns.
func TestSystemEgressAllowlist(t *testing.T) {
	r, c := worldBox(t)
	box := uniq(t)
	cleanup(t, c, box)
	allow := filepath.Join(t.TempDir(), "allow")
	require.NoError(t, os.WriteFile(allow, []byte("# the agent's one API\ncanary.example.net\n"), 0o644))

	res := r.run(t, "new", "--name", box, "--egress", "allow:"+allow)
	require.Equal(t, exitOK, res.code, res.err)
	t.Logf("box new --egress: %s", res.err)
	st := testenv.World(t)
	first := canary{"canary.example.net", world.Canary, st.Greeting("canary")}
	other := canary{"other.example.net", world.Canary2, st.Greeting("canary2")}
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

	// Back under the allowlist (it exists: no resolver restart), at once.
	t0 = time.Now()
	res = r.run(t, "egress", box, "allow", "canary.example.net", "--json")
	took := time.Since(t0)
	require.Equal(t, exitOK, res.code, res.err)
	var ch stack.EgressChange
	require.NoError(t, json.Unmarshal([]byte(res.out), &ch))
	t.Logf("box egress allow (existing policy) took %s; new policy: %v", took, ch.NewPolicy)
	assert.False(t, ch.NewPolicy, "the policy was there: the resolver was not restarted")
	blocked(t, r, box, other, first, "allowlisted again: the other canary is gone at once")

	// A new policy restarts the bridge's resolver: how long it is down,
	// and from the command to the first allowed connection.
	t0 = time.Now()
	res = r.run(t, "egress", box, "allow", "other.example.net", "--json")
	require.Equal(t, exitOK, res.code, res.err)
	require.NoError(t, json.Unmarshal([]byte(res.out), &ch))
	assert.True(t, ch.NewPolicy)
	ok := reaches(t, r, box, other)
	t.Logf("new policy: resolver down %s; command to first allowed connection %s", ch.ResolverDown, time.Since(t0))
	assert.True(t, ok, "the newly allowed canary")
	blocked(t, r, box, first, other, "and not the one no longer allowed")

	// A converge drops the policies no box names.
	res = r.run(t, "rm", "--force", box)
	require.Equal(t, exitOK, res.code, res.err)
	res = r.run(t, "doctor", "--fix")
	t.Logf("doctor --fix after the last allowlisted box: %s", res.out)
	assert.Contains(t, res.out, "no box names it")
}
