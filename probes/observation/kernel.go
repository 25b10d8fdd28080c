package observation

import "fmt"

// What the kernel and load probes saw (the kernel boundary, C-KERNEL).

// IDRange is one line of an id map: Count ids from Inside in the box are
// Outside on the host (the parent user namespace: the host's, for a box).
type IDRange struct {
	Inside  uint32 `json:"inside"`
	Outside uint32 `json:"outside"`
	Count   uint32 `json:"count"`
}

// IDMapEvidence is the box's uid and gid maps.
type IDMapEvidence struct {
	UID []IDRange `json:"uid"`
	GID []IDRange `json:"gid"`
}

// CapsEvidence is the capability sets, by name.
type CapsEvidence struct {
	Effective   []string `json:"effective"`
	Permitted   []string `json:"permitted"`
	Inheritable []string `json:"inheritable"`
	Bounding    []string `json:"bounding"`
	Ambient     []string `json:"ambient"`
	NoNewPrivs  bool     `json:"no_new_privs"`
}

// SeccompEvidence is the filter state and the trials' answers.
type SeccompEvidence struct {
	// Mode is 0 (none), 1 (strict) or 2 (filter); Filters how many.
	Mode    int            `json:"mode"`
	Filters int            `json:"filters"`
	Trials  []SyscallTrial `json:"trials"`
}

// SyscallTrial is one system call tried, and what it answered ("" for
// success).
type SyscallTrial struct {
	Name  string `json:"name"`
	Errno string `json:"errno"`
}

// Trial finds a trial's answer by system call name.
func (e *SeccompEvidence) Trial(name string) (string, bool) {
	for _, t := range e.Trials {
		if t.Name == name {
			return t.Errno, true
		}
	}
	return "", false
}

// MountEntry is one line of mountinfo.
type MountEntry struct {
	Point  string `json:"point"`
	Root   string `json:"root"` // the part of the file system shown there
	FSType string `json:"fstype"`
	Source string `json:"source"`
	Dev    string `json:"dev"` // major:minor
	// Options are the mount's own options (ro, rw, nosuid, ...).
	Options string `json:"options"`
}

// MountsEvidence is the box's root mount, the mounts of file systems
// outside it (Foreign), the host's device nodes bound in (DevNodes), the
// kernel file systems' mounts (Kernel: the drill holds their devices
// against the host's, since a host's /run or /proc bound in looks like
// the box's own from inside) and how many mounts there are.
type MountsEvidence struct {
	Root     MountEntry   `json:"root"`
	Foreign  []MountEntry `json:"foreign"`
	DevNodes []MountEntry `json:"dev_nodes,omitempty"`
	Kernel   []MountEntry `json:"kernel,omitempty"`
	Count    int          `json:"count"`
}

// DeviceNode is one device node.
type DeviceNode struct {
	Path  string `json:"path"`
	Type  string `json:"type"` // "c" or "b"
	Major uint32 `json:"major"`
	Minor uint32 `json:"minor"`
}

// String is "c 1:3 /dev/null".
func (d DeviceNode) String() string {
	return fmt.Sprintf("%s %d:%d %s", d.Type, d.Major, d.Minor, d.Path)
}

// FileAttempt is what one path answered: opened (for writing), read (the
// start of it, printable), or the errno; Absent says it does not exist.
type FileAttempt struct {
	Path    string `json:"path"`
	Opened  bool   `json:"opened,omitempty"`
	Absent  bool   `json:"absent,omitempty"`
	Errno   string `json:"errno,omitempty"`
	Content string `json:"content,omitempty"`
}

// Refused reports whether the kernel refused the path to a writer: a
// permission, or a read-only mount.
func (f FileAttempt) Refused() bool {
	return f.Errno == "EACCES" || f.Errno == "EPERM" || f.Errno == "EROFS"
}

// String is "PATH: opened", "PATH: EACCES" or "PATH: absent".
func (f FileAttempt) String() string {
	switch {
	case f.Opened:
		return f.Path + ": opened for writing"
	case f.Absent:
		return f.Path + ": absent"
	}
	return f.Path + ": " + f.Errno
}

// CgroupTry is one of the box's cgroup v1 hierarchies mounted afresh by
// the child: whether the mount was allowed, and the release_agent it
// found at its root.
type CgroupTry struct {
	Hierarchy    string       `json:"hierarchy"` // its options, e.g. "cpu,cpuacct" or "none,name=systemd"
	Mounted      bool         `json:"mounted"`
	Errno        string       `json:"errno,omitempty"`
	ReleaseAgent *FileAttempt `json:"release_agent,omitempty"`
}

// ReleaseAgentEvidence is every release_agent the box could reach.
type ReleaseAgentEvidence struct {
	// Mounted are the release_agents at the roots of the box's own cgroup
	// v1 mounts (none when it has none).
	Mounted []FileAttempt `json:"mounted"`
	// Fresh are the child's mounts; FreshError says why it could not try
	// (no user namespace for it, for one).
	Fresh      []CgroupTry `json:"fresh"`
	FreshError string      `json:"fresh_error,omitempty"`
}

// Opened lists every release_agent opened for writing.
func (e *ReleaseAgentEvidence) Opened() []string {
	var out []string
	for _, f := range e.Mounted {
		if f.Opened {
			out = append(out, f.Path)
		}
	}
	for _, c := range e.Fresh {
		if c.ReleaseAgent != nil && c.ReleaseAgent.Opened {
			out = append(out, c.ReleaseAgent.Path+" (a fresh "+c.Hierarchy+" mount)")
		}
	}
	return out
}

// HTTPAnswer is one GET's answer: its status and the start of its body
// (at most MaxHTTPBody bytes, printable), or why there is none.
type HTTPAnswer struct {
	Path   string `json:"path"`
	Status int    `json:"status,omitempty"`
	Body   string `json:"body,omitempty"`
	Error  string `json:"error,omitempty"`
}

// LoadEvidence is what a load reached.
type LoadEvidence struct {
	// Max is its own cap; Reached how far it got: processes started, MiB
	// of memory touched or of disk written.
	Max     int `json:"max"`
	Reached int `json:"reached"`
	// StoppedBy is what stopped it: the errno a fork or a write got
	// (EAGAIN, EDQUOT, ENOSPC) or the signal that killed it (SIGKILL: the
	// OOM killer); empty when it reached its cap.
	StoppedBy string `json:"stopped_by,omitempty"`
	// Tasks counts the box's tasks (processes and threads, as the pids
	// limit counts them) when the kernel refused a process.
	Tasks int `json:"tasks,omitempty"`
	// CPUSeconds is the CPU time the agent got over WallSeconds of
	// spinning (load_cpu).
	CPUSeconds  float64 `json:"cpu_seconds,omitempty"`
	WallSeconds float64 `json:"wall_seconds,omitempty"`
	// HeldMS is how long it held what it reached.
	HeldMS int64 `json:"held_ms,omitempty"`
}
