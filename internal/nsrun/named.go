package nsrun

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"

	"github.com/vishvananda/netns"
)

// Dir is where named namespaces are bind-mounted, as `ip netns` does.
// Create never makes it a shared mount of itself the way `ip netns add`
// does: after that, a namespace made before can no longer be deleted by
// name (its mount stays under the new one: "device or resource busy").
const Dir = "/run/netns"

// Create makes a named network namespace, leaving the caller's thread
// where it was.
func Create(name string) error {
	if err := os.MkdirAll(Dir, 0o755); err != nil {
		return fmt.Errorf("creating %s: %w", Dir, err)
	}
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("opening the current namespace: %w", err)
	}
	defer orig.Close()
	ns, err := netns.NewNamed(name)
	if err == nil {
		ns.Close()
	}
	if serr := netns.Set(orig); serr != nil {
		// The thread is stuck in the new namespace: keep it locked so the
		// runtime retires it.
		return errors.Join(err, fmt.Errorf("returning from new namespace %s: %w", name, serr))
	}
	runtime.UnlockOSThread()
	if err != nil {
		return fmt.Errorf("creating namespace %s: %w", name, err)
	}
	return nil
}

// Exists reports whether a named namespace is there.
func Exists(name string) bool {
	_, err := os.Stat(filepath.Join(Dir, name))
	return err == nil
}

// Delete removes a named namespace; a missing one is not an error.
func Delete(name string) error {
	if !Exists(name) {
		return nil
	}
	if err := netns.DeleteNamed(name); err != nil && !errors.Is(err, os.ErrNotExist) {
		// A namespace file that is no longer a mount point is still ours.
		if rerr := os.Remove(filepath.Join(Dir, name)); rerr != nil {
			return fmt.Errorf("deleting namespace %s: %w", name, err)
		}
	}
	return nil
}
