package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/internal/testenv"
)

// TestSystemTierPolicyWorkflow: the seed's reuse workflow as a granted
// user, through incus-user: snapshot a box, change its allowlist (in
// force when the command returns), restore
// the snapshot: the box keeps the new allowlist (proven from inside it);
// a clone of the box and one of its snapshot take the box's current
// allowlist. The admin's two boxes keep both allowlists on the host (a
// granted user can pick only allowlists the host has).
func TestSystemTierPolicyWorkflow(t *testing.T) {
	e := tierWorld(t)
	st := testenv.World(t)
	first, other := worldCanaries(st)
	adminA, adminB := uniq(t), uniq(t)
	cleanup(t, e.c, adminA, adminB)
	for name, allow := range map[string]string{adminA: first.name, adminB: other.name} {
		require.Equal(t, exitOK, e.r.run(t, "new", "--name", name).code)
		res := e.r.run(t, "egress", name, "allow", allow)
		require.Equal(t, exitOK, res.code, res.err)
	}
	u := e.newUser(t)
	e.grant(t, u)
	ur := e.as(u)
	box, fromBox, fromSnap := uniq(t), uniq(t), uniq(t)
	require.Equal(t, exitOK, ur.run(t, "new", "--name", box).code)
	res := ur.run(t, "egress", box, "allow", first.name)
	require.Equal(t, exitOK, res.code, res.err)
	res = ur.run(t, "snapshot", box, "s1")
	require.Equal(t, exitOK, res.code, res.err)
	res = ur.run(t, "egress", box, "allow", other.name)
	require.Equal(t, exitOK, res.code, res.err)
	// Enforced when the command returns (the daemon's refresh socket):
	// before it, the watcher took a granted user's change only at its
	// next resync, up to 30 s later, and this box reached the canary.
	blocked(t, ur, box, first, other, "the allowlist the granted user set")

	res = ur.run(t, "restore", box, "s1", "--force")
	require.Equal(t, exitOK, res.code, "box restore as the granted user: %s", res.err)
	assert.Contains(t, res.out, box+" kept its current policy (egress allow "+other.name)
	blocked(t, ur, box, first, other, "the user's box, restored, keeps its new allowlist")

	res = ur.run(t, "new", "--name", fromBox, "--from", box)
	require.Equal(t, exitOK, res.code, "box new --from as the granted user: %s", res.err)
	blocked(t, ur, fromBox, first, other, "the clone of the user's box has its allowlist")
	res = ur.run(t, "new", "--name", fromSnap, "--from", box+"/s1")
	require.Equal(t, exitOK, res.code, "box new --from a snapshot as the granted user: %s", res.err)
	assert.Contains(t, res.err, fromSnap+" took its source's current policy")
	blocked(t, ur, fromSnap, first, other, "the clone of the snapshot has the box's current allowlist, not the snapshot's")
}
