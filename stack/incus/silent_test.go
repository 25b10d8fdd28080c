package incus_test

import (
	"bufio"
	"context"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/stack/incus"
)

// peekingListener accepts the way incusd's unix socket does (Incus 6.0.4,
// StarttlsListener.Accept): one connection at a time, and Accept returns
// only once the connection's first bytes have arrived (incusd peeks for
// "STARTTLS"). A connection that stays silent holds every later one back.
// Here a peek gives up after peekLimit, so the test never hangs, and the
// longest wait is recorded.
type peekingListener struct {
	net.Listener
	mu      sync.Mutex
	longest time.Duration
	silent  int // connections that sent nothing within peekLimit
}

const peekLimit = 3 * time.Second

type peekedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c peekedConn) Read(b []byte) (int, error) { return c.r.Read(b) }

func (l *peekingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	start := time.Now()
	_ = c.SetReadDeadline(start.Add(peekLimit))
	r := bufio.NewReader(c)
	_, perr := r.Peek(1)
	waited := time.Since(start)
	_ = c.SetReadDeadline(time.Time{})
	l.mu.Lock()
	l.longest = max(l.longest, waited)
	if perr != nil && errors.Is(perr, os.ErrDeadlineExceeded) {
		l.silent++
	}
	l.mu.Unlock()
	return peekedConn{c, r}, nil
}

// TestClientLeavesNoSilentConnection: the client never holds a
// connection to incusd's socket open without sending on it. Go's
// transport dials a connection for a request that then takes an idle one
// (or gives up), and keeps the new one idle, unsent, until its idle
// timeout: incusd's socket then accepted nothing else, and the whole API
// (GET /1.0 too) paused for up to 30 s, about every 10 minutes of a
// make test (docs/measurements.md).
func TestClientLeavesNoSilentConnection(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "unix.socket")
	inner, err := net.Listen("unix", sock)
	require.NoError(t, err)
	l := &peekingListener{Listener: inner}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// A little work, so requests overlap and connections come and go.
		time.Sleep(time.Millisecond)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"type":"sync","status":"Success","status_code":200,"metadata":{"api_version":"1.0","environment":{}}}`))
	})}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })

	c := incus.New(sock)
	// Bursts of requests at once, as a drill's probe phase makes (a plan
	// pushed and an exec started in every box), with quiet between them.
	// Before keep-alives were turned off this left a silent connection in
	// 9 of 10 runs.
	for round := range 100 {
		var wg sync.WaitGroup
		for g := range 24 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				timeout := 10 * time.Second
				if (g+round)%5 == 0 {
					// Some callers give up at once, as one whose context
					// ends while its connection is dialled.
					timeout = 100 * time.Microsecond
				}
				ctx, cancel := context.WithTimeout(context.Background(), timeout)
				defer cancel()
				_, _ = c.Server(ctx)
			}()
		}
		wg.Wait()
		time.Sleep(5 * time.Millisecond)
	}
	// Another client's request, as the incus CLI's or incus-user's: it is
	// accepted only after every connection before it has sent something
	// (or the peek has given up on it).
	start := time.Now()
	_, err = incus.New(sock).Server(testCtx(t))
	require.NoError(t, err)
	took := time.Since(start)
	l.mu.Lock()
	defer l.mu.Unlock()
	t.Logf("the last request took %s; the longest wait for a connection's first bytes %s", took, l.longest)
	require.Zero(t, l.silent, "connections the client opened and sent nothing on for %s (incusd's socket accepts nothing else meanwhile)", peekLimit)
}
