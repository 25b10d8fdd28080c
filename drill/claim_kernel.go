package drill

import (
	"strings"

	"github.com/box-isolation/box/probes"
	"github.com/box-isolation/box/stack/model"
)

// C-KERNEL lives in claim_kernel*.go, a file per concern: the claim and
// the checks every box runs (this file), their judging (_judge), the load
// box and its limits (_load), the guest API (_guestapi) and the mutations
// that take clone-a past the boundary (_mutate).

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
	mint:    mintLoadBox,
	prepare: readGuestAPIConfig,
	build:   buildKernel,
	judge:   judgeKernel,
	// The guest API requests, one box at a time after the other probes
	// (claim_kernel_guestapi.go).
	apart: splitGuestAPI,
}

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

// The paths the kernel probes open and read.
var (
	// procSysPaths are host-wide kernel settings, none a box's own.
	procSysPaths    = []string{"/proc/sys/vm/drop_caches", "/proc/sys/kernel/panic", "/proc/sys/kernel/randomize_va_space", "/proc/sys/fs/file-max", "/proc/sys/vm/overcommit_memory"}
	corePatternPath = "/proc/sys/kernel/core_pattern"
	sysrqPath       = "/proc/sysrq-trigger"
	modprobePath    = "/proc/sys/kernel/modprobe"
	modulesPath     = "/proc/modules"
	lsmPath         = "/proc/self/attr/current"
	// writeControlPath is the box's own network namespace's: a box may
	// write it.
	writeControlPath = "/proc/sys/net/ipv4/ip_forward"
)

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
	lp, loaded := loadPlanOf(t.L)
	if loaded && lp.k {
		places = append(places, PlaceK)
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
	if loaded {
		buildLoads(b, lp)
	}
}
