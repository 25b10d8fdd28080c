package stack

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/internal/testenv/tier"
	"github.com/box-isolation/box/stack/bootunits"
	"github.com/box-isolation/box/stack/model"
	"github.com/box-isolation/box/stack/nft"
)

func TestSavedFirewallFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "box", "firewall.json")
	h := &Host{Boot: BootFiles{FirewallFile: path}}
	require.NoError(t, h.BootFiles().SaveFirewall(func(s *SavedFirewall) {}), "no gateway: nothing to save")
	assert.NoFileExists(t, path)
	gw := netip.MustParseAddr("10.88.0.1")
	require.NoError(t, h.BootFiles().SaveFirewall(func(s *SavedFirewall) { s.Gateway = gw }))
	s, err := readSavedFirewall(path)
	require.NoError(t, err)
	assert.Equal(t, gw, s.Gateway)
	assert.Equal(t, model.Current.Network, s.Bridge)
	first := s.Saved
	require.NoError(t, h.BootFiles().SaveFirewall(func(s *SavedFirewall) { s.Gateway = gw }))
	s, err = readSavedFirewall(path)
	require.NoError(t, err)
	assert.Equal(t, first, s.Saved, "unchanged: not written again")
	eg := &nft.Egress{Policies: []nft.EgressPolicy{{ID: "p1", Boxes: []netip.Addr{netip.MustParseAddr("10.88.0.20")}}}}
	require.NoError(t, h.BootFiles().SaveFirewall(func(s *SavedFirewall) { s.Egress = eg }))
	s, err = readSavedFirewall(path)
	require.NoError(t, err)
	assert.Equal(t, eg, s.Egress, "the egress policies kept with the gateway")
	assert.Equal(t, gw, s.Gateway)

	require.NoError(t, os.WriteFile(path, []byte(`{"version":99}`), 0o644))
	_, err = readSavedFirewall(path)
	assert.ErrorContains(t, err, "box setup-host writes it again")
	assert.Empty(t, (&Host{Boot: BootFiles{FirewallFile: path}, Tier: TierConfig{Granted: true}}).BootFiles().FirewallFile, "a granted user saves nothing")

	removed, err := h.BootFiles().removeSavedFirewall()
	require.NoError(t, err)
	assert.Len(t, removed, 1)
	removed, err = h.BootFiles().removeSavedFirewall()
	require.NoError(t, err)
	assert.Empty(t, removed, "a second teardown finds nothing")
}

func TestVerifyBoot(t *testing.T) {
	withSystemd(t, true)
	dir := t.TempDir()
	h := &Host{Boot: BootFiles{UnitDir: dir, Exe: "/usr/bin/box", FirewallFile: filepath.Join(dir, "firewall.json")}}
	gw := netip.MustParseAddr("10.88.0.1")
	objects := func(fs []model.Finding) []string {
		var out []string
		for _, f := range fs {
			assert.True(t, f.Advisory, "%v: the layers hold now", f)
			out = append(out, f.Object)
		}
		return out
	}
	assert.Equal(t, []string{"unit box-firewall.service", "unit box-guard-and-serve.service", "unit incus.service.d/box.conf", "file " + h.Boot.FirewallFile},
		objects(h.BootFiles().verify(gw)), "nothing set up for the next boot")
	_, _, err := h.BootFiles().ensureUnits()
	require.NoError(t, err)
	require.NoError(t, h.BootFiles().SaveFirewall(func(s *SavedFirewall) { s.Gateway = gw }))
	assert.Empty(t, h.BootFiles().verify(gw))
	f := h.BootFiles().verify(netip.MustParseAddr("10.89.0.1"))
	require.Len(t, f, 1)
	assert.Contains(t, f[0].Problem, "the saved gateway is 10.88.0.1, the bridge's is 10.89.0.1")
	require.NoError(t, os.WriteFile(filepath.Join(dir, bootunits.IncusDropInName), []byte("[Unit]\n"), 0o644))
	assert.Equal(t, []string{"unit incus.service.d/box.conf"}, objects(h.BootFiles().verify(gw)), "an edited drop-in")
	withSystemd(t, false)
	assert.Empty(t, h.BootFiles().verify(gw), "no systemd: no boot units to check")
}

// TestRemoveStaleDnsmasqPIDs: a pid file naming no process, or a thread of
// another process (what killed incusd at boot), goes; one naming a running
// dnsmasq stays.
func TestRemoveStaleDnsmasqPIDs(t *testing.T) {
	dir := t.TempDir()
	write := func(net string, pid int) string {
		t.Helper()
		f := filepath.Join(dir, "networks", net, "dnsmasq.pid")
		require.NoError(t, os.MkdirAll(filepath.Dir(f), 0o755))
		require.NoError(t, os.WriteFile(f, fmt.Appendf(nil, "name: dnsmasq\nargs: [--keep-in-foreground]\npid: %d\nuid: 0\n", pid), 0o644))
		return f
	}
	// A process named dnsmasq (sleep under that name).
	bin := filepath.Join(t.TempDir(), "dnsmasq")
	b, err := os.ReadFile(tier.Tool(t, "sleep", "coreutils"))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(bin, b, 0o755))
	cmd := exec.Command(bin, "60")
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	live := write("boxnet", cmd.Process.Pid)

	// A thread of this test's process: its id is no thread group's.
	tasks, err := os.ReadDir("/proc/self/task")
	require.NoError(t, err)
	tid := 0
	for _, e := range tasks {
		if n, _ := strconv.Atoi(e.Name()); n != os.Getpid() {
			tid = n
		}
	}
	require.NotZero(t, tid, "the Go runtime runs more than one thread")
	thread := write("incusbr0", tid)
	gone := write("old", 1<<22+7) // above pid_max's default
	removed, err := removeStaleDnsmasqPIDs(dir)
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{thread, gone}, removed)
	assert.FileExists(t, live, "a running dnsmasq's file stays")
	assert.NoFileExists(t, thread)
	removed, err = removeStaleDnsmasqPIDs("")
	require.NoError(t, err)
	assert.Empty(t, removed, "no INCUS_DIR: nothing touched")
}
