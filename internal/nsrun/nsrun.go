// Package nsrun runs a function inside a named network namespace (as
// `ip netns` names them) on a locked OS thread, and brings the thread back.
// Sockets opened inside stay in that namespace after Do returns, and
// /proc/sys/net files opened inside are that namespace's.
package nsrun

import (
	"errors"
	"fmt"
	"runtime"

	"github.com/vishvananda/netns"
)

// Do runs fn inside the named namespace; an empty name runs it where the
// caller is.
func Do(name string, fn func() error) error {
	if name == "" {
		return fn()
	}
	target, err := netns.GetFromName(name)
	if err != nil {
		return fmt.Errorf("opening namespace %s: %w", name, err)
	}
	defer target.Close()

	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("opening the current namespace: %w", err)
	}
	defer orig.Close()
	if err := netns.Set(target); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("entering namespace %s: %w", name, err)
	}
	fnErr := fn()
	if err := netns.Set(orig); err != nil {
		// The thread is stuck in the wrong namespace: keep it locked so the
		// runtime retires it instead of reusing it.
		return errors.Join(fnErr, fmt.Errorf("leaving namespace %s: %w", name, err))
	}
	runtime.UnlockOSThread()
	return fnErr
}
