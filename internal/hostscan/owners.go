package hostscan

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Owner is a process holding a socket.
type Owner struct {
	PID  int
	Name string // /proc/<pid>/comm: at most 15 bytes
}

// OwnerScan bounds SocketOwners: a host can have many processes with many
// descriptors, and the owner is only a label.
type OwnerScan struct {
	MaxProcs int           // processes looked at
	MaxFDs   int           // descriptors looked at, over all processes
	Budget   time.Duration // wall time
}

// DefaultOwnerScan is what Listeners uses.
var DefaultOwnerScan = OwnerScan{MaxProcs: 8192, MaxFDs: 1 << 20, Budget: 2 * time.Second}

// SocketOwners finds, for each socket inode, the lowest-numbered process
// under procRoot ("/proc") holding a descriptor to it (the link
// socket:[inode] in /proc/<pid>/fd). It is best effort: processes that end
// during the scan or that it may not read are passed over, and it stops at
// the limits or once every inode is found. Inodes are unique across
// network namespaces, so any process of the machine can be the owner.
func SocketOwners(procRoot string, inodes []uint64, lim OwnerScan) map[uint64]Owner {
	want := make(map[string]uint64, len(inodes))
	for _, ino := range inodes {
		want["socket:["+strconv.FormatUint(ino, 10)+"]"] = ino
	}
	found := make(map[uint64]Owner)
	if len(want) == 0 {
		return found
	}
	ents, err := os.ReadDir(procRoot)
	if err != nil {
		return found
	}
	var pids []int
	for _, e := range ents {
		if pid, err := strconv.Atoi(e.Name()); err == nil && pid > 0 {
			pids = append(pids, pid)
		}
	}
	slices.Sort(pids)
	deadline := time.Now().Add(lim.Budget)
	fds := 0
	for i, pid := range pids {
		if i >= lim.MaxProcs || fds >= lim.MaxFDs || len(found) == len(want) || time.Now().After(deadline) {
			break
		}
		dir := filepath.Join(procRoot, strconv.Itoa(pid), "fd")
		d, err := os.Open(dir)
		if err != nil {
			continue
		}
		names, _ := d.Readdirnames(lim.MaxFDs - fds)
		d.Close()
		fds += len(names)
		for _, n := range names {
			link, err := os.Readlink(filepath.Join(dir, n))
			if err != nil || !strings.HasPrefix(link, "socket:[") {
				continue
			}
			ino, ok := want[link]
			if !ok {
				continue
			}
			if _, seen := found[ino]; seen {
				continue
			}
			found[ino] = Owner{PID: pid, Name: procName(procRoot, pid)}
		}
	}
	return found
}

func procName(procRoot string, pid int) string {
	b, err := os.ReadFile(filepath.Join(procRoot, strconv.Itoa(pid), "comm"))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}
