package drill_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/drill"
	"github.com/box-isolation/box/drill/verdicts"
	"github.com/box-isolation/box/fixtures/world"
	"github.com/box-isolation/box/stack/model"
)

// probeFailures lists a claim's failed results outside the stack channel:
// the probes' own proof, which is what a mutation must show (docs/claims.md, "Mutations").
func probeFailures(cr drill.ClaimResult) []verdicts.Result {
	var out []verdicts.Result
	for _, r := range cr.Results {
		if r.Verdict == drill.Fail && r.Channel != drill.ChannelStack {
			out = append(out, r)
		}
	}
	return out
}

// stackFailures lists a claim's failed stack-channel results.
func stackFailures(cr drill.ClaimResult) []verdicts.Result {
	var out []verdicts.Result
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

// resting is every claim that rests on a layer the mutations knock out,
// and the claims named in also: a mutated run of only those decides
// what a run of the whole catalogue would about the mutations, since a
// mutation's flips count only claims resting on its layers
// (MutationResult.Flipped), and the run adds the baseline claims itself.
func resting(t *testing.T, mutations []string, also ...drill.ClaimID) []drill.Claim {
	t.Helper()
	ms, err := drill.SelectMutations(mutations)
	require.NoError(t, err)
	var out []drill.Claim
	for _, c := range drill.Catalogue {
		rests := slices.ContainsFunc(ms, func(m drill.Mutation) bool {
			return slices.ContainsFunc(m.Layers, func(l model.LayerID) bool { return slices.Contains(c.Layers, l) })
		})
		if rests || slices.Contains(also, c.ID) {
			out = append(out, c)
		}
	}
	return out
}

// TestSystemDrillCanFail knocks out every layer the drill can mutate and
// expects the claims they back to flip to fail through probes, compared
// with one clean run of the whole catalogue made first (each mutated run's
// own restore is verified before the next); and a normal run to pass
// again. Each mutated run runs the claims resting on its layers and those
// its check reads besides: the boxes of the others are minted for nothing
// (about half of a whole run's time).
func TestSystemDrillCanFail(t *testing.T) {
	base := baseline(t, config(t))
	for _, tc := range []struct {
		name      string
		mutations []string
		also      []drill.ClaimID // claims the check reads that rest on none of the layers
		check     func(t *testing.T, rep *drill.Report)
	}{
		{"bridge drop and port isolation", []string{"bridge-drop", "port-isolation"}, nil, func(t *testing.T, rep *drill.Report) {
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
		{"bridge drop only", []string{"bridge-drop"}, nil, func(t *testing.T, rep *drill.Report) {
			sib := claim(t, rep, "C-SIBLING")
			assert.Empty(t, probeFailures(sib), "port isolation alone holds against every probe")
			assert.NotEmpty(t, stackFailures(sib), "but Verify finds the layer gone, and that fails the claim")
			assert.Equal(t, drill.ExitViolated, rep.ExitCode)
			require.Len(t, rep.MutationResults, 1)
			assert.False(t, rep.MutationResults[0].Detected, "no probe flipped: reported as redundant")
			assert.Contains(t, rep.Stack.Layers["L-BRIDGEDROP"], "absent")
			assert.Equal(t, "present", rep.Stack.Layers["L-PORTISO"])
		}},
		{"port isolation only", []string{"port-isolation"}, nil, func(t *testing.T, rep *drill.Report) {
			sib := claim(t, rep, "C-SIBLING")
			assert.Empty(t, probeFailures(sib), "the bridge drop alone holds against every probe")
			assert.NotEmpty(t, stackFailures(sib), "but Verify finds the ports' isolation off, and that fails the claim")
			require.Len(t, rep.MutationResults, 1)
			assert.False(t, rep.MutationResults[0].Detected, "no probe flipped: reported as redundant")
			assert.Contains(t, rep.Stack.Layers["L-PORTISO"], "absent")
			assert.Equal(t, "present", rep.Stack.Layers["L-BRIDGEDROP"])
		}},
		{"host firewall", []string{"host-fw", "guard"}, []drill.ClaimID{"C-TIER"}, func(t *testing.T, rep *drill.Report) {
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
		// The guard holds what the host firewall and the route table hold
		// (and the ACL, bar inbound connections): with it attached neither
		// knocked out flips a probe, and it alone knocked out flips none.
		{"the guard alone", []string{"guard"}, nil, func(t *testing.T, rep *drill.Report) {
			for _, id := range []drill.ClaimID{"C-HOST", "C-LAN"} {
				assert.Empty(t, probeFailures(claim(t, rep, id)), "the nft layers hold %s alone", id)
			}
			assert.NotEmpty(t, stackFailures(claim(t, rep, "C-HOST")), "but Verify finds the guard gone")
			assert.Equal(t, drill.ExitViolated, rep.ExitCode)
			require.Len(t, rep.MutationResults, 1)
			assert.False(t, rep.MutationResults[0].Detected, "no probe flipped: reported as redundant")
			assert.Contains(t, rep.Stack.Layers["L-GUARD"], "absent")
		}},
		{"the host firewall and the route table under the guard", []string{"host-fw", "route"}, nil, func(t *testing.T, rep *drill.Report) {
			for _, id := range []drill.ClaimID{"C-HOST", "C-LAN", "C-NESTED"} {
				assert.Empty(t, probeFailures(claim(t, rep, id)), "the guard holds %s", id)
			}
			require.Len(t, rep.MutationResults, 2)
			for _, m := range rep.MutationResults {
				assert.False(t, m.Detected, "%s: no probe flipped", m.Name)
			}
			assert.Contains(t, rep.Stack.Layers["L-HOSTFW"], "absent")
			assert.Contains(t, rep.Stack.Layers["L-ROUTE"], "absent")
			assert.Equal(t, "present", rep.Stack.Layers["L-GUARD"])
		}},
		{"hosts file", []string{"hosts-file"}, nil, func(t *testing.T, rep *drill.Report) {
			leaked := map[string]bool{}
			for _, r := range probeFailures(claim(t, rep, "C-NAMES")) {
				leaked[r.Target] = true
			}
			assert.True(t, leaked[world.HostOnlyNames[0].Name], "the host-only name in the hosts file leaks: %v", leaked)
			assert.Contains(t, rep.MutationResults[0].Flipped, drill.ClaimID("C-NAMES"))
		}},
		{"acl", []string{"acl", "guard"}, nil, func(t *testing.T, rep *drill.Report) {
			assertProvenByProbes(t, rep, "C-LAN")
			assert.Contains(t, rep.Stack.Layers["L-ACL"], "absent")
			// The LAN hosts are routed elsewhere than the default way, so
			// L-ROUTE still holds them; the modem, private and behind the
			// default route, is the ACL's alone.
			for _, r := range probeFailures(claim(t, rep, "C-LAN")) {
				assert.True(t, strings.HasPrefix(r.Target, world.ModemRole+" "), "only the modem is reached: %s %s", r.Target, r.Channel)
			}
		}},
		{"route", []string{"route", "guard"}, nil, func(t *testing.T, rep *drill.Report) {
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
		{"dns managed", []string{"dns-managed"}, nil, func(t *testing.T, rep *drill.Report) {
			assertProvenByProbes(t, rep, "C-NAMES")
		}},
		{"ipv6 on", []string{"ipv6-on", "guard"}, nil, func(t *testing.T, rep *drill.Report) {
			assertProvenByProbes(t, rep, "C-V6")
		}},
		{"pinning", []string{"pinning"}, nil, func(t *testing.T, rep *drill.Report) {
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
		{"tier", []string{"tier"}, nil, func(t *testing.T, rep *drill.Report) {
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
		{"egress allowlist gone", []string{"egress"}, nil, func(t *testing.T, rep *drill.Report) {
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
		{"egress dns chain gone", []string{"egress-dns"}, nil, func(t *testing.T, rep *drill.Report) {
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
		{"egress names chain gone", []string{"egress-names"}, nil, func(t *testing.T, rep *drill.Report) {
			assertProvenByProbes(t, rep, "C-ALLOW")
			assert.Equal(t, []drill.ClaimID{"C-ALLOW"}, rep.MutationResults[0].Flipped)
			ch := map[drill.Channel]bool{}
			for _, r := range probeFailures(claim(t, rep, "C-ALLOW")) {
				ch[r.Channel] = true
			}
			assert.True(t, ch[drill.ChannelTLS] && ch[drill.ChannelHTTP], "another TLS server name and HTTP Host reached the canary's address: %v", ch)
			assert.False(t, ch[drill.ChannelDNS] || ch[drill.ChannelQUIC], "nothing the proxy does not decide: %v", ch)
		}},
		{"egress forward chain gone", []string{"egress-forward"}, nil, func(t *testing.T, rep *drill.Report) {
			assertProvenByProbes(t, rep, "C-ALLOW")
			assert.Equal(t, []drill.ClaimID{"C-ALLOW"}, rep.MutationResults[0].Flipped)
			ch := map[drill.Channel]bool{}
			for _, r := range probeFailures(claim(t, rep, "C-ALLOW")) {
				ch[r.Channel] = true
			}
			assert.True(t, ch[drill.ChannelQUIC] && ch[drill.ChannelTCP] && ch[drill.ChannelUDP], "QUIC, the second canary by address and the resolver straight: %v", ch)
			assert.False(t, ch[drill.ChannelDNS] || ch[drill.ChannelTLS], "what the resolver and the proxy decide holds: %v", ch)
		}},
		{"door widened by hand", []string{"door-wide"}, nil, func(t *testing.T, rep *drill.Report) {
			assertProvenByProbes(t, rep, "C-EXPOSE")
			lan := false
			for _, r := range probeFailures(claim(t, rep, "C-EXPOSE")) {
				lan = lan || r.From == "lan"
			}
			assert.True(t, lan, "the LAN reached box-a through the widened door")
			assert.NotEmpty(t, stackFailures(claim(t, rep, "C-FLEET")), "and the census names the door")
		}},
		{"dhcp open", []string{"dhcp-open"}, nil, func(t *testing.T, rep *drill.Report) {
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
		{"egress broken", []string{"nat-off"}, []drill.ClaimID{"C-SIBLING", "C-HOST", "C-LAN", "C-INBOUND"}, func(t *testing.T, rep *drill.Report) {
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
			cfg.Claims = resting(t, tc.mutations, tc.also...)
			rep := run(t, cfg)
			assert.Equal(t, tc.mutations, rep.Mutations)
			tc.check(t, rep)
			t.Logf("verdicts: %v; mutation results: %+v", claimVerdicts(rep), rep.MutationResults)
			// Restored and verified by the run itself.
			v, err := cfg.Host.Verify(context.Background())
			require.NoError(t, err)
			assert.Empty(t, v.Findings, "the stack is restored after the mutation")
		})
	}
	rep := run(t, config(t))
	assert.Equal(t, drill.ExitOK, rep.ExitCode, "a normal run passes again: %v", claimVerdicts(rep))
}

// hostLied says a C-SPOOF result failed on the host's own state: its
// neighbour entry for box-b at another MAC, or the bridge's forwarding
// database holding box-b's MAC on another port (not the summary of what
// it held, which every result carries).
func hostLied(r verdicts.Result) bool {
	return strings.Contains(r.Evidence, "(box-b is ") || strings.Contains(r.Evidence, "the bridge learned box-b's MAC on another port")
}
