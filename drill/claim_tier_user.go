package drill

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"strings"
	"time"

	"github.com/box-isolation/box/internal/accounts"
	"github.com/box-isolation/box/stack"
	"github.com/box-isolation/box/stack/access"
	"github.com/box-isolation/box/stack/daemon"
	"github.com/box-isolation/box/stack/hostns"
	"github.com/box-isolation/box/stack/incus"
)

// C-TIER's granted user: the local account the drill makes and grants
// (what this machine must have for it), the port watcher the grant needs,
// and the removal of the user, its project and the decoy network, at
// teardown and of an aborted run's at preflight.

// tierUserComment marks the accounts the drill makes, so a later run finds
// an aborted run's and removes them, and nothing else; tierUserHost
// names the host (a world's namespace) whose run made it, so a run in one
// world never removes the user of a run in another.
const tierUserComment = "box drill C-TIER throwaway"

// tierUserHost is the part of a tier user's comment naming its host.
func tierUserHost(h *stack.Host) string {
	if h.NetNS != "" {
		return " on " + h.NetNS
	}
	return " on the host"
}

// tierPrereqs says what this machine lacks for C-TIER ("" when nothing).
func tierPrereqs(h *stack.Host) string {
	if _, err := os.Stat(h.Tier.Socket(h.Incus)); err != nil {
		return "no incus-user socket at " + h.Tier.Socket(h.Incus) + " (enable incus-user.socket; the world runs one)"
	}
	if _, err := accounts.GroupGID(stack.DefaultTierGroup); h.Tier.Group == "" && err != nil {
		return err.Error()
	}
	for _, bin := range []string{"useradd", "userdel", "gpasswd"} {
		if _, err := exec.LookPath(bin); err != nil {
			return bin + " is not installed (the passwd package)"
		}
	}
	return ""
}

// ensureWatcher starts a port watcher in this process when none runs; the
// returned function stops it (and does nothing when one ran already).
func ensureWatcher(ctx context.Context, h *stack.Host, logf func(string, ...any)) (func(), error) {
	if _, running, err := hostns.DaemonRunning(h.NetNS); err != nil {
		return nil, err
	} else if running {
		return func() {}, nil
	}
	wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan error, 1)
	go func() { done <- daemon.WatchPorts(wctx, h, discard{}) }()
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, running, _ := hostns.DaemonRunning(h.NetNS); running {
			logf("tier: no port watcher ran; the drill runs one while it grants and mints box-t")
			return func() { cancel(); <-done }, nil
		}
		select {
		case err := <-done:
			cancel()
			return nil, fmt.Errorf("starting a port watcher: %w", err)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			cancel()
			<-done
			return nil, errors.New("the port watcher did not start within 5 s")
		}
	}
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

// removeTierUser purges a drill tier user and deletes the account.
func removeTierUser(ctx context.Context, h *stack.Host, name string) error {
	u, err := accounts.Lookup(name)
	if err != nil {
		return nil // gone already
	}
	if _, err := access.NewManager(h).Revoke(ctx, u, "", true); err != nil {
		return fmt.Errorf("teardown: purging tier user %s: %w", name, err)
	}
	// The purge leaves a tombstone for the uid; the account goes, so does it.
	_ = os.Remove(stack.UserStatePath(stack.ServerDir(h.Incus), u.UID))
	if out, err := exec.CommandContext(ctx, "userdel", name).CombinedOutput(); err != nil {
		return fmt.Errorf("teardown: userdel %s: %w: %s", name, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// tierUserOf reports whether an account's comment marks a drill tier user
// of a run on this host. A comment naming no host is an older build's,
// taken as this host's.
func tierUserOf(comment string, h *stack.Host) bool {
	return strings.HasPrefix(comment, tierUserComment) && (!strings.Contains(comment, " on ") || strings.HasSuffix(comment, tierUserHost(h)))
}

// cleanTier is C-TIER's clean: an aborted run's tier users and decoys.
func cleanTier(ctx context.Context, cfg *Config) error {
	if err := cleanTierLeftovers(ctx, cfg.Host, cfg.logf); err != nil {
		return fmt.Errorf("removing an earlier run's tier user: %w", err)
	}
	return nil
}

// cleanTierLeftovers removes an aborted run's tier users and decoys.
func cleanTierLeftovers(ctx context.Context, h *stack.Host, logf func(string, ...any)) error {
	b, err := os.ReadFile("/etc/passwd")
	if err != nil {
		return nil
	}
	var errs []error
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Split(line, ":")
		if len(f) < 5 || !tierUserOf(f[4], h) {
			continue
		}
		if _, err := user.Lookup(f[0]); err != nil {
			continue
		}
		logf("preflight: removing an earlier run's tier user %s", f[0])
		errs = append(errs, removeTierUser(ctx, h, f[0]))
		errs = append(errs, deleteNetworkEventually(ctx, h.Incus, f[0]))
	}
	return errors.Join(errs...)
}

// deleteNetworkEventually deletes a network if it exists.
func deleteNetworkEventually(ctx context.Context, c *incus.Client, name string) error {
	if _, _, err := c.Networks().Get(ctx, name); incus.IsNotFound(err) {
		return nil
	}
	if err := c.Networks().Delete(ctx, name); err != nil && !incus.IsNotFound(err) {
		return fmt.Errorf("deleting network %s: %w", name, err)
	}
	return nil
}
