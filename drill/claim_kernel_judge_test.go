package drill

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/probes"
)

// The id maps a box here has: the shared one, box-l's and box-k's
// isolated ones, and those of the mutations.
var (
	sharedMap  = []probes.IDRange{{Inside: 0, Outside: 1000000, Count: 1000000000}}
	isolatedL  = []probes.IDRange{{Inside: 0, Outside: 1065536, Count: 65536}}
	isolatedK  = []probes.IDRange{{Inside: 0, Outside: 1131072, Count: 65536}}
	rootMapped = []probes.IDRange{{Inside: 0, Outside: 0, Count: 1}, {Inside: 1, Outside: 1000001, Count: 999999999}}
	initial    = []probes.IDRange{{Inside: 0, Outside: 0, Count: 4294967295}}
)

// kernelRun is a run that built C-KERNEL's scenario on the test topology;
// obs fills in what each box's agent answered for a channel (nil: a box
// here, nothing wrong).
func kernelRun(t *testing.T, obs func(place Place, a Action) (probes.Observation, bool)) (*run, []Result) {
	t.Helper()
	scene := testTopology()
	sc := BuildScenario(scene, []Claim{claimKernel})
	r := &run{rep: &Report{Notes: []string{}}, sc: sc, scene: scene, obs: observations{}, agentErr: map[Place]string{},
		names: map[Place]string{}, ends: map[Place]*BoxEnd{}, state: claimStates{}}
	for _, e := range []BoxEnd{scene.A, scene.B, scene.C, scene.T, scene.W, scene.N, scene.L} {
		e := e
		r.names[e.Place], r.ends[e.Place] = e.Instance, &e
	}
	r.names[PlaceK] = "drill-0a1b2c-k"
	g := keep(r.state, KernelID, &guestAPIConfig{off: map[Place]bool{}})
	for p := range r.names {
		g.off[p] = true
	}
	var rs []Result
	put := func(place Place, o probes.Observation) {
		if r.obs[place] == nil {
			r.obs[place] = map[string]probes.Observation{}
		}
		r.obs[place][o.ID] = o
	}
	for _, a := range sc.Actions {
		if a.Claim != KernelID {
			continue
		}
		rs = append(rs, Result{Action: a})
		o := healthy(r, a)
		if obs != nil {
			if got, ok := obs(a.From, a); ok {
				o = got
			}
		}
		o.ID = a.ID
		put(a.From, o)
		if a.Reference.Valid() {
			ctl := healthyControl(a.Reference.ID)
			ctl.ID = a.Reference.ID
			put(a.Reference.At, ctl)
		}
	}
	return r, rs
}

// healthy is what a box's agent answers for a check on this host's stack.
func healthy(r *run, a Action) probes.Observation {
	o := probes.Observation{Outcome: probes.Reached}
	ev := &o.Evidence
	switch a.Channel {
	case ChannelIDMap, ChannelIDMapDisjoint:
		m := sharedMap
		switch a.From {
		case PlaceL:
			m = isolatedL
		case PlaceK:
			m = isolatedK
		}
		ev.IDMap = &probes.IDMapEvidence{UID: m, GID: m}
	case ChannelCapabilities:
		ev.Caps = &probes.CapsEvidence{Effective: probes.CapNames(1<<41 - 1)}
	case ChannelSeccomp:
		ev.Seccomp = &probes.SeccompEvidence{Mode: 2, Filters: 1, Trials: []probes.SyscallTrial{{Name: probes.TrialNameToHandle, Errno: "EOVERFLOW"}, {Name: probes.TrialOpenByHandle, Errno: "ENOSYS"}, {Name: probes.TrialInitModule, Errno: "ENOSYS"}}}
	case ChannelLSM:
		ev.Files = []probes.FileAttempt{{Path: lsmPath, Errno: "EINVAL"}}
	case ChannelMounts:
		ev.Mounts = &probes.MountsEvidence{Root: probes.MountEntry{Point: "/", FSType: "btrfs", Root: "/containers/x/rootfs"}, Foreign: []probes.MountEntry{}, Count: 25,
			DevNodes: []probes.MountEntry{{Point: "/dev/null", Root: "/null", FSType: "devtmpfs"}, {Point: "/dev/net/tun", Root: "/net/tun", FSType: "devtmpfs"}}}
	case ChannelDevices:
		ev.Devices = []probes.DeviceNode{{Path: "/dev/null", Type: "c", Major: 1, Minor: 3}, {Path: "/dev/console", Type: "c", Major: 136, Minor: 0}, {Path: "/dev/net/tun", Type: "c", Major: 10, Minor: 200}}
	case ChannelProcSys, ChannelCorePattern:
		o.Outcome = probes.Rejected
		for _, p := range a.Probe.Paths {
			ev.Files = append(ev.Files, probes.FileAttempt{Path: p, Errno: "EACCES"})
		}
	case ChannelSysrq:
		o.Outcome = probes.Error
		ev.Files = []probes.FileAttempt{{Path: sysrqPath, Absent: true, Errno: "ENOENT"}}
	case ChannelReleaseAgent:
		o.Outcome = probes.Rejected
		ev.ReleaseAgent = &probes.ReleaseAgentEvidence{Mounted: []probes.FileAttempt{}, Fresh: []probes.CgroupTry{{Hierarchy: "pids", Mounted: true, ReleaseAgent: &probes.FileAttempt{Path: "release_agent", Absent: true}}}}
	case ChannelModules:
		ev.Files = []probes.FileAttempt{{Path: modulesPath, Absent: true, Errno: "ENOENT"}, {Path: modprobePath, Absent: true, Errno: "ENOENT"}}
	case ChannelGuestAPI:
		// Off, as box's profile has it.
		o.Outcome, o.Reason = probes.Error, "no socket at "+guestAPISocket
		ev.HTTP = []probes.HTTPAnswer{{Path: "/1.0", Error: "dial unix " + guestAPISocket + ": connect: no such file or directory"}}
	case ChannelProcesses:
		o.Outcome = probes.Rejected
		ev.Load = &probes.LoadEvidence{Max: loadProcCap, Reached: 101, StoppedBy: "EAGAIN", Tasks: loadProcesses, HeldMS: 3000}
	case ChannelCPU:
		ev.Load = &probes.LoadEvidence{Max: loadSpinners, Reached: loadSpinners, CPUSeconds: 1.0, WallSeconds: 4.5}
	case ChannelMemory:
		o.Outcome = probes.Rejected
		ev.Load = &probes.LoadEvidence{Max: loadMemoryCap, Reached: 240, StoppedBy: "SIGKILL"}
	case ChannelDisk:
		o.Outcome = probes.Rejected
		ev.Load = &probes.LoadEvidence{Max: loadDiskCap, Reached: 58, StoppedBy: "EDQUOT"}
	}
	return o
}

func healthyControl(id string) probes.Observation {
	if strings.Contains(id, string(probes.KindSeccomp)) {
		return probes.Observation{Outcome: probes.Reached, Evidence: probes.Evidence{Seccomp: &probes.SeccompEvidence{Mode: 2, Trials: []probes.SyscallTrial{{Name: probes.TrialInitModule, Errno: "ENOSYS"}}}}}
	}
	return probes.Observation{Outcome: probes.Reached, Evidence: probes.Evidence{Files: []probes.FileAttempt{{Path: writeControlPath, Opened: true}}}}
}

func guestAnswers(name, mac string, keys ...string) []probes.HTTPAnswer {
	cfg, _ := json.Marshal(keys)
	devs, _ := json.Marshal(map[string]map[string]string{"eth0": {"type": "nic", "hwaddr": mac}, "root": {"type": "disk"}})
	return []probes.HTTPAnswer{
		{Path: "/1.0", Status: 200, Body: `{"state":"Started","location":"vm"}`},
		{Path: "/1.0/config", Status: 200, Body: string(cfg)},
		{Path: "/1.0/meta-data", Status: 200, Body: "#cloud-config\ninstance-id: x\nlocal-hostname: " + name + "\n"},
		{Path: "/1.0/devices", Status: 200, Body: string(devs)},
	}
}

func byVerdict(rs []Result) map[Verdict][]Result {
	out := map[Verdict][]Result{}
	for _, r := range rs {
		out[r.Verdict] = append(out[r.Verdict], r)
	}
	return out
}

// TestKernelHoldsOnTheStack: every box's checks as this host's stack
// answers them pass, box-l's loads stopped at its limits; what cannot fail
// on this kernel is a note, never a pass.
func TestKernelHoldsOnTheStack(t *testing.T) {
	r, rs := kernelRun(t, nil)
	got := judgeKernel(r, claimKernel, rs)
	v := byVerdict(got)
	for _, res := range append(v[Fail], v[Inconclusive]...) {
		t.Errorf("%s %s %s: %s", res.Verdict, res.From, res.Channel, res.Evidence)
	}
	channels := map[Channel]bool{}
	for _, res := range got {
		channels[res.Channel] = true
	}
	for _, ch := range []Channel{ChannelLSM, ChannelSysrq, ChannelModules} {
		assert.False(t, channels[ch], "%s cannot fail here: no result", ch)
	}
	notes := strings.Join(r.rep.Notes, "\n")
	assert.Contains(t, notes, "lsm is not applicable here")
	assert.Contains(t, notes, "sysrq-trigger is not applicable here")
	assert.Contains(t, notes, "module-loading is not applicable here, in no box: this kernel has no loadable modules")
	assert.Equal(t, 3, strings.Count(notes, string(KernelID)+":"), "each said once, not per box")
	for _, ch := range []Channel{ChannelIDMap, ChannelIDMapDisjoint, ChannelCapabilities, ChannelSeccomp, ChannelMounts, ChannelDevices, ChannelProcSys,
		ChannelCorePattern, ChannelReleaseAgent, ChannelGuestAPI, ChannelProcesses, ChannelCPU, ChannelMemory, ChannelDisk} {
		assert.True(t, channels[ch], "a result on %s", ch)
	}
	places := map[Place]bool{}
	for _, res := range got {
		places[res.From] = true
	}
	for _, p := range []Place{PlaceA, PlaceB, PlaceC, PlaceT, PlaceW, PlaceN, PlaceL, PlaceK} {
		assert.True(t, places[p], "every box checked: %s", p)
	}
}

// TestKernelFailsThroughTheAgents: each break the mutations make, as the
// agent in the box sees it, fails the claim on its channel.
func TestKernelFailsThroughTheAgents(t *testing.T) {
	for _, tc := range []struct {
		name string
		ch   Channel
		obs  func(a Action) probes.Observation
		want string
	}{
		// Its capabilities fail beside it: they are over the host's
		// namespace.
		{"privileged: the initial map", ChannelIDMap, func(a Action) probes.Observation {
			return probes.Observation{Outcome: probes.Reached, Evidence: probes.Evidence{IDMap: &probes.IDMapEvidence{UID: initial, GID: initial}}}
		}, "root in the box is root on the host"},
		{"raw.idmap: host root mapped", ChannelIDMap, func(a Action) probes.Observation {
			return probes.Observation{Outcome: probes.Reached, Evidence: probes.Evidence{IDMap: &probes.IDMapEvidence{UID: rootMapped, GID: rootMapped}}}
		}, "root in the box is root on the host"},
		{"host id 0 inside", ChannelIDMap, func(a Action) probes.Observation {
			m := []probes.IDRange{{Inside: 0, Outside: 1000000, Count: 10}, {Inside: 10, Outside: 0, Count: 1}}
			return probes.Observation{Outcome: probes.Reached, Evidence: probes.Evidence{IDMap: &probes.IDMapEvidence{UID: m, GID: m}}}
		}, "host id 0 is an id in the box"},
		{"a host path", ChannelMounts, func(a Action) probes.Observation {
			return probes.Observation{Outcome: probes.Reached, Evidence: probes.Evidence{Mounts: &probes.MountsEvidence{Root: probes.MountEntry{Point: "/"}, Count: 26,
				Foreign: []probes.MountEntry{{Point: "/mnt/drill-host", FSType: "ext4", Root: "/usr/share", Source: "/dev/vda", Dev: "254:0"}}}}}
		}, "host paths mounted in the box: /mnt/drill-host (ext4 /usr/share of /dev/vda, 254:0)"},
		{"the host's /dev bound in", ChannelMounts, func(a Action) probes.Observation {
			return probes.Observation{Outcome: probes.Reached, Evidence: probes.Evidence{Mounts: &probes.MountsEvidence{Root: probes.MountEntry{Point: "/"}, Count: 26,
				DevNodes: []probes.MountEntry{{Point: "/dev/kmsg", Root: "/kmsg", FSType: "devtmpfs"}}}}}
		}, "/dev/kmsg (the host's /dev/kmsg)"},
		{"a device node", ChannelDevices, func(a Action) probes.Observation {
			return probes.Observation{Outcome: probes.Reached, Evidence: probes.Evidence{Devices: []probes.DeviceNode{{Path: "/dev/null", Type: "c", Major: 1, Minor: 3}, {Path: "/dev/kmsg", Type: "c", Major: 1, Minor: 11}}}}
		}, "beyond a container's default: c 1:11 /dev/kmsg"},
		{"a block device", ChannelDevices, func(a Action) probes.Observation {
			return probes.Observation{Outcome: probes.Reached, Evidence: probes.Evidence{Devices: []probes.DeviceNode{{Path: "/dev/null", Type: "c", Major: 1, Minor: 3}, {Path: "/dev/vda", Type: "b", Major: 254, Minor: 0}}}}
		}, "b 254:0 /dev/vda"},
		{"core_pattern opened", ChannelCorePattern, func(a Action) probes.Observation {
			return probes.Observation{Outcome: probes.Reached, Evidence: probes.Evidence{Files: []probes.FileAttempt{{Path: corePatternPath, Opened: true}}}}
		}, "opened for writing (nothing written): /proc/sys/kernel/core_pattern"},
		{"no filter", ChannelSeccomp, func(a Action) probes.Observation {
			return probes.Observation{Outcome: probes.Reached, Evidence: probes.Evidence{Seccomp: &probes.SeccompEvidence{}}}
		}, "no system call filter"},
		{"the deny list off", ChannelSeccomp, func(a Action) probes.Observation {
			return probes.Observation{Outcome: probes.Reached, Evidence: probes.Evidence{Seccomp: &probes.SeccompEvidence{Mode: 2, Filters: 1,
				Trials: []probes.SyscallTrial{{Name: probes.TrialNameToHandle, Errno: "EOVERFLOW"}, {Name: probes.TrialOpenByHandle, Errno: "EBADF"}}}}}
		}, "open_by_handle_at reached the kernel (EBADF"},
		{"a release_agent opened", ChannelReleaseAgent, func(a Action) probes.Observation {
			return probes.Observation{Outcome: probes.Reached, Evidence: probes.Evidence{ReleaseAgent: &probes.ReleaseAgentEvidence{
				Mounted: []probes.FileAttempt{{Path: "/sys/fs/cgroup/rdma/release_agent", Opened: true}}}}}
		}, "release_agent opened for writing (nothing written): /sys/fs/cgroup/rdma/release_agent"},
		{"the guest API on, telling only the box's own", ChannelGuestAPI, func(a Action) probes.Observation {
			return probes.Observation{Outcome: probes.Reached, Evidence: probes.Evidence{HTTP: guestAnswers("drill-0a1b2c-a", "00:16:3e:00:00:0a", "/1.0/config/user.box", "/1.0/config/"+TagRun)}}
		}, "the box has a guest API (/dev/incus answered)"},
		{"the guest API on, an answer without the run's tag", ChannelGuestAPI, func(a Action) probes.Observation {
			return probes.Observation{Outcome: probes.Reached, Evidence: probes.Evidence{HTTP: guestAnswers("drill-0a1b2c-a", "00:16:3e:00:00:0a", "/1.0/config/user.box")}}
		}, "lacks the run's tag"},
		{"another instance's key", ChannelGuestAPI, func(a Action) probes.Observation {
			return probes.Observation{Outcome: probes.Reached, Evidence: probes.Evidence{HTTP: guestAnswers("drill-0a1b2c-a", "00:16:3e:00:00:0a", "/1.0/config/"+TagRun, "/1.0/config/volatile.eth0.hwaddr")}}
		}, "config key volatile.eth0.hwaddr"},
		{"another instance's name", ChannelGuestAPI, func(a Action) probes.Observation {
			return probes.Observation{Outcome: probes.Reached, Evidence: probes.Evidence{HTTP: guestAnswers("someone-else", "00:16:3e:00:00:0a", "/1.0/config/"+TagRun)}}
		}, "meta-data names someone-else, not drill-0a1b2c-a"},
		{"another instance's MAC", ChannelGuestAPI, func(a Action) probes.Observation {
			return probes.Observation{Outcome: probes.Reached, Evidence: probes.Evidence{HTTP: guestAnswers("drill-0a1b2c-a", "00:16:3e:00:00:ff", "/1.0/config/"+TagRun)}}
		}, "device eth0 has MAC 00:16:3e:00:00:ff, not the box's 00:16:3e:00:00:0a"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, rs := kernelRun(t, func(p Place, a Action) (probes.Observation, bool) {
				if p == PlaceA && a.Channel == tc.ch {
					return tc.obs(a), true
				}
				return probes.Observation{}, false
			})
			got := judgeKernel(r, claimKernel, rs)
			var on *Result
			for _, f := range byVerdict(got)[Fail] {
				assert.Equal(t, PlaceA, f.From, "only box-a fails: %s", f.Evidence)
				if f.Channel == tc.ch {
					on = &f
				}
			}
			require.NotNil(t, on, "box-a's %s fails", tc.ch)
			assert.Contains(t, on.Evidence, tc.want)
			assert.Equal(t, Fail, aggregate(claimKernel, got).Verdict)
		})
	}
}

// TestKernelInconclusive: a refusal where nothing opens, a config list
// that is not the box's, a listing without /dev/null prove nothing.
func TestKernelInconclusive(t *testing.T) {
	for _, tc := range []struct {
		name string
		ch   Channel
		obs  func(a Action) probes.Observation
		want string
	}{
		{"refused, and the control did not open", ChannelProcSys, nil, "the control, the box's own"},
		{"no /dev/null", ChannelDevices, func(a Action) probes.Observation {
			return probes.Observation{Outcome: probes.Reached, Evidence: probes.Evidence{Devices: []probes.DeviceNode{{Path: "/dev/zero", Type: "c", Major: 1, Minor: 5}}}}
		}, "no /dev/null"},
		{"no hierarchy reached", ChannelReleaseAgent, func(a Action) probes.Observation {
			return probes.Observation{Outcome: probes.Rejected, Evidence: probes.Evidence{ReleaseAgent: &probes.ReleaseAgentEvidence{FreshError: "starting a child: EPERM"}}}
		}, "no cgroup v1 hierarchy reached"},
		{"the agent errored", ChannelMounts, func(a Action) probes.Observation {
			return probes.Observation{Outcome: probes.Error, Reason: "reading mountinfo: EACCES"}
		}, "the check could not run: reading mountinfo"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, rs := kernelRun(t, func(p Place, a Action) (probes.Observation, bool) {
				if p == PlaceA && a.Channel == tc.ch && tc.obs != nil {
					return tc.obs(a), true
				}
				return probes.Observation{}, false
			})
			if tc.obs == nil {
				// The control did not open: a box where nothing opens.
				for _, a := range r.sc.Actions {
					if a.From == PlaceA && a.Channel == tc.ch {
						r.obs[PlaceA][a.Reference.ID] = probes.Observation{ID: a.Reference.ID, Outcome: probes.Rejected, Reason: "refused",
							Evidence: probes.Evidence{Files: []probes.FileAttempt{{Path: writeControlPath, Errno: "EROFS"}}}}
					}
				}
			}
			got := judgeKernel(r, claimKernel, rs)
			v := byVerdict(got)
			assert.Empty(t, v[Fail])
			require.NotEmpty(t, v[Inconclusive])
			on := false
			for _, res := range v[Inconclusive] {
				assert.Equal(t, PlaceA, res.From)
				on = on || res.Channel == tc.ch && strings.Contains(res.Evidence, tc.want)
			}
			assert.True(t, on, "box-a's %s is inconclusive: %v", tc.ch, v[Inconclusive])
		})
	}
}

// TestKernelMountsOfTheHost: a kernel file system looks the same from
// inside whether the box made it or the host's was bound in; only its
// device tells. The host's /run bound in fails; what Incus gives every
// container (the guest API's folder, the sysfs masks, cgroups) does not.
func TestKernelMountsOfTheHost(t *testing.T) {
	host := map[string]string{"0:25": "/run", "0:102": "/sys", "0:106": "/var/lib/incus/guestapi", "0:30": "/sys/fs/cgroup/memory", "0:4": "/proc"}
	own := []probes.MountEntry{
		{Point: "/run", FSType: "tmpfs", Root: "/", Dev: "0:167"},
		{Point: "/proc", FSType: "proc", Root: "/", Dev: "0:164"},
		{Point: "/dev/incus", FSType: "tmpfs", Root: "/", Dev: "0:106"},
		{Point: "/sys/kernel/debug", FSType: "sysfs", Root: "/kernel/debug", Dev: "0:102"},
		{Point: "/sys/fs/cgroup/memory", FSType: "cgroup", Root: "/lxc.payload.x", Dev: "0:30"},
		// On a host that is a container, /dev is a tmpfs: its nodes are
		// bound from there.
		{Point: "/dev/null", FSType: "tmpfs", Root: "/null", Dev: "0:25"},
	}
	m := &probes.MountsEvidence{Root: probes.MountEntry{Point: "/", FSType: "btrfs", Root: "/x", Dev: "0:50"}, Foreign: []probes.MountEntry{}, Kernel: own, Count: 6}
	res := judgeMounts(Result{}, m, host)
	assert.Equal(t, Pass, res.Verdict, res.Evidence)

	for _, bound := range []probes.MountEntry{
		{Point: "/mnt/run", FSType: "tmpfs", Root: "/", Dev: "0:25"},
		{Point: "/mnt/proc", FSType: "proc", Root: "/", Dev: "0:4"},
		{Point: "/sys/kernel/debug", FSType: "sysfs", Root: "/", Dev: "0:102"},
		{Point: "/dev/null", FSType: "tmpfs", Root: "/", Dev: "0:25"},
	} {
		m.Kernel = append(slices.Clone(own), bound)
		res := judgeMounts(Result{}, m, host)
		assert.Equal(t, Fail, res.Verdict, "%s: %s", bound.Point, res.Evidence)
		assert.Contains(t, res.Evidence, bound.Point)
	}
}

// TestKernelAbsentInOneBoxOnly: one box's "not there" speaks for every box
// only when every box says it; where another box has /proc/sysrq-trigger,
// the box that does not is inconclusive, named, and no note says the
// kernel lacks it.
func TestKernelAbsentInOneBoxOnly(t *testing.T) {
	r, rs := kernelRun(t, func(p Place, a Action) (probes.Observation, bool) {
		if a.Channel == ChannelSysrq && p == PlaceA {
			return probes.Observation{Outcome: probes.Rejected, Evidence: probes.Evidence{Files: []probes.FileAttempt{{Path: sysrqPath, Errno: "EACCES"}}}}, true
		}
		return probes.Observation{}, false
	})
	var fromB *Result
	for _, res := range judgeKernel(r, claimKernel, rs) {
		if res.Channel == ChannelSysrq && res.From == PlaceB {
			fromB = &res
		}
	}
	require.NotNil(t, fromB, "box-b's sysrq check has a result")
	assert.Equal(t, Inconclusive, fromB.Verdict, fromB.Evidence)
	assert.Contains(t, fromB.Evidence, "other boxes have it")
	for _, n := range r.rep.Notes {
		assert.NotContains(t, n, "sysrq", "no note says the kernel lacks it")
	}
}

// TestKernelAbsentAndOneAgentSilent: a box whose agent returned nothing
// has no say in whether the kernel has a thing: every other box's
// "not there" is still a note, not an inconclusive result.
func TestKernelAbsentAndOneAgentSilent(t *testing.T) {
	r, rs := kernelRun(t, func(p Place, a Action) (probes.Observation, bool) {
		return probes.Observation{}, false
	})
	var kept []Result
	for _, res := range rs {
		if res.From == PlaceL && res.Channel == ChannelSysrq {
			r.agentErr[PlaceL] = "the agent exited 1"
			delete(r.obs[PlaceL], res.ID)
		}
		kept = append(kept, res)
	}
	for _, res := range judgeKernel(r, claimKernel, kept) {
		if res.Channel == ChannelSysrq && res.From != PlaceL {
			t.Errorf("%s's sysrq check has a result (%s: %s); the kernel has none", res.From, res.Verdict, res.Evidence)
		}
	}
	assert.True(t, slices.ContainsFunc(r.rep.Notes, func(n string) bool { return strings.Contains(n, "sysrq") }), "the note says so: %v", r.rep.Notes)
}
