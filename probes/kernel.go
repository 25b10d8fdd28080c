package probes

import (
	"context"
	"errors"
	"fmt"
	"path"
	"strings"

	"github.com/box-isolation/box/probes/observation"
)

// The kernel probes look from inside a box at what the host's kernel lets
// it do (claim C-KERNEL): the id map, capabilities, the system call
// filter, mounts, device nodes, files opened for writing (and closed at
// once: never written), the cgroup release_agent, what an HTTP API on a
// unix socket answers; and the load probes push against the box's limits
// (processes, CPU, memory, disk), each bounded by a cap of its own so that
// a limit that does not hold never takes the host with it. One file each.
//
// A reading probe's outcome is reached when it read what it looks at (the
// evidence holds it, and the drill judges it), error when it could not. A
// probe that tries something the box must not do (open for writing, load
// past a limit) is rejected when the kernel stopped it and reached when it
// got through: arrived, as a packet that should have been blocked.

// Kernel and load probe kinds.
const (
	KindIDMap        Kind = "id_map"         // /proc/self/uid_map and gid_map
	KindCapabilities Kind = "capabilities"   // the capability sets and no_new_privs
	KindSeccomp      Kind = "seccomp"        // the filter's mode, and what denied system calls answer
	KindMounts       Kind = "mounts"         // mountinfo, and the mounts of a file system outside the box's root
	KindDevices      Kind = "devices"        // the device nodes under /dev
	KindWriteOpen    Kind = "write_open"     // paths under /proc and /sys opened for writing, closed at once
	KindReadFiles    Kind = "read_files"     // paths read (the start of each), or why not
	KindReleaseAgent Kind = "release_agent"  // the cgroup v1 release_agent, as the box could reach it
	KindUnixHTTP     Kind = "unix_http"      // GETs on an HTTP API on a unix socket
	KindLoadProcs    Kind = "load_processes" // processes started until the kernel refuses one
	KindLoadCPU      Kind = "load_cpu"       // spinning, with the CPU time it got
	KindLoadMemory   Kind = "load_memory"    // a child touching memory until something stops it
	KindLoadDisk     Kind = "load_disk"      // a file written until the disk is full
)

// Limits of the kernel probes' plans.
const (
	MaxPaths     = 32
	MaxLoadProcs = 4096 // a load_processes cap
	MaxLoadMiB   = 4096 // a load_memory or load_disk cap
	MaxSpinners  = 64
)

// kernelKinds are the kinds validateKernel checks.
var kernelKinds = map[Kind]bool{
	KindIDMap: true, KindCapabilities: true, KindSeccomp: true, KindMounts: true, KindDevices: true,
	KindWriteOpen: true, KindReadFiles: true, KindReleaseAgent: true, KindUnixHTTP: true,
	KindLoadProcs: true, KindLoadCPU: true, KindLoadMemory: true, KindLoadDisk: true,
}

// validateKernel checks a kernel or load probe: only the fields its kind
// uses, each well formed.
func (s *ProbeSpec) validateKernel() error {
	if s.Target.IsValid() || s.Port != 0 || s.Nonce != "" || s.Via.IsValid() || s.Name != "" || s.QType != "" ||
		s.Resolver.IsValid() || s.DstMAC != "" || s.ARPSenderIP.IsValid() || s.Op != "" || s.SrcMAC != "" ||
		s.SrcIP.IsValid() || s.SrcPort != 0 || s.Payload != "" {
		return fmt.Errorf("%s takes no target, port, nonce, via or packet fields", s.Kind)
	}
	paths, socket, max := len(s.Paths) > 0, s.Socket != "", s.Max != 0
	switch s.Kind {
	case KindWriteOpen, KindReadFiles:
		if !paths {
			return fmt.Errorf("%s needs paths", s.Kind)
		}
		for _, p := range s.Paths {
			if err := checkPath(p); err != nil {
				return err
			}
			// Opening for writing has no effect on a file under /proc or
			// /sys until a write; a device node (a watchdog) may act on
			// open, so nothing else is opened.
			if s.Kind == KindWriteOpen && !strings.HasPrefix(p, "/proc/") && !strings.HasPrefix(p, "/sys/") {
				return fmt.Errorf("write_open opens only under /proc/ and /sys/, not %s", p)
			}
			// A process's folder holds links to anything it has open or
			// sees (root, cwd, fd, exe, map_files): a device node too.
			if s.Kind == KindWriteOpen && throughProcessLinks(p) {
				return fmt.Errorf("write_open does not go through a process's links under /proc (%s): they lead anywhere", p)
			}
		}
		paths = false
	case KindUnixHTTP:
		if !socket || !paths {
			return errors.New("unix_http needs socket and paths (the URL paths to GET)")
		}
		if err := checkPath(s.Socket); err != nil {
			return fmt.Errorf("socket: %w", err)
		}
		for _, p := range s.Paths {
			if !strings.HasPrefix(p, "/") || strings.ContainsAny(p, " \t\r\n?#") || len(p) > MaxStringLen {
				return fmt.Errorf("%q is not a URL path", observation.Truncate(p, 64))
			}
		}
		paths, socket = false, false
	case KindLoadProcs, KindLoadMemory, KindLoadDisk, KindLoadCPU:
		limit := map[Kind]int{KindLoadProcs: MaxLoadProcs, KindLoadMemory: MaxLoadMiB, KindLoadDisk: MaxLoadMiB, KindLoadCPU: MaxSpinners}[s.Kind]
		if s.Max < 1 || s.Max > limit {
			return fmt.Errorf("%s needs max, its own cap, 1..%d", s.Kind, limit)
		}
		max = false
		if s.Kind == KindLoadDisk {
			if len(s.Paths) != 1 {
				return errors.New("load_disk needs paths: one directory to write in")
			}
			if err := checkPath(s.Paths[0]); err != nil {
				return err
			}
			paths = false
		}
	}
	if len(s.Paths) > MaxPaths {
		return fmt.Errorf("%d paths, more than the limit of %d", len(s.Paths), MaxPaths)
	}
	if paths || socket || max {
		return fmt.Errorf("%s takes no paths, socket or max", s.Kind)
	}
	return nil
}

// checkPath checks an absolute, clean path from a plan.
func checkPath(p string) error {
	if err := checkText("path", p, MaxStringLen); err != nil {
		return err
	}
	if !strings.HasPrefix(p, "/") || path.Clean(p) != p {
		return fmt.Errorf("path %q is not absolute and clean", observation.Truncate(p, 64))
	}
	return nil
}

// runKernel runs a kernel or load probe.
func runKernel(ctx context.Context, spec ProbeSpec, obs Observation) Observation {
	switch spec.Kind {
	case KindIDMap:
		return probeIDMap(obs)
	case KindCapabilities:
		return probeCapabilities(obs)
	case KindSeccomp:
		return probeSeccomp(obs)
	case KindMounts:
		return probeMounts(obs)
	case KindDevices:
		return probeDevices(obs)
	case KindWriteOpen:
		return probeWriteOpen(spec, obs)
	case KindReadFiles:
		return probeReadFiles(spec, obs)
	case KindReleaseAgent:
		return probeReleaseAgent(ctx, obs)
	case KindUnixHTTP:
		return probeUnixHTTP(ctx, spec, obs)
	case KindLoadProcs:
		return loadProcs(ctx, spec, obs)
	case KindLoadCPU:
		return loadCPU(ctx, spec, obs)
	case KindLoadMemory:
		return loadMemory(ctx, spec, obs)
	case KindLoadDisk:
		return loadDisk(ctx, spec, obs)
	}
	return fail(obs, "not a kernel probe: "+string(spec.Kind))
}

// throughProcessLinks reports whether path goes through one of a
// process's links under /proc (/proc/PID/root, cwd, exe, fd, map_files,
// also under self, thread-self and task/TID): they lead to anything the
// process sees, a device node too.
func throughProcessLinks(path string) bool {
	rest, ok := strings.CutPrefix(path, "/proc/")
	if !ok {
		return false
	}
	parts := strings.Split(rest, "/")
	isID := func(s string) bool { return s != "" && strings.Trim(s, "0123456789") == "" }
	if len(parts) < 2 || !(isID(parts[0]) || parts[0] == "self" || parts[0] == "thread-self") {
		return false
	}
	parts = parts[1:]
	if len(parts) >= 3 && parts[0] == "task" && isID(parts[1]) {
		parts = parts[2:]
	}
	switch parts[0] {
	case "root", "cwd", "exe", "fd", "map_files":
		return true
	}
	return false
}

// procRoot is where /proc is read (tests point it at a fixture).
var procRoot = "/proc"
