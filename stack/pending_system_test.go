package stack_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/box-isolation/box/stack/stacktest/worldtest"

	"github.com/box-isolation/box/stack/stacktest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/drill/image"
	"github.com/box-isolation/box/fixtures/world"
	"github.com/box-isolation/box/stack"
	"github.com/box-isolation/box/stack/boxes"
	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/model"
)

// cutCreate leaves boxnet Pending the way it happens: a create whose
// client goes away mid-request (a cancelled context, Ctrl-C, a killed
// setup-host). Incus has written the row with this member's state
// Pending; its request context is gone before it marks it Created, and
// its revert, on the same context, cannot delete the row. It tries cuts
// from 10 ms on until one lands in that window.
func cutCreate(t *testing.T, ctx context.Context, st *world.State, h *stack.Host, subnet netip.Prefix) {
	t.Helper()
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", st.IncusSocket)
	}}}
	body := fmt.Sprintf(`{"name":%q,"type":"bridge","config":{"ipv4.address":%q,"ipv4.nat":"true","ipv6.address":"none"}}`,
		model.Current.Network, netip.PrefixFrom(subnet.Addr().Next(), subnet.Bits()).String())
	for cut := 10 * time.Millisecond; cut < 2*time.Second; cut += 5 * time.Millisecond {
		rctx, cancel := context.WithTimeout(ctx, cut)
		req, err := http.NewRequestWithContext(rctx, http.MethodPost, "http://incus/1.0/networks", strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		if resp, err := hc.Do(req); err == nil {
			resp.Body.Close()
		}
		cancel()
		// Incus goes on with the request for a moment after the cut.
		time.Sleep(300 * time.Millisecond)
		n, _, err := h.Incus.Networks().Get(ctx, model.Current.Network)
		switch {
		case incus.IsNotFound(err):
			continue
		case err != nil:
			require.NoError(t, err)
		case n.Status == "Pending":
			t.Logf("a create cut off after %s left %s Pending", cut, n.Name)
			return
		default:
			require.NoError(t, h.Incus.Networks().Delete(ctx, n.Name), "the whole create, undone for the next try")
		}
	}
	t.Fatal("no cut-off create left the network Pending")
}

// leavePending puts boxnet, with a box on it, in that same state in
// Incus's database: a network cannot be made Pending with instances on it
// by cutting a create, so the row is written the same way Incus writes it
// (this member's state 0) through incus admin sql; the kernel bridge and
// its dnsmasq stay up, as when incusd dies after starting the bridge.
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

func pendingFindings(v *stack.Verification) (pending, restart []model.Finding) {
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

// TestSystemPendingBridgeRepaired: with no instance on a Pending boxnet
// (left by a create cut off),
// doctor names doctor --fix (not "restart incusd") and Ensure removes it,
// its kernel bridge and dnsmasq, and makes it again on the same subnet;
// with a box on it, Ensure changes nothing and both name the incus
// command, which does mend it.
func TestSystemPendingBridgeRepaired(t *testing.T) {
	ctx, h, st := worldtest.Host(t)
	subnet := netip.MustParsePrefix("10.88.0.0/24")
	cutCreate(t, ctx, st, h, subnet)
	n, _, err := h.Incus.Networks().Get(ctx, model.Current.Network)
	require.NoError(t, err)
	require.Equal(t, "Pending", n.Status, "the state made is the one Incus reports")
	v, err := h.Verify(ctx)
	require.NoError(t, err)
	pending, restart := pendingFindings(v)
	require.Len(t, pending, 1, "doctor finds the Pending bridge: %v", v.Findings)
	assert.Contains(t, pending[0].Fix, "box doctor --fix")
	assert.Empty(t, restart, "no finding says to restart incusd")

	rep, err := h.Ensure(ctx)
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
	n, _, err = h.Incus.Networks().Get(ctx, model.Current.Network)
	require.NoError(t, err)
	assert.Equal(t, "Created", n.Status)
	v, err = h.Verify(ctx)
	require.NoError(t, err)
	assert.Empty(t, v.Findings, "a whole stack after the repair")

	// A box on it: nothing of the user's is touched; the fix is named.
	name := stacktest.Name(t, "pend-")
	t.Cleanup(func() { _ = boxes.NewManager(h).Remove(context.Background(), name) })
	_, err = boxes.NewManager(h).Mint(ctx, boxes.MintRequest{Name: name, Image: image.DefaultAlias})
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
	_, _, err = h.Incus.Instances().Get(ctx, name)
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
