package stack_test

import (
	"context"
	"fmt"
	"maps"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/drill/image"
	"github.com/box-isolation/box/fixtures/world"
	"github.com/box-isolation/box/stack"
	"github.com/box-isolation/box/stack/boxes"
	"github.com/box-isolation/box/stack/guard"
	"github.com/box-isolation/box/stack/hostns"
	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/model"
	"github.com/box-isolation/box/stack/stacktest"
	"github.com/box-isolation/box/stack/stacktest/worldtest"
)

// guardFindings are Verify's findings about L-GUARD.
func guardFindings(t *testing.T, ctx context.Context, h *stack.Host) []string {
	t.Helper()
	v, err := h.Verify(ctx)
	require.NoError(t, err)
	require.Empty(t, v.GuardAbsent, "the world's kernel loads the guard")
	var out []string
	for _, f := range v.Findings {
		if f.Layer == model.LayerGuard {
			out = append(out, f.Object+": "+f.Problem)
		}
	}
	return out
}

// TestSystemGuardInTheWorld: Ensure attaches the guard to boxnet's
// ingress and the world's uplink's egress; a box minted then gets its
// lease and reaches the canary through it (counted as DHCP and forwarded);
// with limits.ingress set on its NIC (Incus then puts its own qdiscs on
// the box's veth) the guard stays and the box's networking works; another
// tool's deletion of the bridge's clsact qdisc is a finding that Ensure
// puts right.
func TestSystemGuardInTheWorld(t *testing.T) {
	ctx, h, st := worldtest.Host(t)
	rep, err := h.Ensure(ctx)
	require.NoError(t, err)
	var attached []string
	for _, c := range rep.Changes {
		if strings.HasPrefix(c.Object, "guard ") {
			attached = append(attached, c.Object)
		}
	}
	assert.Equal(t, []string{"guard boxnet ingress", "guard " + st.Names.Uplink + " egress"}, attached)
	assert.Empty(t, guardFindings(t, ctx, h))

	g, err := hostns.Open(st.Names.HostNS)
	require.NoError(t, err)
	defer g.Close()
	counted := func() map[string]uint64 {
		t.Helper()
		hooks, err := guard.Hooks(g)
		require.NoError(t, err)
		return hooks["boxnet ingress"].Counters
	}
	before := counted()

	box := stacktest.Name(t, "t-guard-")
	t.Cleanup(func() { _ = boxes.NewManager(h).Remove(context.Background(), box) })
	_, err = boxes.NewManager(h).Mint(ctx, boxes.MintRequest{Name: box, Image: image.DefaultAlias})
	require.NoError(t, err)
	_, err = h.Addresses().Wait(ctx, box, 30*time.Second)
	require.NoError(t, err)
	reach := func(when string) {
		t.Helper()
		cmd := fmt.Sprintf("printf 'hi\\n' | nc -w 3 %s %d", world.Canary, world.CanaryTCPPort)
		out, err := h.Incus.Instances().Exec(ctx, box, incus.ExecRequest{Command: []string{"sh", "-c", cmd}})
		require.NoError(t, err)
		assert.Contains(t, string(out.Stdout), st.Greeting("canary"), "%s: the box reaches the canary through the guard (stderr %q)", when, out.Stderr)
	}
	reach("minted")
	after := counted()
	assert.Greater(t, after[guard.PassDHCP.String()], before[guard.PassDHCP.String()], "the box's DHCP passed the guard")
	assert.Greater(t, after[guard.PassForward.String()], before[guard.PassForward.String()], "its connection to the canary passed, forwarded")

	// limits.ingress on the box's NIC: Incus shapes the veth with qdiscs
	// of its own, live.
	inst, etag, err := h.Incus.Instances().Get(ctx, box)
	require.NoError(t, err)
	put := inst.Writable()
	nic := maps.Clone(inst.ExpandedDevices["eth0"])
	nic["limits.ingress"] = "100Mbit"
	put.Devices = maps.Clone(put.Devices)
	if put.Devices == nil {
		put.Devices = map[string]map[string]string{}
	}
	put.Devices["eth0"] = nic
	require.NoError(t, h.Incus.Instances().Update(ctx, box, put, etag))
	assert.Empty(t, guardFindings(t, ctx, h), "the guard stays with a box's ingress limit")
	reach("with limits.ingress")

	// Another tool deletes the bridge's clsact qdisc.
	out, err := exec.Command("ip", "netns", "exec", st.Names.HostNS, "tc", "qdisc", "del", "dev", model.Current.Network, "clsact").CombinedOutput()
	require.NoError(t, err, "%s", out)
	assert.Equal(t, []string{"guard boxnet ingress: no guard attached"}, guardFindings(t, ctx, h))
	_, err = h.Ensure(ctx)
	require.NoError(t, err)
	assert.Empty(t, guardFindings(t, ctx, h))
}
