package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Host mode never aims at the machine's own namespace where a world is;
// aimed at a namespace (a namespace world's host), it may run.
func TestHostModeGuard(t *testing.T) {
	assert.NoError(t, hostModeGuard("", ""), "a real host with no world")
	err := hostModeGuard("network namespace boxw-host", "")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "BOX_NETNS")
	netnsDir = t.TempDir()
	t.Cleanup(func() { netnsDir = "/run/netns" })
	assert.Error(t, hostModeGuard("network namespace boxw-host", "bxr-host"), "a namespace that does not exist")
	require.NoError(t, os.WriteFile(filepath.Join(netnsDir, "bxr-host"), nil, 0o644))
	assert.NoError(t, hostModeGuard("network namespace boxw-host", "bxr-host"), "aimed at a namespace world's host namespace")
}
