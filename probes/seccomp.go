package probes

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// A seccomp probe reads the agent's system call filter state from
// /proc/self/status and tries system calls a container's filter denies,
// each in a form that can do nothing whatever answers it (no file
// descriptor, no module image), to see who answered: the filter's errno,
// or the kernel's. name_to_handle_at, which no filter denies, says whether
// the kernel has the handle system calls at all (ENOSYS there means a
// denial of open_by_handle_at proves nothing).

// The trials, by name.
const (
	TrialNameToHandle = "name_to_handle_at"
	TrialOpenByHandle = "open_by_handle_at"
	TrialInitModule   = "init_module"
)

func probeSeccomp(obs Observation) Observation {
	ev := &SeccompEvidence{}
	if err := readSeccompStatus(filepath.Join(procRoot, "self/status"), ev); err != nil {
		return fail(obs, err.Error())
	}
	errnoOf := func(_, _ uintptr, e unix.Errno) string {
		if e == 0 {
			return ""
		}
		return errnoName(e)
	}
	// A zero-byte handle buffer: EOVERFLOW says the call exists.
	var fh struct {
		bytes uint32
		typ   int32
	}
	var mountID int32
	root := []byte("/\x00")
	cwd := unix.AT_FDCWD
	ev.Trials = append(ev.Trials, SyscallTrial{Name: TrialNameToHandle, Errno: errnoOf(unix.Syscall6(unix.SYS_NAME_TO_HANDLE_AT,
		uintptr(cwd), uintptr(unsafe.Pointer(&root[0])), uintptr(unsafe.Pointer(&fh)), uintptr(unsafe.Pointer(&mountID)), 0, 0))})
	// No mount fd and no handle: nothing to open.
	ev.Trials = append(ev.Trials, SyscallTrial{Name: TrialOpenByHandle, Errno: errnoOf(unix.Syscall(unix.SYS_OPEN_BY_HANDLE_AT, ^uintptr(0), 0, uintptr(unix.O_RDONLY)))})
	// A zero-length module image loads nothing.
	args := []byte("\x00")
	ev.Trials = append(ev.Trials, SyscallTrial{Name: TrialInitModule, Errno: errnoOf(unix.Syscall(unix.SYS_INIT_MODULE, 0, 0, uintptr(unsafe.Pointer(&args[0]))))})
	obs.Evidence.Seccomp = ev
	return done(obs, Reached, fmt.Sprintf("seccomp mode %d, %d filter(s)", ev.Mode, ev.Filters))
}

func readSeccompStatus(file string, ev *SeccompEvidence) error {
	f, err := os.Open(file)
	if err != nil {
		return fmt.Errorf("reading %s: %w", file, err)
	}
	defer f.Close()
	found := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		n, err := strconv.Atoi(strings.TrimSpace(v))
		switch k {
		case "Seccomp":
			if err != nil {
				return fmt.Errorf("%s: Seccomp %q", file, v)
			}
			ev.Mode, found = n, true
		case "Seccomp_filters":
			if err == nil {
				ev.Filters = n
			}
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	if !found {
		return fmt.Errorf("%s has no Seccomp line (a kernel without seccomp)", file)
	}
	return nil
}
