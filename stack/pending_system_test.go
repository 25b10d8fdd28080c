package stack_test

import (
	"context"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/drill/image"
	"github.com/box-isolation/box/fixtures/world"
	"github.com/box-isolation/box/stack"
)

// leavePending puts boxnet in the state an interrupted create leaves in
// Incus's database: Incus writes a new network's row with this member's
// state Pending and marks it Created once the bridge is made, so a create
// cut off in between (incusd killed, the request cancelled) leaves exactly
// this row. The kernel bridge and its dnsmasq stay as incusd made them,
// as when it died after starting the bridge. Two concurrent converges did
// not leave it so on this incusd within a test's time (docs/box.md, "A
// bridge left Pending"), so the row is written here the same way, through
// incus admin sql.
func leavePending(t *testing.T, st *world.State) {
	t.Helper()
	incusSQL(t, st, "UPDATE networks_nodes SET state=0 WHERE network_id=(SELECT id FROM networks WHERE name='boxnet')")
}

func incusSQL(t *testing.T, st *world.State, query string) {
	t.Helper()
	cmd := exec.Command("incus", "admin", "sql", "global", query)
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "INCUS_SOCKET=" + st.IncusSocket, "HOME=" + t.TempDir()}
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "incus admin sql: %s", out)
}

func pendingFindings(v *stack.Verification) (pending, restart []stack.Finding) {
	for _, f := range v.Findings {
		if strings.Contains(f.Problem, "Pending") {
			pending = append(pending, f)
		}
		if strings.Contains(f.Fix, "restart incusd, then box doctor") {
			restart = append(restart, f)
		}
	}
	return pending, restart
}

// TestSystemPendingBridgeRepaired: with no instance on a Pending boxnet,
// doctor names doctor --fix (not "restart incusd") and Ensure removes it,
// its kernel bridge and dnsmasq, and makes it again on the same subnet;
// with a box on it, Ensure changes nothing and both name the incus
// command, which does mend it.
func TestSystemPendingBridgeRepaired(t *testing.T) {
	ctx, h, st := worldHost(t)
	rep, err := h.Ensure(ctx)
	require.NoError(t, err)
	subnet := rep.Subnet.Subnet

	leavePending(t, st)
	n, _, err := h.Incus.Network(ctx, stack.Current.Network)
	require.NoError(t, err)
	require.Equal(t, "Pending", n.Status, "the state made is the one Incus reports")
	v, err := h.Verify(ctx)
	require.NoError(t, err)
	pending, restart := pendingFindings(v)
	require.Len(t, pending, 1, "doctor finds the Pending bridge: %v", v.Findings)
	assert.Contains(t, pending[0].Fix, "box doctor --fix")
	assert.Empty(t, restart, "no finding says to restart incusd")

	rep, err = h.Ensure(ctx)
	require.NoError(t, err, "Ensure repairs a Pending bridge with nothing on it")
	var changes []string
	for _, c := range rep.Changes {
		changes = append(changes, c.String())
	}
	joined := strings.Join(changes, "\n")
	t.Logf("repair:\n%s", joined)
	assert.Contains(t, joined, "removed network boxnet")
	assert.Contains(t, joined, "created network boxnet")
	assert.Equal(t, subnet, rep.Subnet.Subnet, "made again on its subnet")
	n, _, err = h.Incus.Network(ctx, stack.Current.Network)
	require.NoError(t, err)
	assert.Equal(t, "Created", n.Status)
	v, err = h.Verify(ctx)
	require.NoError(t, err)
	assert.Empty(t, v.Findings, "a whole stack after the repair")

	// A box on it: nothing of the user's is touched; the fix is named.
	name := uniq(t, "pend-")
	t.Cleanup(func() { _ = h.Remove(context.Background(), name) })
	_, err = h.Mint(ctx, stack.MintRequest{Name: name, Image: image.DefaultAlias})
	require.NoError(t, err)
	leavePending(t, st)
	v, err = h.Verify(ctx)
	require.NoError(t, err)
	pending, restart = pendingFindings(v)
	require.Len(t, pending, 1, "%v", v.Findings)
	assert.Contains(t, pending[0].Problem, name, "the finding names the box on it")
	assert.Contains(t, pending[0].Fix, "incus admin sql global")
	assert.Empty(t, restart)
	_, err = h.Ensure(ctx)
	require.Error(t, err, "Ensure does not remove a bridge a box is on")
	assert.Contains(t, err.Error(), "incus admin sql global")
	_, _, err = h.Incus.Instance(ctx, name)
	require.NoError(t, err, "the box is still there")

	// The named fix, as the operator would run it (the bridge is live:
	// no incusd restart needed here).
	incusSQL(t, st, "UPDATE networks_nodes SET state=1 WHERE network_id=(SELECT id FROM networks WHERE name='boxnet')")
	_, err = h.Ensure(ctx)
	require.NoError(t, err)
	v, err = h.Verify(ctx)
	require.NoError(t, err)
	pending, _ = pendingFindings(v)
	assert.Empty(t, pending, "the named fix mends it: %v", v.Findings)
}
