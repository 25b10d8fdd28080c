package drill

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/box-isolation/box/fixtures/world"
	"github.com/box-isolation/box/internal/nsrun"
	"github.com/box-isolation/box/probes"
	"github.com/box-isolation/box/stack"
	"github.com/box-isolation/box/stack/incus"
)

// SchemaVersion is the version of the JSON report (docs/drill-report.md).
const SchemaVersion = 2

// Tags the drill puts on its own boxes, so an aborted run's boxes are found
// and removed by the next run, and nothing else ever is.
const (
	TagDrill = "user.drill"
	TagRun   = "user.drill.run"
)

// agentPath is where the agent binary is pushed inside a box.
const agentPath = "/usr/bin/drill-agent"

// Config is one drill run.
type Config struct {
	Host *stack.Host
	// World is the hermetic world the run happens in; HostMode, instead,
	// runs on a real Incus host (never on a development or CI machine).
	World    *world.State
	HostMode *HostMode
	// Image is the probe boxes' image alias.
	Image string
	// Agent is the static drill binary pushed into boxes and run in the
	// world's namespaces; the running binary by default.
	Agent string
	// NoSetup only verifies the stack instead of ensuring it.
	NoSetup bool
	// Claims are the selected claims (all when empty).
	Claims []Claim
	// Log receives progress lines.
	Log io.Writer
	// Version names the build, for the report.
	Version string
	// Mutations knock layers out for this run; the stack is restored and
	// verified afterwards.
	Mutations []Mutation
}

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
	Mutations     []string      `json:"mutations"`
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
	// dirty says the run's teardown or restore failed: the host may carry
	// its leftovers, and nothing more may be done to it.
	dirty bool
}

// Environment is where the run happened.
type Environment struct {
	Mode            string `json:"mode"` // "world" (hermetic) or "host"
	Hostname        string `json:"hostname"`
	Kernel          string `json:"kernel"`
	IncusVersion    string `json:"incus_version"`
	InstanceType    string `json:"instance_type"`
	BridgeNetfilter bool   `json:"bridge_netfilter"`
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
var Layers = []string{"L-NAT", "L-DNS", "L-V6", "L-ACL", "L-HOSTFW", "L-PORTISO", "L-BRIDGEDROP"}

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
	if len(cfg.Mutations) == 0 {
		return runOnce(ctx, cfg)
	}
	clean := cfg
	clean.Mutations = nil
	cfg.logf("clean run: first, so the mutated run's probes have something to be compared with")
	cleanRep, err := runOnce(ctx, clean)
	if err != nil {
		return nil, fmt.Errorf("the clean run before the mutations: %w", err)
	}
	if cleanRep.dirty {
		// Its teardown failed: the host may be dirty, and a mutation on top
		// of that proves nothing and makes it worse.
		cleanRep.Problems = append(cleanRep.Problems, "the mutations were not applied: the clean run before them left problems")
		return cleanRep, nil
	}
	var names []string
	for _, m := range cfg.Mutations {
		names = append(names, m.Name)
	}
	cfg.logf("mutated run: %s", strings.Join(names, ", "))
	rep, err := runOnce(ctx, cfg)
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
		rep.Problems = append(rep.Problems, fmt.Sprintf("comparing with the clean run: %d probe(s) of this run had no counterpart there (the targets changed between the runs), so they prove nothing either way", unmatched))
	}
	return rep, nil
}

// compareRuns lists the probe verdicts that changed between the clean run
// and the mutated one, and how many of the mutated run's probes had no
// counterpart. A probe is matched by claim, channel, source and target
// key, and its rank among those: not by its id, which shifts when a host
// target comes or goes between the runs.
func compareRuns(ms []Mutation, clean, mutated *Report) ([]MutationResult, int) {
	keys := func(rep *Report, visit func(k string, r Result)) {
		seen := map[string]int{}
		for _, cr := range rep.Claims {
			for _, r := range cr.Results {
				if r.Channel == ChannelStack {
					continue
				}
				k := strings.Join([]string{r.Claim, r.Channel, r.From, r.TargetKey}, "|")
				seen[k]++
				visit(fmt.Sprintf("%s|%d", k, seen[k]), r)
			}
		}
	}
	before := map[string]Verdict{}
	keys(clean, func(k string, r Result) { before[k] = r.Verdict })
	changed := []ProbeChange{}
	var flipped []string
	unmatched := 0
	keys(mutated, func(k string, r Result) {
		was, ok := before[k]
		switch {
		case !ok:
			unmatched++
			return
		case was == r.Verdict:
			return
		}
		changed = append(changed, ProbeChange{ID: r.ID, Claim: r.Claim, Channel: r.Channel, From: r.From, Target: r.Target, Clean: was, Mutated: r.Verdict})
		if was == Pass && r.Verdict == Fail && !slices.Contains(flipped, r.Claim) {
			flipped = append(flipped, r.Claim)
		}
	})
	out := []MutationResult{}
	for _, m := range ms {
		out = append(out, MutationResult{Name: m.Name, Layers: m.Layers, Flipped: append([]string{}, flipped...), Changed: changed, Detected: len(flipped) > 0})
	}
	return out, unmatched
}

func runOnce(ctx context.Context, cfg Config) (_ *Report, err error) {
	if cfg.Host == nil || (cfg.World == nil) == (cfg.HostMode == nil) {
		return nil, errors.New("drill run needs either the hermetic world (drill world up) or host mode (--host --canary ADDR:PORT), not both")
	}
	if cfg.Agent == "" {
		exe, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("finding the agent binary: %w", err)
		}
		cfg.Agent = exe
	}
	if len(cfg.Claims) == 0 {
		cfg.Claims = Catalogue
	}
	id := make([]byte, 3)
	if _, err := rand.Read(id); err != nil {
		return nil, err
	}
	// rep is never nil: the deferred teardown and restore below read it
	// on every path, including those that return no report.
	rep := &Report{SchemaVersion: SchemaVersion, RunID: hex.EncodeToString(id), Version: cfg.Version, Started: time.Now().UTC(),
		Stack: StackFacts{Changes: []stack.Change{}, Findings: []stack.Finding{}},
		Boxes: []BoxEnd{}, Problems: []string{}, Claims: []ClaimResult{}, Mutations: []string{}, MutationResults: []MutationResult{}}
	for _, m := range cfg.Mutations {
		rep.Mutations = append(rep.Mutations, m.Name)
	}
	// Registered first, so it runs last: a teardown or restore that failed
	// leaves the host in a state the operator must hear about, whatever the
	// claims said.
	var dirty []string
	defer func() {
		if len(dirty) == 0 {
			return
		}
		if err != nil {
			err = fmt.Errorf("%w; and: %s", err, strings.Join(dirty, "; "))
			return
		}
		rep.dirty = true
		// A violated claim stays 1 (the problems say the rest); otherwise
		// the host may be left dirty, which is a tool error.
		if rep.ExitCode != ExitViolated {
			rep.ExitCode = ExitUsage
		}
	}()
	c := cfg.Host.Incus

	// Preflight.
	cfg.logf("preflight: incusd, leftovers of aborted runs")
	pctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	srv, err := c.Server(pctx)
	if err != nil {
		return nil, fmt.Errorf("preflight: %w", err)
	}
	rep.Environment = Environment{Mode: "world", Hostname: hostname(), Kernel: srv.Environment.KernelVersion,
		IncusVersion: srv.Environment.ServerVersion, InstanceType: "container"}
	if cfg.HostMode != nil {
		rep.Environment.Mode = "host"
	}
	if err := cleanLeftovers(pctx, cfg.Host, ""); err != nil {
		return nil, fmt.Errorf("preflight: cleaning an earlier run's boxes: %w", err)
	}

	// The stack.
	sctx, cancelStack := context.WithTimeout(ctx, 3*time.Minute)
	defer cancelStack()
	if cfg.NoSetup {
		cfg.logf("stack: verifying only (--no-setup)")
	} else {
		cfg.logf("stack: ensuring")
		er, err := cfg.Host.Ensure(sctx)
		if err != nil {
			return nil, fmt.Errorf("stack: %w", err)
		}
		rep.Stack.Ensured = true
		rep.Stack.Changes = er.Changes
	}
	if _, _, err := c.Network(sctx, stack.Current.Network); incus.IsNotFound(err) {
		return nil, fmt.Errorf("stack: there is no isolation stack to drill (no network %s): run box setup-host, or drop --no-setup", stack.Current.Network)
	}
	// Is the host fit to judge on? A bridge with no dnsmasq, or a gateway
	// address someone else holds, gives confident wrong answers.
	before, err := cfg.Host.Verify(sctx)
	if err != nil {
		return nil, fmt.Errorf("stack: %w", err)
	}
	if v := before; v.DnsmasqPID == 0 {
		return nil, fmt.Errorf("preflight: no dnsmasq serves %s (Incus may still call it Created): restart incusd, then box doctor", stack.Current.Network)
	} else {
		for _, f := range v.Findings {
			if strings.HasPrefix(f.Object, "gateway ") {
				return nil, fmt.Errorf("preflight: %s: %s: %s", f.Object, f.Problem, f.Fix)
			}
		}
	}
	if len(cfg.Mutations) > 0 {
		// Registered before the boxes' teardown, so it runs after it: the
		// stack is reconfigured only once no box is left on it.
		defer func() {
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
			defer cancel()
			if err := restoreStack(cctx, &cfg, before.Findings); err != nil {
				rep.Problems = append(rep.Problems, err.Error())
				dirty = append(dirty, err.Error())
			}
		}()
		if err := applyMutations(sctx, &cfg, false, nil); err != nil {
			return nil, err
		}
	}

	// Probe boxes, removed whatever happens.
	names := map[string]string{PlaceA: "drill-" + rep.RunID + "-a", PlaceB: "drill-" + rep.RunID + "-b", PlaceC: "drill-" + rep.RunID + "-c"}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
		defer cancel()
		cfg.logf("teardown: removing this run's boxes")
		if err := cleanLeftovers(cctx, cfg.Host, rep.RunID); err != nil {
			rep.Problems = append(rep.Problems, "teardown: "+err.Error())
			dirty = append(dirty, "teardown: "+err.Error())
		}
	}()
	cfg.logf("boxes: minting %s, %s and cloning %s", names[PlaceA], names[PlaceB], names[PlaceC])
	stamps := map[string]string{TagDrill: "1", TagRun: rep.RunID, stack.StampTemplate: "drill-probe", stack.StampVersion: cfg.Version}
	mctx, cancelMint := context.WithTimeout(ctx, 3*time.Minute)
	defer cancelMint()
	var mintErr [2]error
	var wg sync.WaitGroup
	for i, p := range []string{PlaceA, PlaceB} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			mintErr[i] = mintProbeBox(mctx, &cfg, stack.MintRequest{Name: names[p], Image: cfg.Image, Stamps: stamps})
		}()
	}
	wg.Wait()
	if err := errors.Join(mintErr[:]...); err != nil {
		return nil, fmt.Errorf("boxes: %w", err)
	}
	if _, err := cfg.Host.WaitAddress(mctx, names[PlaceA], 30*time.Second); err != nil {
		return nil, fmt.Errorf("boxes: %w", err)
	}
	if _, err := cfg.Host.Clone(mctx, names[PlaceA], "", names[PlaceC]); err != nil {
		return nil, fmt.Errorf("boxes: %w", err)
	}
	ends := map[string]*BoxEnd{}
	for _, p := range []string{PlaceA, PlaceB, PlaceC} {
		e, err := boxEnd(mctx, cfg.Host, p, names[p])
		if err != nil {
			return nil, fmt.Errorf("boxes: %w", err)
		}
		ends[p] = e
		rep.Boxes = append(rep.Boxes, *e)
	}

	actx, cancelAfter := context.WithTimeout(ctx, 2*time.Minute)
	defer cancelAfter()
	if err := applyMutations(actx, &cfg, true, names); err != nil {
		return nil, err
	}
	// The stack as the probes will find it: which layers are in the path.
	v, err := cfg.Host.Verify(actx)
	if err != nil {
		return nil, fmt.Errorf("stack: %w", err)
	}
	if !v.Subnet.IsValid() {
		return nil, fmt.Errorf("stack: there is no isolation stack to drill (%v): run box setup-host, or drop --no-setup", v.Findings)
	}
	rep.Stack.Subnet, rep.Stack.Gateway, rep.Stack.BridgeMode = v.Subnet.String(), v.Gateway.String(), string(v.BridgeMode)
	findings := mergeFindings(before.Findings, v.Findings)
	rep.Stack.Findings = findings
	rep.Stack.Layers = layerState(findings)
	if bnf, ok := bridgeNetfilter(cfg.Host.NetNS); ok {
		rep.Environment.BridgeNetfilter = bnf
	}

	// The agent, in every box.
	cfg.logf("agent: pushing %s into the boxes", filepath.Base(cfg.Agent))
	if err := pushAgent(actx, c, cfg.Agent, names); err != nil {
		return nil, fmt.Errorf("agent: %w", err)
	}

	var t Topology
	if cfg.World != nil {
		t = worldTopology(cfg.World, v, *ends[PlaceA], *ends[PlaceB], *ends[PlaceC])
	} else if t, err = hostTopology(cfg.HostMode, v, *ends[PlaceA], *ends[PlaceB], *ends[PlaceC]); err != nil {
		return nil, fmt.Errorf("targets: %w", err)
	}
	if n, _, err := c.Network(ctx, stack.Current.Network); err == nil && n.Config["dns.domain"] != "" {
		t.DNSDomain = n.Config["dns.domain"]
	}
	sc := BuildScenario(t, cfg.Claims)
	for _, p := range sc.Plans {
		rep.Summary.Probes += len(p.Probes)
	}
	cfg.logf("probes: %d probes from %d places, %s deadline each, all at once", rep.Summary.Probes, len(sc.Plans), probeDeadline)
	t0 := time.Now()
	obs, agentErr := runPlans(ctx, cfg, c, names, sc.Plans)
	rep.Summary.ProbePhaseMS = time.Since(t0).Milliseconds()
	if rep.Summary.Probes > 0 {
		rep.Summary.MSPerProbe = float64(rep.Summary.ProbePhaseMS) / float64(rep.Summary.Probes)
	}
	for place, e := range agentErr {
		rep.Problems = append(rep.Problems, "agent at "+place+": "+e)
	}
	rep.Problems = append(rep.Problems, failedControls(sc, obs)...)

	// Verdicts: the baselines first, for they decide what a block means.
	baselineOK := true
	judged := map[string]Result{}
	for _, a := range sc.Actions {
		if a.Baseline {
			r := judge(a, obs, t, true, agentErr)
			judged[a.ID] = r
			if r.Verdict != Pass {
				baselineOK = false
			}
		}
	}
	for _, a := range sc.Actions {
		if !a.Baseline {
			judged[a.ID] = judge(a, obs, t, baselineOK, agentErr)
		}
	}
	selected := map[string]bool{}
	for _, cl := range cfg.Claims {
		selected[cl.ID] = true
	}
	for _, cl := range Catalogue {
		var rs []Result
		for _, a := range sc.Actions {
			if a.Claim == cl.ID {
				rs = append(rs, judged[a.ID])
			}
		}
		if len(rs) > 0 {
			rs = append(rs, stackResults(cl, findings)...)
		}
		cr := aggregate(cl, rs)
		if !selected[cl.ID] && !cl.Baseline {
			cr = ClaimResult{Claim: cl, Verdict: Skipped, Reason: "not selected (--claim/--skip); run without them to include it", Results: []Result{}}
		}
		rep.Claims = append(rep.Claims, cr)
	}
	rep.finish()
	rep.DurationMS = time.Since(rep.Started).Milliseconds()
	return rep, nil
}

// finish counts the claims and sets the exit code (SPEC section 5): any
// failed claim is 1, a failed baseline included (the claims it leaves
// unjudgeable are inconclusive); otherwise anything inconclusive is 3.
func (rep *Report) finish() {
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
		if _, ok := out[f.Layer]; !ok || f.Advisory {
			continue
		}
		if out[f.Layer] == "present" {
			out[f.Layer] = "absent: " + f.Object + ": " + f.Problem
		}
	}
	return out
}

// bridgeNetfilter reads whether bridged IPv4 passes the inet hooks in the
// host's namespace (SPEC 7c): a layer not in the path proves nothing.
func bridgeNetfilter(ns string) (bool, bool) {
	var on, ok bool
	_ = nsrun.Do(ns, func() error {
		b, err := os.ReadFile("/proc/sys/net/bridge/bridge-nf-call-iptables")
		if err != nil {
			return err
		}
		ok, on = true, strings.TrimSpace(string(b)) == "1"
		return nil
	})
	return on, ok
}

func hostname() string {
	h, _ := os.Hostname()
	return h
}

// cleanLeftovers removes the drill's own boxes: those of one run, or (run
// empty) of every run. Only instances that carry both the box tag and the
// drill tag are touched.
func cleanLeftovers(ctx context.Context, h *stack.Host, run string) error {
	filter := map[string]string{TagDrill: "1"}
	if run != "" {
		filter[TagRun] = run
	}
	insts, err := h.Incus.Instances(ctx, filter)
	if err != nil {
		return err
	}
	var errs []error
	for _, i := range insts {
		if i.Config[stack.Current.Tag] != "1" {
			continue
		}
		if err := removeWhenIdle(ctx, h, i.Name); err != nil && !isGone(err) {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	left, err := h.Incus.Instances(ctx, filter)
	if err != nil {
		return err
	}
	var names []string
	for _, i := range left {
		if i.Config[stack.Current.Tag] == "1" {
			names = append(names, i.Name)
		}
	}
	if len(names) > 0 {
		return fmt.Errorf("drill boxes still there after removal: %s (remove them with box rm --force NAME)", strings.Join(names, ", "))
	}
	return nil
}

// removeWhenIdle removes a box, waiting out an operation a killed run left
// in flight ("Instance is busy running a create operation").
func removeWhenIdle(ctx context.Context, h *stack.Host, name string) error {
	deadline := time.Now().Add(time.Minute)
	for {
		err := h.Remove(ctx, name)
		if err == nil || !strings.Contains(err.Error(), "is busy") || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(500 * time.Millisecond):
		}
	}
}

func isGone(err error) bool {
	var nsb *stack.NoSuchBoxError
	return errors.As(err, &nsb) || incus.IsNotFound(err)
}

// mintProbeBox mints one probe box, and once more if incusd created it but
// could not start it (seen on a loaded machine: incusd's own start
// operation timing out). A probe box is scaffolding, not evidence: a second
// try changes no verdict.
func mintProbeBox(ctx context.Context, cfg *Config, req stack.MintRequest) error {
	_, err := cfg.Host.Mint(ctx, req)
	var ns *stack.NotStartedError
	if !errors.As(err, &ns) {
		return err
	}
	cfg.logf("boxes: %s would not start (%v); minting it again", req.Name, ns.Err)
	if rerr := removeWhenIdle(ctx, cfg.Host, req.Name); rerr != nil && !isGone(rerr) {
		return errors.Join(err, rerr)
	}
	_, err = cfg.Host.Mint(ctx, req)
	return err
}

// boxEnd reads what the scenario needs about a probe box.
func boxEnd(ctx context.Context, h *stack.Host, place, name string) (*BoxEnd, error) {
	ip, err := h.WaitAddress(ctx, name, 30*time.Second)
	if err != nil {
		return nil, err
	}
	inst, _, err := h.Incus.Instance(ctx, name)
	if err != nil {
		return nil, err
	}
	mac, err := net.ParseMAC(inst.Config["volatile.eth0.hwaddr"])
	if err != nil {
		return nil, fmt.Errorf("%s has no usable MAC (volatile.eth0.hwaddr=%q)", name, inst.Config["volatile.eth0.hwaddr"])
	}
	return &BoxEnd{Place: place, Instance: name, IP: ip, MAC: mac, LinkLocal: drillLinkLocal(mac)}, nil
}

func pushAgent(ctx context.Context, c *incus.Client, agent string, names map[string]string) error {
	var wg sync.WaitGroup
	errs := make([]error, 0, 3)
	var mu sync.Mutex
	for _, p := range []string{PlaceA, PlaceB, PlaceC} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f, err := os.Open(agent)
			if err == nil {
				defer f.Close()
				err = c.PushFile(ctx, names[p], agentPath, f, 0o755, 0, 0)
			}
			if err != nil {
				mu.Lock()
				errs = append(errs, fmt.Errorf("pushing the agent into %s: %w", names[p], err))
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// worldTopology fills the targets from the hermetic world.
func worldTopology(st *world.State, v *stack.Verification, a, b, c BoxEnd) Topology {
	t := Topology{
		Subnet: v.Subnet, Gateway: v.Gateway, A: a, B: b, C: c,
		Canary: world.Canary, CanaryTCP: world.CanaryTCPPort, CanaryUDP: world.EchoUDPPort,
		CanaryGreeting: st.Greeting("canary"), PublicName: world.PublicName, PublicNameAddr: world.Canary, DNSDomain: "incus",
		HostAddrs: []HostAddr{
			{Name: "gateway", Addr: v.Gateway, Via: v.Subnet},
			{Name: "lan-side", Addr: world.LANHostSide.Addr(), Via: world.LANHostSide.Masked()},
			{Name: "uplink", Addr: world.UplinkHost.Addr(), Via: world.UplinkHost.Masked()},
		},
		LANVia: world.LANRouter.Masked(), LANNAT: world.LANHostSide.Addr(), LANSource: world.LANRouter.Addr(),
	}
	for _, h := range world.LANHosts {
		t.LANHosts = append(t.LANHosts, Target{Name: h.Name, Addr: h.Addr, TCPPort: world.LANTCPPort, UDPPort: world.EchoUDPPort})
	}
	return t
}

// runPlans runs every place's plan at once and collects the observations.
func runPlans(ctx context.Context, cfg Config, c *incus.Client, names map[string]string, plans map[string]*probes.Plan) (observations, map[string]string) {
	obs := observations{}
	agentErr := map[string]string{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	places := make([]string, 0, len(plans))
	for p := range plans {
		places = append(places, p)
	}
	sort.Strings(places)
	for _, place := range places {
		plan := plans[place]
		wg.Add(1)
		go func() {
			defer wg.Done()
			rep, err := runPlan(ctx, cfg, c, names, place, plan)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				agentErr[place] = err.Error()
			}
			if rep == nil {
				return
			}
			if rep.Error != "" {
				agentErr[place] = rep.Error
			}
			m := map[string]probes.Observation{}
			for _, o := range rep.Observations {
				m[o.ID] = o
			}
			for _, n := range rep.Neighbors {
				if a, err := netip.ParseAddr(n.Address); err == nil {
					m[pinID(a)] = pinObservation(pinID(a), n)
				}
				if n.Pinned && !n.Removed {
					agentErr[place] = strings.TrimPrefix(agentErr[place]+"; ", "; ") + "a pinned neighbour was left behind: " + n.Error
				}
			}
			obs[place] = m
		}()
	}
	wg.Wait()
	return obs, agentErr
}

// failedControls names the positive controls that did not work: plan
// probes that serve no action (the host's control frames and its probes of
// its own listeners). The verdicts they leave inconclusive say so too; this
// puts the cause where an operator looks first.
func failedControls(sc *Scenario, obs observations) []string {
	actions := map[string]bool{}
	for _, a := range sc.Actions {
		actions[a.ID] = true
	}
	var out []string
	for _, place := range slices.Sorted(maps.Keys(sc.Plans)) {
		for _, p := range sc.Plans[place].Probes {
			if actions[p.ID] {
				continue
			}
			if o, ok := obs.get(place, p.ID); !ok || o.Outcome != probes.Reached {
				out = append(out, fmt.Sprintf("positive control %s at %s failed (%s): the verdicts resting on it are inconclusive", p.ID, place, reportOf(o, ok)))
			}
		}
	}
	return out
}

// pinObservation turns an agent's account of a pinned neighbour into an
// observation the judge can look up.
func pinObservation(id string, n probes.NeighborState) probes.Observation {
	o := probes.Observation{ID: id, Kind: "neighbor", Target: n.Address, Outcome: probes.Reached,
		Reason: "pinned to " + n.MAC + " on " + n.Interface}
	if !n.Pinned {
		o.Outcome, o.Reason = probes.Error, n.Error
	}
	return o
}

func runPlan(ctx context.Context, cfg Config, c *incus.Client, names map[string]string, place string, plan *probes.Plan) (*probes.Report, error) {
	data, err := json.Marshal(plan)
	if err != nil {
		return nil, err
	}
	limit := plan.Deadline() + 20*time.Second
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	var stdout, stderr []byte
	switch place {
	case PlaceHost, PlaceLAN:
		var cmd *exec.Cmd
		switch {
		case cfg.World == nil && cfg.Host.NetNS != "":
			// A real host whose bridge lives in another namespace
			// (BOX_NETNS): the agent runs there, where the bridge is.
			cmd = exec.CommandContext(ctx, "ip", "netns", "exec", cfg.Host.NetNS, cfg.Agent, "agent")
		case cfg.World == nil:
			// A real host: the agent runs right here, in its namespace.
			cmd = exec.CommandContext(ctx, cfg.Agent, "agent")
		default:
			ns := cfg.World.Names.HostNS
			if place == PlaceLAN {
				ns = cfg.World.Names.LANNS
			}
			cmd = exec.CommandContext(ctx, "ip", "netns", "exec", ns, cfg.Agent, "agent")
		}
		cmd.Stdin = bytes.NewReader(data)
		var eb bytes.Buffer
		cmd.Stderr = &eb
		stdout, err = cmd.Output()
		stderr = eb.Bytes()
	default:
		box := names[place]
		planPath := "/tmp/drill-plan.json"
		if err := c.PushFile(ctx, box, planPath, bytes.NewReader(data), 0o600, 0, 0); err != nil {
			return nil, fmt.Errorf("pushing the plan: %w", err)
		}
		var res *incus.ExecResult
		res, err = c.Exec(ctx, box, incus.ExecRequest{Command: []string{agentPath, "agent", "--plan", planPath}})
		if res != nil {
			stdout, stderr = res.Stdout, res.Stderr
			if err == nil && res.ExitCode != 0 {
				err = fmt.Errorf("the agent exited %d", res.ExitCode)
			}
		}
	}
	rep, derr := probes.DecodeReport(bytes.NewReader(stdout))
	if derr != nil {
		return nil, errors.Join(err, fmt.Errorf("reading the agent's report: %w (stderr: %.300s)", derr, stderr))
	}
	// A report came back, but whatever went wrong around it is kept.
	if err != nil {
		err = fmt.Errorf("%w (stderr: %.300s)", err, stderr)
	}
	return rep, err
}

// drillLinkLocal is the link-local address the agent adds on a probe box
// (without duplicate address detection, so it is usable at once): not the
// box's own EUI-64 address, which stays tentative for the box's first
// second or two.
func drillLinkLocal(mac net.HardwareAddr) netip.Addr {
	var b [16]byte
	b[0], b[1] = 0xfe, 0x80
	b[8], b[9] = 0xb0, 0xc5
	copy(b[10:], mac[len(mac)-6:])
	return netip.AddrFrom16(b)
}
