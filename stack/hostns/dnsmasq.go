package hostns

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// ProcArgs is a process's command line; nil when it cannot be read (the
// process is gone, or is a kernel thread).
func ProcArgs(pid int) []string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil || len(b) == 0 {
		return nil
	}
	return strings.Split(strings.TrimSuffix(string(b), "\x00"), "\x00")
}

// DnsmasqFor finds the dnsmasq process serving the bridge in the host's
// namespace: Incus can report a network Created while none runs (after an
// unclean daemon death), so the process is the ground truth. The process
// found last is checked first: the scan of every process on the host
// (every box's too) is made only when it no longer serves the bridge.
func (g *NS) DnsmasqFor(bridge string) int {
	key := fmt.Sprintf("%d/%s", g.Inode, bridge)
	if v, ok := dnsmasqFound.Load(key); ok && g.serves(v.(int), bridge) {
		return v.(int)
	}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || !g.serves(pid, bridge) {
			continue
		}
		dnsmasqFound.Store(key, pid)
		return pid
	}
	return 0
}

// dnsmasqFound is the dnsmasq DnsmasqFor found last, by namespace inode and
// bridge.
var dnsmasqFound sync.Map

// serves says whether process pid is a dnsmasq serving the bridge in this
// namespace.
func (g *NS) serves(pid int, bridge string) bool {
	args := ProcArgs(pid)
	if len(args) == 0 || !strings.HasSuffix(args[0], "dnsmasq") {
		return false
	}
	if !slices.Contains(args, "--interface="+bridge) && !slices.Contains(args, "-i"+bridge) {
		return false
	}
	var st syscall.Stat_t
	return syscall.Stat("/proc/"+strconv.Itoa(pid)+"/ns/net", &st) == nil && st.Ino == g.Inode
}

// DnsmasqLeaseFile finds the lease file of the dnsmasq serving the bridge,
// as that process was told it (Incus passes --dhcp-leasefile=PATH). pid is
// 0 when no dnsmasq serves the bridge, path empty when it names none.
func (g *NS) DnsmasqLeaseFile(bridge string) (path string, pid int) {
	pid = g.DnsmasqFor(bridge)
	if pid == 0 {
		return "", 0
	}
	for _, a := range ProcArgs(pid) {
		if p, ok := strings.CutPrefix(a, "--dhcp-leasefile="); ok {
			path = p
		}
	}
	return path, pid
}

// HoldsDeleted says whether process pid holds path open as a file
// deleted from disk (the kernel's "PATH (deleted)").
func HoldsDeleted(pid int, path string) bool {
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	fds, err := os.ReadDir(dir)
	if err != nil {
		return false
	}
	for _, fd := range fds {
		if l, err := os.Readlink(filepath.Join(dir, fd.Name())); err == nil && l == path+" (deleted)" {
			return true
		}
	}
	return false
}
