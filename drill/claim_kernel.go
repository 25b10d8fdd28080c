package drill

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/box-isolation/box/drill/image"
	"github.com/box-isolation/box/probes"
	"github.com/box-isolation/box/stack"
	"github.com/box-isolation/box/stack/model"
)

// KernelID is C-KERNEL: a box is a container here, and the host's kernel
// is all that stands between it and the host: root in a box is nobody on
// the host, and every way out through the kernel is shut.
const KernelID ClaimID = "C-KERNEL"

var claimKernel = Claim{
	ID: KernelID, From: "inside each probe box, and box-k and box-l (each with an id map of its own), box-l held at its limits by a load while the other claims' probes run",
	To: "the host's kernel: its ids, capabilities, system call filter, mounts, device nodes, /proc/sys, core_pattern, sysrq-trigger, the cgroup release_agent, module loading, the guest API; and the host's processes, CPU, memory and disk",
	Channels: []Channel{ChannelIDMap, ChannelIDMapDisjoint, ChannelCapabilities, ChannelSeccomp, ChannelLSM, ChannelMounts, ChannelDevices,
		ChannelProcSys, ChannelCorePattern, ChannelSysrq, ChannelReleaseAgent, ChannelModules, ChannelGuestAPI,
		ChannelProcesses, ChannelCPU, ChannelMemory, ChannelDisk},
	Expect: "root in a box is no host user, and an isolated box's ids are its own; capabilities only over the box's own user namespace; the system call filter on; no host path mounted and no device node beyond a container's default; /proc/sys, core_pattern, sysrq-trigger and every release_agent refused to a writer (opened, never written); no guest API (box's profile turns /dev/incus off); a fork bomb, a CPU spin, a memory hog and a disk fill stop at box-l's own limits",
	Layers: []model.LayerID{model.LayerFleet},
	Why:    "on a host that cannot run VMs a box is a container: the host's kernel is the boundary, and nothing else proves what a box can do to the host and its siblings besides the network",
	Modes:  everywhere, Evidence: []Evidence{EvidenceProbes},
	prepare: prepareKernel,
	build:   buildKernel,
	judge:   judgeKernel,
}

// prepareKernel mints box-l and box-k, then reads every probe box's
// guest API config.
func prepareKernel(ctx context.Context, r *run) error {
	if err := mintLoadBox(ctx, r); err != nil {
		return err
	}
	readGuestAPIConfig(ctx, r)
	return nil
}

// readGuestAPIConfig reads whether each probe box's config turns its
// guest API off: a box with no /dev/incus passes the guest API check only
// when its config says so (a socket merely missing, with the API on,
// proves nothing about what it would answer).
func readGuestAPIConfig(ctx context.Context, r *run) {
	r.guestAPIOff = map[Place]bool{}
	for place, name := range r.names {
		inst, _, err := r.boxClient(place).Instance(ctx, name)
		if err != nil {
			continue // judged inconclusive: no config read
		}
		r.guestAPIOff[place] = model.GuestAPIOff(inst.ExpandedConfig)
	}
}

// C-KERNEL's own boxes: box-l, the load box, and box-k; both have an id
// map of their own (security.idmap.isolated), held apart.
const (
	PlaceL Place = "box-l"
	PlaceK Place = "box-k"
)

// C-KERNEL's channels: what each result looks at from inside a box.
const (
	ChannelIDMap         Channel = "id-map"
	ChannelIDMapDisjoint Channel = "id-map-disjoint"
	ChannelCapabilities  Channel = "capabilities"
	ChannelSeccomp       Channel = "seccomp"
	ChannelLSM           Channel = "lsm"
	ChannelMounts        Channel = "mounts"
	ChannelDevices       Channel = "devices"
	ChannelProcSys       Channel = "proc-sys"
	ChannelCorePattern   Channel = "core-pattern"
	ChannelSysrq         Channel = "sysrq-trigger"
	ChannelReleaseAgent  Channel = "release-agent"
	ChannelModules       Channel = "module-loading"
	ChannelGuestAPI      Channel = "guest-api"
	ChannelProcesses     Channel = "processes"
	ChannelCPU           Channel = "cpu"
	ChannelMemory        Channel = "memory"
	ChannelDisk          Channel = "disk"
)

// What C-KERNEL's results must observe.
const (
	ExpectContained Expectation = "contained"
	ExpectHeld      Expectation = "held at its limit"
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

// The paths the kernel probes open and read.
var (
	// procSysPaths are host-wide kernel settings, none a box's own.
	procSysPaths    = []string{"/proc/sys/vm/drop_caches", "/proc/sys/kernel/panic", "/proc/sys/kernel/randomize_va_space", "/proc/sys/fs/file-max", "/proc/sys/vm/overcommit_memory"}
	corePatternPath = "/proc/sys/kernel/core_pattern"
	sysrqPath       = "/proc/sysrq-trigger"
	modprobePath    = "/proc/sys/kernel/modprobe"
	modulesPath     = "/proc/modules"
	lsmPath         = "/proc/self/attr/current"
	guestAPISocket  = "/dev/incus/sock"
	guestAPIPaths   = []string{"/1.0", "/1.0/config", "/1.0/meta-data", "/1.0/devices"}
	// The guest API probes run one box at a time after the other probes
	// (splitGuestAPI), each within guestAPIDeadlineMS, its plan's deadline
	// guestAPIPlanMarginMS more.
	guestAPIDeadlineMS   = 1000
	guestAPIPlanMarginMS = 500
	writeControlPath     = "/proc/sys/net/ipv4/ip_forward" // the box's own network namespace's: a box may write it
)

// defaultDevices are the device nodes a container gets (major:minor), and
// ptsMajors its own pseudo-terminals' (the console is one).
var (
	defaultDevices = map[[2]uint32]string{
		{1, 3}: "null", {1, 5}: "zero", {1, 7}: "full", {1, 8}: "random", {1, 9}: "urandom",
		{5, 0}: "tty", {5, 1}: "console", {5, 2}: "ptmx", {10, 229}: "fuse", {10, 200}: "net/tun",
	}
	defaultDevPaths = map[string]bool{"/null": true, "/zero": true, "/full": true, "/random": true, "/urandom": true,
		"/tty": true, "/console": true, "/ptmx": true, "/fuse": true, "/net/tun": true}
)

func isPtsMajor(m uint32) bool { return m >= 136 && m <= 143 }

// kernelCheck is one probe every box runs for C-KERNEL.
type kernelCheck struct {
	ch     Channel
	target string
	spec   probes.ProbeSpec
	// control, when set, is a probe the check is judged beside.
	control *probes.ProbeSpec
}

func kernelProbe(kind probes.Kind, paths ...string) probes.ProbeSpec {
	return probes.ProbeSpec{Kind: kind, DelayMS: 10, DeadlineMS: 2000, Paths: paths}
}

// kernelControls are the probes the checks are judged beside: a path of
// the box's own opened for writing, and the system call filter's trials.
func kernelControls() (writes, seccomp probes.ProbeSpec) {
	return kernelProbe(probes.KindWriteOpen, writeControlPath), kernelProbe(probes.KindSeccomp)
}

// kernelChecks are the probes each box runs, its controls beside them.
func kernelChecks() []kernelCheck {
	k := func(kind probes.Kind) probes.ProbeSpec { return kernelProbe(kind) }
	withPaths := kernelProbe
	ctl, seccomp := kernelControls()
	api := withPaths(probes.KindUnixHTTP, guestAPIPaths...)
	api.Socket = guestAPISocket
	return []kernelCheck{
		{ch: ChannelIDMap, target: "/proc/self/uid_map, gid_map", spec: k(probes.KindIDMap)},
		{ch: ChannelCapabilities, target: "/proc/self/status", spec: k(probes.KindCapabilities)},
		{ch: ChannelSeccomp, target: "the system call filter", spec: seccomp},
		{ch: ChannelLSM, target: lsmPath, spec: withPaths(probes.KindReadFiles, lsmPath)},
		{ch: ChannelMounts, target: "/proc/self/mountinfo", spec: k(probes.KindMounts)},
		{ch: ChannelDevices, target: "/dev", spec: k(probes.KindDevices)},
		{ch: ChannelProcSys, target: "/proc/sys (host-wide settings)", spec: withPaths(probes.KindWriteOpen, procSysPaths...), control: &ctl},
		{ch: ChannelCorePattern, target: corePatternPath, spec: withPaths(probes.KindWriteOpen, corePatternPath), control: &ctl},
		{ch: ChannelSysrq, target: sysrqPath, spec: withPaths(probes.KindWriteOpen, sysrqPath), control: &ctl},
		{ch: ChannelReleaseAgent, target: "cgroup v1 release_agent", spec: k(probes.KindReleaseAgent)},
		{ch: ChannelModules, target: "module loading", spec: withPaths(probes.KindReadFiles, modulesPath, modprobePath), control: &seccomp},
		{ch: ChannelGuestAPI, target: guestAPISocket, spec: api},
	}
}

// loadPlan is what box-l's load may push against: memory only where
// box-l has a memory limit (Mint drops one the host cannot apply), the
// disk only where its root disk has a quota. mintLoadBox finds out;
// buildKernel reads it by box-l's instance name.
type loadPlan struct{ memory, disk, k bool }

var loadPlans = struct {
	sync.Mutex
	m map[string]loadPlan
}{m: map[string]loadPlan{}}

// buildKernel has every probe box run the kernel checks, and box-l its
// loads beside them: the kernel checks first, then each load holding the
// box at a limit until the other boxes' probes are done.
func buildKernel(b *builder) {
	t := b.t
	ends := []BoxEnd{t.A, t.B, t.C, t.T, t.W, t.N, t.L}
	for _, m := range t.Members {
		ends = append(ends, m.Box)
	}
	var places []Place
	for _, e := range ends {
		if e.IP.IsValid() {
			places = append(places, e.Place)
		}
	}
	l := t.L
	var lp loadPlan
	if l.IP.IsValid() {
		loadPlans.Lock()
		var ok bool
		lp, ok = loadPlans.m[l.Instance]
		loadPlans.Unlock()
		if !ok {
			lp = loadPlan{memory: true, disk: true, k: true}
		}
		if lp.k {
			places = append(places, PlaceK)
		}
	}
	for _, p := range places {
		for _, c := range kernelChecks() {
			spec := c.spec
			if c.ch == ChannelGuestAPI {
				// One box at a time, after the other probes
				// (splitGuestAPI): incusd 6.0 (Debian's backports) reads
				// its /dev/incus connection map unlocked while a new or
				// closing connection writes it, and two boxes' requests
				// at once crashed the world's incusd ("concurrent map read
				// and map write", dev_incus.go hoistReq; fixed in Incus
				// 7.3, lxc/incus#3618). docs/measurements.md, "The kernel
				// boundary".
				spec.DeadlineMS = guestAPIDeadlineMS
			}
			a := b.probe(Action{Claim: KernelID, Channel: c.ch, From: p, Target: c.target, TargetKey: "kernel", Expect: ExpectContained}, spec)
			if c.control != nil {
				spec := *c.control
				spec.ID = "kc-" + string(c.control.Kind) + "-" + strings.ReplaceAll(string(p), "@", ".") // a member's box is box@MEMBER
				a.Reference = b.reference(p, spec)
			}
		}
	}
	if !l.IP.IsValid() {
		return
	}
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
	name := r.boxName("l")
	r.names[PlaceL], r.names[PlaceK] = name, r.boxName("k")
	reqs := map[Place]stack.MintRequest{}
	for _, p := range []Place{PlaceL, PlaceK} {
		req, err := r.mintRequest(r.names[p], r.localMember(), false)
		if err != nil {
			return fmt.Errorf("kernel: %w", err)
		}
		if r.cfg.Template != nil {
			res, err := image.Ensure(ctx, r.cfg.Host.Incus, image.DefaultAlias, image.Options{})
			if err != nil {
				return fmt.Errorf("kernel: the probe image for %s: %w", p, err)
			}
			req.Image = res.Alias
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
	r.cfg.logf("kernel: minting %s (isolated id map, %d processes, CPU %s, %s memory, %s disk) and %s (isolated id map)", name, loadProcesses, loadAllowance, req.Memory, req.Disk, r.names[PlaceK])
	// One after the other: each isolated box's range is chosen as it is
	// made (docs/measurements.md, "The kernel boundary").
	for _, p := range []Place{PlaceL, PlaceK} {
		if err := mintProbeBox(ctx, &r.cfg, reqs[p]); err != nil {
			return fmt.Errorf("kernel: %w", err)
		}
	}
	for _, p := range []Place{PlaceL, PlaceK} {
		e, err := boxEnd(ctx, r.cfg.Host, p, r.names[p])
		if err != nil {
			return fmt.Errorf("kernel: %w", err)
		}
		r.ends[p] = e
		r.rep.Boxes = append(r.rep.Boxes, *e)
	}
	lp := loadPlan{k: true}
	if !r.cfg.FillLoads {
		// On the 2-core CI machine the memory hog's OOM kill took box-l's
		// agent too now and then (exit 137), and in one clean-clone run
		// direct writes passed the 64MiB root disk: the pool's kernel had
		// stopped counting, which the stack now names on L-FLEET and
		// rescans (docs/claims.md, "C-KERNEL").
		r.rep.Notes = append(r.rep.Notes, fmt.Sprintf("%s: box-l's memory hog and disk fill are left out (drill run --fill-loads adds them); the limits they meet are shown by the stack's TestSystemLimitsHold", KernelID))
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
	inst, _, err := r.cfg.Host.Incus.Instance(ctx, name)
	if err != nil {
		return fmt.Errorf("kernel: %w", err)
	}
	if lp.memory = inst.ExpandedConfig["limits.memory"] != ""; !lp.memory {
		r.rep.Notes = append(r.rep.Notes, fmt.Sprintf("%s: box-l's memory is not loaded: this host cannot apply a memory limit (box says so when it mints), so a memory hog would take the host's", KernelID))
	}
	st, err := r.cfg.Host.Incus.InstanceState(ctx, name)
	if err != nil {
		return fmt.Errorf("kernel: %w", err)
	}
	if lp.disk = st.Disk["root"].Total > 0; !lp.disk {
		r.rep.Notes = append(r.rep.Notes, fmt.Sprintf("%s: box-l's disk is not filled: its storage pool enforces no root disk size (a dir pool without project quotas), so a disk fill would fill the host's", KernelID))
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

// kernelJudge is what judging one box's checks needs.
type kernelJudge struct {
	r *run
	// notes are the checks not applicable here, each said once.
	notes map[Channel]string
	// host are the host's mounts by device (read once, hostMounts).
	host     map[string]string
	hostRead bool
}

// hostMounts are the devices of the mounts the drill's host sees (its
// own mount namespace's and init's), each with a mount point: a box's
// kernel file system on one of them is the host's, bound in.
func (kj *kernelJudge) hostMounts() map[string]string {
	if !kj.hostRead {
		kj.hostRead = true
		kj.host = map[string]string{}
		for _, f := range []string{"/proc/self/mountinfo", "/proc/1/mountinfo"} {
			b, err := os.ReadFile(f)
			if err != nil {
				continue
			}
			for _, line := range strings.Split(string(b), "\n") {
				if a := strings.Fields(line); len(a) > 4 {
					if _, seen := kj.host[a[2]]; !seen {
						kj.host[a[2]] = a[4]
					}
				}
			}
		}
	}
	return kj.host
}

// judgeKernel judges every box's checks from the agents' observations,
// box-l's id map against every other box's (it is isolated), box-l's
// loads against its limits, and the stack channel.
func judgeKernel(r *run, c Claim, rs []Result) []Result {
	kj := &kernelJudge{r: r, notes: map[Channel]string{}}
	var out, later []Result
	idmaps := map[Place][]probes.IDRange{}
	notApplicable := map[Channel][]Action{}
	for _, res := range rs {
		a := res.Action
		switch {
		case res.Channel == ChannelIDMapDisjoint:
			later = append(later, res)
			continue
		case res.Expect == ExpectHeld:
			res = kj.load(a)
		default:
			res = kj.check(a)
		}
		if res.Verdict == "" {
			// Not applicable here: a note says so, if no other box has it.
			notApplicable[a.Channel] = append(notApplicable[a.Channel], a)
			continue
		}
		out = append(out, res)
		if res.Channel == ChannelIDMap && res.Obs != nil && res.Obs.Evidence.IDMap != nil {
			idmaps[res.From] = res.Obs.Evidence.IDMap.UID
		}
	}
	for _, res := range later {
		out = append(out, disjoint(res, idmaps))
	}
	for _, ch := range slices.Sorted(maps.Keys(kj.notes)) {
		if slices.ContainsFunc(out, func(res Result) bool {
			return res.Channel == ch && (res.Verdict == Pass || res.Verdict == Fail)
		}) {
			// Another box has what this one lacks: the kernel is the same,
			// so the box's own view hides it.
			for _, a := range notApplicable[ch] {
				out = append(out, verdict(Result{Action: a}, Inconclusive, "not there in this box though other boxes have it (the kernel is the same): "+kj.notes[ch]))
			}
			continue
		}
		r.rep.Notes = append(r.rep.Notes, fmt.Sprintf("%s: %s is not applicable here, in no box: %s", KernelID, ch, kj.notes[ch]))
	}
	return judgeProbes(r, c, out)
}

// check judges one box's check; a check not applicable here gives a
// result with no verdict (left out) and a note.
func (kj *kernelJudge) check(a Action) Result {
	res := Result{Action: a}
	o, ok := kj.r.obs.get(a.From, a.ID)
	if !ok {
		why := kj.r.agentErr[a.From]
		if why == "" {
			why = "no reason given"
		}
		return verdict(res, Inconclusive, "the agent at "+string(a.From)+" returned nothing for this check ("+why+")")
	}
	res.Obs = &o
	res.Observed = describe(o)
	ref := func() (probes.Observation, bool) {
		if !a.Reference.Valid() {
			return probes.Observation{}, false
		}
		return kj.r.obs.get(a.Reference.At, a.Reference.ID)
	}
	if o.Outcome == probes.Error && len(o.Evidence.Files) == 0 && o.Evidence.ReleaseAgent == nil {
		if a.Channel == ChannelGuestAPI && strings.HasPrefix(o.Reason, "no socket at") {
			off, read := kj.r.guestAPIOff[a.From]
			switch {
			case !read:
				return verdict(res, Inconclusive, "no guest API in the box ("+o.Reason+"), and its config could not be read to say it is off")
			case !off:
				return verdict(res, Inconclusive, "no guest API in the box ("+o.Reason+") though its config has it on: what it would answer was not seen")
			}
			return verdict(res, Pass, "no guest API in the box ("+o.Reason+"; its config: "+model.GuestAPIKey+"=false): nothing there to tell it anything")
		}
		return verdict(res, Inconclusive, "the check could not run: "+o.Reason)
	}
	ev := o.Evidence
	switch a.Channel {
	case ChannelIDMap:
		return judgeIDMap(res, ev.IDMap)
	case ChannelCapabilities:
		ids, _ := kj.r.obs.get(a.From, kj.sibling(a, ChannelIDMap))
		return judgeCaps(res, ev.Caps, ids.Evidence.IDMap)
	case ChannelSeccomp:
		return judgeSeccomp(res, ev.Seccomp)
	case ChannelLSM:
		return kj.judgeLSM(res, ev.Files)
	case ChannelMounts:
		return judgeMounts(res, ev.Mounts, kj.hostMounts())
	case ChannelDevices:
		return judgeDevices(res, ev.Devices)
	case ChannelProcSys, ChannelCorePattern, ChannelSysrq:
		c, ok := ref()
		return kj.judgeWrites(res, ev.Files, c, ok)
	case ChannelReleaseAgent:
		return judgeReleaseAgent(res, ev.ReleaseAgent)
	case ChannelModules:
		c, ok := ref()
		return kj.judgeModules(res, ev.Files, c, ok)
	case ChannelGuestAPI:
		return kj.judgeGuestAPI(res, ev.HTTP)
	}
	return verdict(res, Inconclusive, "no rule to judge "+string(a.Channel))
}

// sibling is the id of the box's probe on another channel.
func (kj *kernelJudge) sibling(a Action, ch Channel) string {
	for _, s := range kj.r.sc.Actions {
		if s.Claim == KernelID && s.From == a.From && s.Channel == ch {
			return s.ID
		}
	}
	return ""
}

func judgeIDMap(res Result, m *probes.IDMapEvidence) Result {
	if m == nil {
		return verdict(res, Inconclusive, "no id map read")
	}
	root, mapped := probes.HostID(m.UID, 0)
	switch {
	case !mapped:
		return verdict(res, Inconclusive, "root in the box maps to no host uid: not the box's own agent's map")
	case root == 0:
		return verdict(res, Fail, "root in the box is root on the host (host uid 0): "+rangesString(m.UID))
	case probes.HostHolds(m.UID, 0) || probes.HostHolds(m.GID, 0):
		return verdict(res, Fail, "host id 0 is an id in the box: "+rangesString(m.UID)+"; gid "+rangesString(m.GID))
	}
	return verdict(res, Pass, fmt.Sprintf("root in the box is host uid %d; no host id 0 in the box (uid %s; gid %s)", root, rangesString(m.UID), rangesString(m.GID)))
}

func rangesString(m []probes.IDRange) string {
	var out []string
	for _, r := range m {
		out = append(out, fmt.Sprintf("%d->%d x%d", r.Inside, r.Outside, r.Count))
	}
	return strings.Join(out, ", ")
}

// initialMap reports whether an id map is the initial user namespace's:
// every id is itself on the host.
func initialMap(m []probes.IDRange) bool {
	return len(m) == 1 && m[0].Inside == 0 && m[0].Outside == 0 && m[0].Count == 4294967295
}

func judgeCaps(res Result, c *probes.CapsEvidence, ids *probes.IDMapEvidence) Result {
	switch {
	case c == nil:
		return verdict(res, Inconclusive, "no capability sets read")
	case ids == nil:
		return verdict(res, Inconclusive, "the box's id map was not read: whose namespace its capabilities are over is unknown")
	case initialMap(ids.UID) && len(c.Effective) > 0:
		return verdict(res, Fail, fmt.Sprintf("%d capabilities over the host's own user namespace (the box has none of its own): %s", len(c.Effective), strings.Join(c.Effective, ", ")))
	}
	root, _ := probes.HostID(ids.UID, 0)
	return verdict(res, Pass, fmt.Sprintf("%d effective capabilities, over the box's own user namespace only (root there is host uid %d)", len(c.Effective), root))
}

func judgeSeccomp(res Result, s *probes.SeccompEvidence) Result {
	if s == nil {
		return verdict(res, Inconclusive, "no filter state read")
	}
	if s.Mode != 2 {
		return verdict(res, Fail, fmt.Sprintf("no system call filter (seccomp mode %d)", s.Mode))
	}
	n2h, _ := s.Trial(probes.TrialNameToHandle)
	obh, _ := s.Trial(probes.TrialOpenByHandle)
	if n2h == "ENOSYS" {
		return verdict(res, Pass, fmt.Sprintf("a filter is on (%d); this kernel has no handle system calls, so open_by_handle_at's ENOSYS says nothing more", s.Filters))
	}
	if obh != "ENOSYS" {
		return verdict(res, Fail, fmt.Sprintf("a filter is on (%d), but open_by_handle_at reached the kernel (%s; name_to_handle_at %s): Incus's default deny list is not in force", s.Filters, obh, n2h))
	}
	return verdict(res, Pass, fmt.Sprintf("a filter is on (%d) and denies open_by_handle_at (ENOSYS, Incus's default list), which the kernel has (name_to_handle_at: %s)", s.Filters, n2h))
}

func (kj *kernelJudge) judgeLSM(res Result, files []probes.FileAttempt) Result {
	if len(files) != 1 {
		return verdict(res, Inconclusive, "the label was not read")
	}
	f := files[0]
	switch {
	case f.Absent || f.Errno == "EINVAL":
		kj.notes[ChannelLSM] = "this kernel has no security module that labels a process (" + f.String() + ")"
		return Result{}
	case f.Errno != "":
		return verdict(res, Inconclusive, "the label was not read: "+f.String())
	case strings.HasPrefix(strings.TrimSpace(f.Content), "unconfined"):
		return verdict(res, Fail, "the box's processes are unconfined by the host's security module ("+f.Content+")")
	}
	return verdict(res, Pass, "confined by the host's security module: "+strings.TrimSpace(f.Content))
}

func judgeMounts(res Result, m *probes.MountsEvidence, host map[string]string) Result {
	if m == nil {
		return verdict(res, Inconclusive, "no mounts read")
	}
	var bad []string
	for _, f := range m.Foreign {
		bad = append(bad, fmt.Sprintf("%s (%s %s of %s, %s)", f.Point, f.FSType, f.Root, f.Source, f.Dev))
	}
	for _, d := range m.DevNodes {
		if !defaultDevPaths[d.Root] {
			bad = append(bad, fmt.Sprintf("%s (the host's /dev%s)", d.Point, d.Root))
		}
	}
	for _, k := range m.Kernel {
		if node, ok := strings.CutPrefix(k.Point, "/dev"); ok && defaultDevPaths[node] && k.Root == node {
			// A default device node bound from a /dev that is a tmpfs (a
			// host that is itself a container): the node is what counts,
			// and the devices check judges it by its number.
			continue
		}
		if at, ok := host[k.Dev]; ok && !incusOwnMount(k) {
			bad = append(bad, fmt.Sprintf("%s (%s %s, the host's own at %s: device %s)", k.Point, k.FSType, k.Root, at, k.Dev))
		}
	}
	if len(bad) > 0 {
		return verdict(res, Fail, "host paths mounted in the box: "+strings.Join(bad, ", "))
	}
	return verdict(res, Pass, fmt.Sprintf("%d mounts: the root (%s %s) and the kernel's own views (%d, none on a device of the host's %d mounts but Incus's own), of the host's devices only a container's default nodes (%d)", m.Count, m.Root.FSType, m.Root.Root, len(m.Kernel), len(host), len(m.DevNodes)))
}

// incusOwnMount says whether a kernel file system's mount that shares a
// device with the host's is one Incus gives every container: the guest
// API's folder, the folder it hot-plugs mounts through, cgroup
// hierarchies (one per host, seen through the box's cgroup namespace),
// lxcfs's views, and sysfs folders bound over themselves to hide what the
// host mounted there (debugfs, tracefs, securityfs, pstore, fusectl).
func incusOwnMount(m probes.MountEntry) bool {
	switch {
	case m.FSType == "tmpfs" && (m.Point == "/dev/incus" || m.Point == "/dev/.incus-mounts" || m.Point == "/dev/lxd" || m.Point == "/dev/.lxd-mounts"):
		return true
	case m.FSType == "cgroup" || m.FSType == "cgroup2" || m.FSType == "fuse.lxcfs":
		return true
	case m.FSType == "sysfs" && m.Root != "/" && "/sys"+m.Root == m.Point:
		return sysfsMasks[m.Root]
	}
	return false
}

// sysfsMasks are the sysfs folders LXC binds over themselves in a box.
var sysfsMasks = map[string]bool{"/fs/fuse/connections": true, "/fs/pstore": true, "/kernel/debug": true, "/kernel/security": true, "/kernel/tracing": true}

func judgeDevices(res Result, nodes []probes.DeviceNode) Result {
	if len(nodes) == 0 {
		return verdict(res, Inconclusive, "no device node seen: not even /dev/null, so the listing proves nothing")
	}
	var bad []string
	null := false
	for _, n := range nodes {
		if n.Type == "c" && n.Major == 1 && n.Minor == 3 {
			null = true
		}
		if n.Type == "c" && (defaultDevices[[2]uint32{n.Major, n.Minor}] != "" || isPtsMajor(n.Major)) {
			continue
		}
		bad = append(bad, n.String())
	}
	if len(bad) > 0 {
		return verdict(res, Fail, "device nodes beyond a container's default: "+strings.Join(bad, ", "))
	}
	if !null {
		return verdict(res, Inconclusive, "no /dev/null among the nodes seen: the listing proves nothing")
	}
	return verdict(res, Pass, fmt.Sprintf("%d device nodes, each a container's default", len(nodes)))
}

// judgeWrites judges paths opened for writing, beside the control: a path
// of the box's own it may write, which must have opened (else a refusal
// proves only that nothing opens).
func (kj *kernelJudge) judgeWrites(res Result, files []probes.FileAttempt, ctl probes.Observation, ctlOK bool) Result {
	var opened, refused, other, absent []string
	for _, f := range files {
		switch {
		case f.Opened:
			opened = append(opened, f.Path)
		case f.Refused():
			refused = append(refused, f.String())
		case f.Absent:
			absent = append(absent, f.Path)
		default:
			other = append(other, f.String())
		}
	}
	switch {
	case len(opened) > 0:
		return verdict(res, Fail, "opened for writing (nothing written): "+strings.Join(opened, ", "))
	case len(files) > 0 && len(absent) == len(files):
		kj.notes[res.Channel] = "this kernel has none of " + strings.Join(absent, ", ")
		return Result{}
	case len(other) > 0:
		return verdict(res, Inconclusive, "neither opened nor refused: "+strings.Join(other, ", "))
	case !ctlOK || len(ctl.Evidence.Files) == 0 || !ctl.Evidence.Files[0].Opened:
		why := "no answer"
		if ctlOK {
			why = ctl.Reason
		}
		return verdict(res, Inconclusive, "refused ("+strings.Join(refused, ", ")+"), but the control, the box's own "+writeControlPath+", did not open either ("+why+"): a refusal proves nothing where nothing opens")
	}
	ev := "refused to a writer: " + strings.Join(refused, ", ") + "; the box's own " + writeControlPath + " opened (the control)"
	if len(absent) > 0 {
		ev += "; absent here: " + strings.Join(absent, ", ")
	}
	return verdict(res, Pass, ev)
}

func judgeReleaseAgent(res Result, e *probes.ReleaseAgentEvidence) Result {
	if e == nil {
		return verdict(res, Inconclusive, "not looked for")
	}
	if opened := e.Opened(); len(opened) > 0 {
		return verdict(res, Fail, "release_agent opened for writing (nothing written): "+strings.Join(opened, ", "))
	}
	var tried []string
	for _, c := range e.Fresh {
		if c.Mounted {
			tried = append(tried, c.Hierarchy)
		}
	}
	if len(tried) == 0 && len(e.Mounted) == 0 {
		why := e.FreshError
		if why == "" {
			why = "no hierarchy mounted"
		}
		return verdict(res, Inconclusive, "no cgroup v1 hierarchy reached, so no release_agent could have been found: "+why)
	}
	return verdict(res, Pass, fmt.Sprintf("no release_agent reachable: %d cgroup v1 mount(s) of the box's; %d hierarchies mounted afresh in a cgroup namespace of the box's own (%s), none with one at its root", len(e.Mounted), len(tried), strings.Join(tried, ", ")))
}

// judgeModules: where the kernel loads modules, init_module tried with
// nothing to load must have been stopped (the filter's ENOSYS, or EPERM:
// no capability over the host's namespace).
func (kj *kernelJudge) judgeModules(res Result, files []probes.FileAttempt, sc probes.Observation, scOK bool) Result {
	present := slices.ContainsFunc(files, func(f probes.FileAttempt) bool { return f.Path == modulesPath && !f.Absent && f.Errno == "" })
	if !present && slices.ContainsFunc(files, func(f probes.FileAttempt) bool { return f.Path == modulesPath && f.Absent }) {
		kj.notes[ChannelModules] = "this kernel has no loadable modules (no " + modulesPath + ")"
		return Result{}
	}
	if !present {
		return verdict(res, Inconclusive, "whether this kernel loads modules is unknown: "+fmt.Sprint(files))
	}
	if !scOK || sc.Evidence.Seccomp == nil {
		return verdict(res, Inconclusive, "this kernel loads modules, but init_module was not tried")
	}
	errno, _ := sc.Evidence.Seccomp.Trial(probes.TrialInitModule)
	if errno == "ENOSYS" || errno == "EPERM" {
		return verdict(res, Pass, "this kernel loads modules; init_module from the box was stopped ("+errno+")")
	}
	return verdict(res, Fail, "init_module from the box reached the module loader ("+cmpOr(errno, "it succeeded")+")")
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// judgeGuestAPI: the guest API tells a box its own user.* and cloud-init.*
// keys (among them the run's tag, the control that the answer is this
// box's), its own name, its own NIC's MAC, and nothing of any other.
func (kj *kernelJudge) judgeGuestAPI(res Result, answers []probes.HTTPAnswer) Result {
	told := kj.guestAPITold(res.From, answers)
	return verdict(res, Fail, "the box has a guest API (/dev/incus answered), which box's profile turns off ("+model.GuestAPIKey+"=false): "+
		"one box's overlapping requests crash Incus 6.0's incusd (lxc/incus#3618); "+told)
}

// guestAPITold says what a guest API's answers told the box beyond its
// own (its name, its MAC, user.* and cloud-init.* keys), and where it runs.
func (kj *kernelJudge) guestAPITold(place Place, answers []probes.HTTPAnswer) string {
	name := kj.r.names[place]
	var mac net.HardwareAddr
	if e := kj.r.ends[place]; e != nil {
		mac = e.MAC
	}
	get := func(p string) (probes.HTTPAnswer, bool) {
		i := slices.IndexFunc(answers, func(a probes.HTTPAnswer) bool { return a.Path == p })
		if i < 0 || answers[i].Status != 200 {
			return probes.HTTPAnswer{}, false
		}
		return answers[i], true
	}
	cfg, ok := get("/1.0/config")
	if !ok {
		return "it gave no config list"
	}
	var keys []string
	if err := json.Unmarshal([]byte(cfg.Body), &keys); err != nil {
		return "its config list is not JSON: " + err.Error()
	}
	var bad []string
	own := false
	for _, k := range keys {
		k = strings.TrimPrefix(k, "/1.0/config/")
		if k == TagRun {
			own = true
		}
		if !strings.HasPrefix(k, "user.") && !strings.HasPrefix(k, "cloud-init.") {
			bad = append(bad, "config key "+k)
		}
	}
	if md, ok := get("/1.0/meta-data"); ok {
		for _, line := range strings.Split(md.Body, "\n") {
			if h, ok := strings.CutPrefix(line, "local-hostname: "); ok && strings.TrimSpace(h) != name {
				bad = append(bad, "meta-data names "+strings.TrimSpace(h)+", not "+name)
			}
		}
	}
	if dv, ok := get("/1.0/devices"); ok {
		var devs map[string]map[string]string
		if json.Unmarshal([]byte(dv.Body), &devs) == nil {
			for dn, d := range devs {
				if d["type"] == "nic" && mac != nil && d["hwaddr"] != "" && !strings.EqualFold(d["hwaddr"], mac.String()) {
					bad = append(bad, fmt.Sprintf("device %s has MAC %s, not the box's %s", dn, d["hwaddr"], mac))
				}
			}
		}
	}
	if len(bad) > 0 {
		return "it tells the box what is not its own: " + strings.Join(bad, "; ")
	}
	if !own {
		return fmt.Sprintf("its config list (%d keys) lacks the run's tag %s: not this box's answer", len(keys), TagRun)
	}
	where := ""
	if api, ok := get("/1.0"); ok {
		var m map[string]any
		if json.Unmarshal([]byte(api.Body), &m) == nil {
			where = fmt.Sprintf("; it says the box runs on %v", m["location"])
		}
	}
	return fmt.Sprintf("it told %d config keys, all user.* or cloud-init.* and the run's tag among them; its own name and MAC%s", len(keys), where)
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

// C-KERNEL's mutations (drill/mutate.go's table): each takes clone-a past
// the kernel boundary, as the escape hatch or plain incus would, and the
// agent in clone-a must see it. Keys Incus applies only at start (the
// privilege, raw.lxc, raw.idmap) restart clone-a, through box's own stop
// and start so its port is isolated and pinned again; devices are
// hot-plugged into the running box. The mutated box goes with the run's
// boxes at teardown: nothing to restore.
const (
	hostPathSource = "/usr/share"
	unixCharSource = "/dev/kmsg"
	rawLXCBind     = "lxc.mount.entry = " + hostPathSource + " mnt/drill-host none bind,ro,create=dir 0 0"
)

var (
	hostPathDisk   = map[string]map[string]string{"drillhost": {"type": "disk", "source": hostPathSource, "path": "/mnt/drill-disk", "readonly": "true"}}
	unixCharDevice = map[string]map[string]string{"drillkmsg": {"type": "unix-char", "source": unixCharSource, "path": unixCharSource}}
)

// kernelMutation sets config keys and adds devices on the run's clone-a,
// restarting it when a key needs a start to apply.
func kernelMutation(cfg map[string]string, devices map[string]map[string]string) func(ctx context.Context, h *stack.Host, boxes []string) error {
	return func(ctx context.Context, h *stack.Host, boxes []string) error {
		if len(boxes) < 3 {
			return fmt.Errorf("no clone-a among the run's boxes %v", boxes)
		}
		name := boxes[2]
		inst, etag, err := h.Incus.Instance(ctx, name)
		if err != nil {
			return err
		}
		put := inst.Writable()
		maps.Copy(put.Config, cfg)
		if put.Devices == nil {
			put.Devices = map[string]map[string]string{}
		}
		maps.Copy(put.Devices, devices)
		if err := h.Incus.UpdateInstance(ctx, name, put, etag); err != nil {
			return fmt.Errorf("changing %s: %w", name, err)
		}
		if len(cfg) == 0 {
			return nil
		}
		if err := stack.NewManager(h).Stop(ctx, name, true); err != nil {
			return err
		}
		if err := stack.NewManager(h).Start(ctx, name); err != nil {
			return err
		}
		_, err = h.WaitAddress(ctx, name, 30*time.Second)
		return err
	}
}
