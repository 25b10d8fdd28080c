package probes

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"
)

// A load_processes probe is a fork bomb with a cap: it starts processes
// that do nothing (sleep, or this agent holding) until the kernel refuses
// one (EAGAIN: the box's process limit) or it has started max, holds them,
// and kills them all. It counts the box's tasks when refused: the pids
// limit counts threads too.

func loadProcs(ctx context.Context, spec ProbeSpec, obs Observation) Observation {
	ev := &LoadEvidence{Max: spec.Max}
	obs.Evidence.Load = ev
	prewarmThreads(16)
	// Looked up once: on a slow machine every start counts.
	sleep, lookErr := exec.LookPath("sleep")
	start := func() (*exec.Cmd, error) {
		var cmd *exec.Cmd
		if lookErr == nil {
			cmd = exec.Command(sleep, "120")
		} else {
			cmd = ChildCommand(childHold)
		}
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		return cmd, cmd.Start()
	}
	var kids []*exec.Cmd
	defer func() {
		for _, k := range kids {
			_ = k.Process.Kill()
		}
		for _, k := range kids {
			_ = k.Wait()
		}
	}()
	var stopErr error
	for len(kids) < spec.Max && ctx.Err() == nil {
		cmd, err := start()
		if err != nil {
			stopErr = err
			break
		}
		kids = append(kids, cmd)
	}
	ev.Reached = len(kids)
	switch {
	case errors.Is(stopErr, syscall.EAGAIN):
		ev.StoppedBy = "EAGAIN"
		ev.Tasks = countTasks()
		// Room again at once for the agent's own threads (and anything
		// else in the box that needs a task), before holding.
		for range min(16, len(kids)) {
			k := kids[len(kids)-1]
			kids = kids[:len(kids)-1]
			_ = k.Process.Kill()
			_ = k.Wait()
		}
	case stopErr != nil:
		return fail(obs, fmt.Sprintf("starting process %d: %v", len(kids)+1, stopErr))
	case ctx.Err() != nil:
		return fail(obs, fmt.Sprintf("cut short after %d processes: %v", len(kids), ctx.Err()))
	}
	ev.HeldMS = holdUntil(ctx).Milliseconds()
	if ev.StoppedBy == "" {
		return done(obs, Reached, fmt.Sprintf("started %d processes, its own cap: nothing refused one", len(kids)))
	}
	return done(obs, Rejected, fmt.Sprintf("the kernel refused process %d (EAGAIN) with %d tasks in the box; held %d for %s", ev.Reached+1, ev.Tasks, len(kids), time.Duration(ev.HeldMS)*time.Millisecond))
}

// countTasks counts the tasks (threads) of every process this /proc shows:
// in a box, the box's.
func countTasks() int {
	dirs, _ := filepath.Glob(filepath.Join(procRoot, "[0-9]*/task/[0-9]*"))
	return len(dirs)
}

// holdChild is a process that does nothing for a while.
func holdChild() error {
	time.Sleep(2 * time.Minute)
	return nil
}
