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
// deadline, then removes it. It writes only that file, in the box.

func loadDisk(ctx context.Context, spec ProbeSpec, obs Observation) Observation {
	ev := &LoadEvidence{Max: spec.Max}
	obs.Evidence.Load = ev
	f, err := os.CreateTemp(spec.Paths[0], "drill-fill-")
	if err != nil {
		return fail(obs, "making the file to fill: "+err.Error())
	}
	name := f.Name()
	defer os.Remove(name)
	defer f.Close()
	chunk := make([]byte, 1<<20)
	for i := range chunk {
		chunk[i] = byte(i*7 + 1) // not zeros: nothing a file system could leave out
	}
	var werr error
	for ev.Reached < spec.Max && ctx.Err() == nil {
		if _, werr = f.Write(chunk); werr != nil {
			break
		}
		ev.Reached++
		if ev.Reached%32 == 0 {
			// Some file systems account a quota only once written back.
			if werr = f.Sync(); werr != nil {
				break
			}
		}
	}
	if werr == nil && ev.Reached < spec.Max && ctx.Err() != nil {
		return fail(obs, fmt.Sprintf("cut short after %d MiB: %v", ev.Reached, ctx.Err()))
	}
	if werr == nil {
		werr = f.Sync()
	}
	var e unix.Errno
	switch {
	case werr == nil:
		ev.HeldMS = holdUntil(ctx).Milliseconds()
		return done(obs, Reached, fmt.Sprintf("wrote %d MiB to %s, its own cap: nothing stopped it", ev.Reached, filepath.Dir(name)))
	case errors.As(werr, &e) && (e == unix.EDQUOT || e == unix.ENOSPC):
		ev.StoppedBy = errnoName(e)
		ev.HeldMS = holdUntil(ctx).Milliseconds()
		return done(obs, Rejected, fmt.Sprintf("a write failed with %s after %d MiB", ev.StoppedBy, ev.Reached))
	}
	return fail(obs, fmt.Sprintf("writing after %d MiB: %v", ev.Reached, werr))
}
