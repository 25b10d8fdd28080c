package stack

import (
	"context"
	"errors"
	"os"
	"syscall"

	"github.com/box-isolation/box/stack/hostns"
)

// lockSetup takes the host's setup lock for the caller's change.
func (host *Host) lockSetup(ctx context.Context) (unlock func(), err error) {
	path := host.Lock.Path
	if path == "" {
		path = hostns.SetupLockPath(host.NetNS)
	}
	return hostns.TakeSetupLock(ctx, path, host.Lock.Wait, host.Lock.Notice)
}

// SetupHeld says whether another holder has the host's setup lock now,
// and who, without waiting and without taking it.
func (host *Host) SetupHeld() (string, bool) {
	path := host.Lock.Path
	if path == "" {
		path = hostns.SetupLockPath(host.NetNS)
	}
	f, err := os.Open(path)
	if err != nil {
		return "", false
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_SH|syscall.LOCK_NB); err != nil {
		holder, _ := hostns.ReadHolder(path)
		return holder, errors.Is(err, syscall.EWOULDBLOCK)
	}
	_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
	return "", false
}
