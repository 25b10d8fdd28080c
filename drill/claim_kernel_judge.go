package drill

import (
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"

	"github.com/box-isolation/box/probes"
	"github.com/box-isolation/box/stack/model"
)

// C-KERNEL's judging: every box's checks from what its agent saw there,
// each beside its control where it has one, box-l's loads against its
// limits (claim_kernel_load.go), and a note for a check this kernel gives
// no box at all.

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
			off, read := kj.guestAPIOff(a.From)
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
