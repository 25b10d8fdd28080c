// Package verdicts is a drill run's report as data (docs/drill-report.md,
// the --json schema): every claim with its verdict and the results it
// rests on, the stack and the probe boxes as the run found them, what the
// mutations did, and the exit code. The drill's engine (package drill)
// fills one in; the renderer (drill/report) and the release gate
// (drill/gate) read it through this package alone, without linking the
// engine, the stack's code or the probes.
package verdicts

import (
	"net"
	"net/netip"
	"time"

	"github.com/box-isolation/box/probes/observation"
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
	// GuardCounted is what the guard (L-GUARD) counted on this host
	// during the probe phase, by hook ("boxnet ingress") and reason:
	// what it passed and dropped of the probes' traffic.
	GuardCounted map[string]map[string]uint64 `json:"guard_counted,omitempty"`
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
	// Phases is how long each phase of the run took, in order
	// (docs/claims.md, "A run"): preflight, stack, mint, agents, probes,
	// judge and teardown (the run's duration_ms ends before teardown).
	Phases []PhaseTime `json:"phases,omitempty"`
	// Agents is, for each place's agent of the probe phase, how long it
	// took to arm before the agreed start and the slack that left.
	Agents []AgentTiming `json:"agents,omitempty"`
}

// AgentTiming is how one agent armed: its link set-up, listeners and
// witnesses, before the agreed start (docs/drill-report.md, "summary").
type AgentTiming struct {
	Place    string `json:"place"`
	ArmingMS int64  `json:"arming_ms"`
	// SlackMS is the time arming left before the agreed start; negative:
	// the agent armed that late, and started that late.
	SlackMS int64 `json:"slack_ms"`
}

// PhaseTime is how long one phase of a run took.
type PhaseTime struct {
	Phase string `json:"phase"`
	MS    int64  `json:"ms"`
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

// Claim is a claim as a report shows it (and drill list prints it): what
// it states, the layers it rests on, why it matters; the engine's claim
// (drill.Claim) adds how it gathers and judges its evidence.
type Claim struct {
	ID       ClaimID         `json:"id"`
	From     string          `json:"from"`
	To       string          `json:"to"`
	Channels []Channel       `json:"channels"`
	Expect   string          `json:"expect"`
	Layers   []model.LayerID `json:"layers"`
	Why      string          `json:"why"`
	// Baseline claims are positive controls: if one of their probes fails,
	// every blocked claim of the run is inconclusive (a failure of their
	// stack channel alone fails them, and leaves the rest to their probes).
	Baseline bool `json:"baseline"`
}

// ClaimResult is a claim with its judged actions.
type ClaimResult struct {
	Claim
	Verdict Verdict  `json:"verdict"`
	Reason  string   `json:"reason,omitempty"` // for skipped claims: why and how to enable
	Results []Result `json:"results"`
	// Unrun says the claim was selected but could not run here: it proves
	// nothing, so the run is no pass (exit 3) though nothing failed.
	Unrun bool `json:"-"`
}

// Result is one judged action: a probe (or a request, a census, the
// stack channel) with its verdict and what the verdict rests on.
type Result struct {
	ID      string  `json:"id"`
	Claim   ClaimID `json:"claim"`
	Channel Channel `json:"channel"`
	From    Place   `json:"from"`
	// Member is, on a cluster, the member whose host the probe is aimed
	// at (or, for a probe box's own controls, the member it runs on).
	Member string `json:"member,omitempty"`
	Target string `json:"target"` // who, for people: "box-b 10.88.0.12"
	// TargetKey is the matrix column: the target's name without its
	// address or port ("host-gateway", "lan-10"). In the JSON so that a
	// recorded report draws the same matrix.
	TargetKey string      `json:"target_key,omitempty"`
	Expect    Expectation `json:"expect"`
	// Provenance says why the target was probed (a listener, a route, a
	// neighbour, a hosts file...), when it was found rather than brought
	// by the drill.
	Provenance string  `json:"provenance,omitempty"`
	Verdict    Verdict `json:"verdict"`
	Observed   string  `json:"observed"` // what the probe saw
	Evidence   string  `json:"evidence"` // what the verdict rests on
	// AtTarget is what the target saw, when a witness or listener was there.
	AtTarget string                   `json:"at_target,omitempty"`
	Obs      *observation.Observation `json:"observation,omitempty"`
	// Witnessed says a witness at the target watched for the probe (the
	// run's own knowledge: not in the JSON).
	Witnessed bool `json:"-"`
}

// BoxEnd is one probe box as the drill knows it after minting.
type BoxEnd struct {
	Place     Place            `json:"place"`
	Instance  string           `json:"instance"`
	IP        netip.Addr       `json:"ip"`
	MAC       net.HardwareAddr `json:"-"`
	LinkLocal netip.Addr       `json:"link_local"`
	// Type is the instance's type as Incus reports it; the report's
	// environment says it once for all the boxes.
	Type string `json:"-"`
	// Port is its port on the bridge, as the census met it.
	Port string `json:"-"`
	// Member is, on a cluster, the member it runs on.
	Member string `json:"member,omitempty"`
	// Via is the subnet its probes leave by when it is not the box subnet:
	// a workload nested behind a box's NAT, whose packets reach the wire
	// as the box's (IP and MAC above) and only by routing.
	Via netip.Prefix `json:"-"`
}
