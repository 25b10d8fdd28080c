// Package report renders a drill run for people and machines: a readable
// table grouped by claim, the versioned JSON report (see
// docs/drill-report.md and schema.json), a self-contained HTML page (the
// claims, the reachability matrix, the stack, every probe with its
// evidence), a JUnit file with one test case per claim and channel, a
// reachability matrix picture (SVG), and the RUNS.md record row.
package report

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/box-isolation/box/drill/verdicts"
)

// Text writes the run as a table grouped by claim: each line a claim,
// channel, source, target, expected, observed, verdict and evidence. Plain
// ASCII; verdicts are words, never colours.
func Text(w io.Writer, rep *verdicts.Report) {
	env := rep.Environment
	drilled := env.InstanceType
	if env.BoxNewType != "" && env.BoxNewType != env.InstanceType {
		// A run proves the kind of box it minted, and only that.
		drilled += " (box new makes " + env.BoxNewType + " here: not drilled)"
	}
	switch {
	case env.Template != "":
		drilled += " of template " + env.Template + " (" + env.Image + ")"
	case env.Image != "":
		drilled += " from " + env.Image
	}
	fmt.Fprintf(w, "drill run %s (%s) on %s: kernel %s, incus %s, %s, bridge netfilter %s\n",
		rep.RunID, rep.Version, env.Mode, env.Kernel, env.IncusVersion, drilled, onOff(env.BridgeNetfilter))
	fmt.Fprintf(w, "stack: %s via %s, bridge drop %s\n", rep.Stack.Subnet, rep.Stack.Gateway, rep.Stack.BridgeMode)
	for _, l := range slices.Sorted(maps.Keys(rep.Stack.Layers)) {
		fmt.Fprintf(w, "  %-13s %s\n", l, rep.Stack.Layers[l])
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "CLAIM\tCHANNEL\tFROM\tTARGET\tEXPECTED\tOBSERVED\tVERDICT\tEVIDENCE")
	for _, cr := range rep.Claims {
		if cr.Verdict == verdicts.Skipped {
			fmt.Fprintf(tw, "%s\t-\t-\t-\t%s\t-\tSKIPPED\t%s\n", cr.ID, cr.Expect, cr.Reason)
			continue
		}
		for _, r := range cr.Results {
			ev := r.Evidence
			if r.AtTarget != "" {
				ev += "; at the target: " + r.AtTarget
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", cr.ID, r.Channel, r.From, r.Target, r.Expect, r.Observed,
				strings.ToUpper(string(r.Verdict)), clip(ev, 140))
		}
	}
	tw.Flush()
	fmt.Fprintln(w)
	for _, cr := range rep.Claims {
		fmt.Fprintf(w, "%-10s %-12s %s\n", cr.ID, strings.ToUpper(string(cr.Verdict)), cr.Expect)
	}
	if len(rep.Members) > 0 {
		fmt.Fprintln(w)
		for _, m := range rep.Members {
			fmt.Fprintf(w, "member %-16s %d passed, %d failed, %d inconclusive; probe boxes there: %s\n",
				m.Member, m.Passed, m.Failed, m.Inconclusive, strings.Join(verdicts.Strings(m.Boxes), ", "))
			for _, cr := range rep.Claims {
				for _, r := range cr.Results {
					if r.Member == m.Member && r.Verdict != verdicts.Pass {
						fmt.Fprintf(w, "  %s %s %s -> %s: %s\n", strings.ToUpper(string(r.Verdict)), cr.ID, r.From, r.Target, clip(r.Evidence, 120))
					}
				}
			}
		}
	}
	s := rep.Summary
	fmt.Fprintf(w, "\n%d passed, %d failed, %d inconclusive, %d skipped; %d probes in %.1fs (%.0f ms per probe); run %.1fs; exit %d\n",
		s.Passed, s.Failed, s.Inconclusive, s.Skipped, s.Probes, float64(s.ProbePhaseMS)/1000, s.MSPerProbe,
		float64(rep.DurationMS)/1000, rep.ExitCode)
	if len(s.Phases) > 0 {
		var ph []string
		for _, p := range s.Phases {
			ph = append(ph, fmt.Sprintf("%s %.1fs", p.Phase, float64(p.MS)/1000))
		}
		fmt.Fprintf(w, "phases: %s\n", strings.Join(ph, ", "))
	}
	if len(s.Agents) > 0 {
		slow, tight := s.Agents[0], s.Agents[0]
		for _, a := range s.Agents {
			if a.ArmingMS > slow.ArmingMS {
				slow = a
			}
			if a.SlackMS < tight.SlackMS {
				tight = a
			}
		}
		fmt.Fprintf(w, "agents: %d armed before the agreed start; the slowest in %d ms (%s), the least slack %d ms (%s)\n",
			len(s.Agents), slow.ArmingMS, slow.Place, tight.SlackMS, tight.Place)
	}
	if c := rep.Clean; c != nil {
		fmt.Fprintf(w, "clean run %s before the mutations: %d passed, %d failed, %d inconclusive; exit %d\n",
			c.RunID, c.Summary.Passed, c.Summary.Failed, c.Summary.Inconclusive, c.ExitCode)
	}
	// The mutations of a run are applied together: one comparison serves
	// them all, and it is printed once.
	if len(rep.MutationResults) > 0 {
		m := rep.MutationResults[0]
		for _, l := range mutationLines(rep) {
			fmt.Fprintln(w, l)
		}
		for _, c := range m.Changed {
			fmt.Fprintf(w, "  changed: %s %s %s -> %s: %s in the clean run, %s mutated\n", c.Claim, c.Channel, c.From, c.Target, c.Clean, c.Mutated)
		}
	}
	for _, p := range rep.Problems {
		fmt.Fprintf(w, "problem: %s\n", p)
	}
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

func clip(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) <= n {
		return s
	}
	return s[:n-3] + "..."
}

// mutationLines says, one line each, what every mutation of a run did
// measured against its clean run (the mutations of a run are applied
// together: one comparison serves them all, and each is judged by the
// claims resting on its own layers).
func mutationLines(rep *verdicts.Report) []string {
	var names []string
	for _, r := range rep.MutationResults {
		names = append(names, r.Name)
	}
	var out []string
	for _, m := range rep.MutationResults {
		what := "mutation " + m.Name + " (" + strings.Join(verdicts.Strings(m.Layers), ", ")
		if len(names) > 1 {
			what += "; applied with " + strings.Join(slices.DeleteFunc(slices.Clone(names), func(n string) bool { return n == m.Name }), ", ")
		}
		what += ")"
		if m.Detected {
			by := string(m.DetectedBy)
			if m.DetectedBy == verdicts.EvidenceRequests {
				by += " (Incus's answers)"
			}
			out = append(out, fmt.Sprintf("%s: detected by %s: %s flipped from pass to fail (%d verdict(s) changed from the clean run)",
				what, by, strings.Join(verdicts.Strings(m.Flipped), ", "), len(m.Changed)))
			continue
		}
		out = append(out, fmt.Sprintf("%s: not detected: nothing of a claim resting on its layers flipped from pass to fail (%d verdict(s) changed): redundant (another layer holds alone) or untested",
			what, len(m.Changed)))
	}
	return out
}
