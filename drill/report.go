package drill

import (
	"time"

	"github.com/box-isolation/box/stack"
)

// SchemaVersion is the version of the JSON report (docs/drill-report.md).
const SchemaVersion = 3

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
	Ensured    bool              `json:"ensured"`
	Changes    []stack.Change    `json:"changes"`
	Subnet     string            `json:"subnet"`
	Gateway    string            `json:"gateway"`
	BridgeMode string            `json:"bridge_mode"`
	Layers     map[string]string `json:"layers"` // layer -> "present" or "absent: why"
	Findings   []stack.Finding   `json:"findings"`
}

// MutationResult is what knocking one layer out did, measured against the
// clean run: the mutations of one run are applied together, so each names
// every change of the run.
type MutationResult struct {
	Name    string   `json:"name"`
	Layers  []string `json:"layers"`
	Flipped []string `json:"flipped"` // claims with a probe verdict that went from pass to fail
	// Changed is every probe verdict that differs from the clean run's
	// (the stack channel is not among them: it is no proof, SPEC 5).
	Changed  []ProbeChange `json:"changed"`
	Detected bool          `json:"detected"` // false: redundant or untested
}

// ProbeChange is one probe's verdict in the clean run and in the mutated one.
type ProbeChange struct {
	ID      string  `json:"id"`
	Claim   string  `json:"claim"`
	Channel string  `json:"channel"`
	From    string  `json:"from"`
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
}

// Exit codes (SPEC section 5).
const (
	ExitOK           = 0
	ExitViolated     = 1
	ExitUsage        = 2
	ExitInconclusive = 3
)

// Layers is every isolation layer a report accounts for.
var Layers = []string{"L-NAT", "L-DNS", "L-V6", "L-ACL", "L-HOSTFW", "L-PORTISO", "L-BRIDGEDROP", string(stack.LayerPin), string(stack.LayerFleet), string(stack.LayerTier), string(stack.LayerEgress)}

// finish counts the claims and sets the exit code (SPEC section 5): any
// failed claim is 1, a failed baseline included (the claims it leaves
// unjudgeable are inconclusive); otherwise anything inconclusive is 3.
// MemberResult is one cluster member's share of a run.
type MemberResult struct {
	Member       string   `json:"member"`
	Boxes        []string `json:"boxes"` // the probe boxes that ran there (places)
	Passed       int      `json:"passed"`
	Failed       int      `json:"failed"`
	Inconclusive int      `json:"inconclusive"`
}

// groupByMember sums the results about each member.
func (rep *Report) groupByMember() {
	rep.Members = nil
	for _, m := range rep.Environment.Members {
		mr := MemberResult{Member: m, Boxes: []string{}}
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

func (rep *Report) finish() {
	rep.groupByMember()
	violated, inconclusive := false, false
	for _, cr := range rep.Claims {
		switch cr.Verdict {
		case Pass:
			rep.Summary.Passed++
		case Fail:
			rep.Summary.Failed++
			violated = true
		case Inconclusive:
			rep.Summary.Inconclusive++
			inconclusive = true
		case Skipped:
			rep.Summary.Skipped++
		}
	}
	switch {
	case violated:
		rep.ExitCode = ExitViolated
	case inconclusive:
		rep.ExitCode = ExitInconclusive
	default:
		rep.ExitCode = ExitOK
	}
}

// layerState maps the stack's findings onto layers.
func layerState(findings []stack.Finding) map[string]string {
	out := map[string]string{}
	for _, l := range Layers {
		out[l] = "present"
	}
	for _, f := range findings {
		l := string(f.Layer)
		if _, ok := out[l]; !ok || f.Advisory {
			continue
		}
		if out[l] == "present" {
			out[l] = "absent: " + f.Object + ": " + f.Problem
		}
	}
	return out
}
