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
	"github.com/box-isolation/box/stack"
)

// reaches has the box resolve name at its gateway (so an allowlist's set
// learns the answer), then open a TCP connection to addr:80 and read the
// canary's greeting; it reports whether the greeting came.
func reaches(t *testing.T, r runner, box, name string, addr fmt.Stringer) bool {
	t.Helper()
	script := fmt.Sprintf("nslookup %s 10.88.0.1 >/dev/null 2>&1; echo | nc -w 1 %s 80 | head -1", name, addr)
	res := r.run(t, "exec", box, "--", "sh", "-c", script)
	return strings.Contains(res.out, "BOXWORLD canary")
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
	assert.False(t, ch.NewPolicy, "the policy was there: the resolver was not restarted")
	assert.False(t, reaches(t, r, box, "other.example.net", other), "allowlisted again: the other canary is gone at once")
	assert.True(t, reaches(t, r, box, "canary.example.net", canary))

	// A new policy restarts the bridge's resolver: how long it is down,
	// and from the command to the first allowed connection.
	t0 = time.Now()
	res = r.run(t, "egress", box, "allow", "other.example.net", "--json")
	require.Equal(t, exitOK, res.code, res.err)
	require.NoError(t, json.Unmarshal([]byte(res.out), &ch))
	assert.True(t, ch.NewPolicy)
	ok := reaches(t, r, box, "other.example.net", other)
	t.Logf("new policy: resolver down %s; command to first allowed connection %s", ch.ResolverDown, time.Since(t0))
	assert.True(t, ok, "the newly allowed canary")
	assert.False(t, reaches(t, r, box, "canary.example.net", canary), "and not the one no longer allowed")

	// A converge drops the policies no box names.
	res = r.run(t, "rm", "--force", box)
	require.Equal(t, exitOK, res.code, res.err)
	res = r.run(t, "doctor", "--fix")
	t.Logf("doctor --fix after the last allowlisted box: %s", res.out)
	assert.Contains(t, res.out, "no box names it")
}
