package probes

import (
	"context"
	"runtime"
	"sync"
	"time"
)

// What the load probes share. Each pushes against one of the box's limits
// until the kernel stops it or it reaches its own cap (the plan's max, set
// past the limit: a limit that does not hold is seen, and nothing grows
// without bound), holds what it got until shortly before its deadline, so
// the box stays at its limit while the other boxes' probes run, and gives
// it all back.

// LoadReserve is kept at the end of a load probe's deadline to give back
// what it holds (kill its children, remove its file): in a box held to
// half a CPU on a busy host, reaping a hundred processes takes a while.
const LoadReserve = 700 * time.Millisecond

// holdUntil waits until LoadReserve before ctx's deadline.
func holdUntil(ctx context.Context) time.Duration {
	start := time.Now()
	d, ok := ctx.Deadline()
	if !ok {
		return 0
	}
	t := time.NewTimer(time.Until(d.Add(-LoadReserve)))
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
	return time.Since(start)
}

// prewarmThreads has the Go runtime make n threads now, while the box has
// room for them: once a load holds the box at its process limit, a thread
// the runtime could not make would end the agent. A goroutine locked to
// its thread needs a thread of its own; unlocked again, the thread stays,
// idle, for the runtime to use.
func prewarmThreads(n int) {
	var started sync.WaitGroup
	release := make(chan struct{})
	var done sync.WaitGroup
	for range n {
		started.Add(1)
		done.Add(1)
		go func() {
			defer done.Done()
			runtime.LockOSThread()
			started.Done()
			<-release
			runtime.UnlockOSThread()
		}()
	}
	started.Wait()
	close(release)
	done.Wait()
}
