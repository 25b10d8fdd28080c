package stack

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

	"github.com/box-isolation/box/stack/incus"

	"golang.org/x/sys/unix"

	"github.com/box-isolation/box/internal/mountinfo"
	"github.com/box-isolation/box/stack/model"
)

// A box's root disk size on a btrfs pool is a qgroup limit, and it holds
// only while the kernel counts what each subvolume references. Once the
// file system's quota accounting is marked inconsistent (the kernel logs
// "qgroup marked inconsistent, <why>"), it stops counting until a rescan:
// the limits stay set, the counters stop growing, and a box writes past
// its size (measured: 96 MiB into a 64 MiB root disk, the writer's own
// cap, with the box's counter still at its size when it was made). The
// same holds while a rescan runs (every counter starts again at zero). No
// Incus call says so, and Incus never rescans; the kernel says it in
// /sys/fs/btrfs/<uuid>/qgroups/inconsistent. Verify names it, Ensure
// rescans (the kernel's BTRFS_IOC_QUOTA_RESCAN on the pool's mount, in
// incusd's mount namespace), and Mint notes a size that cannot hold now.
// docs/box.md, "Limits".

// poolAcct is what the kernel says of a btrfs pool's quota accounting.
type poolAcct struct {
	pool  string
	mount string // the pool's mount point, in incusd's mount namespace
	root  string // /proc/<incusd>/root: the way into that namespace
	sysfs string // /sys/fs/btrfs/<uuid>
	// enabled: quotas are on (Incus turns them on at the first sized
	// volume); inconsistent: the kernel does not count now.
	enabled, inconsistent bool
}

// Where the kernel's views are read; tests point them at a tree of
// their own.
var (
	procDir = "/proc"
	sysDir  = "/sys"
)

// errNotBtrfs: the pool is not a btrfs mount incusd has.
var errNotBtrfs = errors.New("not a btrfs pool")

// readPoolAcct finds the pool's mount among incusd's (pid), the btrfs
// file system it is and what the kernel says of its accounting.
func readPoolAcct(pid int, pool string) (poolAcct, error) {
	a := poolAcct{pool: pool, root: filepath.Join(procDir, strconv.Itoa(pid), "root")}
	f, err := os.Open(filepath.Join(procDir, strconv.Itoa(pid), "mountinfo"))
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
			a.mount, source = mp, qf[1]
		}
	}
	if err := sc.Err(); err != nil {
		return a, fmt.Errorf("reading incusd's mounts: %w", err)
	}
	if a.mount == "" {
		return a, errNotBtrfs
	}
	dev := filepath.Base(source)
	if real, err := filepath.EvalSymlinks(source); err == nil {
		dev = filepath.Base(real) // /dev/mapper/x is dm-N in sysfs
	}
	matches, _ := filepath.Glob(filepath.Join(sysDir, "fs", "btrfs", "*", "devices", dev))
	if len(matches) != 1 {
		return a, fmt.Errorf("finding the btrfs file system of %s (on %s) under %s/fs/btrfs: %d matches", a.mount, source, sysDir, len(matches))
	}
	a.sysfs = filepath.Dir(filepath.Dir(matches[0]))
	b, err := os.ReadFile(filepath.Join(a.sysfs, "qgroups", "inconsistent"))
	if errors.Is(err, os.ErrNotExist) {
		return a, nil // quotas off: no box's size is a limit yet
	}
	if err != nil {
		return a, fmt.Errorf("reading the pool's quota state: %w", err)
	}
	a.enabled = true
	if e, err := os.ReadFile(filepath.Join(a.sysfs, "qgroups", "enabled")); err == nil && strings.TrimSpace(string(e)) == "0" {
		a.enabled = false
	}
	a.inconsistent = a.enabled && strings.TrimSpace(string(b)) == "1"
	return a, nil
}

// accounting reads the accounting of the pool box mints on, when it
// is a btrfs pool of this host's incusd. ok is false when there is
// nothing to say: another driver, a remote, or a host box cannot look
// into (not root: why says so).
func (st Storage) accounting(ctx context.Context) (a poolAcct, ok bool, why string) {
	if st.Remote {
		return a, false, ""
	}
	pool, _, err := st.Incus.Storage().Pool(ctx, st.Pool)
	if err != nil || pool.Driver != "btrfs" {
		return a, false, ""
	}
	srv, err := st.Incus.Server(ctx)
	if err != nil || srv.Environment.ServerPid <= 0 || srv.Environment.ServerClustered {
		return a, false, ""
	}
	a, err = readPoolAcct(srv.Environment.ServerPid, pool.Name)
	if errors.Is(err, errNotBtrfs) {
		return a, false, ""
	}
	if err != nil {
		return a, false, fmt.Sprintf("the btrfs quota accounting of pool %s was not read: %v", pool.Name, err)
	}
	return a, true, ""
}

// problem is what an inconsistent accounting means for boxes.
func (a poolAcct) problem() string {
	return "btrfs quota accounting is inconsistent (" + filepath.Join(a.sysfs, "qgroups", "inconsistent") + " is 1): the kernel counts no box's writes until a rescan, so no root disk size on it holds"
}

// fixCommand is the rescan by hand, from the host's shell.
func (a poolAcct) fixCommand() string {
	return "box doctor --fix (or: btrfs quota rescan -w " + filepath.Join(a.root, a.mount) + ")"
}

// finding is Verify's finding for the pool's accounting, if any.
func (st Storage) finding(ctx context.Context, v *Verification) {
	a, ok, why := st.accounting(ctx)
	if why != "" {
		v.Notes = append(v.Notes, why)
	}
	if ok && a.inconsistent {
		v.Findings = append(v.Findings, model.Finding{Layer: model.LayerFleet, Object: "storage pool " + a.pool, Problem: a.problem(), Fix: a.fixCommand()})
	}
}

// Rescan ioctls (linux/btrfs.h): _IOW(0x94, 44, struct
// btrfs_ioctl_quota_rescan_args) (64 bytes) and _IO(0x94, 46).
const (
	iocQuotaRescan     = 0x4040942c
	iocQuotaRescanWait = 0x942e
)

// rescanWait bounds how long Ensure waits for a rescan: a pool of a few
// GiB took under a second here; a large one goes on in the kernel, and
// its finding stays until it is done.
const rescanWait = 60 * time.Second

// rescan starts the kernel's rescan of the pool's accounting (or joins
// one running) and waits for it up to rescanWait. done is false when it
// still runs.
func (a poolAcct) rescan(ctx context.Context) (done bool, err error) {
	fd, err := unix.Open(filepath.Join(a.root, a.mount), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return false, fmt.Errorf("opening pool %s's mount: %w", a.pool, err)
	}
	var args [64]byte
	if err := ioctlPtr(fd, iocQuotaRescan, &args[0]); err != nil && !errors.Is(err, unix.EINPROGRESS) {
		unix.Close(fd)
		return false, fmt.Errorf("starting a quota rescan of pool %s: %w", a.pool, err)
	}
	waited := make(chan error, 1)
	go func() {
		defer unix.Close(fd)
		waited <- ioctlPtr(fd, iocQuotaRescanWait, nil)
	}()
	t := time.NewTimer(rescanWait)
	defer t.Stop()
	select {
	case err := <-waited:
		if err != nil {
			return false, fmt.Errorf("waiting for the quota rescan of pool %s: %w", a.pool, err)
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

// ensure rescans the pool's accounting when the kernel has
// stopped counting, and says what it did.
func (st Storage) ensure(ctx context.Context, rep *Report) error {
	a, ok, why := st.accounting(ctx)
	if why != "" {
		rep.Notes = append(rep.Notes, why)
	}
	if !ok || !a.inconsistent {
		return nil
	}
	done, err := a.rescan(ctx)
	if err != nil {
		return fmt.Errorf("%w; run btrfs quota rescan -w %s", err, filepath.Join(a.root, a.mount))
	}
	detail := "btrfs quota rescan done: box root disk sizes hold again"
	if !done {
		detail = fmt.Sprintf("btrfs quota rescan started, still running after %s: sizes hold once it is done (box doctor says when)", rescanWait)
	}
	rep.Changes = append(rep.Changes, model.Change{Object: "storage pool " + a.pool, Action: "updated", Detail: detail})
	return nil
}

// AccountingNote is Mint's note for a box given a size the pool cannot
// hold now, "" when it can (or cannot be told).
func (st Storage) AccountingNote(ctx context.Context, disk string) string {
	if disk == "" {
		return ""
	}
	a, ok, _ := st.accounting(ctx)
	if !ok || !a.inconsistent {
		return ""
	}
	return fmt.Sprintf("%s: pool %s's %s; run %s", model.NoteNoDiskLimit, a.pool, a.problem(), a.fixCommand())
}

// Storage is the storage pool box mints on, as the stack keeps an eye on
// it: a btrfs pool whose kernel stopped counting holds no box's size.
type Storage struct {
	Incus *incus.Client
	Pool  string
	// Remote: the pool is another machine's, whose kernel is not read
	// from here.
	Remote bool
}

// Storage is the pool this host mints on.
func (host *Host) Storage() Storage {
	return Storage{Incus: host.Incus, Pool: host.Options.PoolName(), Remote: host.Remote != ""}
}
