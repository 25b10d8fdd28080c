package drill

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/box-isolation/box/drill/image"
	"github.com/box-isolation/box/probes"
	"github.com/box-isolation/box/stack/boxes"
)

// C-KERNEL's load box: box-l, minted with limits (processes, a CPU
// allowance, memory, a root disk size) and held at them by a load while
// the other claims' probes run; and box-k, which box-l's isolated id map
// is compared with.

// C-KERNEL's own boxes: box-l, the load box, and box-k; both have an id
// map of their own (security.idmap.isolated), held apart.
const (
	PlaceL Place = "box-l"
	PlaceK Place = "box-k"
)

// box-l's limits, and its load's own caps past them: a limit that does
// not hold is seen, and the load stops there, well short of the host's
// (docs/claims.md, "C-KERNEL").
const (
	loadProcesses  = 128
	loadProcCap    = 256
	loadAllowance  = "25ms/100ms"
	loadCPUs       = 0.25
	loadSpinners   = 2
	loadMemoryMiB  = 256
	loadMemoryCap  = 384
	loadDiskMiB    = 64
	loadDiskCap    = 96
	loadDiskFolder = "/" // the box's root disk, in any image
	// The slack a load may pass its limit by and still be held there:
	// tasks that ended while it counted, pages the OOM killer had not
	// yet taken, blocks a quota accounts late.
	loadTaskSlack = 8
	loadMiBSlack  = 32
	// loadGiveBack is how long before the plan's deadline the loads end.
	loadGiveBack = 1500 * time.Millisecond
)

// loadPlan is what box-l's load may push against: memory only where
// box-l has a memory limit (Mint drops one the host cannot apply), the
// disk only where its root disk has a quota. mintLoadBox finds out;
// buildKernel reads it by box-l's instance name (loadPlanOf).
type loadPlan struct{ memory, disk, k bool }

var loadPlans = struct {
	sync.Mutex
	m map[string]loadPlan
}{m: map[string]loadPlan{}}

// loadPlanOf is the load plan of the load box l, and whether there is a
// load box (its plan as mintLoadBox found it, or every load when the
// scene was made without it).
func loadPlanOf(l BoxEnd) (loadPlan, bool) {
	if !l.IP.IsValid() {
		return loadPlan{}, false
	}
	loadPlans.Lock()
	lp, ok := loadPlans.m[l.Instance]
	loadPlans.Unlock()
	if !ok {
		lp = loadPlan{memory: true, disk: true, k: true}
	}
	return lp, true
}

// buildLoads has box-l compare its id map with box-k's, and run its loads
// beside the kernel checks, each holding the box at a limit until the
// other boxes' probes are done.
func buildLoads(b *builder, lp loadPlan) {
	b.probe(Action{Claim: KernelID, Channel: ChannelIDMapDisjoint, From: PlaceL, Target: "box-k's id map (both isolated)", TargetKey: "kernel", Expect: ExpectContained}, kernelProbe(probes.KindIDMap))
	// The loads end, and give back what they hold, while the main volley's
	// last answers are in and before the witnesses' last second: given
	// back at the plan's end, the host's and the LAN's agents were late
	// for their collection on a loaded machine in most runs (the release
	// of box-l's memory, file and processes, all at once).
	budget := int((planDeadline - loadGiveBack).Milliseconds())
	load := func(ch Channel, kind probes.Kind, delay, end, max int, paths ...string) {
		b.probe(Action{Claim: KernelID, Channel: ch, From: PlaceL, Target: loadTargets[ch], TargetKey: "limits", Expect: ExpectHeld},
			probes.ProbeSpec{Kind: kind, DelayMS: delay, DeadlineMS: end - delay, Max: max, Paths: paths})
	}
	// The fork bomb comes last: once the kernel checks' children have come
	// and gone (a few ms), and with the memory hog once it has met the OOM
	// killer (a second kill while the box is full of processes could take
	// the agent). Without the hog it starts 0.2 s in.
	//
	// The CPU spin never runs beside the fork bomb's starts, though at
	// the lowest priority: the box's allowance is spent whenever the bomb
	// waits for a child's exec, and the box is then held back for the rest
	// of the period. Beside it, the bomb started 100 or so processes in
	// 3.3 s on a slow machine, just reaching the limit at the plan's end or
	// cut short (inconclusive); alone, in 1.5 s (docs/measurements.md,
	// "The kernel boundary"). So without the hog the spin comes once the
	// bomb has mostly filled the box, and with it, before the bomb.
	end := budget - 50
	procDelay, cpuDelay, cpuEnd := 200, 1600, end
	if lp.memory {
		procDelay, cpuDelay, cpuEnd = 2000, 100, 1900+int(probes.LoadReserve.Milliseconds())
	}
	load(ChannelCPU, probes.KindLoadCPU, cpuDelay, cpuEnd, loadSpinners)
	if lp.memory {
		load(ChannelMemory, probes.KindLoadMemory, 10, end, loadMemoryCap)
	}
	if lp.disk {
		load(ChannelDisk, probes.KindLoadDisk, 100, end, loadDiskCap, loadDiskFolder)
	}
	load(ChannelProcesses, probes.KindLoadProcs, procDelay, end, loadProcCap)
}

// loadTargets say what each load meets.
var loadTargets = map[Channel]string{
	ChannelProcesses: fmt.Sprintf("limits.processes=%d (a fork bomb, its own cap %d)", loadProcesses, loadProcCap),
	ChannelCPU:       fmt.Sprintf("limits.cpu.allowance=%s (%d threads spinning)", loadAllowance, loadSpinners),
	ChannelMemory:    fmt.Sprintf("limits.memory=%dMiB (a memory hog, its own cap %d MiB)", loadMemoryMiB, loadMemoryCap),
	ChannelDisk:      fmt.Sprintf("a %dMiB root disk (a disk fill, its own cap %d MiB)", loadDiskMiB, loadDiskCap),
}

// mintLoadBox mints box-l, with an id map of its own and the limits its
// load meets (processes, a CPU allowance, memory and a root disk size),
// and box-k, with an id map of its own too, both from the probe image (a
// template's image would not fit a small disk). What of its load this
// host cannot bound is left out, and the report says so.
func mintLoadBox(ctx context.Context, r *run) error {
	names := map[Place]string{PlaceL: r.name(PlaceL, r.boxName("l")), PlaceK: r.name(PlaceK, r.boxName("k"))}
	name := names[PlaceL]
	reqs := map[Place]boxes.MintRequest{}
	for _, p := range []Place{PlaceL, PlaceK} {
		req, err := r.mintRequest(names[p], r.members.local(), false)
		if err != nil {
			return fmt.Errorf("kernel: %w", err)
		}
		if r.cfg.Template != nil {
			res, err := image.Ensure(ctx, r.cfg.Host.Incus, image.DefaultAlias, image.Options{})
			if err != nil {
				return fmt.Errorf("kernel: the probe image for %s: %w", p, err)
			}
			req.Image, req.Fingerprint, req.Origin = res.Alias, "", ""
		}
		req.IsolatedIDMap = true
		reqs[p] = req
	}
	req := reqs[PlaceL]
	req.Processes = fmt.Sprint(loadProcesses)
	req.CPUAllowance = loadAllowance
	req.Memory = fmt.Sprintf("%dMiB", loadMemoryMiB)
	req.Disk = fmt.Sprintf("%dMiB", loadDiskMiB)
	reqs[PlaceL] = req
	r.cfg.logf("kernel: minting %s (isolated id map, %d processes, CPU %s, %s memory, %s disk) and %s (isolated id map)", name, loadProcesses, loadAllowance, req.Memory, req.Disk, names[PlaceK])
	// One after the other: each isolated box's range is chosen as it is
	// made (docs/measurements.md, "The kernel boundary").
	for _, p := range []Place{PlaceL, PlaceK} {
		if err := mintProbeBox(ctx, &r.cfg, reqs[p]); err != nil {
			return fmt.Errorf("kernel: %w", err)
		}
	}
	for _, p := range []Place{PlaceL, PlaceK} {
		e, err := boxEnd(ctx, r.cfg.Host, p, names[p])
		if err != nil {
			return fmt.Errorf("kernel: %w", err)
		}
		r.addBox(e)
	}
	lp := loadPlan{k: true}
	if !r.cfg.FillLoads {
		// On the 2-core CI machine the memory hog's OOM kill took box-l's
		// agent too now and then (exit 137), and in one clean-clone run
		// direct writes passed the 64MiB root disk: the pool's kernel had
		// stopped counting, which the stack now names on L-FLEET and
		// rescans (docs/claims.md, "C-KERNEL").
		r.note(fmt.Sprintf("%s: box-l's memory hog and disk fill are left out (drill run --fill-loads adds them); the limits they meet are shown by stack/boxes' TestSystemLimitsHold", KernelID))
		r.later(func(context.Context) error {
			loadPlans.Lock()
			delete(loadPlans.m, name)
			loadPlans.Unlock()
			return nil
		})
		loadPlans.Lock()
		loadPlans.m[name] = lp
		loadPlans.Unlock()
		return nil
	}
	inst, _, err := r.cfg.Host.Incus.Instances().Get(ctx, name)
	if err != nil {
		return fmt.Errorf("kernel: %w", err)
	}
	if lp.memory = inst.ExpandedConfig["limits.memory"] != ""; !lp.memory {
		r.note(fmt.Sprintf("%s: box-l's memory is not loaded: this host cannot apply a memory limit (box says so when it mints), so a memory hog would take the host's", KernelID))
	}
	st, err := r.cfg.Host.Incus.Instances().State(ctx, name)
	if err != nil {
		return fmt.Errorf("kernel: %w", err)
	}
	if lp.disk = st.Disk["root"].Total > 0; !lp.disk {
		r.note(fmt.Sprintf("%s: box-l's disk is not filled: its storage pool enforces no root disk size (a dir pool without project quotas), so a disk fill would fill the host's", KernelID))
	}
	loadPlans.Lock()
	loadPlans.m[name] = lp
	loadPlans.Unlock()
	r.later(func(context.Context) error {
		loadPlans.Lock()
		delete(loadPlans.m, name)
		loadPlans.Unlock()
		return nil
	})
	return nil
}

// isolatedPlaces are the boxes the drill mints with an id map of their
// own.
var isolatedPlaces = []Place{PlaceL, PlaceK}

// disjoint holds the isolated boxes' id maps, as their agents read them,
// apart: no host id in common. Incus keeps isolated boxes apart from each
// other only; where the others share one map over the whole subordinate
// range, an isolated box's range lies inside it, and the result says so.
func disjoint(res Result, m map[Place][]probes.IDRange) Result {
	res = Result{Action: res.Action}
	var got []Place
	for _, p := range isolatedPlaces {
		if _, ok := m[p]; ok {
			got = append(got, p)
		}
	}
	if len(got) < 2 {
		return verdict(res, Inconclusive, fmt.Sprintf("the id maps of %d isolated box(es) were read: two are needed to compare", len(got)))
	}
	a, b := m[got[0]], m[got[1]]
	res.Observed = rangesString(a) + " / " + rangesString(b)
	if at, overlap := probes.Overlap(a, b); overlap {
		return verdict(res, Fail, fmt.Sprintf("%s's and %s's isolated id maps share host id %d (%s; %s)", got[0], got[1], at, rangesString(a), rangesString(b)))
	}
	ev := fmt.Sprintf("%s's and %s's isolated id maps share no host id (%s; %s)", got[0], got[1], rangesString(a), rangesString(b))
	var inside []string
	for _, p := range slices.Sorted(maps.Keys(m)) {
		if slices.Contains(isolatedPlaces, p) {
			continue
		}
		if _, overlap := probes.Overlap(a, m[p]); overlap {
			inside = append(inside, string(p))
		}
	}
	if len(inside) > 0 {
		ev += "; the boxes that are not isolated (" + strings.Join(inside, ", ") + ") share one map that holds both ranges: only isolated boxes are kept apart"
	}
	return verdict(res, Pass, ev)
}

// load judges one of box-l's loads against its limit, and says what the
// load reached.
func (kj *kernelJudge) load(a Action) Result {
	res := Result{Action: a}
	o, ok := kj.r.obs.get(a.From, a.ID)
	if !ok {
		return verdict(res, Inconclusive, "the load box's agent returned nothing for this load ("+cmpOr(kj.r.agentErr[a.From], "no reason given")+")")
	}
	res.Obs = &o
	res.Observed = describe(o)
	l := o.Evidence.Load
	if l == nil {
		return verdict(res, Inconclusive, "the load could not run: "+o.Reason)
	}
	switch a.Channel {
	case ChannelProcesses:
		switch {
		case o.Outcome == probes.Reached:
			return verdict(res, Fail, fmt.Sprintf("started %d processes, its own cap: limits.processes=%d did not stop it", l.Reached, loadProcesses))
		case l.StoppedBy == "EAGAIN" && l.Tasks < loadProcesses-loadTaskSlack:
			return verdict(res, Inconclusive, fmt.Sprintf("refused at %d tasks, well short of limits.processes=%d: another limit (a user's RLIMIT_NPROC, the host's pid_max) stopped it first, so the box's was not shown", l.Tasks, loadProcesses))
		case l.StoppedBy == "EAGAIN" && l.Tasks <= loadProcesses+loadTaskSlack:
			return verdict(res, Pass, fmt.Sprintf("the fork bomb stopped at %d tasks in the box (%d processes of its own; the kernel refused the next: EAGAIN) and held them %s", l.Tasks, l.Reached, time.Duration(l.HeldMS)*time.Millisecond))
		case l.StoppedBy == "EAGAIN":
			return verdict(res, Fail, fmt.Sprintf("refused only at %d tasks, past limits.processes=%d", l.Tasks, loadProcesses))
		}
	case ChannelCPU:
		if l.WallSeconds <= 0 {
			break
		}
		got := l.CPUSeconds / l.WallSeconds
		if got > loadCPUs*1.25+0.05 {
			return verdict(res, Fail, fmt.Sprintf("%d threads spinning for %.1f s got %.2f CPUs, past the allowance's %.2f", loadSpinners, l.WallSeconds, got, loadCPUs))
		}
		if got < loadCPUs/4 {
			return verdict(res, Inconclusive, fmt.Sprintf("%d threads spinning for %.1f s got only %.2f CPUs, far below the allowance's %.2f: the load did not push (or the host was too busy to give it any), so the cap was not shown", loadSpinners, l.WallSeconds, got, loadCPUs))
		}
		return verdict(res, Pass, fmt.Sprintf("%d threads spinning for %.1f s got %.2f CPUs (%.2f s of CPU time): at most the allowance's %.2f", loadSpinners, l.WallSeconds, got, l.CPUSeconds, loadCPUs))
	case ChannelMemory:
		switch {
		case o.Outcome == probes.Reached:
			return verdict(res, Fail, fmt.Sprintf("touched %d MiB, its own cap: limits.memory=%dMiB did not stop it", l.Reached, loadMemoryMiB))
		case l.StoppedBy == "SIGKILL" && l.Reached < loadMemoryMiB-2*loadMiBSlack:
			return verdict(res, Inconclusive, fmt.Sprintf("the memory hog was killed after only %d MiB, well short of limits.memory=%dMiB: something else took it, so the limit was not shown", l.Reached, loadMemoryMiB))
		case l.StoppedBy == "SIGKILL" && l.Reached <= loadMemoryMiB+loadMiBSlack:
			return verdict(res, Pass, fmt.Sprintf("the memory hog was killed (the OOM killer, in the box) after touching %d MiB, within limits.memory=%dMiB", l.Reached, loadMemoryMiB))
		case l.StoppedBy == "SIGKILL":
			return verdict(res, Fail, fmt.Sprintf("killed only after %d MiB, past limits.memory=%dMiB", l.Reached, loadMemoryMiB))
		}
	case ChannelDisk:
		switch {
		case o.Outcome == probes.Reached:
			return verdict(res, Fail, fmt.Sprintf("wrote %d MiB, its own cap: the %dMiB root disk did not stop it", l.Reached, loadDiskMiB))
		case (l.StoppedBy == "EDQUOT" || l.StoppedBy == "ENOSPC") && l.Reached < loadDiskMiB/2:
			return verdict(res, Inconclusive, fmt.Sprintf("the disk fill stopped at %d MiB (%s), well short of the %dMiB root disk: a full pool says the same, so the box's size was not shown", l.Reached, l.StoppedBy, loadDiskMiB))
		case (l.StoppedBy == "EDQUOT" || l.StoppedBy == "ENOSPC") && l.Reached <= loadDiskMiB+loadMiBSlack:
			return verdict(res, Pass, fmt.Sprintf("the disk fill stopped at %d MiB (%s) of the %dMiB root disk, and held it %s", l.Reached, l.StoppedBy, loadDiskMiB, time.Duration(l.HeldMS)*time.Millisecond))
		case l.StoppedBy != "":
			return verdict(res, Fail, fmt.Sprintf("stopped (%s) only after %d MiB, past the %dMiB root disk", l.StoppedBy, l.Reached, loadDiskMiB))
		}
	}
	return verdict(res, Inconclusive, "the load ended without meeting a limit or its cap: "+o.Reason)
}
