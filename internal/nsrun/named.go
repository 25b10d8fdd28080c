package nsrun

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
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
		rerr := os.Remove(filepath.Join(Dir, name))
		if errors.Is(rerr, unix.EBUSY) {
			rerr = deleteCovered(name)
		}
		if rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
			return fmt.Errorf("deleting namespace %s: %w (and removing its file: %w)", name, err, rerr)
		}
	}
	return nil
}

// deleteCovered removes a name whose namespace mount another mount hides.
// `ip netns add` bind-mounts Dir onto itself, copying the names made before
// it on top; once such a copy is unmounted, the first mount is still under
// the new Dir, where umount cannot reach it (EINVAL) and unlink refuses
// the file (EBUSY: a mount point in this mount namespace). A thread in a
// private mount namespace of its own lifts the covers on Dir, drops the
// namespace mount there and unlinks the file; the kernel then detaches
// the mounts on that file in every other mount namespace, the hidden one
// here included. Nothing else under Dir changes for anyone but the thread,
// which ends with its goroutine.
func deleteCovered(name string) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread leaves with its mount namespace
		errc <- uncoverAndUnlink(filepath.Join(Dir, name))
	}()
	return <-errc
}

// uncoverAndUnlink runs on a locked thread it may spoil.
func uncoverAndUnlink(path string) error {
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("entering a mount namespace of its own: %w", err)
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("making the mounts private to it: %w", err)
	}
	dir := filepath.Dir(path)
	for range 16 {
		err := unix.Unlink(path)
		if err == nil || errors.Is(err, unix.ENOENT) {
			return nil
		}
		if !errors.Is(err, unix.EBUSY) {
			return fmt.Errorf("unlinking %s: %w", path, err)
		}
		// Still a mount point here: drop what is mounted on the file, or
		// else the cover on its directory that hides it.
		if uerr := unix.Unmount(path, unix.MNT_DETACH); uerr == nil {
			continue
		}
		if uerr := unix.Unmount(dir, unix.MNT_DETACH); uerr != nil {
			return fmt.Errorf("unlinking %s: %w (and uncovering %s: %w)", path, err, dir, uerr)
		}
	}
	return fmt.Errorf("unlinking %s: still a mount point after 16 mounts taken off it", path)
}
