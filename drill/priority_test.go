package drill

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/box-isolation/box/internal/testenv/tier"
)

// TestPrivilegedRaisePriority: every thread runs at runNice during a run,
// and is put back after it.
func TestPrivilegedRaisePriority(t *testing.T) {
	tier.Root(t)
	nice := func(tid int) int {
		p, err := unix.Getpriority(unix.PRIO_PROCESS, tid)
		require.NoError(t, err)
		return 20 - p
	}
	before := map[int]int{}
	for _, tid := range threads() {
		before[tid] = nice(tid)
	}
	require.NotEmpty(t, before)
	restore := raisePriority()
	for _, tid := range threads() {
		assert.Equal(t, runNice, nice(tid), "thread %d during the run", tid)
	}
	restore()
	for _, tid := range threads() {
		if n, ok := before[tid]; ok {
			assert.Equal(t, n, nice(tid), "thread %d after the run", tid)
		}
	}
}
