package drill

import (
	"context"
	"slices"
	"strings"

	"github.com/box-isolation/box/drill/verdicts"
)

// judgeAll gives every action its verdict, the baselines first, for they
// decide what a block means; each claim then turns its actions into its
// results (its own judging, or its actions and the stack channel), and
// its results into its verdict.
func (r *run) judgeAll(context.Context) error {
	sc, obs, t := r.sc, r.obs, r.scene
	baselineOK := true
	judged := map[string]Result{}
	for _, a := range sc.Actions {
		if a.Baseline {
			res := judge(a, obs, t, true, r.agentErr)
			judged[a.ID] = res
			if res.Verdict != Pass {
				baselineOK = false
			}
		}
	}
	claims := map[ClaimID]Claim{}
	for _, c := range Catalogue {
		claims[c.ID] = c
	}
	for _, a := range sc.Actions {
		if a.Baseline {
			continue
		}
		res := judge(a, obs, t, baselineOK, r.agentErr)
		if c := claims[a.Claim]; c.refine != nil {
			res = c.refine(r, res)
		}
		judged[a.ID] = res
	}
	r.judged = r.judged[:0]
	for _, a := range sc.Actions {
		r.judged = append(r.judged, judged[a.ID])
	}
	selected := map[ClaimID]bool{}
	for _, c := range r.cfg.Claims {
		selected[c.ID] = true
	}
	for _, c := range Catalogue {
		r.rep.Claims = append(r.rep.Claims, r.judgeClaim(c, selected[c.ID]))
	}
	finish(r.rep)
	return nil
}

// judgeClaim judges one claim of the catalogue from the run's results.
func (r *run) judgeClaim(c Claim, selected bool) ClaimResult {
	if !selected && !c.Baseline {
		why := r.cfg.Left[c.ID]
		if why == "" {
			why = "not selected (--claim/--skip); run without them to include it"
		}
		return ClaimResult{Claim: c.Reported(), Verdict: Skipped, Reason: why, Results: []verdicts.Result{}}
	}
	if why := r.skipped[c.ID]; why != "" {
		return ClaimResult{Claim: c.Reported(), Verdict: Skipped, Reason: "could not run here: " + why, Results: []verdicts.Result{}, Unrun: true}
	}
	var rs []Result
	for _, res := range r.judged {
		if res.Claim == c.ID {
			rs = append(rs, res)
		}
	}
	judgeFn := c.judge
	if judgeFn == nil {
		judgeFn = judgeProbes
	}
	return aggregate(c, judgeFn(r, c, rs))
}

// placeControlled makes the blocks of the probes from place inconclusive
// unless place's own controls (its probes that expect to reach or
// resolve) all passed: a box that reaches nothing "blocks" everything.
func placeControlled(rs []Result, place Place) []Result { return controlledBy(rs, rs, place) }

// controlledBy is placeControlled with place's controls taken from all
// (another claim's results, for a member's box: its controls are C-EGRESS's
// and C-DNS's).
func controlledBy(rs, all []Result, place Place) []Result {
	var failed []string
	controls := 0
	for _, r := range all {
		if r.From == place && (r.Expect == ExpectReach || r.Expect == ExpectResolve) {
			controls++
			if r.Verdict != Pass {
				failed = append(failed, r.Target+": "+r.Evidence)
			}
		}
	}
	if controls == 0 {
		failed = append(failed, string(place)+" ran no control")
	}
	if len(failed) == 0 {
		return rs
	}
	out := slices.Clone(rs)
	for i, r := range out {
		if r.From == place && r.Verdict == Pass && (r.Expect == ExpectBlocked || r.Expect == ExpectNoName || r.Expect == ExpectNotForwarded) {
			out[i].Verdict = Inconclusive
			out[i].Evidence = "looked blocked, but " + string(place) + "'s own control failed (" + strings.Join(failed, "; ") + "), so the block proves nothing"
		}
	}
	return out
}
