package probes

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// A load_memory probe has a child touch memory, 4 MiB at a time, up to max
// MiB, saying how far it got after each step; the child holds it until the
// probe ends. The kernel stops it where the box's memory limit holds (the
// OOM killer kills the child: it makes itself the first choice); a child
// that reached max was stopped by nothing.

const memoryStepMiB = 4

func loadMemory(ctx context.Context, spec ProbeSpec, obs Observation) Observation {
	ev := &LoadEvidence{Max: spec.Max}
	obs.Evidence.Load = ev
	cmd := ChildCommand(childMemory, "DRILL_AGENT_MEMORY_MIB="+strconv.Itoa(spec.Max))
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return fail(obs, err.Error())
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return fail(obs, err.Error())
	}
	if err := cmd.Start(); err != nil {
		return fail(obs, "starting the child: "+err.Error())
	}
	progress := make(chan int, 64)
	go func() {
		defer close(progress)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if n, err := strconv.Atoi(strings.TrimSpace(sc.Text())); err == nil {
				progress <- n
			}
		}
	}()
	exited := make(chan error, 1)
	go func() {
		for n := range progress {
			ev.Reached = n
		}
		exited <- cmd.Wait()
	}()
	ev.HeldMS = holdUntil(ctx).Milliseconds()
	stdin.Close() // tells a child that is still holding to let go
	var werr error
	killedHere := false
	select {
	case werr = <-exited:
	default:
		// Still holding (short of its cap at the deadline): this SIGKILL
		// is the probe's own, and no limit met it.
		killedHere = true
		_ = cmd.Process.Kill()
		werr = <-exited
	}
	var ee *exec.ExitError
	switch {
	case ev.Reached >= spec.Max:
		return done(obs, Reached, fmt.Sprintf("touched %d MiB, its own cap: nothing stopped it", ev.Reached))
	case killedHere:
		return fail(obs, fmt.Sprintf("the child still held %d MiB of %d at the deadline, killed by the probe: no limit was met", ev.Reached, spec.Max))
	case errors.As(werr, &ee) && ee.ProcessState != nil:
		if ws, ok := ee.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL {
			ev.StoppedBy = "SIGKILL"
			return done(obs, Rejected, fmt.Sprintf("the child was killed (SIGKILL: the OOM killer) after touching %d MiB", ev.Reached))
		}
		return fail(obs, fmt.Sprintf("the child ended after %d MiB: %v", ev.Reached, werr))
	}
	return fail(obs, fmt.Sprintf("the child stopped at %d MiB of %d without being killed (%v)", ev.Reached, spec.Max, werr))
}

// memoryChild touches DRILL_AGENT_MEMORY_MIB MiB of anonymous memory in
// steps, saying how many after each, then holds it until in closes.
func memoryChild(in io.Reader, out io.Writer) error {
	total, err := strconv.Atoi(os.Getenv("DRILL_AGENT_MEMORY_MIB"))
	if err != nil || total < 1 || total > MaxLoadMiB {
		return fmt.Errorf("DRILL_AGENT_MEMORY_MIB: want 1..%d", MaxLoadMiB)
	}
	// The child is the one the OOM killer takes, not the agent beside it
	// (raising one's own score needs no privilege).
	if err := os.WriteFile("/proc/self/oom_score_adj", []byte("1000"), 0); err != nil {
		return fmt.Errorf("making the child the OOM killer's first choice: %w", err)
	}
	var held [][]byte
	page := unix.Getpagesize()
	for got := 0; got < total; {
		step := min(memoryStepMiB, total-got)
		b, err := unix.Mmap(-1, 0, step<<20, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
		if err != nil {
			return fmt.Errorf("mapping %d MiB more after %d: %w", step, got, err)
		}
		for i := 0; i < len(b); i += page {
			b[i] = 1
		}
		held = append(held, b)
		got += step
		fmt.Fprintln(out, got)
	}
	_, _ = io.Copy(io.Discard, in)
	_ = held
	return nil
}
