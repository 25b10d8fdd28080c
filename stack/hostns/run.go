package hostns

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
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

// RunDir holds box's run-time files: the setup lock, one watcher lock
// per network namespace watched, the teardown marker, the egress
// service's state. Under /run, so a reboot clears them.
const RunDir = "/run/box"

func WatchLockPath(ino uint64) string {
	return filepath.Join(RunDir, fmt.Sprintf("watch-ports-%d.lock", ino))
}

// Label names the host's namespace for messages.
func Label(netns string) string {
	if netns == "" {
		return "this process's network namespace"
	}
	return "network namespace " + netns
}

// WatcherRunning says whether a port watcher (box watch-ports) holds the
// lock of the host's namespace, and its PID. It takes the lock shared and
// at once lets go, so it never waits.
func WatcherRunning(netns string) (pid int, running bool, err error) {
	ino, err := Inode(netns)
	if err != nil {
		return 0, false, err
	}
	path := WatchLockPath(ino)
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("reading the port watcher's lock: %w", err)
	}
	defer f.Close()
	err = syscall.Flock(int(f.Fd()), syscall.LOCK_SH|syscall.LOCK_NB)
	if err == nil {
		return 0, false, nil
	}
	if !errors.Is(err, syscall.EWOULDBLOCK) {
		return 0, false, fmt.Errorf("testing the port watcher's lock %s: %w", path, err)
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

// LockWatcher takes the namespace's watcher lock and writes this process's
// PID into it. The file is removed on release; a lock taken on a file that
// was meanwhile removed is let go and taken again on the new one.
func LockWatcher(ino uint64, ns string) (func(), error) {
	path := WatchLockPath(ino)
	if err := os.MkdirAll(RunDir, 0o755); err != nil {
		return nil, fmt.Errorf("watching ports: %w", err)
	}
	// WatcherRunning holds the lock shared for an instant: try for a while.
	deadline := time.Now().Add(250 * time.Millisecond)
	for {
		f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
		if err != nil {
			return nil, fmt.Errorf("watching ports: opening the lock: %w", err)
		}
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil && sameFile(f, path) {
			if err := f.Truncate(0); err == nil {
				_, err = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
			}
			if err != nil {
				f.Close()
				return nil, fmt.Errorf("watching ports: writing the PID into %s: %w", path, err)
			}
			return func() { os.Remove(path); f.Close() }, nil
		}
		b, _ := io.ReadAll(f)
		f.Close()
		if err != nil && !errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("watching ports: locking %s: %w", path, err)
		}
		if err != nil && time.Now().After(deadline) {
			holder := strings.TrimSpace(string(b))
			if holder == "" {
				holder = "unknown"
			}
			return nil, fmt.Errorf("a port watcher (pid %s) already watches %s: one runs per namespace (it holds %s); stop it first", holder, ns, path)
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
