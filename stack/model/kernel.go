package model

import (
	"fmt"
	"strings"
)

// The kernel boundary in the census. A box here is a container: the
// host's kernel is all that stands between it and the host, and these
// instance keys move that boundary. box sets none of them but the stronger
// ones it offers (an isolated id map); set by hand (the escape hatch, plain
// incus), each is named with why, or reported as allowed with why when it
// only makes the box stricter. Most take effect when the box next starts,
// so the census judges the config, and C-KERNEL judges what the box really
// got, from inside it.

// kernelKeyRule judges one key of this family: what it takes away (a
// problem, "" for none) and, when it is no problem, why it is allowed
// ("" when the value is the default and says nothing).
type kernelKeyRule struct {
	// match reports whether the rule is for the key.
	match func(key string) bool
	judge func(key, value string) (problem, allowed string)
}

// RestartNote ends the fix of a key Incus applies only at start.
const RestartNote = " (it takes effect when the box starts again: box down, box start)"

func exactly(k string) func(string) bool { return func(key string) bool { return key == k } }

func prefixed(p string) func(string) bool {
	return func(key string) bool { return strings.HasPrefix(key, p) }
}

// interceptWhy is, per system call Incus can intercept, what incusd then
// does on the host for the box. None is accepted: box's nesting needs none
// (nesting.go), so even those Incus documents as safe have no reason to be
// on.
var interceptWhy = map[string]string{
	"mknod":              "incusd makes device nodes in the box on the host's behalf (Incus documents the devices it allows as safe)",
	"mknodat":            "incusd makes device nodes in the box on the host's behalf (Incus documents the devices it allows as safe)",
	"setxattr":           "incusd sets trusted extended attributes in the box on the host's behalf (Incus documents the attributes it allows as safe)",
	"mount":              "incusd mounts file systems in the box on the host's behalf (Incus warns the kernel's file system code then meets data the box controls)",
	"mount.allowed":      "names the file systems incusd mounts in the box on the host's behalf",
	"mount.fuse":         "has incusd mount file systems through FUSE for the box",
	"mount.shift":        "has incusd shift the ids of what it mounts for the box",
	"bpf":                "incusd loads BPF programs for the box on the host's behalf",
	"bpf.devices":        "incusd loads device cgroup BPF programs for the box on the host's behalf",
	"sched_setscheduler": "incusd changes scheduling policies for the box on the host's behalf",
	"sysinfo":            "incusd answers sysinfo for the box on the host's behalf",
}

// kernelKeyRules are the kernel boundary's keys, each once.
var kernelKeyRules = []kernelKeyRule{
	{match: exactly("raw.idmap"), judge: func(_, v string) (string, string) {
		if mapsHostRoot(v) {
			return fmt.Sprintf("sets raw.idmap=%q, mapping host id 0 into the box: root on the host is a user in the box", OneLine(v)), ""
		}
		return fmt.Sprintf("sets raw.idmap=%q: host ids mapped straight into the box, past Incus's own allocation", OneLine(v)), ""
	}},
	{match: exactly("raw.apparmor"), judge: func(_, v string) (string, string) {
		return "sets raw.apparmor: raw AppArmor rules that widen or replace the box's profile", ""
	}},
	{match: exactly("raw.seccomp"), judge: func(_, v string) (string, string) {
		return "sets raw.seccomp: a raw system call policy in place of the box's filter", ""
	}},
	{match: exactly("linux.kernel_modules"), judge: func(_, v string) (string, string) {
		return fmt.Sprintf("sets linux.kernel_modules=%s: incusd loads those modules into the host's kernel for the box", v), ""
	}},
	{match: prefixed("linux.kernel_modules."), judge: func(k, v string) (string, string) {
		return fmt.Sprintf("sets %s=%s: how incusd loads kernel modules into the host's kernel for the box (Incus keeps it for administrators)", k, v), ""
	}},
	{match: prefixed("security.delegate_bpf"), judge: func(k, v string) (string, string) {
		if k == "security.delegate_bpf" && (v == "" || (!IncusTrue(v) && isIncusBool(v))) {
			return "", ""
		}
		return fmt.Sprintf("sets %s=%s: BPF delegated to the box (a BPF token), so it loads programs into the host's kernel (Incus keeps it for administrators)", k, v), ""
	}},
	{match: prefixed("linux.sysctl."), judge: func(k, v string) (string, string) {
		return fmt.Sprintf("sets %s=%s: a kernel setting of the box's namespaces set from outside at start; box sets none", k, v), ""
	}},
	{match: exactly("security.syscalls.deny_default"), judge: func(_, v string) (string, string) {
		if v != "" && !IncusTrue(v) {
			return fmt.Sprintf("sets security.syscalls.deny_default=%s: Incus's default deny list (kexec_load, open_by_handle_at, init_module, ...) is off", v), ""
		}
		return "", ""
	}},
	{match: exactly("security.syscalls.deny_compat"), judge: func(_, v string) (string, string) {
		if IncusTrue(v) {
			return "", "stricter: the 32-bit compat system calls are denied too"
		}
		return "", ""
	}},
	{match: exactly("security.syscalls.deny"), judge: func(_, v string) (string, string) {
		if strings.TrimSpace(v) != "" {
			return "", "stricter: more system calls denied, beside Incus's default list"
		}
		return "", ""
	}},
	{match: exactly("security.syscalls.allow"), judge: func(_, v string) (string, string) {
		if strings.TrimSpace(v) != "" {
			return "sets security.syscalls.allow: an allow list in place of Incus's default deny list, so what it lets through is no filter box knows", ""
		}
		return "", ""
	}},
	{match: prefixed("security.syscalls.intercept."), judge: func(k, v string) (string, string) {
		if v == "" || (!IncusTrue(v) && isIncusBool(v)) {
			return "", ""
		}
		what := interceptWhy[strings.TrimPrefix(k, "security.syscalls.intercept.")]
		if what == "" {
			what = "incusd then makes that system call on the host for the box"
		}
		return fmt.Sprintf("sets %s=%s: %s; box never sets it (nesting does not need it)", k, v, what), ""
	}},
	{match: prefixed("security.syscalls."), judge: func(k, v string) (string, string) {
		return fmt.Sprintf("sets %s=%s, a system call filter key box does not know", k, v), ""
	}},
	{match: exactly("security.idmap.isolated"), judge: func(_, v string) (string, string) {
		if IncusTrue(v) {
			return "", "stricter: a host id range of its own, which no other instance shares"
		}
		return "", ""
	}},
	{match: exactly("security.idmap.size"), judge: func(_, v string) (string, string) {
		return "", "the size of the box's host id range"
	}},
	{match: exactly("security.idmap.base"), judge: func(_, v string) (string, string) {
		return fmt.Sprintf("sets security.idmap.base=%s: the box's host id range chosen by hand, which may be the host's own users' or another instance's", v), ""
	}},
	{match: prefixed("security.idmap."), judge: func(k, v string) (string, string) {
		return fmt.Sprintf("sets %s=%s, an id map key box does not know", k, v), ""
	}},
	{match: prefixed("limits.kernel."), judge: func(k, v string) (string, string) {
		return fmt.Sprintf("sets %s=%s: a resource limit of the box's processes in place of the host's default (raised, as memlock, rtprio or nofile can be, it gives the box what the host's own processes may not take); box sets none", k, v), ""
	}},
	// Off in box's profile; a box that sets it on has /dev/incus again.
	// Not set at all (a profile of before it was off, or a backup made
	// under one) is Verify's finding on the profile, not the box's.
	{match: exactly(GuestAPIKey), judge: func(_, v string) (string, string) {
		if IncusTrue(v) {
			return GuestAPIKey + "=" + v + ": the box has /dev/incus, through which one box's overlapping requests took the host's incusd down within a second (Incus 6.0, lxc/incus#3618); box's profile turns it off", ""
		}
		return "", ""
	}},
	{match: exactly("security.guestapi.images"), judge: func(_, v string) (string, string) {
		if IncusTrue(v) {
			return "sets security.guestapi.images=true: /dev/incus hands the box the host's images", ""
		}
		return "", ""
	}},
}

// GuestAPIKey turns a box's guest API (/dev/incus) on or off; box's
// profile has it off.
const GuestAPIKey = "security.guestapi"

// GuestAPIOff says an instance's (expanded) config turns its guest API
// off (Incus's default is on).
func GuestAPIOff(cfg map[string]string) bool {
	v := cfg[GuestAPIKey]
	return v != "" && !IncusTrue(v)
}

// JudgeKernelKey judges one instance config key of the kernel boundary:
// ok says the key is of this family; problem is what it takes away, or
// allowed why it is allowed (both empty: the default, nothing to say).
func JudgeKernelKey(key, value string) (problem, allowed string, ok bool) {
	for _, r := range kernelKeyRules {
		if r.match(key) {
			problem, allowed = r.judge(key, value)
			return problem, allowed, true
		}
	}
	return "", "", false
}

// isIncusBool reports whether v is a boolean as Incus spells one.
func isIncusBool(v string) bool {
	switch strings.ToLower(v) {
	case "true", "1", "yes", "on", "false", "0", "no", "off":
		return true
	}
	return false
}

// mapsHostRoot reports whether a raw.idmap maps host id 0: a line "both|uid|gid
// HOST[-HOST] BOX[-BOX]" whose host side holds 0.
func mapsHostRoot(idmap string) bool {
	for _, line := range strings.Split(idmap, "\n") {
		f := strings.Fields(line)
		if len(f) < 3 {
			continue
		}
		lo, _, _ := strings.Cut(f[1], "-")
		if lo == "0" {
			return true
		}
	}
	return false
}

func OneLine(v string) string {
	return strings.ReplaceAll(strings.TrimSpace(v), "\n", "; ")
}

// IncusTrue is a boolean config value as Incus reads it: "1", "yes" and
// "on" are true as well (a privileged box spelt security.privileged=1 is
// privileged).
func IncusTrue(v string) bool {
	switch strings.ToLower(v) {
	case "true", "1", "yes", "on":
		return true
	}
	return false
}
