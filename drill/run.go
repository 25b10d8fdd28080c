package drill

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/box-isolation/box/drill/topo"
	"github.com/box-isolation/box/drill/verdicts"
	"github.com/box-isolation/box/stack"
	"github.com/box-isolation/box/stack/boxes"
	"github.com/box-isolation/box/stack/model"
	"github.com/box-isolation/box/templates"
)

// Config is one drill run.
type Config struct {
	Host *stack.Host
	// Topology is what the run aims at: the hermetic world's, or a real
	// host's (never a development or CI machine's own).
	Topology topo.Topology
	// Image is the probe boxes' image: an alias or fingerprint here, or
	// REMOTE:ALIAS that Incus pulls (Host.IncusConfigDir names the remotes).
	Image string
	// Template, when set, mints the probe boxes as box new mints that
	// template's boxes: its image and its user-data, waited for until it
	// reports ready (template.go). Nil: the busybox probe image.
	Template *templates.Template
	// Agent is the static drill binary pushed into boxes and run in the
	// world's namespaces; the running binary by default.
	Agent string
	// NoSetup only verifies the stack instead of ensuring it.
	NoSetup bool
	// Claims are the selected claims (all when empty); Left says why each
	// claim of the catalogue that is not among them was left out (Resolve
	// gives both).
	Claims []Claim
	Left   map[ClaimID]string
	// Log receives progress lines.
	Log io.Writer
	// Version names the build, for the report.
	Version string
	// Mutations knock layers out for this run; the stack is restored and
	// verified afterwards.
	Mutations []Mutation
	// FillLoads adds C-KERNEL's memory hog and disk fill to box-l's load
	// (the fork bomb and the CPU spin always run): left out by default,
	// see docs/claims.md, "C-KERNEL".
	FillLoads bool
	// Baseline, with mutations, is a clean run of this same configuration
	// made before: the mutated run is compared with it instead of with a
	// clean run of its own. The caller vouches that the stack and the
	// world did not change in between (the drill package's tests knock
	// out one layer after another against one clean run).
	Baseline *Report
}

func (cfg *Config) logf(format string, args ...any) {
	if cfg.Log != nil {
		fmt.Fprintf(cfg.Log, format+"\n", args...)
	}
}

// Run runs the drill. The error is for a run that could not happen at all
// (exit 2); a run that happened returns its report, whose ExitCode says how
// the claims fared. With mutations, a clean run comes first and the
// mutated run's probe verdicts are compared with it: a mutation is proven
// by probes that changed, not by the layers it names.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	defer raisePriority()()
	if len(cfg.Mutations) == 0 {
		rep, _, err := runOnce(ctx, cfg)
		return rep, err
	}
	cleanRep, cleanDirty := cfg.Baseline, false
	if cleanRep != nil {
		if len(cleanRep.Mutations) > 0 {
			return nil, fmt.Errorf("the baseline run %s had mutations (%s): compare with a clean run", cleanRep.RunID, strings.Join(cleanRep.Mutations, ", "))
		}
		cfg.logf("clean run: %s, made before, is what the mutated run's probes are compared with", cleanRep.RunID)
	} else {
		clean := cfg
		clean.Mutations = nil
		cfg.logf("clean run: first, so the mutated run's probes have something to be compared with")
		var err error
		if cleanRep, cleanDirty, err = runOnce(ctx, clean); err != nil {
			return nil, fmt.Errorf("the clean run before the mutations: %w", err)
		}
	}
	if cleanDirty {
		// Its teardown failed: the host may be dirty, and a mutation on top
		// of that proves nothing and makes it worse.
		dirty := *cleanRep // a baseline is the caller's: not changed here
		dirty.Problems = append(slices.Clone(cleanRep.Problems), "the mutations were not applied: the clean run before them left problems")
		return &dirty, nil
	}
	var names []string
	for _, m := range cfg.Mutations {
		names = append(names, m.Name)
	}
	cfg.logf("mutated run: %s", strings.Join(names, ", "))
	rep, _, err := runOnce(ctx, cfg)
	if err != nil {
		return nil, err
	}
	for _, p := range cleanRep.Problems {
		rep.Problems = append(rep.Problems, "clean run: "+p)
	}
	rep.Clean = &CleanRun{RunID: cleanRep.RunID, ExitCode: cleanRep.ExitCode, Summary: cleanRep.Summary, DurationMS: cleanRep.DurationMS}
	var unmatched int
	rep.MutationResults, unmatched = compareRuns(cfg.Mutations, cleanRep, rep)
	if unmatched > 0 {
		rep.Notes = append(rep.Notes, fmt.Sprintf("comparing with the clean run: %d probe(s) of this run had no counterpart there (the targets changed between the runs), so they prove nothing either way", unmatched))
	}
	return rep, nil
}

// compareRuns lists the verdicts that changed between the clean run and
// the mutated one (the stack channel is no proof and is left out), and
// how many of the mutated run's results had no counterpart. A result is
// matched by claim, channel, source and target key, and its rank among
// those: not by its id, which shifts when a host target comes or goes
// between the runs. A mutation is detected when a result of the kind of
// evidence that must show it (a probe, for every layer but the tier
// restriction, which Incus's answers show) of a claim resting on one of
// its layers went from pass to fail: a flip elsewhere, or of the census,
// is listed among the changes and proves nothing about the layer.
func compareRuns(ms []Mutation, clean, mutated *Report) ([]MutationResult, int) {
	keys := func(rep *Report, visit func(k string, r verdicts.Result)) {
		seen := map[string]int{}
		for _, cr := range rep.Claims {
			for _, r := range cr.Results {
				if evidenceOf(r.Channel) == "" {
					continue
				}
				k := strings.Join([]string{string(r.Claim), string(r.Channel), string(r.From), r.TargetKey}, "|")
				seen[k]++
				visit(fmt.Sprintf("%s|%d", k, seen[k]), r)
			}
		}
	}
	before := map[string]Verdict{}
	keys(clean, func(k string, r verdicts.Result) { before[k] = r.Verdict })
	changed := []ProbeChange{}
	unmatched := 0
	keys(mutated, func(k string, r verdicts.Result) {
		was, ok := before[k]
		switch {
		case !ok:
			unmatched++
			return
		case was == r.Verdict:
			return
		}
		changed = append(changed, ProbeChange{ID: r.ID, Claim: r.Claim, Channel: r.Channel, From: r.From, Target: r.Target, Clean: was, Mutated: r.Verdict})
	})
	out := []MutationResult{}
	for _, m := range ms {
		flipped := []ClaimID{}
		for _, c := range changed {
			cl, ok := ClaimByID(c.Claim)
			if !ok || c.Clean != Pass || c.Mutated != Fail || evidenceOf(c.Channel) != m.shownBy() ||
				!slices.ContainsFunc(cl.Layers, func(l model.LayerID) bool { return slices.Contains(m.Layers, l) }) || slices.Contains(flipped, c.Claim) {
				continue
			}
			flipped = append(flipped, c.Claim)
		}
		mr := MutationResult{Name: m.Name, Layers: m.Layers, Flipped: flipped, Changed: changed, Detected: len(flipped) > 0}
		if mr.Detected {
			mr.DetectedBy = m.shownBy()
		}
		out = append(out, mr)
	}
	return out, unmatched
}

// run is one drill run going through its phases (docs/claims.md, "A run"), one file
// each: preflight, stack, boxes, agents, probes, judge; teardown undoes
// what the phases set up, last first, whatever happened.
type run struct {
	cfg Config
	rep *Report
	// mu guards what the claims' mints add side by side (mintSideBySide):
	// names, ends, the report's boxes, projects, state, skipped, undo.
	mu sync.Mutex
	// undo is what teardown runs, last first: the boxes' removal, the
	// stack's restoration after mutations.
	undo []func(context.Context) error
	// before and v are the stack as Verify found it before the boxes and
	// as the probes find it; findings merges both.
	before, v *stack.Verification
	findings  []model.Finding
	// boxNew is what box new makes on this host, for the report to
	// compare the probe boxes with.
	boxNew   model.TypeDecision
	names    map[Place]string // place -> instance
	ends     map[Place]*BoxEnd
	scene    Scene
	sc       *Scenario
	obs      observations
	agentErr map[Place]string
	// skipped says why a selected claim could not run here (what the
	// host lacks); judged is every action's result.
	skipped map[ClaimID]string
	judged  []Result
	// state is what each claim keeps over the run; projects are the
	// Incus projects of the probe boxes minted in one of their own (box-t,
	// by its user).
	state    claimStates
	projects map[Place]string
	// members are, on a cluster, the members the drill can enter.
	members cluster
	// baseImage is the fingerprint box-a's image resolved to: what the
	// boxes minted without a pull (box-t, through incus-user) are made of.
	baseImage string
	// tmplImages and tmplImage are, in a template run, the host's
	// template images and the one every probe box is a copy of.
	tmplImages *boxes.TemplateImages
	tmplImage  *boxes.TemplateImage
}

func runOnce(ctx context.Context, cfg Config) (_ *Report, dirty bool, err error) {
	if cfg.Host == nil || cfg.Topology.Source == "" {
		return nil, false, errors.New("drill run needs a stack host and a topology: the hermetic world's (drill world up) or a real host's (--host --canary ADDR:PORT)")
	}
	if cfg.Agent == "" {
		exe, err := os.Executable()
		if err != nil {
			return nil, false, fmt.Errorf("finding the agent binary: %w", err)
		}
		cfg.Agent = exe
	}
	if len(cfg.Claims) == 0 {
		cfg.Claims = Catalogue
	}
	id := make([]byte, 3)
	if _, err := rand.Read(id); err != nil {
		return nil, false, err
	}
	r := &run{cfg: cfg, skipped: map[ClaimID]string{}, state: claimStates{}, projects: map[Place]string{}, rep: &Report{SchemaVersion: SchemaVersion, RunID: hex.EncodeToString(id), Version: cfg.Version, Started: time.Now().UTC(),
		Stack: StackFacts{Changes: []model.Change{}, Findings: []model.Finding{}},
		Boxes: []BoxEnd{}, Problems: []string{}, Notes: []string{}, Claims: []ClaimResult{}, Mutations: []string{}, MutationResults: []MutationResult{}}}
	for _, m := range cfg.Mutations {
		r.rep.Mutations = append(r.rep.Mutations, m.Name)
	}
	// A teardown or restore that failed leaves the host in a state the
	// operator must hear about, whatever the claims said.
	defer func() {
		t0 := time.Now()
		left := r.teardown(ctx)
		r.rep.Summary.Phases = append(r.rep.Summary.Phases, verdicts.PhaseTime{Phase: "teardown", MS: time.Since(t0).Milliseconds()})
		if len(left) == 0 {
			return
		}
		if err != nil {
			err = fmt.Errorf("%w; and: %s", err, strings.Join(left, "; "))
			return
		}
		dirty = true
		// A violated claim stays 1 (the problems say the rest); otherwise
		// the host may be left dirty, which is a tool error.
		if r.rep.ExitCode != ExitViolated {
			r.rep.ExitCode = ExitUsage
		}
	}()
	for _, phase := range []struct {
		name string
		run  func(context.Context) error
	}{{"preflight", r.preflight}, {"stack", r.ensureStack}, {"mint", r.mintBoxes}, {"agents", r.pushAgents}, {"probes", r.runProbes}, {"judge", r.judgeAll}} {
		t0 := time.Now()
		err := phase.run(ctx)
		r.rep.Summary.Phases = append(r.rep.Summary.Phases, verdicts.PhaseTime{Phase: phase.name, MS: time.Since(t0).Milliseconds()})
		if err != nil {
			return nil, false, err
		}
	}
	r.rep.DurationMS = time.Since(r.rep.Started).Milliseconds()
	return r.rep, false, nil
}

// skip records why a selected claim cannot run here; it is reported as
// skipped with the reason, and the run is not a pass.
func (r *run) skip(id ClaimID, why string) {
	r.cfg.logf("%s: skipped: %s", id, why)
	r.locked(func() { r.skipped[id] = why })
}

// later registers an undo for teardown.
func (r *run) later(fn func(context.Context) error) {
	r.locked(func() { r.undo = append(r.undo, fn) })
}
