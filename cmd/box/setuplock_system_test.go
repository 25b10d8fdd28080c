package main

import (
	"bytes"
	"context"
	"encoding/json"
	"maps"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/internal/testenv"
	"github.com/box-isolation/box/stack/model"
)

// TestSystemConcurrentSetupHost runs two `box setup-host` processes at
// once on a host with no stack, as the boot unit and an operator can: both
// succeed (one may wait for the other's lock), and what they leave is one
// whole stack with its bridge created, not Pending. Three rounds, because
// two creates of one network collide only when they overlap.
func TestSystemConcurrentSetupHost(t *testing.T) {
	r, c := worldBox(t)
	exe := testenv.Binary(t, "box")
	ctx := context.Background()
	for round := 1; round <= 3; round++ {
		res := r.run(t, "teardown-host", "--force", "--yes")
		require.Equal(t, exitOK, res.code, "round %d: teardown-host: %s", round, res.err)

		outs := make([]procResult, 2)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range outs {
			wg.Go(func() {
				<-start
				outs[i] = runBoxProcess(t, exe, r.env, "setup-host")
			})
		}
		close(start)
		wg.Wait()
		for i, o := range outs {
			t.Logf("round %d, setup-host #%d -> %d\nstdout: %s\nstderr: %s", round, i+1, o.code, o.out, o.err)
			assert.Equal(t, exitOK, o.code, "round %d: setup-host #%d failed beside another: %s", round, i+1, o.err)
		}
		n, _, err := c.Networks().Get(ctx, model.Current.Network)
		require.NoError(t, err, "round %d", round)
		assert.Equal(t, "Created", n.Status, "round %d: network %s", round, n.Name)

		res = r.run(t, "doctor", "--json")
		var dr doctorResult
		require.NoError(t, json.Unmarshal([]byte(res.out), &dr), "round %d: %s", round, res.err)
		assert.Empty(t, dr.Verification.Findings, "round %d: the two setups left a whole stack", round)
		if t.Failed() {
			break
		}
	}
	// Leave the world's stack whole for the tests after this one.
	res := r.run(t, "setup-host")
	require.Equal(t, exitOK, res.code, "setup-host after: %s", res.err)
}

// procResult is one box process's exit code and output.
type procResult struct {
	code     int
	out, err string
}

// runBoxProcess runs exe as a process of its own (a lock between
// processes is what the test is about) with env and nothing else.
func runBoxProcess(t *testing.T, exe string, env map[string]string, args ...string) procResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, exe, args...)
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	for _, k := range slices.Sorted(maps.Keys(env)) {
		cmd.Env = append(cmd.Env, k+"="+env[k])
	}
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	res := procResult{out: o.String(), err: strings.TrimSpace(e.String())}
	if err != nil {
		res.code = -1
		if ee, ok := err.(*exec.ExitError); ok {
			res.code = ee.ExitCode()
		}
	}
	return res
}
