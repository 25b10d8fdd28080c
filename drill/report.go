package drill

import (
	"github.com/box-isolation/box/drill/verdicts"
	"github.com/box-isolation/box/stack/model"
)

// The report's types are drill/verdicts', a leaf that the renderer
// (drill/report) and the release gate (drill/gate) read without the
// engine; the engine fills a report in, and names its types here.
type (
	Report         = verdicts.Report
	Environment    = verdicts.Environment
	StackFacts     = verdicts.StackFacts
	MutationResult = verdicts.MutationResult
	ProbeChange    = verdicts.ProbeChange
	CleanRun       = verdicts.CleanRun
	Summary        = verdicts.Summary
	MemberResult   = verdicts.MemberResult
	ClaimResult    = verdicts.ClaimResult
	BoxEnd         = verdicts.BoxEnd
)

// SchemaVersion is the version of the JSON report (docs/drill-report.md).
const SchemaVersion = verdicts.SchemaVersion

// Exit codes (docs/claims.md, "Verdicts and exit codes").
const (
	ExitOK           = verdicts.ExitOK
	ExitViolated     = verdicts.ExitViolated
	ExitUsage        = verdicts.ExitUsage
	ExitInconclusive = verdicts.ExitInconclusive
)

// Layers is every isolation layer a report accounts for (verdicts.Layers).
func Layers() []model.LayerID { return verdicts.Layers() }

// groupByMember sums the results about each member.
func groupByMember(rep *Report) {
	rep.Members = nil
	for _, m := range rep.Environment.Members {
		mr := MemberResult{Member: m, Boxes: []Place{}}
		for _, b := range rep.Boxes {
			if b.Member == m {
				mr.Boxes = append(mr.Boxes, b.Place)
			}
		}
		for _, cr := range rep.Claims {
			for _, r := range cr.Results {
				if r.Member != m {
					continue
				}
				switch r.Verdict {
				case Pass:
					mr.Passed++
				case Fail:
					mr.Failed++
				case Inconclusive:
					mr.Inconclusive++
				}
			}
		}
		rep.Members = append(rep.Members, mr)
	}
}

// finish counts the claims and sets the exit code (docs/claims.md, "Verdicts and exit codes"): any
// failed claim is 1, a failed baseline included (the claims it leaves
// unjudgeable are inconclusive); otherwise anything inconclusive, or a
// selected claim that could not run, is 3.
func finish(rep *Report) {
	groupByMember(rep)
	violated, unproven := false, false
	for _, cr := range rep.Claims {
		switch cr.Verdict {
		case Pass:
			rep.Summary.Passed++
		case Fail:
			rep.Summary.Failed++
			violated = true
		case Inconclusive:
			rep.Summary.Inconclusive++
			unproven = true
		case Skipped:
			rep.Summary.Skipped++
			// Left out by the operator's patterns or the mode's rules is
			// what was asked; selected and unable to run is not.
			unproven = unproven || cr.Unrun
		}
	}
	switch {
	case violated:
		rep.ExitCode = ExitViolated
	case unproven:
		rep.ExitCode = ExitInconclusive
	default:
		rep.ExitCode = ExitOK
	}
}

// layerState maps the stack's findings onto layers.
func layerState(findings []model.Finding) map[model.LayerID]string {
	out := map[model.LayerID]string{}
	for _, l := range Layers() {
		out[l] = "present"
	}
	for _, f := range findings {
		if _, ok := out[f.Layer]; !ok || f.Advisory {
			continue
		}
		if out[f.Layer] == "present" {
			out[f.Layer] = "absent: " + f.Object + ": " + f.Problem
		}
	}
	return out
}
