package witnesslog

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestAppendThenRead: what the world appends the drill reads back, from
// the time it asks for on; a line that is no query is skipped.
func TestAppendThenRead(t *testing.T) {
	path := filepath.Join(t.TempDir(), "dns-witness.log")
	start := time.Now().UTC().Truncate(time.Second)
	old := Query{At: start.Add(-time.Minute), From: "203.0.113.53:1", Name: "old.attacker.example.", QType: "A"}
	now := Query{At: start.Add(time.Second), From: "203.0.113.53:2", Name: "new.attacker.example.", QType: "TXT"}
	require.NoError(t, Append(path, old))
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = f.WriteString("not json\n")
	require.NoError(t, err)
	require.NoError(t, f.Close())
	require.NoError(t, Append(path, now))

	got, err := Read(path, start)
	require.NoError(t, err)
	assert.Equal(t, []Query{now}, got)

	_, err = Read(filepath.Join(t.TempDir(), "none.log"), start)
	assert.ErrorContains(t, err, "reading the witness nameserver's log")
}
