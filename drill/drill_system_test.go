package drill_test

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/drill"
	"github.com/box-isolation/box/drill/image"
	"github.com/box-isolation/box/fixtures/world"
	"github.com/box-isolation/box/internal/testenv"
	"github.com/box-isolation/box/stack"
	"github.com/box-isolation/box/stack/model"
	"github.com/box-isolation/box/templates"
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
	left, err := cfg.Host.Incus.Instances(context.Background(), map[string]string{drill.TagDrill: "1"})
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

func verdicts(rep *drill.Report) map[drill.ClaimID]drill.Verdict {
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
	aimed := map[string]drill.Result{}
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
	asked := map[string]drill.Result{}
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
			if r.Witness != nil && r.Channel != drill.ChannelStack {
				w := r.Obs
				require.NotNil(t, w, "%s %s", cr.ID, r.Channel)
				assert.Contains(t, r.AtTarget, "alive", "%s %s: every witness proved it was capturing", cr.ID, r.Channel)
			}
		}
		assert.Equal(t, 1, stackCh, "%s has its stack channel", cr.ID)
	}
	t.Logf("%d probes, probe phase %d ms (%.0f ms per probe), run %d ms", rep.Summary.Probes, rep.Summary.ProbePhaseMS, rep.Summary.MSPerProbe, rep.DurationMS)
}

// probeFailures lists a claim's failed results outside the stack channel:
// the probes' own proof, which is what a mutation must show (docs/claims.md, "Mutations").
func probeFailures(cr drill.ClaimResult) []drill.Result {
	var out []drill.Result
	for _, r := range cr.Results {
		if r.Verdict == drill.Fail && r.Channel != drill.ChannelStack {
			out = append(out, r)
		}
	}
	return out
}

// stackFailures lists a claim's failed stack-channel results.
func stackFailures(cr drill.ClaimResult) []drill.Result {
	var out []drill.Result
	for _, r := range cr.Results {
		if r.Verdict == drill.Fail && r.Channel == drill.ChannelStack {
			out = append(out, r)
		}
	}
	return out
}

// assertProvenByProbes: the mutation flipped the claim to fail through at
// least one probe channel, and the comparison with the clean run says so.
func assertProvenByProbes(t *testing.T, rep *drill.Report, id drill.ClaimID) {
	t.Helper()
	assertDetected(t, rep, id, drill.EvidenceProbes)
}

// assertDetected: the mutation flipped the claim to fail through the kind
// of evidence that must show its layer gone, and the comparison with the
// clean run says so.
func assertDetected(t *testing.T, rep *drill.Report, id drill.ClaimID, by drill.Evidence) {
	t.Helper()
	assert.Equal(t, drill.ExitViolated, rep.ExitCode)
	cr := claim(t, rep, id)
	assert.Equal(t, drill.Fail, cr.Verdict, id)
	assert.NotEmpty(t, probeFailures(cr), "%s fails through a probe channel, not only through Verify", id)
	require.NotNil(t, rep.Clean, "a mutation run is compared with a clean run")
	assert.Equal(t, drill.ExitOK, rep.Clean.ExitCode, "the clean run passed")
	require.NotEmpty(t, rep.MutationResults)
	for _, m := range rep.MutationResults {
		assert.True(t, m.Detected, "%s detected", m.Name)
		assert.Equal(t, by, m.DetectedBy, "%s detected by %s", m.Name, by)
		assert.Contains(t, m.Flipped, id)
		var changed bool
		for _, c := range m.Changed {
			assert.NotEqual(t, drill.ChannelStack, c.Channel, "the stack channel is no proof")
			if c.Claim == id && c.Clean == drill.Pass && c.Mutated == drill.Fail {
				changed = true
			}
		}
		assert.True(t, changed, "a probe of %s went from pass in the clean run to fail", id)
	}
}

// TestSystemDrillCanFail knocks out every layer the drill can mutate and
// expects the claims they back to flip to fail through probes, compared
// with one clean run made first (each mutated run's own restore is
// verified before the next); and a normal run to pass again.
func TestSystemDrillCanFail(t *testing.T) {
	base := baseline(t, config(t))
	for _, tc := range []struct {
		name      string
		mutations []string
		check     func(t *testing.T, rep *drill.Report)
	}{
		{"bridge drop and port isolation", []string{"bridge-drop", "port-isolation"}, func(t *testing.T, rep *drill.Report) {
			assertProvenByProbes(t, rep, "C-SIBLING")
			sawIt := false
			for _, r := range claim(t, rep, "C-SIBLING").Results {
				if r.Verdict == drill.Fail && strings.HasPrefix(r.AtTarget, "the witness saw") {
					sawIt = true
				}
			}
			assert.True(t, sawIt, "the peer's witness saw the frames")
			assert.Contains(t, rep.Stack.Layers["L-BRIDGEDROP"], "absent")
			assert.Contains(t, rep.Stack.Layers["L-PORTISO"], "absent")
		}},
		{"bridge drop only", []string{"bridge-drop"}, func(t *testing.T, rep *drill.Report) {
			sib := claim(t, rep, "C-SIBLING")
			assert.Empty(t, probeFailures(sib), "port isolation alone holds against every probe")
			assert.NotEmpty(t, stackFailures(sib), "but Verify finds the layer gone, and that fails the claim")
			assert.Equal(t, drill.ExitViolated, rep.ExitCode)
			require.Len(t, rep.MutationResults, 1)
			assert.False(t, rep.MutationResults[0].Detected, "no probe flipped: reported as redundant")
			assert.Contains(t, rep.Stack.Layers["L-BRIDGEDROP"], "absent")
			assert.Equal(t, "present", rep.Stack.Layers["L-PORTISO"])
		}},
		{"port isolation only", []string{"port-isolation"}, func(t *testing.T, rep *drill.Report) {
			sib := claim(t, rep, "C-SIBLING")
			assert.Empty(t, probeFailures(sib), "the bridge drop alone holds against every probe")
			assert.NotEmpty(t, stackFailures(sib), "but Verify finds the ports' isolation off, and that fails the claim")
			require.Len(t, rep.MutationResults, 1)
			assert.False(t, rep.MutationResults[0].Detected, "no probe flipped: reported as redundant")
			assert.Contains(t, rep.Stack.Layers["L-PORTISO"], "absent")
			assert.Equal(t, "present", rep.Stack.Layers["L-BRIDGEDROP"])
		}},
		{"host firewall", []string{"host-fw"}, func(t *testing.T, rep *drill.Report) {
			assertProvenByProbes(t, rep, "C-HOST")
			failed := map[string]bool{}
			for _, r := range probeFailures(claim(t, rep, "C-HOST")) {
				if strings.Contains(r.Target, world.UplinkHost.Addr().String()) {
					failed["uplink"] = true
					for _, svc := range []string{"tcp/22", "tcp/3000", "tcp/53", "udp/53"} {
						if strings.Contains(r.Target, svc) {
							failed[svc] = true
						}
					}
				}
			}
			assert.True(t, failed["uplink"], "C-HOST fails for the uplink address")
			for _, svc := range []string{"tcp/22", "tcp/3000", "tcp/53", "udp/53"} {
				assert.True(t, failed[svc], "the host's %s on the uplink address is reached: %v", svc, failed)
			}
			assert.ElementsMatch(t, []drill.ClaimID{"C-HOST", "C-NESTED"}, rep.MutationResults[0].Flipped, "the claims resting on the host firewall show it: the box's and its nested workload's")
			tierFlipped := false
			for _, c := range rep.MutationResults[0].Changed {
				tierFlipped = tierFlipped || (c.Claim == "C-TIER" && c.Clean == drill.Pass && c.Mutated == drill.Fail)
			}
			assert.True(t, tierFlipped, "box-t's host probes flip too, listed among the changes (C-TIER rests on the tier restriction, so they do not prove the layer)")
		}},
		{"hosts file", []string{"hosts-file"}, func(t *testing.T, rep *drill.Report) {
			leaked := map[string]bool{}
			for _, r := range probeFailures(claim(t, rep, "C-NAMES")) {
				leaked[r.Target] = true
			}
			assert.True(t, leaked[world.HostOnlyNames[0].Name], "the host-only name in the hosts file leaks: %v", leaked)
			assert.Contains(t, rep.MutationResults[0].Flipped, drill.ClaimID("C-NAMES"))
		}},
		{"acl", []string{"acl"}, func(t *testing.T, rep *drill.Report) {
			assertProvenByProbes(t, rep, "C-LAN")
			assert.Contains(t, rep.Stack.Layers["L-ACL"], "absent")
			// The LAN hosts are routed elsewhere than the default way, so
			// L-ROUTE still holds them; the modem, private and behind the
			// default route, is the ACL's alone.
			for _, r := range probeFailures(claim(t, rep, "C-LAN")) {
				assert.True(t, strings.HasPrefix(r.Target, world.ModemRole+" "), "only the modem is reached: %s %s", r.Target, r.Channel)
			}
		}},
		{"route", []string{"route"}, func(t *testing.T, rep *drill.Report) {
			assertProvenByProbes(t, rep, "C-LAN")
			assert.Contains(t, rep.Stack.Layers["L-ROUTE"], "absent")
			// The ACL still holds every private address; the LAN host
			// outside the private ranges is L-ROUTE's alone.
			failed := 0
			for _, r := range probeFailures(claim(t, rep, "C-LAN")) {
				failed++
				assert.True(t, strings.HasPrefix(r.Target, "lan-bench "), "only the non-private LAN host is reached: %s %s", r.Target, r.Channel)
			}
			assert.Equal(t, 3, failed, "lan-bench over TCP, UDP and ICMP")
		}},
		{"dns managed", []string{"dns-managed"}, func(t *testing.T, rep *drill.Report) {
			assertProvenByProbes(t, rep, "C-NAMES")
		}},
		{"ipv6 on", []string{"ipv6-on"}, func(t *testing.T, rep *drill.Report) {
			assertProvenByProbes(t, rep, "C-V6")
		}},
		{"pinning", []string{"pinning"}, func(t *testing.T, rep *drill.Report) {
			assertProvenByProbes(t, rep, "C-SPOOF")
			assert.ElementsMatch(t, []drill.ClaimID{"C-SPOOF", "C-NESTED"}, rep.MutationResults[0].Flipped, "pinning is a layer of its own: no sibling probe flips, the lies and the nested MAC do")
			nestedMAC := false
			for _, r := range probeFailures(claim(t, rep, "C-NESTED")) {
				nestedMAC = nestedMAC || r.From == drill.PlaceNestMAC
			}
			assert.True(t, nestedMAC, "a frame with the nested workload's own MAC got past the box's port")
			poisoned, hostSaw, returnLost := false, false, false
			for _, r := range probeFailures(claim(t, rep, "C-SPOOF")) {
				poisoned = poisoned || strings.Contains(r.Evidence, "(box-b is ")
				hostSaw = hostSaw || (r.Channel == "ipv4-source" && strings.Contains(r.Evidence, "the target saw the traffic arrive"))
				returnLost = returnLost || r.Channel == "return-traffic"
			}
			assert.True(t, poisoned, "the host's neighbour entry for box-b, at box-a's MAC, is the evidence")
			assert.True(t, hostSaw, "a forged source reached the host's bridge")
			assert.True(t, returnLost, "box-b's return traffic went missing")
			assert.Contains(t, rep.Stack.Layers["L-PIN"], "absent")
		}},
		{"tier", []string{"tier"}, func(t *testing.T, rep *drill.Report) {
			assertDetected(t, rep, "C-TIER", drill.EvidenceRequests)
			assert.Equal(t, []drill.ClaimID{"C-TIER"}, rep.MutationResults[0].Flipped, "only the granted user's attempts flip")
			allowed := map[string]bool{}
			for _, r := range probeFailures(claim(t, rep, "C-TIER")) {
				if r.Channel == drill.ChannelRestriction {
					allowed[r.ID] = true
				}
			}
			assert.True(t, allowed["t-nic-decoy"], "the user attached a NIC on another managed network: %v", allowed)
			assert.False(t, allowed["t-proxy"] || allowed["t-disk-host"] || allowed["t-privileged"], "the other restrictions still hold: %v", allowed)
		}},
		{"egress allowlist gone", []string{"egress"}, func(t *testing.T, rep *drill.Report) {
			assertProvenByProbes(t, rep, "C-ALLOW")
			assert.Equal(t, []drill.ClaimID{"C-ALLOW"}, rep.MutationResults[0].Flipped, "only the allowlisted box's probes flip")
			reached := map[string]bool{}
			for _, r := range probeFailures(claim(t, rep, "C-ALLOW")) {
				reached[r.TargetKey] = true
			}
			assert.True(t, reached["internet-2"], "box-w reached the second canary: %v", reached)
			assert.True(t, reached["resolver"], "box-w reached a public resolver straight: %v", reached)
			assert.False(t, reached["lan-rebind"], "the allowed name that points at the LAN stays unreachable without the allowlist too (the ACL): %v", reached)
			assert.Contains(t, rep.Stack.Layers["L-EGRESS"], "absent")
		}},
		// One chain of the egress table at a time: each shown by its own
		// probes of C-ALLOW's, and by nothing of any other claim.
		{"egress dns chain gone", []string{"egress-dns"}, func(t *testing.T, rep *drill.Report) {
			assertProvenByProbes(t, rep, "C-ALLOW")
			assert.Equal(t, []drill.ClaimID{"C-ALLOW"}, rep.MutationResults[0].Flipped)
			tunnel := 0
			for _, r := range probeFailures(claim(t, rep, "C-ALLOW")) {
				if r.Channel == drill.ChannelDNS {
					tunnel++
					assert.Contains(t, r.Evidence, "DNS tunnel")
				}
			}
			assert.Equal(t, 3, tunnel, "box-w's three questions reached the witness nameserver")
		}},
		{"egress names chain gone", []string{"egress-names"}, func(t *testing.T, rep *drill.Report) {
			assertProvenByProbes(t, rep, "C-ALLOW")
			assert.Equal(t, []drill.ClaimID{"C-ALLOW"}, rep.MutationResults[0].Flipped)
			ch := map[drill.Channel]bool{}
			for _, r := range probeFailures(claim(t, rep, "C-ALLOW")) {
				ch[r.Channel] = true
			}
			assert.True(t, ch[drill.ChannelTLS] && ch[drill.ChannelHTTP], "another TLS server name and HTTP Host reached the canary's address: %v", ch)
			assert.False(t, ch[drill.ChannelDNS] || ch[drill.ChannelQUIC], "nothing the proxy does not decide: %v", ch)
		}},
		{"egress forward chain gone", []string{"egress-forward"}, func(t *testing.T, rep *drill.Report) {
			assertProvenByProbes(t, rep, "C-ALLOW")
			assert.Equal(t, []drill.ClaimID{"C-ALLOW"}, rep.MutationResults[0].Flipped)
			ch := map[drill.Channel]bool{}
			for _, r := range probeFailures(claim(t, rep, "C-ALLOW")) {
				ch[r.Channel] = true
			}
			assert.True(t, ch[drill.ChannelQUIC] && ch[drill.ChannelTCP] && ch[drill.ChannelUDP], "QUIC, the second canary by address and the resolver straight: %v", ch)
			assert.False(t, ch[drill.ChannelDNS] || ch[drill.ChannelTLS], "what the resolver and the proxy decide holds: %v", ch)
		}},
		{"door widened by hand", []string{"door-wide"}, func(t *testing.T, rep *drill.Report) {
			assertProvenByProbes(t, rep, "C-EXPOSE")
			lan := false
			for _, r := range probeFailures(claim(t, rep, "C-EXPOSE")) {
				lan = lan || r.From == "lan"
			}
			assert.True(t, lan, "the LAN reached box-a through the widened door")
			assert.NotEmpty(t, stackFailures(claim(t, rep, "C-FLEET")), "and the census names the door")
		}},
		{"dhcp open", []string{"dhcp-open"}, func(t *testing.T, rep *drill.Report) {
			assertProvenByProbes(t, rep, "C-SPOOF")
			assert.Equal(t, []drill.ClaimID{"C-SPOOF"}, rep.MutationResults[0].Flipped, "only the DHCP lies flip")
			failed := map[drill.Channel]bool{}
			for _, r := range probeFailures(claim(t, rep, "C-SPOOF")) {
				failed[r.Channel] = true
			}
			for _, ch := range []drill.Channel{drill.ChannelDHCPRelease, drill.ChannelDHCPDecline, drill.ChannelDHCPStarve, drill.ChannelDHCPClientID, drill.ChannelDHCPHType} {
				assert.True(t, failed[ch], "the server took the %s lie: %v", ch, failed)
			}
			assert.Contains(t, rep.Stack.Layers["L-DHCP"], "absent")
		}},
		{"egress broken", []string{"nat-off"}, func(t *testing.T, rep *drill.Report) {
			// One exit rule: a failed baseline is a violated claim (exit 1),
			// and the claims it leaves unjudgeable are inconclusive.
			assertProvenByProbes(t, rep, "C-EGRESS")
			for _, id := range []drill.ClaimID{"C-SIBLING", "C-HOST", "C-LAN", "C-INBOUND"} {
				assert.Equal(t, drill.Inconclusive, claim(t, rep, id).Verdict, "%s is not passed on a broken baseline", id)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := config(t, tc.mutations...)
			cfg.Baseline = base
			rep := run(t, cfg)
			assert.Equal(t, tc.mutations, rep.Mutations)
			tc.check(t, rep)
			t.Logf("verdicts: %v; mutation results: %+v", verdicts(rep), rep.MutationResults)
			// Restored and verified by the run itself.
			v, err := cfg.Host.Verify(context.Background())
			require.NoError(t, err)
			assert.Empty(t, v.Findings, "the stack is restored after the mutation")
		})
	}
	rep := run(t, config(t))
	assert.Equal(t, drill.ExitOK, rep.ExitCode, "a normal run passes again: %v", verdicts(rep))
}

// hostLied says a C-SPOOF result failed on the host's own state: its
// neighbour entry for box-b at another MAC, or the bridge's forwarding
// database holding box-b's MAC on another port (not the summary of what
// it held, which every result carries).
func hostLied(r drill.Result) bool {
	return strings.Contains(r.Evidence, "(box-b is ") || strings.Contains(r.Evidence, "the bridge learned box-b's MAC on another port")
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

// TestSystemNamesLANUpstream: a stack whose resolver forwards to the LAN's
// (an operator's BOX_DNS pointing at the office resolver) answers the LAN's
// internal names to every box, and C-NAMES says so.
func TestSystemNamesLANUpstream(t *testing.T) {
	cfg := config(t)
	restoreAfter(t, cfg)
	host := *cfg.Host
	host.Options.DNS = []netip.Addr{world.LANResolver}
	cfg.Host = &host
	cfg.Claims = []drill.Claim{claimOf(t, "C-NAMES")}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	rep, err := drill.Run(ctx, cfg)
	require.NoError(t, err)
	leaked := map[string]bool{}
	for _, r := range probeFailures(claim(t, rep, "C-NAMES")) {
		leaked[r.Target] = true
	}
	assert.True(t, leaked[world.InternalNames[0].Name], "an internal name of the LAN zone leaks: %v", leaked)
	assert.Equal(t, drill.Pass, claim(t, rep, "C-DNS").Verdict, "the public name still resolves (the LAN resolver answers it)")
	assert.Equal(t, drill.ExitViolated, rep.ExitCode)
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

// TestSystemNoSetupDrift: with --no-setup, a stack broken by hand fails
// the claims resting on what is broken, whatever the drill's own fresh
// boxes happen to show.
func TestSystemNoSetupDrift(t *testing.T) {
	t.Run("bridge drop table deleted", func(t *testing.T) {
		cfg := config(t)
		restoreAfter(t, cfg)
		ensured(t, cfg)
		inHost(t, cfg, "nft", "delete", "table", "bridge", model.Current.NFTTable)
		cfg.NoSetup = true
		rep := run(t, cfg)
		assert.Equal(t, drill.ExitViolated, rep.ExitCode)
		sib := claim(t, rep, "C-SIBLING")
		assert.Equal(t, drill.Fail, sib.Verdict)
		fails := stackFailures(sib)
		require.NotEmpty(t, fails, "C-SIBLING fails through the stack channel")
		assert.Contains(t, fails[0].Evidence, "bridge")
		assert.Empty(t, probeFailures(sib), "port isolation still stops the fresh boxes' probes: only Verify sees the hole")
		assert.Equal(t, drill.Pass, claim(t, rep, "C-HOST").Verdict, "claims not resting on the layer are untouched")
	})
	t.Run("DHCP restriction dropped from raw.dnsmasq by hand", func(t *testing.T) {
		cfg := config(t)
		restoreAfter(t, cfg)
		ensured(t, cfg)
		// As an operator types it: the settings without the two DHCP
		// lines, through a shell's $(...).
		inHost(t, cfg, "sh", "-c", `incus network set `+model.Current.Network+` raw.dnsmasq="$(incus network get `+model.Current.Network+` raw.dnsmasq | grep -v '^dhcp-ignore')"`)
		cfg.NoSetup = true
		cfg.Claims = []drill.Claim{claimOf(t, "C-SPOOF")}
		rep := run(t, cfg)
		sp := claim(t, rep, "C-SPOOF")
		assert.Equal(t, drill.Fail, sp.Verdict)
		assert.NotEmpty(t, stackFailures(sp), "Verify sees the lines gone")
		channels := map[drill.Channel]bool{}
		for _, r := range probeFailures(sp) {
			channels[r.Channel] = true
		}
		assert.True(t, channels[drill.ChannelDHCPClientID], "the server leased to a made-up client identifier: %v", channels)
		assert.False(t, channels[drill.ChannelDHCPRelease] || channels[drill.ChannelDHCPStarve], "the pin table still stops the messages naming another hardware address: %v", channels)
	})
	t.Run("ARP let past the pins by hand", func(t *testing.T) {
		cfg := config(t)
		restoreAfter(t, cfg)
		ensured(t, cfg)
		// What an operator types while chasing an ARP problem: every ARP
		// frame accepted ahead of the pin rules. IPv4 stays pinned.
		inHost(t, cfg, "nft", "insert", "rule", "bridge", model.Current.NFTTable+"_pin", "prerouting", "ether", "type", "arp", "accept")
		cfg.NoSetup = true
		cfg.Claims = []drill.Claim{claimOf(t, "C-SPOOF"), claimOf(t, "C-SIBLING")}
		rep := run(t, cfg)
		sp := claim(t, rep, "C-SPOOF")
		assert.Equal(t, drill.Fail, sp.Verdict)
		assert.NotEmpty(t, stackFailures(sp), "Verify sees the rule")
		channels := map[drill.Channel]bool{}
		poisoned := false
		for _, r := range probeFailures(sp) {
			channels[r.Channel] = true
			poisoned = poisoned || hostLied(r)
		}
		assert.True(t, channels["arp"], "a forged ARP reaches the host: %v", channels)
		assert.True(t, channels["mac"], "so does one from box-b's MAC: %v", channels)
		assert.False(t, channels["ipv4-source"], "IPv4 is still pinned: %v", channels)
		assert.True(t, poisoned, "the host's neighbour table (or the bridge's forwarding database) is the evidence")
		assert.Equal(t, drill.Pass, claim(t, rep, "C-SIBLING").Verdict, "the sibling layers are apart")
	})
	t.Run("ARP let past the pins by hand, seen from a nested workload", func(t *testing.T) {
		cfg := config(t)
		restoreAfter(t, cfg)
		ensured(t, cfg)
		inHost(t, cfg, "nft", "insert", "rule", "bridge", model.Current.NFTTable+"_pin", "prerouting", "ether", "type", "arp", "accept")
		cfg.NoSetup = true
		cfg.Claims = []drill.Claim{claimOf(t, "C-NESTED")}
		rep := run(t, cfg)
		nested := claim(t, rep, "C-NESTED")
		assert.Equal(t, drill.Fail, nested.Verdict)
		fromMAC, fromNAT := false, false
		for _, r := range probeFailures(nested) {
			fromMAC = fromMAC || (r.From == drill.PlaceNestMAC && r.Channel == drill.ChannelARP)
			fromNAT = fromNAT || r.From == drill.PlaceNestNAT
		}
		assert.True(t, fromMAC, "the nested workload's own MAC reached the host's bridge by ARP")
		assert.False(t, fromNAT, "what leaves by the box's NAT is still the box's, and pinned")
	})
	t.Run("ipv6 on at the bridge", func(t *testing.T) {
		cfg := config(t)
		restoreAfter(t, cfg)
		ensured(t, cfg)
		inHost(t, cfg, "incus", "network", "set", model.Current.Network, "ipv6.address=fd42:b0c6::1/64", "ipv6.nat=true")
		cfg.NoSetup = true
		rep := run(t, cfg)
		assert.Equal(t, drill.ExitViolated, rep.ExitCode)
		v6 := claim(t, rep, "C-V6")
		assert.Equal(t, drill.Fail, v6.Verdict)
		assert.NotEmpty(t, stackFailures(v6), "Verify sees IPv6 on the bridge")
		pf := probeFailures(v6)
		assert.NotEmpty(t, pf, "and so do the probes")
		for _, r := range pf {
			t.Logf("C-V6 probe %s from %s: %s; %s", r.Channel, r.From, r.Evidence, r.AtTarget)
		}
	})
	t.Run("ssh and DNS let in by hand", func(t *testing.T) {
		cfg := config(t)
		restoreAfter(t, cfg)
		ensured(t, cfg)
		// What an operator types to reach a box's sshd "just for now", and
		// the DNS accept as the stack had it before it was scoped.
		inHost(t, cfg, "nft", "insert", "rule", "inet", model.Current.NFTTable, "input", "iifname", model.Current.Network, "tcp", "dport", "22", "accept")
		inHost(t, cfg, "nft", "insert", "rule", "inet", model.Current.NFTTable, "input", "iifname", model.Current.Network, "udp", "dport", "53", "accept")
		cfg.NoSetup = true
		cfg.Claims = []drill.Claim{claimOf(t, "C-HOST")}
		rep := run(t, cfg)
		hc := claim(t, rep, "C-HOST")
		assert.NotEmpty(t, stackFailures(hc), "Verify sees the rules")
		reached := map[string]bool{}
		for _, r := range probeFailures(hc) {
			reached[r.Target] = strings.Contains(r.AtTarget, "counted after the host's filter")
		}
		uplink := world.UplinkHost.Addr().String()
		for _, svc := range []string{"tcp/22 (listener", "udp/53 (DNS"} {
			found := false
			for target, counted := range reached {
				if strings.Contains(target, " "+uplink+" "+svc) {
					found = true
					assert.True(t, counted, "%s: the counting chain saw it pass the filter", target)
				}
			}
			assert.True(t, found, "the probe of %s on the uplink fails: %v", svc, reached)
		}
	})
	t.Run("the host firewall's final drop deleted by hand", func(t *testing.T) {
		cfg := config(t)
		restoreAfter(t, cfg)
		st, _ := testenv.Incus(t)
		ensured(t, cfg)
		cmd := exec.Command("ip", "netns", "exec", cfg.Host.NetNS, "nft", "-a", "list", "chain", "inet", model.Current.NFTTable, "input")
		cmd.Env = append(os.Environ(), "INCUS_DIR="+st.IncusDir)
		out, err := cmd.Output()
		require.NoError(t, err)
		handle := ""
		for _, line := range strings.Split(string(out), "\n") {
			if f := strings.Fields(line); len(f) == 6 && f[2] == "drop" && f[3] == "#" && f[4] == "handle" {
				handle = f[5] // iifname "boxnet" drop # handle N
			}
		}
		require.NotEmpty(t, handle, "the final drop in:\n%s", out)
		inHost(t, cfg, "nft", "delete", "rule", "inet", model.Current.NFTTable, "input", "handle", handle)
		cfg.NoSetup = true
		cfg.Claims = []drill.Claim{claimOf(t, "C-HOST")}
		rep := run(t, cfg)
		failed := map[string]bool{}
		for _, r := range probeFailures(claim(t, rep, "C-HOST")) {
			for _, svc := range []string{"tcp/22", "tcp/3000"} {
				if strings.Contains(r.Target, world.UplinkHost.Addr().String()+" "+svc) {
					failed[svc] = true
				}
			}
		}
		assert.Equal(t, map[string]bool{"tcp/22": true, "tcp/3000": true}, failed, "the host's ssh stand-in and developer server are reached on the uplink")
		assert.NotEmpty(t, stackFailures(claim(t, rep, "C-HOST")), "Verify sees the rule gone")
	})
	t.Run("a hosts-file name, no-hosts taken out by hand", func(t *testing.T) {
		cfg := config(t)
		restoreAfter(t, cfg)
		ensured(t, cfg)
		st, _ := testenv.Incus(t)
		// Appended in place: the file is bind-mounted into incusd's view.
		hosts := st.Names.HostsFile()
		before, err := os.ReadFile(hosts)
		require.NoError(t, err)
		t.Cleanup(func() { require.NoError(t, os.WriteFile(hosts, before, 0o644)) })
		require.NoError(t, os.WriteFile(hosts, append(before, []byte("10.20.0.99 buildcache.corp.internal buildcache\n")...), 0o644))
		hup := func() {
			v, err := cfg.Host.Verify(context.Background())
			require.NoError(t, err)
			require.NotZero(t, v.DnsmasqPID)
			require.NoError(t, syscall.Kill(v.DnsmasqPID, syscall.SIGHUP), "dnsmasq re-reads its hosts files")
		}
		hup()
		cfg.NoSetup = true
		cfg.Claims = []drill.Claim{claimOf(t, "C-NAMES")}
		rep := run(t, cfg)
		asked := false
		for _, r := range claim(t, rep, "C-NAMES").Results {
			if r.Target == "buildcache.corp.internal." {
				asked = true
				assert.Equal(t, drill.Pass, r.Verdict, "with no-hosts the name stays the host's: %s", r.Evidence)
			}
		}
		assert.True(t, asked, "the name written into the hosts file is asked")

		n, _, err := cfg.Host.Incus.Network(context.Background(), model.Current.Network)
		require.NoError(t, err)
		inHost(t, cfg, "incus", "network", "set", model.Current.Network, "raw.dnsmasq="+strings.Replace(n.Config["raw.dnsmasq"], "no-hosts\n", "", 1))
		rep = run(t, cfg)
		leaked := map[string]bool{}
		for _, r := range probeFailures(claim(t, rep, "C-NAMES")) {
			leaked[r.Target] = true
		}
		assert.True(t, leaked["buildcache.corp.internal."], "the name leaks: %v", leaked)
		assert.True(t, leaked["PTR 10.20.0.99"], "and its PTR: %v", leaked)
		assert.NotEmpty(t, stackFailures(claim(t, rep, "C-NAMES")), "Verify sees no-hosts gone")
	})

	t.Run("a port forwarded to the LAN, the ACL detached by hand", func(t *testing.T) {
		cfg := config(t)
		restoreAfter(t, cfg)
		ensured(t, cfg)
		lan := world.LANHosts[2] // on the LAN link: reachable from the host
		inHost(t, cfg, "nft", "add table ip portfwd; add chain ip portfwd prerouting { type nat hook prerouting priority dstnat; }; "+
			"add rule ip portfwd prerouting tcp dport 2222 dnat to "+lan.Addr.String()+":"+strconv.Itoa(world.LANTCPPort))
		t.Cleanup(func() { inHost(t, cfg, "nft", "delete", "table", "ip", "portfwd") })
		cfg.NoSetup = true
		cfg.Claims = []drill.Claim{claimOf(t, "C-HOST")}
		forwarded := func(rep *drill.Report) []drill.Result {
			var out []drill.Result
			for _, r := range claim(t, rep, "C-HOST").Results {
				if r.Provenance == "forward" {
					out = append(out, r)
				}
			}
			return out
		}
		rep := run(t, cfg)
		fw := forwarded(rep)
		require.NotEmpty(t, fw, "the forwarded port is a target")
		for _, r := range fw {
			assert.Equal(t, drill.Pass, r.Verdict, "%s: the ACL drops what the forward sends to the LAN: %s", r.Target, r.Evidence)
			assert.Contains(t, r.AtTarget, "nothing counted")
		}

		inHost(t, cfg, "incus", "network", "unset", model.Current.Network, "security.acls")
		// L-ROUTE still holds: the forward sends to the LAN, which is not
		// the way of the host's default route.
		rep = run(t, cfg)
		fw = forwarded(rep)
		require.NotEmpty(t, fw)
		for _, r := range fw {
			assert.Equal(t, drill.Pass, r.Verdict, "%s: with the ACL detached L-ROUTE drops what the forward sends to the LAN: %s", r.Target, r.Evidence)
		}
		inHost(t, cfg, "nft", "delete", "table", "inet", model.Current.NFTTable+"_route")
		rep = run(t, cfg)
		failed := 0
		for _, r := range forwarded(rep) {
			if r.Verdict == drill.Fail {
				failed++
				assert.Contains(t, r.AtTarget, "counted after the host's filter", r.Target)
			}
		}
		assert.Positive(t, failed, "without the ACL and L-ROUTE the box reaches the LAN host through the forward: %v", forwarded(rep))
	})

}

// TestSystemWitnessControlSuppressed: with the host's control frames
// dropped on the bridge, the boxes' witnesses cannot prove they were
// capturing, and their probes are inconclusive, never passed.
func TestSystemWitnessControlSuppressed(t *testing.T) {
	cfg := config(t)
	cfg.Claims = []drill.Claim{claimOf(t, "C-SIBLING")}
	table := "drilltest"
	inHost(t, cfg, "nft", "add", "table", "bridge", table)
	t.Cleanup(func() { inHost(t, cfg, "nft", "delete", "table", "bridge", table) })
	inHost(t, cfg, "nft", "add", "chain", "bridge", table, "out", "{ type filter hook output priority 0 ; }")
	inHost(t, cfg, "nft", "add", "rule", "bridge", table, "out", "ether", "type", "0x88b5", "drop")

	rep := run(t, cfg)
	assert.Equal(t, drill.ExitInconclusive, rep.ExitCode)
	sib := claim(t, rep, "C-SIBLING")
	assert.Equal(t, drill.Inconclusive, sib.Verdict)
	n := 0
	for _, r := range sib.Results {
		if r.Channel == drill.ChannelStack {
			continue
		}
		n++
		assert.Equal(t, drill.Inconclusive, r.Verdict, "%s %s", r.Channel, r.Target)
		assert.Contains(t, r.Evidence, "positive control", "%s %s", r.Channel, r.Target)
	}
	assert.Greater(t, n, 8)
}

// TestSystemKilledRunIsCleanedUp: a run killed half-way leaves its boxes;
// the next run removes them first and passes.
func TestSystemKilledRunIsCleanedUp(t *testing.T) {
	cfg := config(t)
	cmd := exec.Command(cfg.Agent, "run", "--claim", "C-SIBLING")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	require.NoError(t, cmd.Start())
	killed := false
	deadline := time.Now().Add(90 * time.Second)
	for time.Now().Before(deadline) {
		insts, err := cfg.Host.Incus.Instances(context.Background(), map[string]string{drill.TagDrill: "1"})
		require.NoError(t, err)
		if len(insts) >= 2 {
			require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
			killed = true
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	cmd.Wait() //nolint:errcheck
	require.True(t, killed, "the first run never minted its boxes")
	left, err := cfg.Host.Incus.Instances(context.Background(), map[string]string{drill.TagDrill: "1"})
	require.NoError(t, err)
	require.NotEmpty(t, left, "the killed run left boxes behind (nothing to clean up otherwise)")

	rep := run(t, cfg)
	assert.Equal(t, drill.ExitOK, rep.ExitCode, "%v", verdicts(rep))
}

// TestSystemFailureAfterMintCleansUp: a run that fails once its boxes
// exist (here: the agent cannot be pushed) returns the error, does not
// panic, and removes its boxes.
func TestSystemFailureAfterMintCleansUp(t *testing.T) {
	cfg := config(t)
	cfg.Agent = filepath.Join(t.TempDir(), "no-such-agent")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rep, err := drill.Run(ctx, cfg)
	require.Error(t, err)
	assert.Nil(t, rep)
	assert.Contains(t, err.Error(), "agent")
	assertNoDrillBoxes(t, cfg)
}

// TestSystemBridgeNetfilterOn measures a fact of docs/world.md, "These machines": with br_netfilter's
// bridge-nf-call-* on in the host namespace, bridged IPv4 and IPv6 pass
// the inet hooks, so with both sibling layers knocked out the ACL still
// stops IPv4 between boxes and L-ROUTE's forward drop IPv6, while ARP gets
// through. The report says which way the world was.
func TestSystemBridgeNetfilterOn(t *testing.T) {
	cfg := config(t, "bridge-drop", "port-isolation")
	cfg.Claims = []drill.Claim{claimOf(t, "C-SIBLING")}
	set := func(v string) {
		t.Helper()
		require.NoError(t, world.Do(cfg.Host.NetNS, func() error {
			for _, k := range []string{"iptables", "ip6tables", "arptables"} {
				if err := os.WriteFile("/proc/sys/net/bridge/bridge-nf-call-"+k, []byte(v), 0o644); err != nil {
					return err
				}
			}
			return nil
		}))
	}
	set("1")
	t.Cleanup(func() { set("0") })

	rep := run(t, cfg)
	assert.True(t, rep.Environment.BridgeNetfilter, "the report records bridge netfilter on")
	got := map[drill.Channel]drill.Verdict{}
	for _, r := range claim(t, rep, "C-SIBLING").Results {
		if r.TargetKey == string(drill.PlaceB) && !strings.HasPrefix(r.Target, "every peer") {
			got[r.Channel] = r.Verdict
		}
	}
	assert.Equal(t, map[drill.Channel]drill.Verdict{
		"arp":  drill.Fail,                                       // below the inet hooks: through
		"icmp": drill.Pass, "tcp": drill.Pass, "udp": drill.Pass, // the ACL's 10/8 drop sees bridged IPv4
		// L-ROUTE's forward drop sees bridged IPv6 too: its out-interface
		// is a bridge port, not an uplink (before L-ROUTE it got through).
		"icmpv6-link-local": drill.Pass,
	}, got)
}

func claimOf(t *testing.T, id drill.ClaimID) drill.Claim {
	t.Helper()
	c, ok := drill.ClaimByID(id)
	require.True(t, ok, id)
	return c
}

// TestSystemDrillOnTemplateBoxes: the drill on the boxes people use. Its
// probe boxes are minted as box new mints the claude template's, from
// images:debian/12/cloud pulled through the world's image server, each
// provisioned (cloud-init ran the template's user-data, installed the
// agent from the stand-ins and wrote the ready marker) before the agent
// is pushed; every claim holds there, the discovery multicast Debian would
// send among the probes.
func TestSystemDrillOnTemplateBoxes(t *testing.T) {
	cfg := config(t)
	st := testenv.World(t)
	if st.DebianImage == "" {
		testenv.Unavailable(t, "needs the world's Debian image: run `bin/drill world image --debian` (minutes, once per machine)")
	}
	tpl, err := templates.Get("claude")
	require.NoError(t, err)
	cfg.Template, cfg.Image = tpl, tpl.Image
	cfg.Host.IncusConfigDir = st.IncusConf
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	start := time.Now()
	rep, err := drill.Run(ctx, cfg)
	require.NoError(t, err)
	t.Logf("a run on the claude template's boxes took %s (probe phase %d ms, %d probes)", time.Since(start).Round(time.Second), rep.Summary.ProbePhaseMS, rep.Summary.Probes)
	for _, cr := range rep.Claims {
		assert.Equal(t, drill.Pass, cr.Verdict, "%s on Debian boxes", cr.ID)
	}
	assert.Equal(t, drill.ExitOK, rep.ExitCode)
	assert.Equal(t, "claude", rep.Environment.Template)
	assert.Equal(t, "images:debian/12/cloud", rep.Environment.Image)
	multicast := 0
	for _, r := range claim(t, rep, "C-SIBLING").Results {
		if r.Channel == drill.ChannelMDNS || r.Channel == drill.ChannelLLMNR || r.Channel == drill.ChannelSSDP {
			multicast++
			assert.Equal(t, drill.Pass, r.Verdict, "%s %s", r.Channel, r.Target)
		}
	}
	assert.Equal(t, 6, multicast, "mDNS, LLMNR and SSDP at each of the two peers")
}
