package probes

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	mnt "github.com/box-isolation/box/internal/mountinfo"
	"github.com/box-isolation/box/probes/observation"
)

// A mounts probe reads the box's mountinfo and names every mount that
// shows it a file system outside its own root: a disk-backed file system
// other than the root's, or a part of the root's own file system outside
// the tree the box's root is (a host path bound in, on a dir pool).
// Kernel file systems (proc, sysfs, tmpfs, cgroup, ...) are the box's own
// views; a devtmpfs mount is one of the host's device nodes bound in, and
// is listed for the drill to judge by the node it shows.

// kernelFS are file systems with no backing store of the host's: a new
// mount of one is a view of the box's own namespaces or memory (a bind of
// the host's is not, which only its device tells).
var kernelFS = map[string]bool{
	"proc": true, "sysfs": true, "tmpfs": true, "devpts": true, "mqueue": true, "cgroup": true, "cgroup2": true,
	"fuse.lxcfs": true, "hugetlbfs": true, "autofs": true, "ramfs": true, "nsfs": true,
	// Nested containers' overlays, made of the box's own folders.
	"overlay": true,
}

// hostWideFS have one instance for the whole host (the kernel's debug,
// tracing, security, firmware and BPF views): a box may show one only
// read-only.
var hostWideFS = map[string]bool{
	"debugfs": true, "tracefs": true, "securityfs": true, "efivarfs": true, "pstore": true, "bpf": true,
	"configfs": true, "binfmt_misc": true, "fusectl": true,
}

func probeMounts(obs Observation) Observation {
	file := filepath.Join(procRoot, "self/mountinfo")
	b, err := os.ReadFile(file)
	if err != nil {
		return fail(obs, fmt.Sprintf("reading %s: %v", file, err))
	}
	ev, err := judgeMounts(string(b))
	if err != nil {
		return fail(obs, err.Error())
	}
	obs.Evidence.Mounts = ev
	if len(ev.Foreign) > 0 {
		var pts []string
		for _, m := range ev.Foreign {
			pts = append(pts, fmt.Sprintf("%s (%s %s of %s)", m.Point, m.FSType, m.Root, m.Source))
		}
		return done(obs, Reached, fmt.Sprintf("%d mounts; outside the box's root: %s", ev.Count, strings.Join(pts, ", ")))
	}
	return done(obs, Reached, fmt.Sprintf("%d mounts, none of a file system outside the box's root", ev.Count))
}

// judgeMounts reads a mountinfo and sorts its mounts.
func judgeMounts(mountinfo string) (*MountsEvidence, error) {
	var all []MountEntry
	for _, line := range strings.Split(strings.TrimSpace(mountinfo), "\n") {
		pre, post, ok := strings.Cut(line, " - ")
		a, b := strings.Fields(pre), strings.Fields(post)
		if !ok || len(a) < 6 || len(b) < 2 {
			return nil, fmt.Errorf("mountinfo line %q: not as the kernel writes it", observation.Truncate(line, 80))
		}
		all = append(all, MountEntry{Point: mnt.Unescape(a[4]), Root: mnt.Unescape(a[3]), FSType: b[0], Source: mnt.Unescape(b[1]), Dev: a[2], Options: a[5]})
	}
	ev := &MountsEvidence{Count: len(all), Foreign: []MountEntry{}}
	found := false
	// The last mount on / is the one the box sees.
	for _, m := range all {
		if m.Point == "/" {
			ev.Root, found = m, true
		}
	}
	if !found {
		return nil, fmt.Errorf("mountinfo has no root mount")
	}
	for _, m := range all {
		switch {
		case m == ev.Root:
		case m.FSType == "devtmpfs":
			ev.DevNodes = append(ev.DevNodes, m)
		case hostWideFS[m.FSType] && readOnly(m.Options):
		case kernelFS[m.FSType]:
			ev.Kernel = append(ev.Kernel, m)
		case m.Dev == ev.Root.Dev && m.Source == ev.Root.Source && within(m.Root, ev.Root.Root):
			// The box's own tree, mounted again (a bind inside the box).
		default:
			ev.Foreign = append(ev.Foreign, m)
		}
	}
	return ev, nil
}

// readOnly reports whether a mount's own options hold ro.
func readOnly(options string) bool {
	for _, o := range strings.Split(options, ",") {
		if o == "ro" {
			return true
		}
	}
	return false
}

// within reports whether path p is root or under it.
func within(p, root string) bool {
	return root == "/" || p == root || strings.HasPrefix(p, strings.TrimSuffix(root, "/")+"/")
}
