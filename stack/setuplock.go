package stack

import (
	"context"
	"errors"
	"os"
	"syscall"

	"github.com/box-isolation/box/stack/hostns"
)

// path is the lock's file for the host whose namespace is netns.
func (l SetupLock) path(netns string) string {
	if l.Path != "" {
		return l.Path
	}
	return hostns.SetupLockPath(netns)
}

// take takes the setup lock of the host whose namespace is netns for the
// caller's change.
func (l SetupLock) take(ctx context.Context, netns string) (unlock func(), err error) {
	return hostns.TakeSetupLock(ctx, l.path(netns), l.Wait, l.Notice)
}

// Held says whether another holder has the setup lock of the host whose
// namespace is netns now, and who, without waiting and without taking it.
func (l SetupLock) Held(netns string) (string, bool) {
	path := l.path(netns)
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
