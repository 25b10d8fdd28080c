package drill_test

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/drill"
	"github.com/box-isolation/box/drill/image"
	"github.com/box-isolation/box/drill/verdicts"
	"github.com/box-isolation/box/fixtures/world"
	"github.com/box-isolation/box/internal/testenv"
	"github.com/box-isolation/box/stack"
	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/model"
)

// The system tier: whole drill runs in the hermetic world. The agent is the
// drill binary itself, built once for these tests.

// agent is the drill binary the runs push into their boxes.
func agent(t *testing.T) string { return testenv.Drill(t) }

func config(t *testing.T, mutations ...string) drill.Config {
	t.Helper()
	st, c := testenv.Incus(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, err := image.Ensure(ctx, c, image.DefaultAlias, image.Options{})
	require.NoError(t, err)
	ms, err := drill.SelectMutations(mutations)
	require.NoError(t, err)
	return drill.Config{
		Host:     &stack.Host{Incus: c, NetNS: st.Names.HostNS, Options: model.Options{DNS: []netip.Addr{world.Resolver}}},
		Topology: st.Topology(), Image: image.DefaultAlias, Agent: agent(t), Version: "test", Mutations: ms,
		Log: testWriter{t},
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// runAttempts is how many times run tries a drill whose clean run was
// inconclusive, or that had problems (a positive control late for its
// collection), never one whose clean run failed: on the shared 2-core machine an
// incusd exec or file push now and then outlasts its deadline, or a
// host-side witness its collection (docs/world.md, "The test tiers"). An
// inconclusive run proves nothing either way, so it is run again; every
// try is logged, and the last one is judged whole.
const runAttempts = 3

func run(t *testing.T, cfg drill.Config) *drill.Report {
	t.Helper()
	var rep *drill.Report
	for try := 1; ; try++ {
		ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
		var err error
		rep, err = drill.Run(ctx, cfg)
		cancel()
		require.NoError(t, err)
		cleanExit := rep.ExitCode
		if rep.Clean != nil {
			cleanExit = rep.Clean.ExitCode
		}
		if cleanExit != drill.ExitInconclusive && len(rep.Problems) == 0 || try == runAttempts {
			break
		}
		t.Logf("try %d of %d: %s; running the drill again", try, runAttempts, undecided(rep))
		assertNoDrillBoxes(t, cfg)
	}
	assert.Empty(t, rep.Problems)
	for _, cr := range rep.Claims {
		for _, r := range cr.Results {
			if r.Verdict != drill.Pass {
				t.Logf("%s %s %s -> %s: %s: %s; %s", r.Verdict, cr.ID, r.From, r.Target, r.Channel, r.Evidence, r.AtTarget)
			}
		}
	}
	assertNoDrillBoxes(t, cfg)
	return rep
}

// undecided says why a run is tried again: its problems, and the claims
// its clean run left inconclusive with the first such result of each (a
// clean run made inside a mutated one keeps only its counts).
func undecided(rep *drill.Report) string {
	var why []string
	for _, p := range rep.Problems {
		why = append(why, "problem: "+p)
	}
	if rep.Clean != nil {
		if rep.Clean.ExitCode == drill.ExitInconclusive {
			why = append(why, fmt.Sprintf("its clean run %s had %d claim(s) inconclusive", rep.Clean.RunID, rep.Clean.Summary.Inconclusive))
		}
		return strings.Join(why, "; ")
	}
	for _, cr := range rep.Claims {
		if cr.Verdict != drill.Inconclusive {
			continue
		}
		for _, r := range cr.Results {
			if r.Verdict == drill.Inconclusive {
				why = append(why, fmt.Sprintf("%s inconclusive: %s from %s to %s: %s", cr.ID, r.Channel, r.From, r.Target, r.Evidence))
				break
			}
		}
	}
	return strings.Join(why, "; ")
}

// baseline is a clean run that passed, for mutated runs to be compared
// with (drill.Config.Baseline): one for a test's mutations rather than one
// before each.
func baseline(t *testing.T, cfg drill.Config) *drill.Report {
	t.Helper()
	rep := run(t, cfg)
	require.Equal(t, drill.ExitOK, rep.ExitCode, "the clean run the mutated ones are compared with passes: %s", undecided(rep))
	return rep
}

func assertNoDrillBoxes(t *testing.T, cfg drill.Config) {
	t.Helper()
	left, err := cfg.Host.Incus.Instances().List(context.Background(), map[string]string{drill.TagDrill: "1"})
	require.NoError(t, err)
	assert.Empty(t, left, "the run removed its boxes")
}

func claim(t *testing.T, rep *drill.Report, id drill.ClaimID) drill.ClaimResult {
	t.Helper()
	for _, cr := range rep.Claims {
		if cr.ID == id {
			return cr
		}
	}
	t.Fatalf("claim %s missing from the report", id)
	return drill.ClaimResult{}
}

func claimVerdicts(rep *drill.Report) map[drill.ClaimID]drill.Verdict {
	out := map[drill.ClaimID]drill.Verdict{}
	for _, cr := range rep.Claims {
		out[cr.ID] = cr.Verdict
	}
	return out
}

// TestSystemDrillHolds: a full run on a healthy stack proves every claim.
func TestSystemDrillHolds(t *testing.T) {
	cfg := config(t)
	rep := run(t, cfg)
	require.Len(t, rep.Claims, len(drill.Catalogue), "every claim is in the report")
	for _, c := range drill.Catalogue {
		cr := claim(t, rep, c.ID)
		assert.Equal(t, drill.Pass, cr.Verdict, "%s", c.ID)
		assert.NotEmpty(t, cr.Results, "%s was exercised", c.ID)
	}
	assert.Equal(t, drill.ExitOK, rep.ExitCode)
	assert.Greater(t, rep.Summary.Probes, 40)
	for _, l := range drill.Layers() {
		assert.Equal(t, "present", rep.Stack.Layers[l], l)
	}
	assert.Empty(t, rep.Stack.Findings, "a run after a successful ensure verifies clean")
	// What the host really runs is aimed at, and judged after the filter.
	aimed := map[string]verdicts.Result{}
	for _, r := range claim(t, rep, "C-HOST").Results {
		aimed[r.Target] = r
	}
	for _, addr := range []string{"10.88.0.1", world.UplinkHost.Addr().String(), world.LANHostSide.Addr().String()} {
		for _, svc := range []string{"tcp/22", "tcp/3000", "udp/123"} {
			found := false
			for target, r := range aimed {
				if strings.Contains(target, " "+addr+" "+svc+" ") {
					found = true
					assert.Equal(t, drill.Pass, r.Verdict, "%s: %s", target, r.Evidence)
					assert.Equal(t, "listener", string(r.Provenance), target)
					assert.Contains(t, r.AtTarget, "nothing counted after the host's filter", target)
				}
			}
			assert.True(t, found, "the host's %s on %s is probed", svc, addr)
		}
	}
	// Names only the host's side knows are asked, and do not resolve.
	asked := map[string]verdicts.Result{}
	for _, r := range claim(t, rep, "C-NAMES").Results {
		asked[r.Target] = r
	}
	for _, n := range []string{world.HostOnlyNames[0].Name, world.InternalNames[0].Name, "PTR " + world.LANHostSide.Addr().String()} {
		r, ok := asked[n]
		if assert.True(t, ok, "%s is asked: %v", n, maps.Keys(asked)) {
			assert.Equal(t, drill.Pass, r.Verdict, "%s: %s", n, r.Evidence)
		}
	}
	for _, cr := range rep.Claims {
		var stackCh int
		for _, r := range cr.Results {
			if r.Channel == drill.ChannelStack {
				stackCh++
				assert.Equal(t, drill.Pass, r.Verdict, "%s stack channel: %s", cr.ID, r.Evidence)
			}
			if r.Witnessed && r.Channel != drill.ChannelStack {
				w := r.Obs
				require.NotNil(t, w, "%s %s", cr.ID, r.Channel)
				assert.Contains(t, r.AtTarget, "alive", "%s %s: every witness proved it was capturing", cr.ID, r.Channel)
			}
		}
		assert.Equal(t, 1, stackCh, "%s has its stack channel", cr.ID)
	}
	t.Logf("%d probes, probe phase %d ms (%.0f ms per probe), run %d ms", rep.Summary.Probes, rep.Summary.ProbePhaseMS, rep.Summary.MSPerProbe, rep.DurationMS)
}

// inHost runs a command in the world's host namespace, as an operator
// would type it there; incus talks to the world's incusd.
func inHost(t *testing.T, cfg drill.Config, args ...string) {
	t.Helper()
	st, _ := testenv.Incus(t)
	cmd := exec.Command("ip", append([]string{"netns", "exec", cfg.Host.NetNS}, args...)...)
	cmd.Env = append(os.Environ(), "INCUS_DIR="+st.IncusDir)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%v: %s", args, out)
}

// ensured converges the stack, so a test that breaks it by hand has it to
// break whatever ran before.
func ensured(t *testing.T, cfg drill.Config) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, err := cfg.Host.Ensure(ctx)
	require.NoError(t, err, "the stack is there to break")
}

// unguarded takes the guard off the bridge as an operator would (its tc
// qdisc deleted): the guard holds what a hole made by hand in the host
// firewall opens (TestSystemDrillCanFail, "the host firewall and the route
// table under the guard"), so a test of what the probes see through such
// a hole has it gone first. restoreAfter puts it back.
func unguarded(t *testing.T, cfg drill.Config) {
	t.Helper()
	unguardedIn(t, cfg.Host.NetNS)
}

// unguardedIn is unguarded in the host namespace ns (a cluster member's,
// another world's).
func unguardedIn(t *testing.T, ns string) {
	t.Helper()
	out, err := exec.Command("ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", model.Current.Network, "clsact").CombinedOutput()
	require.NoError(t, err, "deleting the guard's qdisc in %s: %s", ns, out)
}

// restoreAfter converges the stack back when the test ends, whatever it
// broke by hand, and checks it verifies clean.
func restoreAfter(t *testing.T, cfg drill.Config) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		_, err := cfg.Host.Ensure(ctx)
		require.NoError(t, err)
		v, err := cfg.Host.Verify(ctx)
		require.NoError(t, err)
		assert.Empty(t, v.Findings, "the stack is whole again")
	})
}

func claimOf(t *testing.T, id drill.ClaimID) drill.Claim {
	t.Helper()
	c, ok := drill.ClaimByID(id)
	require.True(t, ok, id)
	return c
}

// TestSystemHostModeRoutedWorld runs `drill run --host` as an operator
// would, aimed at the host namespace of a second namespace world built
// only for this test and shaped unlike the default one: its LAN sits
// behind a router on a routed /24 (10.40.0.0/24), reachable only through
// the host's route, with the LAN's resolver there. Host mode discovers its
// targets (the route, the resolver, samples) and watches them leave the
// host on its outward interfaces. With the stack whole, C-LAN passes; with
// L-ROUTE's table deleted by hand it fails naming the non-private routed
// prefix below, and with the ACL also narrowed so 10/8 is no longer
// dropped, naming the routed LAN's resolver. The router also routes a prefix that is in no
// private range (198.18.40.0/24, inside RFC 2544's benchmark range): the
// host routes it to its LAN, not by its default route, so discovery
// samples it and L-ROUTE must keep every box's packet to it on the host.
// A second non-private prefix (198.18.50.0/24) the host routes by its
// default route's own interface, to a second router on the uplink's
// segment: the out interface alone does not tell it from the internet, so
// only L-ROUTE's drop for that prefix keeps it; taking that one rule out
// by hand fails C-LAN naming it and nothing else.
// The test world is torn down after; BOX_ROUTED_WORLD names it ("bxr"
// by default), so that runs beside each other do not share one.
func TestSystemHostModeRoutedWorld(t *testing.T) {
	testenv.World(t)
	nftBin := testenv.Tool(t, "nft", "nftables")
	exe := agent(t)
	name := cmp.Or(os.Getenv("BOX_ROUTED_WORLD"), "bxr")
	cfg := world.Config{Name: name, Shape: world.ShapeRouted, Executable: exe}
	require.Empty(t, world.Leftovers(cfg), "a world named %s is already here: not this test's to tear down", name)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		require.NoError(t, world.Down(ctx, cfg, true, nil))
		assert.Empty(t, world.Leftovers(cfg), "the test world is gone")
	})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	st, err := world.Up(ctx, cfg, testWriter{t})
	require.NoError(t, err)
	// A fresh host: no probe image, no image server. The run imports its
	// own.
	imgs, err := incus.New(st.IncusSocket).Images().List(ctx)
	require.NoError(t, err)
	require.Empty(t, imgs, "the test world starts with no image")

	env := append(os.Environ(), "BOX_NETNS="+st.Names.HostNS, "INCUS_DIR="+st.IncusDir, "BOX_DNS="+world.Resolver.String())
	var firstStderr string
	hostRun := func(extra ...string) *drill.Report {
		t.Helper()
		// The canary must answer TCP, ICMP and DNS, like a public resolver:
		// the world's resolver does.
		args := append([]string{"run", "--host", "--canary", world.Resolver.String() + ":53", "--public-name", world.PublicName, "--claim", "C-LAN", "--claim", "C-INBOUND", "--json"}, extra...)
		cmd := exec.Command(exe, args...)
		cmd.Env = env
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if firstStderr == "" {
			firstStderr = stderr.String()
		}
		var exit *exec.ExitError
		if err != nil && !(errors.As(err, &exit) && exit.ExitCode() != drill.ExitUsage) {
			t.Fatalf("drill %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
		}
		var rep drill.Report
		require.NoError(t, json.Unmarshal(out, &rep), "%s", stderr.String())
		for _, cr := range rep.Claims {
			for _, r := range cr.Results {
				if r.Verdict != drill.Pass {
					t.Logf("%s %s %s -> %s: %s: %s; %s", r.Verdict, cr.ID, r.From, r.Target, r.Channel, r.Evidence, r.AtTarget)
				}
			}
		}
		return &rep
	}
	lanResults := func(rep *drill.Report) map[string][]verdicts.Result {
		out := map[string][]verdicts.Result{}
		for _, r := range claim(t, rep, "C-LAN").Results {
			out[r.TargetKey+" "+r.Target] = append(out[r.TargetKey+" "+r.Target], r)
		}
		return out
	}

	rep := hostRun()
	assert.Contains(t, firstStderr, "probe image "+image.DefaultAlias+" imported", "drill run --host imported its own probe image")
	assert.Equal(t, "host", rep.Environment.Mode)
	for _, id := range []drill.ClaimID{"C-EGRESS", "C-DNS", "C-DHCP", "C-LAN", "C-INBOUND"} {
		assert.Equal(t, drill.Pass, claim(t, rep, id).Verdict, "%s with the stack whole", id)
	}
	resolver, public := false, 0
	publicSample := world.RoutedPublicLAN.Masked().Addr().Next().String()
	for _, r := range claim(t, rep, "C-LAN").Results {
		if r.Channel == drill.ChannelStack {
			continue
		}
		if strings.Contains(r.Target, world.RoutedResolver.String()) {
			resolver = true
			assert.Equal(t, "resolver", string(r.Provenance))
		}
		if strings.HasSuffix(r.Target, " "+publicSample) {
			public++
			assert.Equal(t, "route", string(r.Provenance))
			assert.Equal(t, drill.Pass, r.Verdict, "%s %s: a box's packet to the non-private routed prefix stays on the host: %s; %s", r.Target, r.Channel, r.Evidence, r.AtTarget)
		}
		assert.Contains(t, r.AtTarget, "not seen leaving the host", "%s %s: %s", r.Target, r.Channel, r.Evidence)
	}
	uplinkSample := world.RoutedUplinkLAN.Masked().Addr().Next().String()
	sameNIC := 0
	for _, r := range claim(t, rep, "C-LAN").Results {
		if strings.HasSuffix(r.Target, " "+uplinkSample) {
			sameNIC++
			assert.Equal(t, "route", string(r.Provenance))
			assert.Equal(t, drill.Pass, r.Verdict, "%s %s: a box's packet to the prefix routed by the uplink stays on the host: %s; %s", r.Target, r.Channel, r.Evidence, r.AtTarget)
		}
	}
	assert.Equal(t, 3, sameNIC, "the prefix %s routed by the uplink is sampled at %s over TCP, UDP and ICMP: %v", world.RoutedUplinkLAN, uplinkSample, lanResults(rep))
	assert.True(t, resolver, "the routed LAN's resolver, from the host's resolv.conf, is a target: %v", lanResults(rep))
	assert.Equal(t, 3, public, "the non-private routed prefix %s is sampled at %s over TCP, UDP and ICMP: %v", world.RoutedPublicLAN, publicSample, lanResults(rep))
	fromLAN := 0
	for _, r := range claim(t, rep, "C-INBOUND").Results {
		if r.From == drill.PlaceLAN {
			fromLAN++
			assert.Contains(t, r.AtTarget, "the witness saw nothing", "%s %s: %s", r.Target, r.Channel, r.Evidence)
		}
	}
	assert.GreaterOrEqual(t, fromLAN, 8, "the LAN stand-in probes box-a from a source in each private range")
	assert.Equal(t, drill.ExitOK, rep.ExitCode, "problems %v, notes %v", rep.Problems, rep.Notes)

	failedAt := func(rep *drill.Report, addr string) bool {
		for _, r := range claim(t, rep, "C-LAN").Results {
			if r.Verdict == drill.Fail && r.Channel != drill.ChannelStack && strings.HasSuffix(r.Target, " "+addr) {
				return true
			}
		}
		return false
	}
	// The guard holds all that follows on its own (198.18/15 is a range
	// it never routes to, and the prefix routed by the uplink is not the
	// default route's gateway's): its qdisc deleted by hand first, so the
	// probes show each nft layer's part.
	unguardedIn(t, st.Names.HostNS)
	// L-ROUTE's drop for the prefix routed by the uplink taken out by
	// hand (its out interface is an uplink, so nothing else of L-ROUTE
	// stops it): C-LAN fails naming it, and only it.
	listed, err := exec.Command("ip", "netns", "exec", st.Names.HostNS, nftBin, "-a", "list", "chain", "inet", "box_route", "forward").CombinedOutput()
	require.NoError(t, err, "%s", listed)
	handle := ""
	for _, l := range strings.Split(string(listed), "\n") {
		if strings.Contains(l, "ip daddr "+world.RoutedUplinkLAN.String()+" drop") {
			_, handle, _ = strings.Cut(l, "# handle ")
		}
	}
	require.NotEmpty(t, handle, "L-ROUTE has a drop for %s:\n%s", world.RoutedUplinkLAN, listed)
	out, err := exec.Command("ip", "netns", "exec", st.Names.HostNS, nftBin, "delete", "rule", "inet", "box_route", "forward", "handle", strings.TrimSpace(handle)).CombinedOutput()
	require.NoError(t, err, "%s", out)
	rep = hostRun("--no-setup")
	assert.Equal(t, drill.Fail, claim(t, rep, "C-LAN").Verdict)
	assert.True(t, failedAt(rep, uplinkSample), "C-LAN fails naming %s, routed by the uplink itself: %v", uplinkSample, lanResults(rep))
	assert.False(t, failedAt(rep, publicSample), "the prefix routed to the LAN is still kept by the out-interface rule: %v", lanResults(rep))

	// L-ROUTE removed by hand: the ACL drops only the private ranges, so
	// the non-private routed prefix is reached, and the private LAN is
	// still not.
	cmd := exec.Command("ip", "netns", "exec", st.Names.HostNS, nftBin, "delete", "table", "inet", "box_route")
	out, err = cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	rep = hostRun("--no-setup")
	assert.Equal(t, drill.Fail, claim(t, rep, "C-LAN").Verdict)
	assert.True(t, failedAt(rep, publicSample), "C-LAN fails naming %s, the non-private routed prefix: %v", publicSample, lanResults(rep))
	assert.False(t, failedAt(rep, world.RoutedResolver.String()), "the ACL still keeps the routed LAN's resolver: %v", lanResults(rep))

	// And the ACL narrowed by hand: 10/8 is no longer dropped.
	cmd = exec.Command("ip", "netns", "exec", st.Names.HostNS, "incus", "network", "acl", "rule", "remove", "box-isolate", "egress", "destination=10.0.0.0/8")
	cmd.Env = env
	out, err = cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	rep = hostRun("--no-setup")
	assert.Equal(t, drill.Fail, claim(t, rep, "C-LAN").Verdict)
	assert.True(t, failedAt(rep, world.RoutedResolver.String()), "C-LAN fails naming the routed LAN's resolver: %v", lanResults(rep))

	// An ingress rule opened for the host's own LAN prefix only: the LAN
	// stand-in sends from inside it, so a probe (not only Verify) shows it.
	cmd = exec.Command("ip", "netns", "exec", st.Names.HostNS, "incus", "network", "acl", "rule", "add", "box-isolate", "ingress", "action=allow", "source="+world.RoutedHostSide.Masked().String())
	cmd.Env = env
	out, err = cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	rep = hostRun("--no-setup")
	fromLANPrefix, fromElsewhere := 0, 0
	for _, r := range claim(t, rep, "C-INBOUND").Results {
		if r.From != drill.PlaceLAN || r.Verdict != drill.Fail {
			continue
		}
		if strings.Contains(r.Target, " from 192.168.30.") {
			fromLANPrefix++
		} else {
			fromElsewhere++
		}
	}
	assert.Positive(t, fromLANPrefix, "a source in the host's LAN prefix %s reaches box-a through the rule", world.RoutedHostSide.Masked())
	assert.Zero(t, fromElsewhere, "no other source does")

	// Opened by hand: the ACL no longer drops what comes in.
	cmd = exec.Command("ip", "netns", "exec", st.Names.HostNS, "incus", "network", "set", "boxnet", "security.acls.default.ingress.action=allow")
	cmd.Env = env
	out, err = cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	rep = hostRun("--no-setup")
	inbound := 0
	for _, r := range claim(t, rep, "C-INBOUND").Results {
		if r.From == drill.PlaceLAN && r.Verdict == drill.Fail {
			inbound++
			assert.Contains(t, r.AtTarget, "the witness saw", r.Target)
		}
	}
	assert.Positive(t, inbound, "a LAN source reaches box-a through the host's forward path")
	out, err = exec.Command("ip", "netns", "list").CombinedOutput()
	require.NoError(t, err)
	assert.NotContains(t, string(out), "drl-", "the LAN stand-in is gone after the run")
}
