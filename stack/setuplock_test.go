package stack

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/box-isolation/box/stack/hostns"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestSetupLockPath(t *testing.T) {
	assert.Equal(t, "/run/box/setup.lock", hostns.SetupLockPath(""), "a real host")
	assert.Equal(t, "/run/box/setup-boxw-host.lock", hostns.SetupLockPath("boxw-host"), "a world's host is a host of its own")
}

// TestSetupLockWaitsAndNamesTheHolder: a second taker waits, is told who
// holds the lock, and gets it once the first lets go.
func TestSetupLockWaitsAndNamesTheHolder(t *testing.T) {
	path := filepath.Join(t.TempDir(), "setup.lock")
	unlock, err := hostns.TakeSetupLock(context.Background(), path, time.Minute, nil)
	require.NoError(t, err)
	held, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.Contains(t, string(held), "pid ", "the holder names itself")

	var mu sync.Mutex
	var notices []string
	got := make(chan error, 1)
	go func() {
		u2, err := hostns.TakeSetupLock(context.Background(), path, time.Minute, func(s string) {
			mu.Lock()
			notices = append(notices, s)
			mu.Unlock()
		})
		if err == nil {
			u2()
		}
		got <- err
	}()
	// The second taker has not got it while the first holds it: it told
	// its waiting first (its notice comes before it would take the lock).
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(notices) > 0
	}, 30*time.Second, 10*time.Millisecond)
	select {
	case err := <-got:
		t.Fatalf("the second taker finished while the first held the lock: %v", err)
	default:
	}
	unlock()
	require.NoError(t, <-got)
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, notices, 1, "told once")
	assert.Contains(t, notices[0], "waiting for the setup lock "+path)
	assert.Contains(t, notices[0], strings.TrimSpace(string(held)), "the notice names the holder")
}

// TestSetupLockTimesOut: past its wait, a taker fails and says who holds it.
func TestSetupLockTimesOut(t *testing.T) {
	path := filepath.Join(t.TempDir(), "setup.lock")
	unlock, err := hostns.TakeSetupLock(context.Background(), path, time.Minute, nil)
	require.NoError(t, err)
	defer unlock()
	_, err = hostns.TakeSetupLock(context.Background(), path, 300*time.Millisecond, nil)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "is still held by pid ")
	assert.Contains(t, err.Error(), "let that run finish")
}

// TestSetupLockEndsWithItsContext: a cancelled wait gives up at once.
func TestSetupLockEndsWithItsContext(t *testing.T) {
	path := filepath.Join(t.TempDir(), "setup.lock")
	unlock, err := hostns.TakeSetupLock(context.Background(), path, time.Minute, nil)
	require.NoError(t, err)
	defer unlock()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = hostns.TakeSetupLock(ctx, path, time.Minute, nil)
	require.ErrorIs(t, err, context.Canceled)
}

// TestSetupHeld: the healer's look at the lock says who holds it, takes
// nothing, and sees it free once the holder lets go.
func TestSetupHeld(t *testing.T) {
	path := filepath.Join(t.TempDir(), "setup.lock")
	h := &Host{Lock: SetupLock{Path: path}}
	_, held := h.Lock.Held(h.NetNS)
	assert.False(t, held, "no lock file yet")
	unlock, err := hostns.TakeSetupLock(context.Background(), path, time.Minute, nil)
	require.NoError(t, err)
	holder, held := h.Lock.Held(h.NetNS)
	assert.True(t, held)
	assert.Contains(t, holder, "pid ")
	unlock()
	_, held = h.Lock.Held(h.NetNS)
	assert.False(t, held, "free again")
	again, err := hostns.TakeSetupLock(context.Background(), path, time.Second, nil)
	require.NoError(t, err, "the look took nothing")
	again()
}
