package hostns

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/box-isolation/box/internal/atomicfile"
)

// teardownMarker is the file `box teardown-host` holds while it removes
// the stack: the healer puts nothing back while it names a live process.
func teardownMarker(ino uint64) string {
	return filepath.Join(RunDir, fmt.Sprintf("teardown-%d", ino))
}

// MarkTeardown writes the teardown marker for the host's namespace; the
// returned function removes it.
func MarkTeardown(netns string) (func(), error) {
	ino, err := Inode(netns)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(RunDir, 0o755); err != nil {
		return nil, fmt.Errorf("marking the teardown for the healer: %w", err)
	}
	path := teardownMarker(ino)
	if err := os.WriteFile(path, []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644); err != nil {
		return nil, fmt.Errorf("marking the teardown for the healer: %w", err)
	}
	return func() { _ = os.Remove(path) }, nil
}

// TearingDown names the process tearing the stack down, or 0. A marker
// whose process is gone (a teardown killed half way) is stale and ignored.
func TearingDown(ino uint64) int {
	b, err := os.ReadFile(teardownMarker(ino))
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0
	}
	if err := syscall.Kill(pid, 0); err != nil && !errors.Is(err, syscall.EPERM) {
		return 0
	}
	return pid
}

// RunDir holds box's run-time files: the setup lock, the daemon's locks
// (one per network namespace), the teardown marker, the egress service's
// state. Under /run, so a reboot clears them.
const RunDir = "/run/box"

// DaemonLockPath is the lock box's daemon holds while it serves the
// namespace with inode ino: one daemon per namespace.
func DaemonLockPath(ino uint64) string {
	return filepath.Join(RunDir, fmt.Sprintf("guard-and-serve-%d.lock", ino))
}

// RefreshSocketPath is the daemon's refresh socket in the namespace with
// inode ino: a box command that cannot touch the kernel (a granted
// user's) asks for a refresh there and waits for it (AskRefresh).
func RefreshSocketPath(ino uint64) string {
	return filepath.Join(RunDir, fmt.Sprintf("refresh-%d.sock", ino))
}

// AskRefresh asks the daemon serving netns to refresh the ports, the pins
// and the egress table now, and waits until it has, after the question
// (at most wait). A daemon without the socket (one of a release before
// it) is not asked: its periodic resync takes the change.
func AskRefresh(ctx context.Context, netns string, wait time.Duration) error {
	ino, err := Inode(netns)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	conn, err := (&net.Dialer{}).DialContext(ctx, "unix", RefreshSocketPath(ino))
	if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ECONNREFUSED) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("asking box's daemon for a refresh: %w", err)
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	switch line = strings.TrimSpace(line); {
	case err != nil && line == "":
		return fmt.Errorf("box's daemon did not answer within %s (%v): box doctor says why", wait, err)
	case line != RefreshDone:
		return fmt.Errorf("box's daemon: %s (box doctor says more)", line)
	}
	return nil
}

// RefreshDone is what the daemon answers on its refresh socket once the
// refresh after the question is done.
const RefreshDone = "refreshed"

// legacyLockPath is the lock of the daemon as box named it before
// (box watch-ports). The daemon holds it too, so a box of the old name
// and one of the new never serve a namespace at once: each refuses while
// the other holds its lock.
func legacyLockPath(ino uint64) string {
	return filepath.Join(RunDir, fmt.Sprintf("watch-ports-%d.lock", ino))
}

// Label names the host's namespace for messages.
func Label(netns string) string {
	if netns == "" {
		return "this process's network namespace"
	}
	return "network namespace " + netns
}

// DaemonRunning says whether box's daemon (box guard-and-serve, or the
// watch-ports of a box of before its rename) holds the lock of the host's
// namespace, and its PID. It takes the lock shared and at once lets go,
// so it never waits.
func DaemonRunning(netns string) (pid int, running bool, err error) {
	ino, err := Inode(netns)
	if err != nil {
		return 0, false, err
	}
	for _, path := range []string{DaemonLockPath(ino), legacyLockPath(ino)} {
		if pid, running, err := lockHeld(path); err != nil || running {
			return pid, running, err
		}
	}
	return 0, false, nil
}

// lockHeld says whether a process holds the lock at path, and its PID.
func lockHeld(path string) (pid int, held bool, err error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("reading the daemon's lock: %w", err)
	}
	defer f.Close()
	err = syscall.Flock(int(f.Fd()), syscall.LOCK_SH|syscall.LOCK_NB)
	if err == nil {
		return 0, false, nil
	}
	if !errors.Is(err, syscall.EWOULDBLOCK) {
		return 0, false, fmt.Errorf("testing the daemon's lock %s: %w", path, err)
	}
	b, _ := io.ReadAll(f)
	pid, _ = strconv.Atoi(strings.TrimSpace(string(b)))
	return pid, true, nil
}

// Inode is the inode of the host's namespace: only a stat, so a granted
// user, who cannot open netlink in another namespace, can still ask.
func Inode(netns string) (uint64, error) {
	var st syscall.Stat_t
	nsPath := "/proc/self/ns/net"
	if netns != "" {
		nsPath = "/run/netns/" + netns
	}
	if err := syscall.Stat(nsPath, &st); err != nil {
		return 0, fmt.Errorf("reading %s: %w", nsPath, err)
	}
	return st.Ino, nil
}

// LockDaemon takes the daemon's locks of the namespace with inode ino
// (ns names it in messages), both its own and its old name's, and writes
// this process's PID into them. While another daemon holds one, it waits
// up to wait (at least a moment: DaemonRunning holds a lock shared for an
// instant), then refuses. The files are removed on release.
func LockDaemon(ino uint64, ns string, wait time.Duration) (func(), error) {
	if err := os.MkdirAll(RunDir, 0o755); err != nil {
		return nil, fmt.Errorf("locking the daemon: %w", err)
	}
	wait = max(wait, 250*time.Millisecond)
	// The old name's first: a daemon of before the rename takes only it.
	legacy, err := takeRunLock(legacyLockPath(ino), ns, wait)
	if err != nil {
		return nil, err
	}
	own, err := takeRunLock(DaemonLockPath(ino), ns, wait)
	if err != nil {
		legacy()
		return nil, err
	}
	return func() { own(); legacy() }, nil
}

// takeRunLock takes the lock at path for this process, waiting up to wait
// for another holder. A lock taken on a file that was meanwhile removed
// is let go and taken again on the new one.
func takeRunLock(path, ns string, wait time.Duration) (func(), error) {
	deadline := time.Now().Add(wait)
	for {
		f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
		if err != nil {
			return nil, fmt.Errorf("locking the daemon: opening %s: %w", path, err)
		}
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil && sameFile(f, path) {
			if err := f.Truncate(0); err == nil {
				_, err = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
			}
			if err != nil {
				f.Close()
				return nil, fmt.Errorf("locking the daemon: writing the PID into %s: %w", path, err)
			}
			return func() { os.Remove(path); f.Close() }, nil
		}
		b, _ := io.ReadAll(f)
		f.Close()
		if err != nil && !errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("locking the daemon: %s: %w", path, err)
		}
		if err != nil && time.Now().After(deadline) {
			holder := strings.TrimSpace(string(b))
			if holder == "" {
				holder = "unknown"
			}
			return nil, fmt.Errorf("box's daemon (pid %s) already serves %s: one runs per namespace (it holds %s); stop it first", holder, ns, path)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// sameFile reports whether the open file is still the one at path.
func sameFile(f *os.File, path string) bool {
	a, err := f.Stat()
	if err != nil {
		return false
	}
	b, err := os.Stat(path)
	return err == nil && os.SameFile(a, b)
}

// DaemonStatus is what box's daemon runs in a namespace and whether each
// service is up, as it last wrote it (DaemonStatusPath); box doctor reads
// it beside the daemon's lock.
type DaemonStatus struct {
	PID      int            `json:"pid"`
	Services []ServiceState `json:"services"`
}

// ServiceState is one service of the daemon.
type ServiceState struct {
	Name    string    `json:"name"`              // ports, healer, routes, egress
	Does    string    `json:"does"`              // what it is for, one line
	Up      bool      `json:"up"`                //
	Problem string    `json:"problem,omitempty"` // why it is down
	Since   time.Time `json:"since"`             // when it went up or down
}

// DaemonStatusPath is the daemon's status file in the namespace with inode
// ino.
func DaemonStatusPath(ino uint64) string {
	return filepath.Join(RunDir, fmt.Sprintf("guard-and-serve-%d.json", ino))
}

// WriteDaemonStatus replaces the status file in one rename.
func WriteDaemonStatus(ino uint64, st DaemonStatus) error {
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	if err := atomicfile.Write(DaemonStatusPath(ino), b, 0o644); err != nil {
		return fmt.Errorf("writing the daemon's status: %w", err)
	}
	return nil
}

// ReadDaemonStatus reads the daemon's status in netns: what its services
// last said, when the daemon runs (nil, nil when none runs).
func ReadDaemonStatus(netns string) (*DaemonStatus, error) {
	pid, running, err := DaemonRunning(netns)
	if err != nil || !running {
		return nil, err
	}
	ino, err := Inode(netns)
	if err != nil {
		return nil, err
	}
	st := &DaemonStatus{PID: pid}
	b, err := os.ReadFile(DaemonStatusPath(ino))
	if errors.Is(err, os.ErrNotExist) {
		return st, nil // a daemon of before the services were told apart
	}
	if err != nil {
		return nil, fmt.Errorf("reading the daemon's status: %w", err)
	}
	if err := json.Unmarshal(b, st); err != nil {
		return nil, fmt.Errorf("reading the daemon's status %s: %w", DaemonStatusPath(ino), err)
	}
	st.PID = pid
	return st, nil
}
