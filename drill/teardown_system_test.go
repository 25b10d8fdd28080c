package drill_test

import (
	"context"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/drill"
)

// TestSystemKilledRunIsCleanedUp: a run killed half-way leaves its boxes;
// the next run removes them first and passes.
func TestSystemKilledRunIsCleanedUp(t *testing.T) {
	cfg := config(t)
	cmd := exec.Command(cfg.Agent, "run", "--claim", "C-SIBLING")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	require.NoError(t, cmd.Start())
	killed := false
	deadline := time.Now().Add(90 * time.Second)
	for time.Now().Before(deadline) {
		insts, err := cfg.Host.Incus.Instances().List(context.Background(), map[string]string{drill.TagDrill: "1"})
		require.NoError(t, err)
		if len(insts) >= 2 {
			require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
			killed = true
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	cmd.Wait() //nolint:errcheck
	require.True(t, killed, "the first run never minted its boxes")
	left, err := cfg.Host.Incus.Instances().List(context.Background(), map[string]string{drill.TagDrill: "1"})
	require.NoError(t, err)
	require.NotEmpty(t, left, "the killed run left boxes behind (nothing to clean up otherwise)")

	rep := run(t, cfg)
	assert.Equal(t, drill.ExitOK, rep.ExitCode, "%v", claimVerdicts(rep))
}

// TestSystemFailureAfterMintCleansUp: a run that fails once its boxes
// exist (here: the agent cannot be pushed) returns the error, does not
// panic, and removes its boxes.
func TestSystemFailureAfterMintCleansUp(t *testing.T) {
	cfg := config(t)
	cfg.Agent = filepath.Join(t.TempDir(), "no-such-agent")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rep, err := drill.Run(ctx, cfg)
	require.Error(t, err)
	assert.Nil(t, rep)
	assert.Contains(t, err.Error(), "agent")
	assertNoDrillBoxes(t, cfg)
}
