package probes

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"
)

// PlanReadTimeout bounds how long RunAgent waits for a whole plan on
// stdin; an exec whose stdin is never closed must not hang the agent.
const PlanReadTimeout = 10 * time.Second

// RunAgent is the in-box agent (`drill agent`): it reads one plan (JSON,
// version 1) from in, runs its listeners, witnesses and probes
// concurrently, and writes one report (JSON, version 1, one line) to out.
// It returns within the plan's deadline whatever the probes do, plus the
// time to write the report.
//
// A plan that cannot be read or is invalid still gets a report, with only
// "error" set, and RunAgent returns that error. Probe failures are not
// RunAgent errors: they are observations with outcome "error".
func RunAgent(ctx context.Context, in io.Reader, out io.Writer) error {
	if child, err := RunChild(in, out); child {
		return err
	}
	plan, err := readPlanWithin(ctx, in, PlanReadTimeout)
	if err != nil {
		now := time.Now()
		rep := &Report{Version: ReportVersion, StartedAt: now, FinishedAt: now, Observations: []Observation{}, Error: err.Error()}
		if werr := writeReport(out, rep); werr != nil {
			return errors.Join(err, werr)
		}
		return err
	}
	if plan.Nest != nil {
		return writeReport(out, RunNested(ctx, plan))
	}
	return writeReport(out, RunPlan(ctx, plan))
}

func readPlanWithin(ctx context.Context, in io.Reader, timeout time.Duration) (*Plan, error) {
	type result struct {
		p   *Plan
		err error
	}
	ch := make(chan result, 1)
	go func() {
		p, err := DecodePlan(in)
		ch <- result{p, err}
	}()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case r := <-ch:
		return r.p, r.err
	case <-t.C:
		return nil, fmt.Errorf("read plan: nothing complete on stdin within %s (is stdin closed?)", timeout)
	case <-ctx.Done():
		return nil, fmt.Errorf("read plan: %w", ctx.Err())
	}
}

func writeReport(out io.Writer, rep *Report) error {
	for i := range rep.Observations {
		if !rep.Observations[i].Outcome.Valid() {
			rep.Observations[i].Outcome = Error
			rep.Observations[i].Reason = "internal: no outcome was recorded"
		}
	}
	if err := json.NewEncoder(out).Encode(rep); err != nil {
		return fmt.Errorf("write report: %w", err)
	}
	return nil
}

// RunPlan runs a validated plan in this process's network namespace and
// returns the report. Observations come in plan order: listeners, then
// witnesses, then probes. The agent arms first (the link-local address,
// the pinned neighbours, every listener and witness), then waits for the
// plan's start, so arming never eats into a probe's time: every window,
// delay and the deadline count from the start, and the report says how
// long arming took and how much time it left before the start (a
// negative slack: it armed late, and started that late). Everything runs
// under one deadline: the tasks stop AgentMargin/2 before it, and
// whatever has not reported by then is recorded as an error, never as
// silence.
func RunPlan(ctx context.Context, p *Plan) *Report {
	armStart := time.Now()
	planned := p.Start(armStart)
	rep := &Report{Version: ReportVersion}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()

	tearDown := setUpLink(p, rep)

	n := len(p.Listeners) + len(p.Witnesses) + len(p.Probes)
	slots := make([]Observation, n)
	filled := make([]bool, n)
	var mu sync.Mutex
	closed := false
	var wg sync.WaitGroup
	set := func(i int, o Observation) {
		mu.Lock()
		if !closed {
			slots[i], filled[i] = o, true
		}
		mu.Unlock()
	}
	begin := armTasks(runCtx, p, set)
	if armingHook != nil {
		armingHook()
	}
	armedAt := time.Now()
	start := waitStart(ctx, planned)
	rep.StartedAt = start
	rep.ArmingMS = armedAt.Sub(armStart).Milliseconds()
	if !p.StartAt.IsZero() {
		rep.SlackMS = p.StartAt.Sub(armedAt).Milliseconds()
	}
	hard := start.Add(p.Deadline())
	stop := time.AfterFunc(time.Until(hard.Add(-AgentMargin/2)), cancel)
	defer stop.Stop()
	begin(start, &wg)
	startProbes(runCtx, p, &wg, set)
	waitTasks(&wg, hard.Add(-AgentMargin/4))

	mu.Lock()
	closed = true
	rep.Observations = make([]Observation, n)
	copy(rep.Observations, slots)
	for j := range rep.Observations {
		if !filled[j] {
			o := &rep.Observations[j]
			id, kind := planItem(p, j)
			*o = fail(Observation{ID: id, Kind: kind, StartedAt: start}, "did not finish before the plan's deadline")
			o.ElapsedMS = time.Since(start).Milliseconds()
		}
	}
	mu.Unlock()

	tearDown()
	rep.FinishedAt = time.Now()
	return rep
}

// setUpLink adds the plan's link-local address and pins its neighbours
// before any task runs, recording both in rep. tearDown undoes both once
// the tasks are done and records in rep the state it leaves them in.
func setUpLink(p *Plan, rep *Report) (tearDown func()) {
	var removeLL func() LinkLocalState
	if p.LinkLocal != nil {
		st, rm, err := EnsureLinkLocal(p.LinkLocal.Via, p.LinkLocal.Address)
		if err != nil {
			st.Error = err.Error()
		}
		rep.LinkLocal = &st
		removeLL = rm
	}
	var unpin func() []NeighborState
	if len(p.Neighbors) > 0 {
		rep.Neighbors, unpin = PinNeighbors(p.Neighbors)
	}
	return func() {
		if unpin != nil {
			rep.Neighbors = unpin()
		}
		if removeLL != nil {
			st := removeLL()
			if rep.LinkLocal.Error != "" && st.Error == "" {
				st.Error = rep.LinkLocal.Error
			}
			rep.LinkLocal = &st
		}
	}
}

// armingHook, when set (by a test), runs at the end of arming: a slow
// host's arming, made by hand.
var armingHook func()

// armTasks arms the plan's listeners and witnesses, in order, each
// reporting to set under its index in report order; what it returns
// starts their windows at the plan's start and waits for them in wg. A
// witness armed late would see nothing and make a leak look blocked:
// they are all armed before any probe fires.
func armTasks(ctx context.Context, p *Plan, set func(int, Observation)) func(start time.Time, wg *sync.WaitGroup) {
	var waits []func(start time.Time, wg *sync.WaitGroup)
	i := 0
	for _, spec := range p.Listeners {
		idx := i
		i++
		l, err := armListener(ctx, spec)
		if err != nil {
			set(idx, fail(Observation{ID: spec.ID, Kind: spec.Kind, StartedAt: time.Now()}, err.Error()))
			continue
		}
		waits = append(waits, func(start time.Time, wg *sync.WaitGroup) {
			l.begin(ctx, start)
			wg.Add(1)
			go func() { defer wg.Done(); set(idx, l.Wait(ctx)) }()
		})
	}
	for _, spec := range p.Witnesses {
		idx := i
		i++
		w, err := armWitness(spec)
		if err != nil {
			set(idx, fail(Observation{ID: spec.ID, Kind: KindWitness, StartedAt: time.Now()}, err.Error()))
			continue
		}
		waits = append(waits, func(start time.Time, wg *sync.WaitGroup) {
			w.begin(start)
			wg.Add(1)
			go func() { defer wg.Done(); set(idx, w.Wait(ctx)) }()
		})
	}
	return func(start time.Time, wg *sync.WaitGroup) {
		for _, w := range waits {
			w(start, wg)
		}
	}
}

// startProbes fires the plan's probes, each reporting to set under its
// index in report order (after the listeners and witnesses).
func startProbes(ctx context.Context, p *Plan, wg *sync.WaitGroup, set func(int, Observation)) {
	i := len(p.Listeners) + len(p.Witnesses)
	for _, spec := range p.Probes {
		idx := i
		i++
		wg.Add(1)
		go func() { defer wg.Done(); set(idx, RunProbe(ctx, spec)) }()
	}
}

// waitTasks waits for every task of wg, but not past until: a task still
// running then is reported unfinished rather than holding up the report.
func waitTasks(wg *sync.WaitGroup, until time.Time) {
	all := make(chan struct{})
	go func() { wg.Wait(); close(all) }()
	collect := time.NewTimer(time.Until(until))
	select {
	case <-all:
	case <-collect.C:
	}
	collect.Stop()
}

// waitStart waits until at (not past ctx) and returns the instant the
// agent starts.
func waitStart(ctx context.Context, at time.Time) time.Time {
	wait := time.Until(at)
	if wait <= 0 {
		return time.Now()
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
	return time.Now()
}

// planItem names the j-th task of a plan in report order.
func planItem(p *Plan, j int) (string, Kind) {
	if j < len(p.Listeners) {
		return p.Listeners[j].ID, p.Listeners[j].Kind
	}
	j -= len(p.Listeners)
	if j < len(p.Witnesses) {
		return p.Witnesses[j].ID, KindWitness
	}
	j -= len(p.Witnesses)
	return p.Probes[j].ID, p.Probes[j].Kind
}
