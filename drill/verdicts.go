package drill

import (
	"context"
	"maps"

	"github.com/box-isolation/box/stack"
)

// judgeAll gives every action its verdict, the baselines first, for they
// decide what a block means, and aggregates them into claims.
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
	for _, a := range sc.Actions {
		if !a.Baseline {
			judged[a.ID] = judgeSpoof(judge(a, obs, t, baselineOK, r.agentErr), obs, t, r.neigh, r.neighErr)
		}
	}
	selected := map[string]bool{}
	for _, cl := range r.cfg.Claims {
		selected[cl.ID] = true
	}
	rep := r.rep
	for _, cl := range Catalogue {
		var rs []Result
		for _, a := range sc.Actions {
			if a.Claim == cl.ID {
				rs = append(rs, judged[a.ID])
			}
		}
		switch {
		case cl.ID == "C-FLEET":
			var census *stack.Census
			if r.v != nil {
				census = r.v.Fleet
			}
			// box-t lives in its user's project, and its isolation is off on
			// purpose: C-TIER judges it.
			own := maps.Clone(r.names)
			delete(own, PlaceT)
			rs = fleetResults(cl, census, r.cfg.Host.Incus.ProjectName(), own, r.findings)
		case cl.ID == "C-TIER":
			rs = r.tierResults(cl, rs)
		case cl.ID == "C-EXPOSE" && len(rs) == 0 && r.doorErr != "":
			a := Action{ID: "e-door", Claim: cl.ID, Channel: "tcp", From: "drill", Target: "a door to box-a", TargetKey: "door", Expect: ExpectReach}
			rs = []Result{{Action: a, Verdict: Inconclusive, Observed: "no door", Evidence: "box expose could not open the door here: " + r.doorErr}}
		case cl.ID == "C-HOST" && len(rs) > 0 && len(r.members) > 0:
			// Another member's box's blocks count only if its own
			// controls held.
			var all []Result
			for _, a := range sc.Actions {
				all = append(all, judged[a.ID])
			}
			for _, p := range r.memberBoxPlaces() {
				rs = controlledBy(rs, all, p)
			}
			rs = append(rs, stackResults(cl, r.findings)...)
		case cl.ID == "C-ALLOW" && len(rs) > 0:
			rs = append(allowControlled(rs), stackResults(cl, r.findings)...)
		case len(rs) > 0:
			rs = append(rs, stackResults(cl, r.findings)...)
		}
		cr := aggregate(cl, rs)
		if !selected[cl.ID] && !cl.Baseline {
			cr = ClaimResult{Claim: cl, Verdict: Skipped, Reason: "not selected (--claim/--skip); run without them to include it", Results: []Result{}}
		}
		rep.Claims = append(rep.Claims, cr)
	}
	rep.finish()
	return nil
}
