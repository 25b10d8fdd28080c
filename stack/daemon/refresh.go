package daemon

import (
	"context"
	"net"
	"os"
	"sync"
	"time"

	"github.com/box-isolation/box/stack/hostns"
)

// The refresh socket (hostns.RefreshSocketPath): a box command that
// cannot touch the kernel (a granted user's: an allowlist changed, a box
// restored or cloned) connects, and the daemon refreshes the ports, then
// the pins and the egress table, and answers once a pin refresh that
// began after the question is done: the command returns with its change
// enforced, not at the next resync. Any local user may ask; a burst of
// questions is one refresh (the watcher's debounce), and asking changes
// nothing but when the daemon looks.

// refreshAnswerWait is how long a question waits for its refresh, and
// refreshAskEvery the shortest time between two refreshes asked for.
const (
	refreshAnswerWait = 30 * time.Second
	refreshAskEvery   = 100 * time.Millisecond
)

// refreshWaiters are the questions waiting for the next pin refresh; each
// is answered with its outcome (hostns.RefreshDone, or why it failed).
type refreshWaiters struct {
	mu      sync.Mutex
	waiting []chan string
}

func (rw *refreshWaiters) add() chan string {
	ch := make(chan string, 1)
	rw.mu.Lock()
	rw.waiting = append(rw.waiting, ch)
	rw.mu.Unlock()
	return ch
}

// take hands over the questions asked so far: a pin refresh takes them
// before it begins and answers them when it is done.
func (rw *refreshWaiters) take() []chan string {
	rw.mu.Lock()
	defer rw.mu.Unlock()
	out := rw.waiting
	rw.waiting = nil
	return out
}

func answer(waiters []chan string, err error) {
	outcome := hostns.RefreshDone
	if err != nil {
		outcome = "the refresh failed: " + err.Error()
	}
	for _, ch := range waiters {
		ch <- outcome
	}
}

// listenRefresh serves the refresh socket until ctx ends; asked is
// told of each question (the run loop refreshes).
func (w *watcher) listenRefresh(ctx context.Context, asked chan<- struct{}) {
	path := hostns.RefreshSocketPath(w.g.Inode)
	_ = os.Remove(path)
	l, err := net.Listen("unix", path)
	if err == nil {
		err = os.Chmod(path, 0o666)
	}
	if err != nil {
		w.logf("the refresh socket %s: %v; a granted user's changes wait for the periodic resync", path, err)
		return
	}
	go func() {
		<-ctx.Done()
		l.Close()
		os.Remove(path)
	}()
	var last time.Time
	for {
		conn, err := l.Accept()
		if err != nil {
			return
		}
		done := w.waiters.add()
		// At most one refresh a refreshAskEvery, however often a local
		// user asks: the question waits for the next one.
		if wait := refreshAskEvery - time.Since(last); wait > 0 {
			time.Sleep(wait)
		}
		last = time.Now()
		select {
		case asked <- struct{}{}:
		default: // a refresh is asked for already
		}
		go func() {
			defer conn.Close()
			select {
			case outcome := <-done:
				_, _ = conn.Write([]byte(outcome + "\n"))
			case <-time.After(refreshAnswerWait):
			case <-ctx.Done():
			}
		}()
	}
}
