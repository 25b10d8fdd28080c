// Package ascred opens unix-socket connections under another user's
// credentials, from a process running as root.
//
// A unix socket's peer learns who connected from the credentials of the
// connecting thread at connect(2) (SO_PEERCRED), and its filesystem
// permissions are checked against that thread's fsuid and groups. Linux
// keeps credentials per thread; the raw setresuid/setresgid/setgroups
// system calls change only the calling thread (glibc and Go's syscall
// package broadcast them to every thread, the raw calls do not). So
// DialUnix locks a fresh goroutine to its thread, gives that thread the
// user's credentials, connects, and gives the thread its own back before
// unlocking it. Only the effective ids change (the real and saved stay
// root's), so the way back is always open. Were it to fail, the goroutine
// ends still locked and the runtime retires the thread; but a retired
// main thread is not ended, only parked (the runtime cannot end a
// process's first thread), and it would keep the borrowed identity for
// the process's life: /proc then shows the whole process as the user's,
// and a purge of that user (which ends the user's processes) kills it.
// Hence the restore, rather than relying on retirement alone.
//
// box uses it to act as a granted user towards incus-user (which keys a
// connection to a project by the peer's uid) without starting a process.
package ascred

import (
	"context"
	"fmt"
	"net"
	"runtime"
	"slices"
	"syscall"
	"unsafe"
)

// Cred is who a connection claims to be.
type Cred struct {
	UID, GID uint32
	// Groups are the supplementary groups (nil: none).
	Groups []uint32
}

func (c Cred) String() string { return fmt.Sprintf("uid %d gid %d groups %v", c.UID, c.GID, c.Groups) }

type result struct {
	conn net.Conn
	err  error
}

// DialUnix connects to the unix socket at path as cred. It needs
// CAP_SETUID and CAP_SETGID (root).
func DialUnix(ctx context.Context, path string, cred Cred) (net.Conn, error) {
	ch := make(chan result, 1)
	go func() {
		// Unlocked only once the thread is itself again; otherwise it ends
		// with this goroutine.
		runtime.LockOSThread()
		own, err := current()
		if err != nil {
			ch <- result{err: fmt.Errorf("reading this thread's identity: %w", err)}
			return
		}
		if err := become(cred); err != nil {
			ch <- result{err: fmt.Errorf("taking on %s: %w", cred, err)}
			return
		}
		var d net.Dialer
		conn, err := d.DialContext(ctx, "unix", path)
		// Restored before the caller hears back, so no thread is still
		// the user once DialUnix returns.
		if restore(own) == nil {
			runtime.UnlockOSThread()
		}
		ch <- result{conn, err}
	}()
	r := <-ch
	return r.conn, r.err
}

// current is the calling thread's effective identity.
func current() (Cred, error) {
	n, err := syscall.Getgroups() // the raw call: this thread's
	if err != nil {
		return Cred{}, err
	}
	groups := make([]uint32, len(n))
	for i, g := range n {
		groups[i] = uint32(g)
	}
	return Cred{UID: uint32(syscall.Geteuid()), GID: uint32(syscall.Getegid()), Groups: groups}, nil
}

// restore gives the calling thread its own identity back: the uid first,
// which brings back the capabilities needed for the rest. It reports an
// error unless the thread is entirely itself again.
func restore(own Cred) error {
	if err := setUID(own.UID); err != nil {
		return err
	}
	if err := setGID(own.GID); err != nil {
		return err
	}
	if err := setGroups(own.Groups); err != nil {
		return err
	}
	now, err := current()
	if err != nil {
		return err
	}
	if now.UID != own.UID || now.GID != own.GID || !slices.Equal(now.Groups, own.Groups) {
		return fmt.Errorf("the thread is %s, not %s", now, own)
	}
	return nil
}

// become gives the calling thread cred as its effective (and filesystem)
// identity. Groups first and the uid last: after the uid changes the
// thread may no longer change the others.
func become(cred Cred) error {
	if err := setGroups(cred.Groups); err != nil {
		return err
	}
	if err := setGID(cred.GID); err != nil {
		return err
	}
	return setUID(cred.UID)
}

// The raw calls change only the calling thread. -1 leaves an id as it is:
// only the effective (and so the filesystem) ids change, and the saved
// ones keep the way back.
const keep = ^uintptr(0)

func setGroups(gs []uint32) error {
	var gp unsafe.Pointer
	groups := slices.Clone(gs)
	if len(groups) > 0 {
		gp = unsafe.Pointer(&groups[0])
	}
	if _, _, e := syscall.RawSyscall(syscall.SYS_SETGROUPS, uintptr(len(groups)), uintptr(gp), 0); e != 0 {
		return fmt.Errorf("setgroups: %w", e)
	}
	return nil
}

func setGID(gid uint32) error {
	if _, _, e := syscall.RawSyscall(syscall.SYS_SETRESGID, keep, uintptr(gid), keep); e != 0 {
		return fmt.Errorf("setresgid: %w", e)
	}
	return nil
}

func setUID(uid uint32) error {
	if _, _, e := syscall.RawSyscall(syscall.SYS_SETRESUID, keep, uintptr(uid), keep); e != 0 {
		return fmt.Errorf("setresuid: %w", e)
	}
	return nil
}
