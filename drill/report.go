package drill

import (
	"time"

	"github.com/box-isolation/box/stack/model"
)

// SchemaVersion is the version of the JSON report (docs/drill-report.md).
const SchemaVersion = 4

// Report is a whole run (the --json schema, version SchemaVersion).
type Report struct {
	SchemaVersion int           `json:"schema_version"`
	RunID         string        `json:"run_id"`
	Version       string        `json:"version"`
	Started       time.Time     `json:"started"`
	DurationMS    int64         `json:"duration_ms"`
	Environment   Environment   `json:"environment"`
	Stack         StackFacts    `json:"stack"`
	Boxes         []BoxEnd      `json:"boxes"`
	Claims        []ClaimResult `json:"claims"`
	Summary       Summary       `json:"summary"`
	// Members groups the results by cluster member (the member a probe
	// was aimed at, or whose host layers a finding is about); empty off a
	// cluster.
	Members   []MemberResult `json:"members,omitempty"`
	Mutations []string       `json:"mutations"`
	// MutationResults says, for each mutation, which probe verdicts changed
	// from a clean run made first in the same invocation; one that flipped
	// no probe to fail is redundant (another layer holds alone) or
	// untested. Clean is that run, nil in a run without mutations.
	MutationResults []MutationResult `json:"mutation_results"`
	Clean           *CleanRun        `json:"clean_run,omitempty"`
	ExitCode        int              `json:"exit_code"`
	// Problems are errors that did not stop the run (a teardown that
	// left something behind is one).
	Problems []string `json:"problems"`
	// Notes are what the run could not look at (a file not read, names
	// left out, legacy iptables rules not read).
	Notes []string `json:"notes"`
	// dirty says the run's teardown or restore failed: the host may carry
	// its leftovers, and nothing more may be done to it.
	dirty bool
}

// Environment is where the run happened.
type Environment struct {
	Mode         string `json:"mode"` // "world" (hermetic) or "host"
	Hostname     string `json:"hostname"`
	Kernel       string `json:"kernel"`
	IncusVersion string `json:"incus_version"`
	// InstanceType is the probe boxes' type, as Incus reports them.
	InstanceType string `json:"instance_type"`
	// Image is what the probe boxes were minted from; Template, in a
	// template run, the template whose boxes they are.
	Image    string `json:"image,omitempty"`
	Template string `json:"template,omitempty"`
	// BoxNewType is what box new makes on this host without --vm or
	// --container; a run proves nothing about another kind of box, and
	// its Notes say so where the two differ.
	BoxNewType      string `json:"box_new_type,omitempty"`
	BridgeNetfilter bool   `json:"bridge_netfilter"`
	// Members are, on an Incus cluster, the members the run drilled (a
	// probe box on each, the first the one the drill talks to).
	Members []string `json:"members,omitempty"`
}

// StackFacts is the isolation stack as the run found it.
type StackFacts struct {
	Ensured    bool                     `json:"ensured"`
	Changes    []model.Change           `json:"changes"`
	Subnet     string                   `json:"subnet"`
	Gateway    string                   `json:"gateway"`
	BridgeMode string                   `json:"bridge_mode"`
	Layers     map[model.LayerID]string `json:"layers"` // layer -> "present" or "absent: why"
	Findings   []model.Finding          `json:"findings"`
}

// MutationResult is what knocking one layer out did, measured against the
// clean run: the mutations of one run are applied together, so each names
// every change of the run.
type MutationResult struct {
	Name   string          `json:"name"`
	Layers []model.LayerID `json:"layers"`
	// Flipped are the claims resting on the mutated layers with a result
	// of the kind that must show the layer gone (DetectedBy) that went
	// from pass to fail.
	Flipped []ClaimID `json:"flipped"`
	// Changed is every verdict that differs from the clean run's (the
	// stack channel is not among them: it is no proof, docs/claims.md, "Mutations").
	Changed  []ProbeChange `json:"changed"`
	Detected bool          `json:"detected"` // false: redundant or untested
	// DetectedBy is the evidence that showed it: "probes", or "requests"
	// (Incus's answers, for the tier restriction); empty when undetected.
	DetectedBy Evidence `json:"detected_by,omitempty"`
}

// ProbeChange is one probe's verdict in the clean run and in the mutated one.
type ProbeChange struct {
	ID      string  `json:"id"`
	Claim   ClaimID `json:"claim"`
	Channel Channel `json:"channel"`
	From    Place   `json:"from"`
	Target  string  `json:"target"`
	Clean   Verdict `json:"clean"`
	Mutated Verdict `json:"mutated"`
}

// CleanRun is the run without mutations that a mutation run is compared with.
type CleanRun struct {
	RunID      string  `json:"run_id"`
	ExitCode   int     `json:"exit_code"`
	Summary    Summary `json:"summary"`
	DurationMS int64   `json:"duration_ms"`
}

// Summary counts claims and probes.
type Summary struct {
	Passed       int     `json:"passed"`
	Failed       int     `json:"failed"`
	Inconclusive int     `json:"inconclusive"`
	Skipped      int     `json:"skipped"`
	Probes       int     `json:"probes"`
	ProbePhaseMS int64   `json:"probe_phase_ms"`
	MSPerProbe   float64 `json:"ms_per_probe"`
	// AgentsLateMS is how long after the agreed start the latest agent of
	// the probe phase began (absent: every one within 50 ms of it).
	AgentsLateMS int64 `json:"agents_late_ms,omitempty"`
}

// Exit codes (docs/claims.md, "Verdicts and exit codes").
const (
	ExitOK           = 0
	ExitViolated     = 1
	ExitUsage        = 2
	ExitInconclusive = 3
)

// Layers is every isolation layer a report accounts for: the stack's,
// but the stack as a whole (its findings fail the claims resting on it,
// and no report line is kept for it).
func Layers() []model.LayerID {
	var out []model.LayerID
	for _, l := range model.Layers {
		if l.ID != model.LayerStack {
			out = append(out, l.ID)
		}
	}
	return out
}

// MemberResult is one cluster member's share of a run.
type MemberResult struct {
	Member       string  `json:"member"`
	Boxes        []Place `json:"boxes"` // the probe boxes that ran there (places)
	Passed       int     `json:"passed"`
	Failed       int     `json:"failed"`
	Inconclusive int     `json:"inconclusive"`
}

// groupByMember sums the results about each member.
func (rep *Report) groupByMember() {
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
func (rep *Report) finish() {
	rep.groupByMember()
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
