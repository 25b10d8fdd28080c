package stack

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/box-isolation/box/internal/rootonly"
	"github.com/box-isolation/box/stack/model"
)

// bootUnit loads the firewall part of the stack at boot from the file
// setup-host saved (SavedFirewall), with no Incus call, before Incus
// starts: box's tables hold before incusd restores a single box. Its
// rules name boxnet, which need not exist yet.
const bootUnit = `[Unit]
Description=box: load the isolation firewall box setup-host saved (nft tables inet box, bridge box, bridge box_pin, inet box_route), before Incus starts
DefaultDependencies=no
After=local-fs.target
Before=network-pre.target incus.service incus-startup.service shutdown.target
Wants=network-pre.target
Conflicts=shutdown.target

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=%s setup-host --boot

[Install]
WantedBy=multi-user.target
`

// daemonUnit runs box's daemon (package daemon), which guards the stack
// (the bridge's ports isolated, in the bridge drop's port set and pinned
// as boxes restart on their own; box's tables and Incus's put back after
// another tool's flush; L-ROUTE following the routes) and serves the
// allowlisted boxes (their resolver and proxy: they resolve nothing while
// it is down). It is ready (Type=notify) once it has subscribed to the
// kernel's link events and synced the ports, with no Incus call: Incus
// starts after it (incusDropIn), so the port of every box Incus restores
// at boot joins the drop's set from the link event alone. It conflicts
// with its unit of its old name (box-ports.service): starting it stops
// that one, and with --take-over it waits for the old daemon's lock and
// serves the moment the old one lets go (it starts while the old one
// stops, not after it: the allowlisted boxes' resolver is gone for
// milliseconds, not for a daemon's start). The two never serve at once.
const daemonUnit = `[Unit]
Description=box: guard the isolation stack (ports isolated and pinned, box's tables put back, routes followed) and serve allowlisted boxes (their resolver and proxy)
DefaultDependencies=no
After=local-fs.target box-firewall.service
Wants=box-firewall.service
Before=incus.service incus-startup.service shutdown.target
Conflicts=shutdown.target box-ports.service

[Service]
Type=notify
NotifyAccess=main
ExecStart=%s guard-and-serve --take-over
Restart=always
RestartSec=2

[Install]
WantedBy=multi-user.target
`

// incusDropIn makes Incus's daemon want box's units and start after them,
// however it is started (at boot, by its socket, by incus-startup): Incus
// restores at boot every instance that ran at shutdown. Wants, not
// Requires: a failing box unit does not keep Incus down (box doctor names
// it). setup-host writes it; the package does not ship it (installing box
// changes nothing until setup-host runs).
//
// It also gives incusd an empty, read-only /dev/mqueue: Incus binds the
// host's /dev/mqueue into every unprivileged container when it exists
// (systemd mounts it on every host), and that is the host's POSIX message
// queue instance, shared by the host and every box (a queue made on the
// host, or in one box, is listed, opened and removed in another: measured
// in the world's machine, caught by C-KERNEL's mounts). A box's own
// mq_open(3) uses its own IPC namespace, which needs no mount. The
// option runs incusd in a mount namespace of its own (systemd's
// PrivateMounts): its mounts (a pool's, an instance's rootfs) are not
// seen from the host's shell (docs/box.md, "Incus's /dev/mqueue").
const incusDropIn = `# box: Incus starts, and restores its instances, only after box's firewall
# is loaded and its daemon is ready; and Incus binds an empty,
# read-only /dev/mqueue into its containers, not the host's message queues
# (written by box setup-host; box teardown-host removes it).
[Unit]
Wants=box-firewall.service box-guard-and-serve.service
After=box-firewall.service box-guard-and-serve.service

[Service]
TemporaryFileSystem=/dev/mqueue:ro
`

// IncusDropInName is the drop-in Ensure writes for incus.service, relative
// to the unit directory.
const IncusDropInName = "incus.service.d/box.conf"

// BootUnitName and DaemonUnitName are the systemd units Ensure installs on
// systemd hosts. LegacyDaemonUnitName is the daemon's unit as box named it
// before it was renamed: setup-host replaces it, doctor names it.
const (
	BootUnitName         = "box-firewall.service"
	DaemonUnitName       = "box-guard-and-serve.service"
	LegacyDaemonUnitName = "box-ports.service"
)

// bootUnits are the units, in the order they are written.
var bootUnits = []struct{ name, text, does string }{
	{BootUnitName, bootUnit, "loads the saved nft tables at boot, before Incus starts"},
	{DaemonUnitName, daemonUnit, "runs box guard-and-serve: guards the stack (ports, pins, tables, routes) and serves allowlisted boxes (resolver and proxy)"},
}

// BootUnit is one systemd unit as Ensure writes it.
type BootUnit struct {
	Name string // e.g. box-firewall.service
	Text string // the unit file
	Does string // what it is for, one line
}

// BootUnits are the units Ensure writes, for the box binary at exe: the
// packages ship the same text, so the two never drift.
func BootUnits(exe string) []BootUnit {
	var out []BootUnit
	for _, u := range bootUnits {
		out = append(out, BootUnit{Name: u.name, Text: fmt.Sprintf(u.text, exe), Does: u.does})
	}
	return out
}

// exeRootOnly says why root's units must not run the box binary at exe
// (rootonly.Check); tests stub it.
var exeRootOnly = func(exe string) error { return rootonly.Check(exe, rootonly.Lstat) }

// systemdRunning reports whether systemd is the init system here.
var systemdRunning = func() bool {
	_, err := os.Stat("/run/systemd/system")
	return err == nil
}

// ensureUnits writes the boot units where systemd is, replacing the
// daemon's unit of its old name, and says what happens where systemd is
// not.
func (boot BootFiles) ensureUnits() (string, []model.Change, error) {
	if boot.UnitDir == "" {
		return "no boot unit here: the nft tables are not re-applied at boot and no daemon runs; run `box setup-host` after a reboot, and keep `box guard-and-serve` running", nil, nil
	}
	if !systemdRunning() {
		return "no systemd on this host: the nft tables are not re-applied at boot and no daemon runs; from your init system, run `box setup-host --firewall-only` after each boot and keep `box guard-and-serve` running", nil, nil
	}
	if err := exeRootOnly(boot.Exe); err != nil {
		return "", nil, fmt.Errorf("refusing to write box's boot units: they would run %s as root at every boot, and %w, so another user could change what root runs. Install box where only root can write (the .deb, or install.sh run as root, into /usr/local/bin) and run that box's setup-host", boot.Exe, err)
	}
	var changes []model.Change
	for _, u := range BootUnits(boot.Exe) {
		path := filepath.Join(boot.UnitDir, u.Name)
		if b, err := os.ReadFile(path); err == nil && string(b) == u.Text {
			continue
		}
		if err := os.WriteFile(path, []byte(u.Text), 0o644); err != nil {
			return "", changes, fmt.Errorf("writing %s: %w", path, err)
		}
		link := filepath.Join(boot.UnitDir, "multi-user.target.wants", u.Name)
		if err := os.MkdirAll(filepath.Dir(link), 0o755); err != nil {
			return "", changes, err
		}
		os.Remove(link)
		if err := os.Symlink(path, link); err != nil {
			return "", changes, fmt.Errorf("enabling %s: %w", u.Name, err)
		}
		changes = append(changes, model.Change{Object: "unit " + u.Name, Action: "created", Detail: u.Does})
	}
	renamed, err := boot.removeLegacyDaemon()
	if err != nil {
		return "", changes, err
	}
	changes = append(changes, renamed...)
	dropIn := filepath.Join(boot.UnitDir, IncusDropInName)
	if b, err := os.ReadFile(dropIn); err != nil || string(b) != incusDropIn {
		if err := os.MkdirAll(filepath.Dir(dropIn), 0o755); err != nil {
			return "", changes, err
		}
		if err := os.WriteFile(dropIn, []byte(incusDropIn), 0o644); err != nil {
			return "", changes, fmt.Errorf("writing %s: %w", dropIn, err)
		}
		changes = append(changes, model.Change{Object: "unit incus.service drop-in " + filepath.Base(dropIn), Action: "created", Detail: "Incus starts after box's firewall and daemon, with an empty read-only /dev/mqueue"})
	}
	// box runs no systemctl: what it wrote takes effect at the next boot,
	// or when the operator restarts the units.
	var notes []string
	switch {
	case len(renamed) > 0:
		// The old unit's daemon still runs: starting the new one stops it
		// (Conflicts), and the new one takes over its lock (--take-over).
		notes = append(notes, fmt.Sprintf("box's daemon is now %s (it was %s, which still runs): switch to it now with: systemctl daemon-reload && systemctl start %s (that stops the old one; the new one serves as it lets go)", DaemonUnitName, LegacyDaemonUnitName, DaemonUnitName))
	case slices.ContainsFunc(changes, func(c model.Change) bool { return c.Object == "unit "+DaemonUnitName }):
		notes = append(notes, "box's daemon starts at the next boot; to start it now: systemctl daemon-reload && systemctl restart "+DaemonUnitName)
	}
	if slices.ContainsFunc(changes, func(c model.Change) bool { return strings.HasPrefix(c.Object, "unit incus.service drop-in") }) {
		notes = append(notes, "Incus takes its drop-in at its next start: systemctl daemon-reload && systemctl restart incus (running boxes keep the host's /dev/mqueue until they restart)")
	}
	return strings.Join(notes, "; "), changes, nil
}

// removeUnits disables and removes the boot units, the daemon's of its
// old name too.
func (boot BootFiles) removeUnits() ([]model.Change, error) {
	var changes []model.Change
	var errs []error
	if boot.UnitDir == "" {
		return nil, nil
	}
	dropIn := filepath.Join(boot.UnitDir, IncusDropInName)
	if err := os.Remove(dropIn); err == nil {
		changes = append(changes, model.Change{Object: "unit incus.service drop-in " + filepath.Base(dropIn), Action: "removed"})
		os.Remove(filepath.Dir(dropIn)) // only if empty: another drop-in there is not box's
	} else if !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	legacy, err := boot.removeLegacyDaemon()
	changes = append(changes, legacy...)
	if err != nil {
		errs = append(errs, err)
	}
	for _, u := range bootUnits {
		os.Remove(filepath.Join(boot.UnitDir, "multi-user.target.wants", u.name))
		if err := os.Remove(filepath.Join(boot.UnitDir, u.name)); err == nil {
			changes = append(changes, model.Change{Object: "unit " + u.name, Action: "removed"})
		} else if !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return changes, errors.Join(errs...)
}

// legacyDaemonUnit says whether the daemon's unit of its old name is in
// the unit directory, as box setup-host wrote it (a unit of that name
// that is not box's is left alone).
func (boot BootFiles) legacyDaemonUnit() bool {
	b, err := os.ReadFile(filepath.Join(boot.UnitDir, LegacyDaemonUnitName))
	return err == nil && strings.Contains(string(b), "\nDescription=box: ")
}

// removeLegacyDaemon removes the daemon's unit of its old name and its
// wants link. Its process, if it runs, runs on until the operator stops
// it: box runs no systemctl.
func (boot BootFiles) removeLegacyDaemon() ([]model.Change, error) {
	if boot.UnitDir == "" || !boot.legacyDaemonUnit() {
		return nil, nil
	}
	os.Remove(filepath.Join(boot.UnitDir, "multi-user.target.wants", LegacyDaemonUnitName))
	if err := os.Remove(filepath.Join(boot.UnitDir, LegacyDaemonUnitName)); err != nil {
		return nil, fmt.Errorf("removing the daemon's old unit: %w", err)
	}
	return []model.Change{{Object: "unit " + LegacyDaemonUnitName, Action: "removed", Detail: "the daemon's old name; " + DaemonUnitName + " replaces it"}}, nil
}
