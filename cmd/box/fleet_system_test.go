package main

import (
	"context"
	"encoding/json"
	"net/netip"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/drill"
	"github.com/box-isolation/box/drill/image"
	"github.com/box-isolation/box/fixtures/world"
	"github.com/box-isolation/box/internal/testenv"
	"github.com/box-isolation/box/stack"
	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/model"
	"github.com/box-isolation/box/stack/stacktest/worldtest"
)

// handOver runs what box handed over to the incus CLI, for real: the
// escape hatch as a person uses it.
func handOver(t *testing.T, r runner, args ...string) {
	t.Helper()
	res := r.run(t, append([]string{"incus"}, args...)...)
	require.Equal(t, exitOK, res.code, res.err)
	require.NotEmpty(t, res.handedOver)
	cmd := exec.Command(res.handedOver[0], res.handedOver[1:]...)
	cmd.Env = res.env
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%v: %s", res.handedOver, out)
}

// doctorOf runs box doctor --json (with args) and returns its result.
func doctorOf(t *testing.T, r runner, args ...string) (int, doctorResult) {
	t.Helper()
	res := r.run(t, append([]string{"doctor", "--json"}, args...)...)
	var d doctorResult
	require.NoError(t, json.Unmarshal([]byte(res.out), &d), res.out)
	return res.code, d
}

// fleetFindings are the census's findings naming one box.
func fleetFindings(d doctorResult, name string) []model.Finding {
	var out []model.Finding
	for _, f := range d.Verification.Findings {
		if f.Layer == model.LayerFleet && f.Object == "box "+name {
			out = append(out, f)
		}
	}
	return out
}

// fleetClaim runs the drill for C-FLEET alone (its baselines come along)
// in the world.
func fleetClaim(t *testing.T, c *incus.Client) drill.ClaimResult {
	t.Helper()
	st := testenv.World(t)
	cl, _ := drill.ClaimByID("C-FLEET")
	cfg := drill.Config{
		Host:     &stack.Host{Incus: c, NetNS: st.Names.HostNS, Options: model.Options{DNS: []netip.Addr{world.Resolver}}},
		Topology: st.Topology(), Image: image.DefaultAlias, Agent: testenv.Drill(t), Version: "test",
		Claims: []drill.Claim{cl},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rep, err := drill.Run(ctx, cfg)
	require.NoError(t, err)
	for _, cr := range rep.Claims {
		if cr.ID == "C-FLEET" {
			for _, res := range cr.Results {
				t.Logf("C-FLEET %s: %s: %s", res.Verdict, res.Target, res.Evidence)
			}
			return cr
		}
	}
	t.Fatal("no C-FLEET in the report")
	return drill.ClaimResult{}
}

// TestSystemFleet: a box taken off the stack through the escape hatch
// fails C-FLEET, box doctor and box list name it, doctor --fix repairs
// what box owns (the port's flag and set) and names the rest; a second NIC
// on another bridge fails C-FLEET too.
func TestSystemFleet(t *testing.T) {
	r, c := worldBox(t)
	// The pool counting (an earlier test's box deleted, its subvolume
	// cleaned a moment later, can stop the kernel counting): doctor's
	// first check below holds the whole host to clean.
	st := testenv.World(t)
	worldtest.EnsureCounting(context.Background(), t, &stack.Host{Incus: c, NetNS: st.Names.HostNS, Options: model.Options{DNS: []netip.Addr{world.Resolver}}}, st)
	name := uniq(t)
	cleanup(t, c, name)
	require.Equal(t, exitOK, r.run(t, "new", "--name", name).code)
	code, d := doctorOf(t, r)
	require.Equal(t, exitOK, code, "a fresh box is on the stack: %v", d.Verification.Findings)
	require.Equal(t, drill.Pass, fleetClaim(t, c).Verdict, "C-FLEET holds before the change")

	// Port isolation off on its NIC: Incus re-plugs it with a new port,
	// not isolated and outside the bridge drop's set.
	handOver(t, r, name, "--", "config", "device", "set", "{}", "eth0", "security.port_isolation=false")
	code, d = doctorOf(t, r)
	assert.Equal(t, exitFailed, code)
	found := fleetFindings(d, name)
	require.NotEmpty(t, found, "doctor names the box: %v", d.Verification.Findings)
	all, _ := json.Marshal(found)
	assert.Contains(t, string(all), "port isolation off")
	assert.Contains(t, string(all), "incus config device set "+name+" eth0 security.port_isolation=true")
	list := r.run(t, "list")
	assert.Regexp(t, name+`\s+Running\s+container\s+OFF`, list.out, "box list marks it")
	assert.Contains(t, list.err, name+" is off the stack: NIC eth0 has port isolation off")
	cr := fleetClaim(t, c)
	assert.Equal(t, drill.Fail, cr.Verdict, "C-FLEET fails on a box off the stack")
	named := false
	for _, res := range cr.Results {
		named = named || (res.Verdict == drill.Fail && res.Target == string(model.LayerFleet)+" box "+name)
	}
	assert.True(t, named, "the failure names the box")

	// --fix repairs the port's flag and set, and names the rest.
	code, d = doctorOf(t, r, "--fix")
	assert.Equal(t, exitFailed, code, "the NIC's setting is the user's to change")
	port := ""
	for _, s := range d.Verification.Fleet.Siblings {
		if s.Name == name {
			port = s.Port
			for _, p := range s.Problems {
				assert.NotContains(t, p.What, "not isolated (kernel flag)", "--fix isolated the port")
				assert.NotContains(t, p.What, "not in the bridge drop's port set", "--fix put the port in the set")
			}
		}
	}
	require.NotEmpty(t, port)
	for _, p := range d.Verification.Ports {
		if p.Name == port {
			assert.True(t, p.Isolated, "the kernel flag is back on %s", port)
		}
	}
	assert.NotEmpty(t, fleetFindings(d, name), "the NIC setting is still named, with its command")

	// The named fix, then --fix again: on the stack.
	handOver(t, r, name, "--", "config", "device", "set", "{}", "eth0", "security.port_isolation=true")
	code, d = doctorOf(t, r, "--fix")
	assert.Equal(t, exitOK, code, "%v", d.Verification.Findings)

	// A second NIC on another bridge.
	other := "tcli" + name[len(name)-6:]
	ctx := context.Background()
	require.NoError(t, c.Networks().Create(ctx, incus.NetworksPost{Name: other, Type: "bridge",
		Config: map[string]string{"ipv4.address": "none", "ipv6.address": "none"}}))
	t.Cleanup(func() {
		// The box first: Incus refuses to delete a network in use.
		c.Instances().SetState(context.Background(), name, "stop", 0, true) //nolint:errcheck
		if err := deleteEventually(c, name); err != nil {
			t.Errorf("cleaning up %s: %v", name, err)
		}
		if err := c.Networks().Delete(context.Background(), other); err != nil && !incus.IsNotFound(err) {
			t.Errorf("deleting network %s: %v", other, err)
		}
	})
	handOver(t, r, name, "--", "config", "device", "add", "{}", "eth1", "nic", "network="+other)
	code, d = doctorOf(t, r)
	assert.Equal(t, exitFailed, code)
	all, _ = json.Marshal(fleetFindings(d, name))
	assert.Contains(t, string(all), "second NIC eth1 on network "+other)
	assert.Equal(t, drill.Fail, fleetClaim(t, c).Verdict, "a second NIC fails C-FLEET")
	// Remove the box before the network (Incus refuses a network in use).
	require.Equal(t, exitOK, r.run(t, "rm", "--force", name).code)
}
