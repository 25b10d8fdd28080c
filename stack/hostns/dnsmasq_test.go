package hostns

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The kernel names an open file deleted from disk "PATH (deleted)".
func TestHoldsDeleted(t *testing.T) {
	path := filepath.Join(t.TempDir(), "leases")
	f, err := os.Create(path)
	require.NoError(t, err)
	defer f.Close()
	assert.False(t, HoldsDeleted(os.Getpid(), path))
	require.NoError(t, os.Rename(path, path+".old"))
	require.NoError(t, os.WriteFile(path, nil, 0o644))
	assert.False(t, HoldsDeleted(os.Getpid(), path), "renamed, not deleted: its link names the new path")
	require.NoError(t, os.Remove(path+".old"))
	assert.True(t, HoldsDeleted(os.Getpid(), path+".old"))
}
