package hostns

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

// PortsLock and PinsLock are the files whose flocks serialise port-set
// and pin refreshes.
const (
	PortsLock = "/run/lock/box-ports.lock"
	PinsLock  = "/run/lock/box-pins.lock"
	// PolicyLock serializes box's writes of the policy store (the bridge's
	// user keys): removes and mints running at once otherwise lose to each
	// other's ETag, and a loaded Incus answers slowly enough that retries
	// run out (seen with 13 boxes removed at once beside 240).
	PolicyLock = "/run/lock/box-policies.lock"
)

// LockPorts takes the port set's lock (lockFile).
func LockPorts(ctx context.Context) (func(), error) { return LockFile(ctx, PortsLock, "the port set") }

// LockFile takes an exclusive flock on path without blocking forever: a
// stuck holder makes the caller fail with a message, not hang, and ctx is
// honoured. what names what the lock guards, for that message.
func LockFile(ctx context.Context, path, what string) (func(), error) {
	return LockFileWait(ctx, path, what, 30*time.Second, nil)
}

// LockFileWait is LockFile waiting up to limit, for a lock held for long
// (a template image's build); waiting, when set, is told once that another
// holder has it.
func LockFileWait(ctx context.Context, path, what string, limit time.Duration, waiting func()) (func(), error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDONLY, 0o644)
	if err != nil {
		return nil, fmt.Errorf("locking %s: %w", what, err)
	}
	deadline := time.Now().Add(limit)
	// A refresh holds the lock about a millisecond: look again soon, then
	// less often (docs/measurements.md, "The port watcher").
	wait := time.Millisecond
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() { f.Close() }, nil
		}
		if waiting != nil {
			waiting()
			waiting = nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) || time.Now().After(deadline) {
			f.Close()
			return nil, fmt.Errorf("locking %s (%s, held by another box command?): %w", what, path, err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, ctx.Err()
		case <-time.After(wait):
		}
		wait = min(2*wait, 50*time.Millisecond)
	}
}

// The setup lock: Ensure, EnsureFirewall and Teardown hold one host-wide
// flock while they change the host, so two of them at once (the boot
// unit's setup-host --firewall-only and an operator's setup-host, or
// doctor --fix, or two test packages) run one after the other instead of
// racing each other's creates in Incus ("UNIQUE constraint failed", a
// network left Pending). docs/setup-lock.md says more.
const (
	// SetupLockWait is how long a second caller waits by default.
	SetupLockWait = 5 * time.Minute
)

// SetupLockPath is the lock of the host whose network namespace is netns:
// /run/box/setup.lock on a real host (netns ""), one per namespace for the
// hermetic world's hosts and cluster members, which are hosts of their own.
func SetupLockPath(netns string) string {
	if netns == "" {
		return filepath.Join(RunDir, "setup.lock")
	}
	return filepath.Join(RunDir, "setup-"+netns+".lock")
}

// lockPoll is how often a waiter tries the lock again.
const lockPoll = 100 * time.Millisecond

// TakeSetupLock flocks path, waiting up to wait (SetupLockWait when 0)
// for another holder, and telling notice once who that is. The holder
// writes its pid, command and start into the file so a waiter can say so.
func TakeSetupLock(ctx context.Context, path string, wait time.Duration, notice func(string)) (func(), error) {
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
		holder, named := ReadHolder(path)
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

// ReadHolder is what the lock's holder wrote about itself, and whether it
// has yet.
func ReadHolder(path string) (string, bool) {
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

// AddressLock serialises picking a fixed address with setting it.
const AddressLock = "/run/lock/box-addresses.lock"
