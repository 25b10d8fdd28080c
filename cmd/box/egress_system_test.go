package main

import (
	"encoding/json"
	"fmt"
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
)

// reaches has the box resolve name at its gateway (so an allowlist's set
// learns the answer), then send an HTTP request for name to addr:80 and
// read the canary's greeting; it reports whether the greeting came.
func reaches(t *testing.T, r runner, box, name string, addr fmt.Stringer) bool {
	t.Helper()
	script := fmt.Sprintf("nslookup %s 10.88.0.1 >/dev/null 2>&1; printf 'GET / HTTP/1.0\\r\\nHost: %s\\r\\n\\r\\n' | nc -w 1 %s 80 | head -1", name, name, addr)
	res := r.run(t, "exec", box, "--", "sh", "-c", script)
	return strings.Contains(res.out, "BOXWORLD canary")
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
	canary, other := world.Canary, world.Canary2
	assert.True(t, reaches(t, r, box, "canary.example.net", canary), "the allowed canary, by its name")
	assert.False(t, reaches(t, r, box, "other.example.net", other), "not the other canary")

	show := r.run(t, "egress", box, "show", "--json")
	require.Equal(t, exitOK, show.code, show.err)
	var st egressResult
	require.NoError(t, json.Unmarshal([]byte(show.out), &st))
	assert.Equal(t, []string{"canary.example.net"}, st.Names)
	assert.Contains(t, st.Allowed, canary.String(), "the resolver's answer is in the set")

	// Open: the very next connection goes through.
	t0 := time.Now()
	res = r.run(t, "egress", box, "open", "--json")
	require.Equal(t, exitOK, res.code, res.err)
	t.Logf("box egress open took %s", time.Since(t0))
	assert.True(t, reaches(t, r, box, "other.example.net", other), "open: the other canary too, at once")

	// Back under the allowlist (it exists: no resolver restart), at once.
	t0 = time.Now()
	res = r.run(t, "egress", box, "allow", "canary.example.net", "--json")
	took := time.Since(t0)
	require.Equal(t, exitOK, res.code, res.err)
	var ch stack.EgressChange
	require.NoError(t, json.Unmarshal([]byte(res.out), &ch))
	t.Logf("box egress allow (existing policy) took %s; new policy: %v", took, ch.NewPolicy)
	assert.False(t, ch.NewPolicy, "the policy was there")
	assert.False(t, reaches(t, r, box, "other.example.net", other), "allowlisted again: the other canary is gone at once")
	assert.True(t, reaches(t, r, box, "canary.example.net", canary))

	// A new policy: from the command to the first allowed connection.
	t0 = time.Now()
	res = r.run(t, "egress", box, "allow", "other.example.net", "--json")
	require.Equal(t, exitOK, res.code, res.err)
	require.NoError(t, json.Unmarshal([]byte(res.out), &ch))
	assert.True(t, ch.NewPolicy)
	ok := reaches(t, r, box, "other.example.net", other)
	t.Logf("new policy: command to first allowed connection %s", time.Since(t0))
	assert.True(t, ok, "the newly allowed canary")
	assert.False(t, reaches(t, r, box, "canary.example.net", canary), "and not the one no longer allowed")

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
}
