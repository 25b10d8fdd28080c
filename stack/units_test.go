package stack

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/box-isolation/box/internal/rootonly"
	"github.com/box-isolation/box/stack/bootunits"
	"github.com/box-isolation/box/stack/model"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func withSystemd(t *testing.T, running bool) {
	t.Helper()
	old := systemdRunning
	systemdRunning = func() bool { return running }
	// The units' binary is root's alone (TestBootUnitsRefuseABinaryAUserCanChange
	// says what happens when it is not).
	oldExe := exeRootOnly
	exeRootOnly = func(string) error { return nil }
	t.Cleanup(func() { systemdRunning, exeRootOnly = old, oldExe })
}

func TestBootUnits(t *testing.T) {
	withSystemd(t, true)
	dir := t.TempDir()
	h := &Host{Boot: BootFiles{UnitDir: dir, Exe: "/usr/local/bin/box"}}

	note, changes, err := h.BootFiles().ensureUnits()
	require.NoError(t, err)
	assert.Equal(t, []model.Change{
		{Object: "unit box-firewall.service", Action: "created", Detail: "loads the saved nft tables at boot, before Incus starts"},
		{Object: "unit box-guard-and-serve.service", Action: "created", Detail: "runs box guard-and-serve: guards the stack (ports, pins, tables, routes) and serves allowlisted boxes (resolver and proxy)"},
		{Object: "unit incus.service drop-in box.conf", Action: "created", Detail: "Incus starts after box's firewall and daemon, with an empty read-only /dev/mqueue"},
	}, changes)
	assert.Contains(t, note, "systemctl restart box-guard-and-serve.service", "box starts no service itself: it says how")
	assert.Contains(t, note, "systemctl restart incus", "and how Incus takes its drop-in")

	read := func(name string) string {
		b, err := os.ReadFile(filepath.Join(dir, name))
		require.NoError(t, err)
		return string(b)
	}
	// Both before Incus, however it starts: the firewall from the saved
	// file (no Incus call), the watcher ready before incusd restores a box.
	fw := read(bootunits.BootUnitName)
	for _, line := range []string{"DefaultDependencies=no", "Before=network-pre.target incus.service incus-startup.service shutdown.target",
		"Type=oneshot\nRemainAfterExit=yes\nExecStart=/usr/local/bin/box setup-host --boot"} {
		assert.Contains(t, fw, line+"\n")
	}
	ports := read(bootunits.DaemonUnitName)
	for _, line := range []string{"After=local-fs.target box-firewall.service\nWants=box-firewall.service", "Before=incus.service incus-startup.service shutdown.target",
		"Conflicts=shutdown.target box-ports.service", "Type=notify", "ExecStart=/usr/local/bin/box guard-and-serve --take-over", "Restart=always", "WantedBy=multi-user.target"} {
		assert.Contains(t, ports, line+"\n")
	}
	dropIn := read(bootunits.IncusDropInName)
	assert.Contains(t, dropIn, "[Unit]\nWants=box-firewall.service box-guard-and-serve.service\nAfter=box-firewall.service box-guard-and-serve.service\n")
	assert.Contains(t, dropIn, "[Service]\nTemporaryFileSystem=/dev/mqueue:ro\n", "not the host's message queues in every box")
	for _, name := range []string{bootunits.BootUnitName, bootunits.DaemonUnitName} {
		target, err := os.Readlink(filepath.Join(dir, "multi-user.target.wants", name))
		require.NoError(t, err, "%s is enabled", name)
		assert.Equal(t, filepath.Join(dir, name), target)
	}

	note, changes, err = h.BootFiles().ensureUnits()
	require.NoError(t, err)
	assert.Empty(t, changes, "a second run changes nothing")
	assert.Empty(t, note)

	require.NoError(t, os.WriteFile(filepath.Join(dir, bootunits.DaemonUnitName), []byte("edited\n"), 0o644))
	_, changes, err = h.BootFiles().ensureUnits()
	require.NoError(t, err)
	require.Len(t, changes, 1, "only the drifted unit is rewritten")
	assert.Equal(t, "unit box-guard-and-serve.service", changes[0].Object)
	assert.Equal(t, ports, read(bootunits.DaemonUnitName))

	removed, err := h.BootFiles().removeUnits()
	require.NoError(t, err)
	assert.Equal(t, []model.Change{{Object: "unit incus.service drop-in box.conf", Action: "removed"}, {Object: "unit box-firewall.service", Action: "removed"}, {Object: "unit box-guard-and-serve.service", Action: "removed"}}, removed)
	assert.NoDirExists(t, filepath.Join(dir, "incus.service.d"), "the drop-in's directory, empty, goes with it")
	left, err := os.ReadDir(filepath.Join(dir, "multi-user.target.wants"))
	require.NoError(t, err)
	assert.Empty(t, left, "both units disabled")
	removed, err = h.BootFiles().removeUnits()
	require.NoError(t, err)
	assert.Empty(t, removed, "a second removal finds nothing")
}

func TestBootUnitsWithoutSystemd(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name    string
		systemd bool
		dir     string
		note    string
	}{
		{"no unit directory (the hermetic world)", true, "", "no boot unit here"},
		{"no systemd", false, dir, "no systemd on this host"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			withSystemd(t, tc.systemd)
			h := &Host{Boot: BootFiles{UnitDir: tc.dir, Exe: "/usr/local/bin/box"}}
			note, changes, err := h.BootFiles().ensureUnits()
			require.NoError(t, err)
			assert.Empty(t, changes)
			assert.Contains(t, note, tc.note)
			assert.Contains(t, note, "box guard-and-serve", "it says the daemon must be kept running by hand")
			ents, err := os.ReadDir(dir)
			require.NoError(t, err)
			assert.Empty(t, ents, "nothing written")
		})
	}
}

// The packages ship the units from bootunits.BootUnits: the same text Ensure writes.
func TestBootUnitsExported(t *testing.T) {
	withSystemd(t, true)
	dir := t.TempDir()
	h := &Host{Boot: BootFiles{UnitDir: dir, Exe: "/usr/bin/box"}}
	_, _, err := h.BootFiles().ensureUnits()
	require.NoError(t, err)
	units := bootunits.BootUnits("/usr/bin/box")
	require.Len(t, units, 2)
	for _, u := range units {
		b, err := os.ReadFile(filepath.Join(dir, u.Name))
		require.NoError(t, err)
		assert.Equal(t, string(b), u.Text, u.Name)
		assert.Contains(t, u.Text, "ExecStart=/usr/bin/box ")
		assert.NotEmpty(t, u.Does)
	}
}

// oldDaemonUnit is the daemon's unit as box wrote it before the rename
// (the last release's text, for /usr/local/bin/box).
const oldDaemonUnit = `[Unit]
Description=box: keep boxnet's bridge ports isolated, in the bridge drop's port set and pinned; put box's tables back
DefaultDependencies=no
After=local-fs.target box-firewall.service
Wants=box-firewall.service
Before=incus.service incus-startup.service shutdown.target
Conflicts=shutdown.target

[Service]
Type=notify
NotifyAccess=main
ExecStart=/usr/local/bin/box watch-ports
Restart=always
RestartSec=2

[Install]
WantedBy=multi-user.target
`

// TestBootUnitsReplaceTheOldDaemon: on a host a box of before the rename
// set up, setup-host replaces the daemon's old unit (and its wants link)
// with the new one, rewrites the drop-in to want it, and says how to
// switch; doctor names the old unit until then. A unit of that name that
// is not box's is left alone.
func TestBootUnitsReplaceTheOldDaemon(t *testing.T) {
	withSystemd(t, true)
	dir := t.TempDir()
	h := &Host{Boot: BootFiles{UnitDir: dir, Exe: "/usr/local/bin/box"}}
	_, _, err := h.BootFiles().ensureUnits()
	require.NoError(t, err)
	// As the old box left the host: its unit enabled, the drop-in wanting it.
	require.NoError(t, os.Remove(filepath.Join(dir, "multi-user.target.wants", bootunits.DaemonUnitName)))
	require.NoError(t, os.Remove(filepath.Join(dir, bootunits.DaemonUnitName)))
	require.NoError(t, os.WriteFile(filepath.Join(dir, bootunits.LegacyDaemonUnitName), []byte(oldDaemonUnit), 0o644))
	require.NoError(t, os.Symlink(filepath.Join(dir, bootunits.LegacyDaemonUnitName), filepath.Join(dir, "multi-user.target.wants", bootunits.LegacyDaemonUnitName)))
	drop := filepath.Join(dir, bootunits.IncusDropInName)
	b, err := os.ReadFile(drop)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(drop, []byte(strings.ReplaceAll(string(b), bootunits.DaemonUnitName, bootunits.LegacyDaemonUnitName)), 0o644))

	var objects []string
	for _, f := range h.BootFiles().verify(netip.Addr{}) {
		objects = append(objects, f.Object)
	}
	assert.Contains(t, objects, "unit "+bootunits.LegacyDaemonUnitName, "doctor names the old unit")

	note, changes, err := h.BootFiles().ensureUnits()
	require.NoError(t, err)
	var did []string
	for _, c := range changes {
		did = append(did, c.Action+" "+c.Object)
	}
	assert.Equal(t, []string{"created unit " + bootunits.DaemonUnitName, "removed unit " + bootunits.LegacyDaemonUnitName, "created unit incus.service drop-in box.conf"}, did)
	assert.Contains(t, note, "systemctl daemon-reload && systemctl start "+bootunits.DaemonUnitName)
	assert.NoFileExists(t, filepath.Join(dir, bootunits.LegacyDaemonUnitName))
	wants, err := os.ReadDir(filepath.Join(dir, "multi-user.target.wants"))
	require.NoError(t, err)
	var enabled []string
	for _, e := range wants {
		enabled = append(enabled, e.Name())
	}
	assert.ElementsMatch(t, []string{bootunits.BootUnitName, bootunits.DaemonUnitName}, enabled, "exactly one daemon unit enabled")
	b, err = os.ReadFile(drop)
	require.NoError(t, err)
	assert.NotContains(t, string(b), bootunits.LegacyDaemonUnitName, "the drop-in wants the new unit only")

	// Someone else's box-ports.service is not box's to remove.
	other := "[Unit]\nDescription=a port forwarder of the admin's own\n"
	require.NoError(t, os.WriteFile(filepath.Join(dir, bootunits.LegacyDaemonUnitName), []byte(other), 0o644))
	_, changes, err = h.BootFiles().ensureUnits()
	require.NoError(t, err)
	assert.Empty(t, changes)
	b, err = os.ReadFile(filepath.Join(dir, bootunits.LegacyDaemonUnitName))
	require.NoError(t, err)
	assert.Equal(t, other, string(b))
}

// TestBootUnitsRefuseABinaryAUserCanChange: setup-host writes no unit that
// would run, as root, a binary another user could change (here one under
// the temporary directory, which anyone may write); one only root can
// change (the system's shell) it writes.
func TestBootUnitsRefuseABinaryAUserCanChange(t *testing.T) {
	withSystemd(t, true)
	exeRootOnly = func(exe string) error { return rootonly.Check(exe, rootonly.Lstat) }
	dir := t.TempDir()
	exe := filepath.Join(t.TempDir(), "box")
	require.NoError(t, os.WriteFile(exe, []byte("#!/bin/sh\n"), 0o755))
	h := &Host{Boot: BootFiles{UnitDir: dir, Exe: exe}}
	_, changes, err := h.BootFiles().ensureUnits()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "refusing to write box's boot units: they would run "+exe+" as root at every boot, and ")
	assert.Contains(t, err.Error(), " is writable by others (mode 1777)", "the temporary directory")
	assert.Contains(t, err.Error(), "Install box where only root can write")
	assert.Empty(t, changes)
	left, err := os.ReadDir(dir)
	require.NoError(t, err)
	assert.Empty(t, left, "no unit written")
	// setup-host asks first, before any call to Incus (this host has none).
	_, err = h.Ensure(context.Background())
	require.Error(t, err)
	assert.Contains(t, err.Error(), "refusing to write box's boot units")
	assert.Contains(t, err.Error(), "nothing was changed")

	if os.Geteuid() == 0 {
		h.Boot.Exe = "/bin/sh" // root's, on every Debian system
		_, changes, err = h.BootFiles().ensureUnits()
		require.NoError(t, err)
		assert.NotEmpty(t, changes)
	}
}
