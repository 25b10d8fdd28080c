package stack

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/box-isolation/box/internal/rootonly"
	"github.com/box-isolation/box/stack/bootunits"
	"github.com/box-isolation/box/stack/model"
)

// exeRootOnly says why root's units must not run the box binary at exe
// (rootonly.Check); tests stub it.
var exeRootOnly = func(exe string) error { return rootonly.Check(exe, rootonly.Lstat) }

// refuseExe says why setup-host must write no unit to run boot.Exe:
// another user could change it. Ensure asks before it changes anything;
// nil where no unit is written.
func (boot BootFiles) refuseExe() error {
	if boot.UnitDir == "" || !systemdRunning() {
		return nil
	}
	if err := exeRootOnly(boot.Exe); err != nil {
		return fmt.Errorf("refusing to write box's boot units: they would run %s as root at every boot, and %w, so another user could change what root runs. Install box where only root can write (the .deb, or install.sh run as root, into /usr/local/bin) and run that box's setup-host; nothing was changed", boot.Exe, err)
	}
	return nil
}

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
	if err := boot.refuseExe(); err != nil {
		return "", nil, err
	}
	var changes []model.Change
	for _, u := range bootunits.BootUnits(boot.Exe) {
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
	dropIn := filepath.Join(boot.UnitDir, bootunits.IncusDropInName)
	if b, err := os.ReadFile(dropIn); err != nil || string(b) != bootunits.IncusDropIn {
		if err := os.MkdirAll(filepath.Dir(dropIn), 0o755); err != nil {
			return "", changes, err
		}
		if err := os.WriteFile(dropIn, []byte(bootunits.IncusDropIn), 0o644); err != nil {
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
		notes = append(notes, fmt.Sprintf("box's daemon is now %s (it was %s, which still runs): switch to it now with: systemctl daemon-reload && systemctl start %s (that stops the old one; the new one serves as it lets go)", bootunits.DaemonUnitName, bootunits.LegacyDaemonUnitName, bootunits.DaemonUnitName))
	case slices.ContainsFunc(changes, func(c model.Change) bool { return c.Object == "unit "+bootunits.DaemonUnitName }):
		notes = append(notes, "box's daemon starts at the next boot; to start it now: systemctl daemon-reload && systemctl restart "+bootunits.DaemonUnitName)
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
	dropIn := filepath.Join(boot.UnitDir, bootunits.IncusDropInName)
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
	for _, u := range bootunits.BootUnits(boot.Exe) {
		os.Remove(filepath.Join(boot.UnitDir, "multi-user.target.wants", u.Name))
		if err := os.Remove(filepath.Join(boot.UnitDir, u.Name)); err == nil {
			changes = append(changes, model.Change{Object: "unit " + u.Name, Action: "removed"})
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
	b, err := os.ReadFile(filepath.Join(boot.UnitDir, bootunits.LegacyDaemonUnitName))
	return err == nil && strings.Contains(string(b), "\nDescription=box: ")
}

// removeLegacyDaemon removes the daemon's unit of its old name and its
// wants link. Its process, if it runs, runs on until the operator stops
// it: box runs no systemctl.
func (boot BootFiles) removeLegacyDaemon() ([]model.Change, error) {
	if boot.UnitDir == "" || !boot.legacyDaemonUnit() {
		return nil, nil
	}
	os.Remove(filepath.Join(boot.UnitDir, "multi-user.target.wants", bootunits.LegacyDaemonUnitName))
	if err := os.Remove(filepath.Join(boot.UnitDir, bootunits.LegacyDaemonUnitName)); err != nil {
		return nil, fmt.Errorf("removing the daemon's old unit: %w", err)
	}
	return []model.Change{{Object: "unit " + bootunits.LegacyDaemonUnitName, Action: "removed", Detail: "the daemon's old name; " + bootunits.DaemonUnitName + " replaces it"}}, nil
}
