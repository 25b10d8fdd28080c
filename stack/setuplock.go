package stack

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// The setup lock: Ensure, EnsureFirewall and Teardown hold one host-wide
// flock while they change the host, so two of them at once (the boot
// unit's setup-host --firewall-only and an operator's setup-host, or
// doctor --fix, or two test packages) run one after the other instead of
// racing each other's creates in Incus ("UNIQUE constraint failed", a
// network left Pending). docs/setup-lock.md says more.
const (
	// SetupLockDir holds the lock files: under /run, so a reboot clears
	// them (a flock dies with its holder anyway).
	SetupLockDir = "/run/box"
	// SetupLockWait is how long a second caller waits by default.
	SetupLockWait = 5 * time.Minute
)

// SetupLockPath is the lock of the host whose network namespace is netns:
// /run/box/setup.lock on a real host (netns ""), one per namespace for the
// hermetic world's hosts and cluster members, which are hosts of their own.
func SetupLockPath(netns string) string {
	if netns == "" {
		return filepath.Join(SetupLockDir, "setup.lock")
	}
	return filepath.Join(SetupLockDir, "setup-"+netns+".lock")
}

// lockSetup takes the host's setup lock for the caller's change.
func (host *Host) lockSetup(ctx context.Context) (unlock func(), err error) {
	path := host.SetupLockPath
	if path == "" {
		path = SetupLockPath(host.NetNS)
	}
	return takeSetupLock(ctx, path, host.LockWait, host.Notice)
}

// lockPoll is how often a waiter tries the lock again.
const lockPoll = 100 * time.Millisecond

// takeSetupLock flocks path, waiting up to wait (SetupLockWait when 0)
// for another holder, and telling notice once who that is. The holder
// writes its pid, command and start into the file so a waiter can say so.
func takeSetupLock(ctx context.Context, path string, wait time.Duration, notice func(string)) (func(), error) {
	if wait <= 0 {
		wait = SetupLockWait
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("setup lock: %w (box setup-host runs as root)", err)
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("setup lock: %w (box setup-host runs as root)", err)
	}
	deadline := time.Now().Add(wait)
	told := false
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			break
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("setup lock %s: %w", path, err)
		}
		holder, named := readHolder(path)
		// The holder writes its name just after it takes the lock: give
		// it a moment before telling the operator about a nameless one.
		if !told && notice != nil && (named || time.Until(deadline) < wait-time.Second) {
			notice(fmt.Sprintf("waiting for the setup lock %s, held by %s (up to %s)", path, holder, wait))
			told = true
		}
		if time.Now().After(deadline) {
			f.Close()
			return nil, fmt.Errorf("the setup lock %s is still held by %s after %s: let that run finish and try again (the lock goes with its process; if it hangs, stop it)", path, holder, wait)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("waiting for the setup lock %s (held by %s): %w", path, holder, ctx.Err())
		case <-time.After(lockPoll):
		}
	}
	// Name the holder for whoever waits next; a failure here costs only
	// the name in their message.
	if err := f.Truncate(0); err == nil {
		fmt.Fprintf(f, "pid %d (%s), since %s\n", os.Getpid(), commandLine(), time.Now().UTC().Format("15:04:05 MST"))
		_ = f.Sync()
	}
	// Unnamed again on the way out, so the next holder is never taken
	// for this one in the instant before it writes its own name.
	return func() { _ = f.Truncate(0); f.Close() }, nil
}

// setupHeld says whether another holder has the host's setup lock now,
// and who, without waiting and without taking it.
func (host *Host) setupHeld() (string, bool) {
	path := host.SetupLockPath
	if path == "" {
		path = SetupLockPath(host.NetNS)
	}
	f, err := os.Open(path)
	if err != nil {
		return "", false
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_SH|syscall.LOCK_NB); err != nil {
		holder, _ := readHolder(path)
		return holder, errors.Is(err, syscall.EWOULDBLOCK)
	}
	_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
	return "", false
}

// readHolder is what the lock's holder wrote about itself, and whether it
// has yet.
func readHolder(path string) (string, bool) {
	b, err := os.ReadFile(path)
	if s := strings.TrimSpace(string(b)); err == nil && s != "" {
		return s, true
	}
	return "another process (it has not written its name yet)", false
}

// commandLine is this process as ps would show it, short.
func commandLine() string {
	args := append([]string{filepath.Base(os.Args[0])}, os.Args[1:]...)
	s := strings.Join(args, " ")
	if len(s) > 80 {
		s = s[:77] + "..."
	}
	return s
}
