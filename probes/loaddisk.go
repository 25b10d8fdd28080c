package probes

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// A load_disk probe writes a file of its own in its directory, 1 MiB at a
// time, up to max MiB, until a write fails with the disk full (EDQUOT: the
// box's quota, or ENOSPC); it holds the file until shortly before its
// deadline, then removes it. It writes only that file, in the box, and
// past the page cache where the file system allows (O_DIRECT): cached
// pages count against the box's memory limit, beside a memory load, and
// the kernel cannot always reclaim them fast enough to spare the agent.

func loadDisk(ctx context.Context, spec ProbeSpec, obs Observation) Observation {
	ev := &LoadEvidence{Max: spec.Max}
	obs.Evidence.Load = ev
	name := filepath.Join(spec.Paths[0], fmt.Sprintf("drill-fill-%d", os.Getpid()))
	direct := true
	fd, err := unix.Open(name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_DIRECT|unix.O_CLOEXEC, 0o600)
	if errors.Is(err, unix.EINVAL) {
		// No direct I/O here (tmpfs): through the page cache then.
		direct = false
		fd, err = unix.Open(name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC, 0o600)
	}
	if err != nil {
		return fail(obs, "making the file to fill: "+err.Error())
	}
	defer func() {
		unix.Close(fd)
		os.Remove(name)
		// The space back at once: a file system may count it against the
		// quota until it commits, and the agent's report is still to be
		// written (Incus records it on the box's volume).
		if d, err := unix.Open(spec.Paths[0], unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0); err == nil {
			_ = unix.Syncfs(d)
			unix.Close(d)
		}
	}()
	// Page-aligned, as direct I/O needs; not zeros, which a file system
	// could leave out.
	chunk, err := unix.Mmap(-1, 0, 1<<20, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return fail(obs, "a buffer to write: "+err.Error())
	}
	defer unix.Munmap(chunk)
	for i := range chunk {
		chunk[i] = byte(i*7 + 1)
	}
	var werr error
	for ev.Reached < spec.Max && ctx.Err() == nil {
		if _, werr = unix.Write(fd, chunk); werr != nil {
			break
		}
		ev.Reached++
		if !direct && ev.Reached%4 == 0 {
			// Through the page cache, some file systems account a quota
			// only once written back.
			if werr = unix.Fdatasync(fd); werr != nil {
				break
			}
		}
	}
	if werr == nil && ev.Reached < spec.Max && ctx.Err() != nil {
		return fail(obs, fmt.Sprintf("cut short after %d MiB: %v", ev.Reached, ctx.Err()))
	}
	if werr == nil {
		werr = unix.Fdatasync(fd)
	}
	var e unix.Errno
	switch {
	case werr == nil:
		ev.HeldMS = holdUntil(ctx).Milliseconds()
		return done(obs, Reached, fmt.Sprintf("wrote %d MiB to %s, its own cap: nothing stopped it", ev.Reached, spec.Paths[0]))
	case errors.As(werr, &e) && (e == unix.EDQUOT || e == unix.ENOSPC):
		ev.StoppedBy = errnoName(e)
		ev.HeldMS = holdUntil(ctx).Milliseconds()
		return done(obs, Rejected, fmt.Sprintf("a write failed with %s after %d MiB", ev.StoppedBy, ev.Reached))
	}
	return fail(obs, fmt.Sprintf("writing after %d MiB: %v", ev.Reached, werr))
}
