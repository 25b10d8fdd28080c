package probes

import (
	"errors"
	"fmt"
	"strings"

	"golang.org/x/sys/unix"
)

// A write_open probe opens each of its paths for writing and closes it at
// once, writing nothing: whether the kernel takes a writer is the
// question, and for the files under /proc and /sys it is asked at open
// (a sysctl's permission, a read-only mount). The paths are the plan's,
// under /proc and /sys only (a device node may act on open).

// openForWrite opens path for writing and closes it: no byte is written,
// nothing is created or truncated, a FIFO does not block.
func openForWrite(path string) FileAttempt {
	// No magic link (/proc/PID/root, cwd, fd: they lead anywhere) is
	// followed anywhere on the path (O_NOFOLLOW guards only its last
	// part), where the kernel has openat2; /proc/self itself is a plain
	// link.
	how := unix.OpenHow{
		Flags:   unix.O_WRONLY | unix.O_NOFOLLOW | unix.O_NONBLOCK | unix.O_NOCTTY | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_NO_MAGICLINKS,
	}
	fd, err := unix.Openat2(unix.AT_FDCWD, path, &how)
	if errors.Is(err, unix.ENOSYS) {
		fd, err = unix.Open(path, int(how.Flags), 0)
	}
	if err != nil {
		return attemptErr(path, err)
	}
	unix.Close(fd)
	return FileAttempt{Path: path, Opened: true}
}

func attemptErr(path string, err error) FileAttempt {
	var e unix.Errno
	if errors.As(err, &e) {
		if e == unix.ENOENT || e == unix.ENOTDIR {
			return FileAttempt{Path: path, Absent: true, Errno: errnoName(e)}
		}
		return FileAttempt{Path: path, Errno: errnoName(e)}
	}
	return FileAttempt{Path: path, Errno: err.Error()}
}

func probeWriteOpen(spec ProbeSpec, obs Observation) Observation {
	var opened, refused, absent []string
	for _, p := range spec.Paths {
		a := openForWrite(p)
		obs.Evidence.Files = append(obs.Evidence.Files, a)
		switch {
		case a.Opened:
			opened = append(opened, p)
		case a.Refused():
			refused = append(refused, a.String())
		case a.Absent:
			absent = append(absent, p)
		}
	}
	switch {
	case len(opened) > 0:
		return done(obs, Reached, "opened for writing: "+strings.Join(opened, ", "))
	case len(refused) > 0:
		return done(obs, Rejected, "refused to a writer: "+strings.Join(refused, ", "))
	case len(absent) == len(spec.Paths):
		return fail(obs, "none of the paths exists: "+strings.Join(absent, ", "))
	}
	return fail(obs, fmt.Sprintf("no path opened or was refused: %v", obs.Evidence.Files))
}
