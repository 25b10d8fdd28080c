// Package btrfs reads what the kernel says of a btrfs storage pool's quota
// accounting, in incusd's mount namespace, and rescans it. A box's root
// disk size on a btrfs pool is a qgroup limit, and it holds only while the
// kernel counts (the stack's diskacct.go says what box does with it).
package btrfs

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"github.com/box-isolation/box/internal/mountinfo"
	"golang.org/x/sys/unix"
)

// Accounting is what the kernel says of a btrfs pool's quota accounting.
type Accounting struct {
	Pool  string
	Mount string // the pool's mount point, in incusd's mount namespace
	Root  string // /proc/<incusd>/root: the way into that namespace
	SysFS string // /sys/fs/btrfs/<uuid>
	// Enabled: quotas are on (Incus turns them on at the first sized
	// volume); Inconsistent: the kernel does not count now.
	Enabled, Inconsistent bool
}

// Where the kernel's views are read; tests point them at a tree of
// their own.
var (
	ProcDir = "/proc"
	SysDir  = "/sys"
)

// ErrNotBtrfs: the pool is not a btrfs mount incusd has.
var ErrNotBtrfs = errors.New("not a btrfs pool")

// Read finds the pool's mount among incusd's (pid), the btrfs
// file system it is and what the kernel says of its accounting.
func Read(pid int, pool string) (Accounting, error) {
	a := Accounting{Pool: pool, Root: filepath.Join(ProcDir, strconv.Itoa(pid), "root")}
	f, err := os.Open(filepath.Join(ProcDir, strconv.Itoa(pid), "mountinfo"))
	if err != nil {
		return a, fmt.Errorf("reading incusd's mounts: %w", err)
	}
	defer f.Close()
	var source string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		// ID parent major:minor root mountpoint options [optional...] - fstype source superoptions
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		pf, qf := strings.Fields(pre), strings.Fields(post)
		if !ok || len(pf) < 5 || len(qf) < 2 || qf[0] != "btrfs" {
			continue
		}
		if mp := mountinfo.Unescape(pf[4]); strings.HasSuffix(mp, "/storage-pools/"+pool) {
			a.Mount, source = mp, qf[1]
		}
	}
	if err := sc.Err(); err != nil {
		return a, fmt.Errorf("reading incusd's mounts: %w", err)
	}
	if a.Mount == "" {
		return a, ErrNotBtrfs
	}
	dev := filepath.Base(source)
	if real, err := filepath.EvalSymlinks(source); err == nil {
		dev = filepath.Base(real) // /dev/mapper/x is dm-N in sysfs
	}
	matches, _ := filepath.Glob(filepath.Join(SysDir, "fs", "btrfs", "*", "devices", dev))
	if len(matches) != 1 {
		return a, fmt.Errorf("finding the btrfs file system of %s (on %s) under %s/fs/btrfs: %d matches", a.Mount, source, SysDir, len(matches))
	}
	a.SysFS = filepath.Dir(filepath.Dir(matches[0]))
	b, err := os.ReadFile(filepath.Join(a.SysFS, "qgroups", "inconsistent"))
	if errors.Is(err, os.ErrNotExist) {
		return a, nil // quotas off: no box's size is a limit yet
	}
	if err != nil {
		return a, fmt.Errorf("reading the pool's quota state: %w", err)
	}
	a.Enabled = true
	if e, err := os.ReadFile(filepath.Join(a.SysFS, "qgroups", "enabled")); err == nil && strings.TrimSpace(string(e)) == "0" {
		a.Enabled = false
	}
	a.Inconsistent = a.Enabled && strings.TrimSpace(string(b)) == "1"
	return a, nil
}

// Problem is what an inconsistent accounting means for boxes.
func (a Accounting) Problem() string {
	return "btrfs quota accounting is inconsistent (" + filepath.Join(a.SysFS, "qgroups", "inconsistent") + " is 1): the kernel counts no box's writes until a rescan, so no root disk size on it holds"
}

// FixCommand is the rescan by hand, from the host's shell.
func (a Accounting) FixCommand() string {
	return "box doctor --fix (or: btrfs quota rescan -w " + filepath.Join(a.Root, a.Mount) + ")"
}

// Rescan ioctls (linux/btrfs.h): _IOW(0x94, 44, struct
// btrfs_ioctl_quota_rescan_args) (64 bytes) and _IO(0x94, 46).
const (
	iocQuotaRescan     = 0x4040942c
	iocQuotaRescanWait = 0x942e
)

// RescanWait bounds how long a rescan is waited for for a rescan: a pool of a few
// GiB took under a second here; a large one goes on in the kernel, and
// its finding stays until it is done.
const RescanWait = 60 * time.Second

// Rescan starts the kernel's rescan of the pool's accounting (or joins
// one running) and waits for it up to RescanWait. done is false when it
// still runs.
func (a Accounting) Rescan(ctx context.Context) (done bool, err error) {
	fd, err := unix.Open(filepath.Join(a.Root, a.Mount), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return false, fmt.Errorf("opening pool %s's mount: %w", a.Pool, err)
	}
	var args [64]byte
	if err := ioctlPtr(fd, iocQuotaRescan, &args[0]); err != nil && !errors.Is(err, unix.EINPROGRESS) {
		unix.Close(fd)
		return false, fmt.Errorf("starting a quota rescan of pool %s: %w", a.Pool, err)
	}
	waited := make(chan error, 1)
	go func() {
		defer unix.Close(fd)
		waited <- ioctlPtr(fd, iocQuotaRescanWait, nil)
	}()
	t := time.NewTimer(RescanWait)
	defer t.Stop()
	select {
	case err := <-waited:
		if err != nil {
			return false, fmt.Errorf("waiting for the quota rescan of pool %s: %w", a.Pool, err)
		}
		return true, nil
	case <-t.C:
		return false, nil
	case <-ctx.Done():
		return false, ctx.Err()
	}
}

func ioctlPtr(fd int, req uintptr, p *byte) error {
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), req, uintptr(unsafe.Pointer(p))); e != 0 {
		return e
	}
	return nil
}
