package worldstate

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/drill/topo"
)

func TestLoadFile(t *testing.T) {
	dir := t.TempDir()
	_, err := LoadFile(filepath.Join(dir, "missing.json"))
	assert.True(t, errors.Is(err, ErrNoWorld), "missing state is ErrNoWorld, got %v", err)

	bad := filepath.Join(dir, "bad.json")
	require.NoError(t, os.WriteFile(bad, []byte(`{"version": 9}`), 0o644))
	_, err = LoadFile(bad)
	assert.ErrorContains(t, err, "version 9")

	// A world built before the host services and the LAN resolver is not
	// taken for one that has them.
	old := filepath.Join(dir, "old.json")
	require.NoError(t, os.WriteFile(old, []byte(`{"version": 1, "name": "boxw"}`), 0o644))
	_, err = LoadFile(old)
	assert.ErrorContains(t, err, fmt.Sprintf("version 1, want %d", StateVersion))

	dead := filepath.Join(dir, "dead.json")
	require.NoError(t, os.WriteFile(dead, []byte(fmt.Sprintf(`{"version": %d, "name": "boxw", "services_pid": 999999999}`, StateVersion)), 0o644))
	_, err = LoadFile(dead)
	assert.ErrorContains(t, err, "not running")

	live := filepath.Join(dir, "live.json")
	require.NoError(t, os.WriteFile(live, []byte(fmt.Sprintf(`{"version": %d, "name": "boxw", "nonce": "n1"}`, StateVersion)), 0o644))
	st, err := LoadFile(live)
	require.NoError(t, err)
	assert.Equal(t, "BOXWORLD canary n1", st.Greeting("canary"))
}

// TestTopology: a drill run in the world aims at the world's plan, its
// greetings carry the world's nonce, and the witness's log is in the
// world's state folder.
func TestTopology(t *testing.T) {
	st := &State{Names: NamesFor(DefaultName), Nonce: "n1", StateDir: "/run/box-world/boxw"}
	top := st.Topology()
	assert.Equal(t, topo.SourceWorld, top.Source)
	assert.Equal(t, Canary, top.Canary)
	assert.Equal(t, "BOXWORLD canary n1", top.CanaryGreeting)
	assert.Equal(t, "boxw-lan", top.LANNS)
	assert.Equal(t, "/etc/netns/boxw-host/hosts", top.HostsFile)
	assert.Equal(t, "/run/box-world/boxw/dns-witness.log", top.Allow.WitnessLog)
	assert.True(t, top.Allow.Valid())
	assert.Len(t, top.LANHosts, len(LANHosts)+1, "every LAN host and the modem")
	assert.True(t, top.LANHosts[len(top.LANHosts)-1].Uplink, "the modem is behind the default route")
}
