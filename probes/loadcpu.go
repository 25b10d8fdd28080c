package probes

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// A load_cpu probe spins max threads, niced, until shortly before its
// deadline and says how much CPU time the agent got for it: under a CPU
// allowance, no more than the allowance of the wall time, however many
// spin.

func loadCPU(ctx context.Context, spec ProbeSpec, obs Observation) Observation {
	ev := &LoadEvidence{Max: spec.Max}
	obs.Evidence.Load = ev
	d, ok := ctx.Deadline()
	if !ok {
		return fail(obs, "no deadline to spin to")
	}
	until := d.Add(-LoadReserve)
	before, err := cpuTime()
	if err != nil {
		return fail(obs, err.Error())
	}
	t0 := time.Now()
	var wg sync.WaitGroup
	for range spec.Max {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// On a thread of its own at the lowest priority: the spin takes
			// what CPU time the box has to spare, not what its other work
			// needs (raising one's nice value needs no privilege). The
			// thread stays locked, so it ends with the goroutine.
			runtime.LockOSThread()
			_ = unix.Setpriority(unix.PRIO_PROCESS, 0, 19)
			for n := 0; ; n++ {
				if n%4096 == 0 && (time.Now().After(until) || ctx.Err() != nil) {
					return
				}
			}
		}()
	}
	wg.Wait()
	after, err := cpuTime()
	if err != nil {
		return fail(obs, err.Error())
	}
	ev.WallSeconds = time.Since(t0).Seconds()
	ev.CPUSeconds = (after - before).Seconds()
	ev.Reached = spec.Max
	ev.HeldMS = time.Since(t0).Milliseconds()
	return done(obs, Reached, fmt.Sprintf("%d spinning for %.2f s got %.2f s of CPU (%.2f CPUs)", spec.Max, ev.WallSeconds, ev.CPUSeconds, ev.CPUSeconds/ev.WallSeconds))
}

// cpuTime is the CPU time this process has had, user and system.
func cpuTime() (time.Duration, error) {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		return 0, fmt.Errorf("getrusage: %w", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), nil
}
