package drill

import (
	"fmt"
	"slices"
	"strings"

	"github.com/box-isolation/box/stack/model"
)

// The stack channel (docs/claims.md, "Evidence rules": Verify is evidence): a layer that the
// stack's Verify finds absent or drifted fails every claim resting on it,
// whatever the probes saw. The probes only meet the drill's own fresh
// boxes; Verify reads what every box on the host lives with.

// StackRule says, for people, which of Verify's findings fail the claim.
func (c Claim) StackRule() string {
	var layers []string
	whole := false
	for _, l := range c.Layers {
		if l == model.LayerStack {
			whole = true
			continue
		}
		layers = append(layers, string(l))
	}
	var parts []string
	if len(layers) > 0 {
		parts = append(parts, "a finding on "+strings.Join(layers, " or "))
	}
	if whole {
		parts = append(parts, "a finding on the stack as a whole (the box-net profile beyond its port isolation: devices, root disk)")
	}
	return strings.Join(parts, ", or ") + " fails it; advisory findings (another firewall's forward policy, legacy leftovers) do not"
}

// rests reports whether a finding removes a layer the claim rests on.
func (c Claim) rests(f model.Finding) bool {
	return !f.Advisory && slices.Contains(c.Layers, f.Layer)
}

// stackResults judges a claim's stack channel: one failed result per
// finding that removes one of its layers, or one passed result saying
// Verify found them all present.
func stackResults(c Claim, findings []model.Finding) []Result {
	var out []Result
	for _, f := range findings {
		if !c.rests(f) {
			continue
		}
		target := string(f.Layer) + " " + f.Object
		if f.Member != "" {
			target += " on member " + f.Member
		}
		a := Action{ID: fmt.Sprintf("s-%s-%d", c.ID, len(out)+1), Claim: c.ID, Channel: ChannelStack, From: PlaceVerify, Member: f.Member,
			Target: target, TargetKey: string(ChannelStack), Expect: ExpectPresent}
		out = append(out, Result{Action: a, Verdict: Fail, Observed: "absent",
			Evidence: fmt.Sprintf("Verify: %s: %s (fix: %s)", f.Object, f.Problem, f.Fix)})
	}
	if len(out) > 0 {
		return out
	}
	layers := make([]string, len(c.Layers))
	for i, l := range c.Layers {
		layers[i] = string(l)
	}
	a := Action{ID: "s-" + string(c.ID), Claim: c.ID, Channel: ChannelStack, From: PlaceVerify,
		Target: strings.Join(layers, ", "), TargetKey: string(ChannelStack), Expect: ExpectPresent}
	return []Result{{Action: a, Verdict: Pass, Observed: "present",
		Evidence: "Verify found " + strings.Join(layers, ", ") + " as desired"}}
}

// mergeFindings is every finding of the Verify passes of one run, each
// once: a drift seen before the boxes were minted counts even if a later
// pass missed it.
func mergeFindings(passes ...[]model.Finding) []model.Finding {
	out := []model.Finding{}
	seen := map[string]bool{}
	for _, fs := range passes {
		for _, f := range fs {
			if k := f.String(); !seen[k] {
				seen[k] = true
				out = append(out, f)
			}
		}
	}
	return out
}
