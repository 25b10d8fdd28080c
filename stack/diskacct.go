package stack

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"

	"github.com/box-isolation/box/stack/btrfs"
	"github.com/box-isolation/box/stack/incus"

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

// accounting reads the accounting of the pool box mints on, when it
// is a btrfs pool of this host's incusd. ok is false when there is
// nothing to say: another driver, a remote, or a host box cannot look
// into (not root: why says so).
func (st Storage) accounting(ctx context.Context) (a btrfs.Accounting, ok bool, why string) {
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
	a, err = btrfs.Read(srv.Environment.ServerPid, pool.Name)
	if errors.Is(err, btrfs.ErrNotBtrfs) {
		return a, false, ""
	}
	if err != nil {
		return a, false, fmt.Sprintf("the btrfs quota accounting of pool %s was not read: %v", pool.Name, err)
	}
	return a, true, ""
}

// finding is Verify's finding for the pool's accounting, if any.
func (st Storage) finding(ctx context.Context, v *Verification) {
	a, ok, why := st.accounting(ctx)
	if why != "" {
		v.Notes = append(v.Notes, why)
	}
	if ok && a.Inconsistent {
		v.Findings = append(v.Findings, model.Finding{Layer: model.LayerFleet, Object: "storage pool " + a.Pool, Problem: a.Problem(), Fix: a.FixCommand()})
	}
}

// ensure rescans the pool's accounting when the kernel has
// stopped counting, and says what it did.
func (st Storage) ensure(ctx context.Context, rep *Report) error {
	a, ok, why := st.accounting(ctx)
	if why != "" {
		rep.Notes = append(rep.Notes, why)
	}
	if !ok || !a.Inconsistent {
		return nil
	}
	done, err := a.Rescan(ctx)
	if err != nil {
		return fmt.Errorf("%w; run btrfs quota rescan -w %s", err, filepath.Join(a.Root, a.Mount))
	}
	detail := "btrfs quota rescan done: box root disk sizes hold again"
	if !done {
		detail = fmt.Sprintf("btrfs quota rescan started, still running after %s: sizes hold once it is done (box doctor says when)", btrfs.RescanWait)
	}
	rep.Changes = append(rep.Changes, model.Change{Object: "storage pool " + a.Pool, Action: "updated", Detail: detail})
	return nil
}

// AccountingNote is Mint's note for a box given a size the pool cannot
// hold now, "" when it can (or cannot be told).
func (st Storage) AccountingNote(ctx context.Context, disk string) string {
	if disk == "" {
		return ""
	}
	a, ok, _ := st.accounting(ctx)
	if !ok || !a.Inconsistent {
		return ""
	}
	return fmt.Sprintf("%s: pool %s's %s; run %s", model.NoteNoDiskLimit, a.Pool, a.Problem(), a.FixCommand())
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
