package stack

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/box-isolation/box/stack/model"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func withSystemd(t *testing.T, running bool) {
	t.Helper()
	old := systemdRunning
	systemdRunning = func() bool { return running }
	t.Cleanup(func() { systemdRunning = old })
}

func TestBootUnits(t *testing.T) {
	withSystemd(t, true)
	dir := t.TempDir()
	h := &Host{Boot: BootFiles{UnitDir: dir, Exe: "/usr/local/bin/box"}}

	note, changes, err := h.BootFiles().ensureUnits()
	require.NoError(t, err)
	assert.Equal(t, []model.Change{
		{Object: "unit box-firewall.service", Action: "created", Detail: "loads the saved nft tables at boot, before Incus starts"},
		{Object: "unit box-ports.service", Action: "created", Detail: "runs box watch-ports, which keeps the bridge's ports isolated, in the port set and pinned"},
		{Object: "unit incus.service drop-in box.conf", Action: "created", Detail: "Incus starts after box's firewall and port watcher, with an empty read-only /dev/mqueue"},
	}, changes)
	assert.Contains(t, note, "systemctl restart box-ports.service", "box starts no service itself: it says how")
	assert.Contains(t, note, "systemctl restart incus", "and how Incus takes its drop-in")

	read := func(name string) string {
		b, err := os.ReadFile(filepath.Join(dir, name))
		require.NoError(t, err)
		return string(b)
	}
	// Both before Incus, however it starts: the firewall from the saved
	// file (no Incus call), the watcher ready before incusd restores a box.
	fw := read(BootUnitName)
	for _, line := range []string{"DefaultDependencies=no", "Before=network-pre.target incus.service incus-startup.service shutdown.target",
		"Type=oneshot\nRemainAfterExit=yes\nExecStart=/usr/local/bin/box setup-host --boot"} {
		assert.Contains(t, fw, line+"\n")
	}
	ports := read(PortsUnitName)
	for _, line := range []string{"After=local-fs.target box-firewall.service", "Before=incus.service incus-startup.service shutdown.target",
		"Type=notify", "ExecStart=/usr/local/bin/box watch-ports", "Restart=always", "WantedBy=multi-user.target"} {
		assert.Contains(t, ports, line+"\n")
	}
	dropIn := read(IncusDropInName)
	assert.Contains(t, dropIn, "[Unit]\nWants=box-firewall.service box-ports.service\nAfter=box-firewall.service box-ports.service\n")
	assert.Contains(t, dropIn, "[Service]\nTemporaryFileSystem=/dev/mqueue:ro\n", "not the host's message queues in every box")
	for _, name := range []string{BootUnitName, PortsUnitName} {
		target, err := os.Readlink(filepath.Join(dir, "multi-user.target.wants", name))
		require.NoError(t, err, "%s is enabled", name)
		assert.Equal(t, filepath.Join(dir, name), target)
	}

	note, changes, err = h.BootFiles().ensureUnits()
	require.NoError(t, err)
	assert.Empty(t, changes, "a second run changes nothing")
	assert.Empty(t, note)

	require.NoError(t, os.WriteFile(filepath.Join(dir, PortsUnitName), []byte("edited\n"), 0o644))
	_, changes, err = h.BootFiles().ensureUnits()
	require.NoError(t, err)
	require.Len(t, changes, 1, "only the drifted unit is rewritten")
	assert.Equal(t, "unit box-ports.service", changes[0].Object)
	assert.Equal(t, ports, read(PortsUnitName))

	removed, err := h.BootFiles().removeUnits()
	require.NoError(t, err)
	assert.Equal(t, []model.Change{{Object: "unit incus.service drop-in box.conf", Action: "removed"}, {Object: "unit box-firewall.service", Action: "removed"}, {Object: "unit box-ports.service", Action: "removed"}}, removed)
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
			assert.Contains(t, note, "box watch-ports", "it says the port watcher must be kept running by hand")
			ents, err := os.ReadDir(dir)
			require.NoError(t, err)
			assert.Empty(t, ents, "nothing written")
		})
	}
}

// The packages ship the units from BootUnits: the same text Ensure writes.
func TestBootUnitsExported(t *testing.T) {
	withSystemd(t, true)
	dir := t.TempDir()
	h := &Host{Boot: BootFiles{UnitDir: dir, Exe: "/usr/bin/box"}}
	_, _, err := h.BootFiles().ensureUnits()
	require.NoError(t, err)
	units := BootUnits("/usr/bin/box")
	require.Len(t, units, 2)
	for _, u := range units {
		b, err := os.ReadFile(filepath.Join(dir, u.Name))
		require.NoError(t, err)
		assert.Equal(t, string(b), u.Text, u.Name)
		assert.Contains(t, u.Text, "ExecStart=/usr/bin/box ")
		assert.NotEmpty(t, u.Does)
	}
}
