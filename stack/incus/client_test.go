package incus_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/incus/incustest"
)

// newFake returns a fake incusd and a client pointed at it.
func newFake(t *testing.T) (*incustest.Server, *incus.Client) {
	t.Helper()
	srv := incustest.New(t)
	return srv, incus.New(srv.Socket())
}

// testCtx bounds every test so a bug hangs for seconds, not minutes.
func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// jsonBody decodes a recorded request body.
func jsonBody(t *testing.T, r incustest.Request) map[string]any {
	t.Helper()
	var m map[string]any
	require.NoError(t, json.Unmarshal(r.Body, &m), "body %s", r.Body)
	return m
}

func TestDefaultSocket(t *testing.T) {
	tests := []struct {
		name, socket, dir, want string
	}{
		{"default", "", "", "/var/lib/incus/unix.socket"},
		{"INCUS_DIR", "", "/srv/incus", "/srv/incus/unix.socket"},
		{"INCUS_SOCKET wins", "/run/x.sock", "/srv/incus", "/run/x.sock"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("INCUS_SOCKET", tt.socket)
			t.Setenv("INCUS_DIR", tt.dir)
			assert.Equal(t, tt.want, incus.DefaultSocket())
			assert.Equal(t, tt.want, incus.New("").Socket())
		})
	}
}

func TestProjectScopesEveryRequest(t *testing.T) {
	srv, c := newFake(t)
	srv.Handle("GET /1.0/instances", func(w http.ResponseWriter, r *http.Request) {
		incustest.Sync(w, []any{})
	})
	srv.Handle("DELETE /1.0/instances/{name}", func(w http.ResponseWriter, r *http.Request) {
		srv.Async(w, incustest.Op{Description: "Deleting instance"})
	})
	p := c.Project("box-alice")
	assert.Equal(t, "box-alice", p.ProjectName())
	assert.Equal(t, "", c.ProjectName(), "Project must return a copy")

	_, err := p.Instances().List(testCtx(t), nil)
	require.NoError(t, err)
	require.NoError(t, p.Instances().Delete(testCtx(t), "b1"))
	_, err = c.Instances().List(testCtx(t), nil)
	require.NoError(t, err)

	reqs := srv.Requests()
	require.Len(t, reqs, 4) // list, delete, wait, list
	for _, r := range reqs[:3] {
		assert.Equal(t, "box-alice", r.Query.Get("project"), "%s %s", r.Method, r.Path)
	}
	assert.False(t, reqs[3].Query.Has("project"), "unscoped client sent a project")
}

func TestServer(t *testing.T) {
	tests := []struct {
		driver string
		want   []string
		vms    bool
	}{
		{"lxc", []string{"lxc"}, false},
		{"lxc | qemu", []string{"lxc", "qemu"}, true},
		{"qemu", []string{"qemu"}, true},
		{"", nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.driver, func(t *testing.T) {
			srv, c := newFake(t)
			srv.Handle("GET /1.0", func(w http.ResponseWriter, r *http.Request) {
				incustest.Sync(w, map[string]any{
					"api_version": "1.0", "auth": "trusted", "api_extensions": []string{"instances"},
					"config": map[string]any{"core.https_address": ":8443"},
					"environment": map[string]any{
						"driver": tt.driver, "driver_version": "6.0.0 | 9.0.0", "kernel": "Linux",
						"kernel_version": "6.18.0", "server_version": "6.0.4", "storage": "dir",
						"server_name": "host", "architectures": []string{"x86_64", "i686"},
					},
				})
			})
			s, err := c.Server(testCtx(t))
			require.NoError(t, err)
			assert.Equal(t, tt.want, s.Drivers())
			assert.Equal(t, tt.vms, s.CanRunVMs())
			assert.Equal(t, "1.0", s.APIVersion)
			assert.Equal(t, "trusted", s.Auth)
			assert.Equal(t, "6.0.4", s.Environment.ServerVersion)
			assert.Equal(t, "dir", s.Environment.StorageDriver)
			assert.Equal(t, "6.18.0", s.Environment.KernelVersion)
			assert.Equal(t, []string{"x86_64", "i686"}, s.Environment.Architectures)
			assert.Equal(t, ":8443", s.Config["core.https_address"])
			assert.True(t, s.HasExtension("instances"))
		})
	}
}

func TestUnreachable(t *testing.T) {
	tests := []struct {
		name  string
		setup func(t *testing.T, sock string)
		errno syscall.Errno
	}{
		{"no socket", func(t *testing.T, sock string) {}, syscall.ENOENT},
		{"stale socket, daemon gone", func(t *testing.T, sock string) {
			ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
			require.NoError(t, err)
			ln.SetUnlinkOnClose(false)
			require.NoError(t, ln.Close())
		}, syscall.ECONNREFUSED},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sock := filepath.Join(t.TempDir(), "unix.socket")
			tt.setup(t, sock)
			c := incus.New(sock)
			_, err := c.Server(testCtx(t))
			require.Error(t, err)
			assert.True(t, incus.IsUnreachable(err))
			assert.False(t, incus.IsNotFound(err))
			assert.ErrorIs(t, err, tt.errno)
			var ue *incus.UnreachableError
			require.ErrorAs(t, err, &ue)
			assert.Equal(t, sock, ue.Socket)
			msg := err.Error()
			assert.Contains(t, msg, "cannot reach incusd at "+sock)
			assert.Contains(t, msg, "check that incusd is running")
			assert.Contains(t, msg, "INCUS_SOCKET")
			assert.Equal(t, 1, strings.Count(msg, sock), "socket named once: %s", msg)
		})
	}
}

func TestUnreachableHints(t *testing.T) {
	tests := []struct {
		errno syscall.Errno
		want  string
	}{
		{syscall.ENOENT, "check that incusd is running"},
		{syscall.ECONNREFUSED, "check that incusd is running"},
		{syscall.EACCES, "join the incus-admin group"},
	}
	for _, tt := range tests {
		t.Run(tt.errno.Error(), func(t *testing.T) {
			err := &incus.UnreachableError{Socket: "/s", Err: &net.OpError{Op: "dial", Net: "unix", Err: os.NewSyscallError("connect", tt.errno)}}
			assert.Contains(t, err.Error(), tt.want)
			assert.Contains(t, err.Error(), "incus: cannot reach incusd at /s: connect: "+tt.errno.Error())
			assert.ErrorIs(t, err, tt.errno)
		})
	}
}

func TestIgnoresHTTPProxy(t *testing.T) {
	t.Setenv("HTTP_PROXY", "http://127.0.0.1:1")
	t.Setenv("http_proxy", "http://127.0.0.1:1")
	srv, c := newFake(t)
	srv.Handle("GET /1.0/instances", func(w http.ResponseWriter, r *http.Request) { incustest.Sync(w, []any{}) })
	_, err := c.Instances().List(testCtx(t), nil)
	require.NoError(t, err)
}

func TestErrors(t *testing.T) {
	tests := []struct {
		name    string
		handler http.HandlerFunc
		check   func(t *testing.T, err error)
	}{
		{
			name: "not found",
			handler: func(w http.ResponseWriter, r *http.Request) {
				incustest.Error(w, http.StatusNotFound, "Instance not found")
			},
			check: func(t *testing.T, err error) {
				assert.True(t, incus.IsNotFound(err))
				assert.False(t, incus.IsConflict(err))
				assert.False(t, incus.IsAlreadyExists(err))
				var se *incus.StatusError
				require.ErrorAs(t, err, &se)
				assert.Equal(t, incus.StatusError{Method: "GET", Path: "/1.0/instances/x", Code: 404, Message: "Instance not found"}, *se)
				assert.Equal(t, "incus: GET /1.0/instances/x: instance not found (404)", se.Error())
				assert.Equal(t, "getting instance x: incus: GET /1.0/instances/x: instance not found (404)", err.Error())
			},
		},
		{
			name: "conflict",
			handler: func(w http.ResponseWriter, r *http.Request) {
				incustest.Error(w, http.StatusConflict, "Network \"x\" already exists")
			},
			check: func(t *testing.T, err error) {
				assert.True(t, incus.IsConflict(err))
				assert.True(t, incus.IsAlreadyExists(err))
				assert.False(t, incus.IsNotFound(err))
			},
		},
		{
			name: "already exists as 400 (network ACL)",
			handler: func(w http.ResponseWriter, r *http.Request) {
				incustest.Error(w, http.StatusBadRequest, "The network ACL already exists")
			},
			check: func(t *testing.T, err error) {
				assert.False(t, incus.IsConflict(err), "IsConflict is 409 only")
				assert.True(t, incus.IsAlreadyExists(err))
			},
		},
		{
			name: "error code falls back to the HTTP status",
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(http.StatusForbidden)
				_, _ = w.Write([]byte(`{"type":"error","error":"not authorized"}`))
			},
			check: func(t *testing.T, err error) {
				var se *incus.StatusError
				require.ErrorAs(t, err, &se)
				assert.Equal(t, 403, se.Code)
			},
		},
		{
			name: "non-JSON error page keeps its status",
			handler: func(w http.ResponseWriter, r *http.Request) {
				http.Error(w, "upstream gone", http.StatusBadGateway)
			},
			check: func(t *testing.T, err error) {
				var se *incus.StatusError
				require.ErrorAs(t, err, &se)
				assert.Equal(t, 502, se.Code)
				assert.Contains(t, se.Message, "upstream gone")
			},
		},
		{
			name: "malformed: not JSON",
			handler: func(w http.ResponseWriter, r *http.Request) {
				_, _ = w.Write([]byte("<html>hello</html>"))
			},
			check: func(t *testing.T, err error) {
				var me *incus.MalformedError
				require.ErrorAs(t, err, &me)
				assert.Contains(t, err.Error(), "malformed response")
				assert.Contains(t, err.Error(), "<html>hello</html>")
				assert.False(t, incus.IsNotFound(err))
			},
		},
		{
			name: "malformed: no envelope",
			handler: func(w http.ResponseWriter, r *http.Request) {
				_, _ = w.Write([]byte(`{"name":"x"}`))
			},
			check: func(t *testing.T, err error) {
				var me *incus.MalformedError
				require.ErrorAs(t, err, &me)
			},
		},
		{
			name: "malformed: metadata of the wrong shape",
			handler: func(w http.ResponseWriter, r *http.Request) {
				incustest.Sync(w, []string{"not", "an", "instance"})
			},
			check: func(t *testing.T, err error) {
				var me *incus.MalformedError
				require.ErrorAs(t, err, &me)
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv, c := newFake(t)
			srv.Handle("GET /1.0/instances/x", tt.handler)
			inst, etag, err := c.Instances().Get(testCtx(t), "x")
			require.Error(t, err)
			assert.Nil(t, inst)
			assert.Empty(t, etag)
			tt.check(t, err)
		})
	}
}

func TestOperationFailure(t *testing.T) {
	srv, c := newFake(t)
	srv.Handle("POST /1.0/instances", func(w http.ResponseWriter, r *http.Request) {
		srv.Async(w, incustest.Op{Description: "Creating instance", Err: "Failed creating instance from image: Image not found"})
	})
	err := c.Instances().Create(testCtx(t), incus.InstancesPost{Name: "b1", Source: incus.InstanceSource{Type: "image", Alias: "nope"}})
	require.Error(t, err)
	var oe *incus.OperationError
	require.ErrorAs(t, err, &oe)
	assert.Equal(t, "Failed creating instance from image: Image not found", oe.Message)
	assert.Equal(t, 400, oe.Code)
	assert.Equal(t, "Creating instance", oe.Description)
	assert.NotEmpty(t, oe.ID)
	assert.Equal(t, "creating instance b1: incus: operation "+oe.ID+" (creating instance) failed: failed creating instance from image: Image not found", err.Error())
	assert.False(t, incus.IsNotFound(err), "an operation's failure is not an HTTP 404")
	assert.False(t, srv.CancelRequested(oe.ID), "a failed operation must not be cancelled")
}

func TestOperationAlreadyExists(t *testing.T) {
	for _, msg := range []string{
		`Add instance info to the database: This "instances" entry already exists`,
		// What incusd 6.0.4 says, measured in the hermetic world.
		`Failed creating instance record: Add instance info to the database: Failed to create "instances" entry: UNIQUE constraint failed: instances.project_id, instances.name`,
	} {
		srv, c := newFake(t)
		srv.Handle("POST /1.0/instances", func(w http.ResponseWriter, r *http.Request) {
			srv.Async(w, incustest.Op{Description: "Creating instance", Err: msg})
		})
		err := c.Instances().Create(testCtx(t), incus.InstancesPost{Name: "b1"})
		assert.True(t, incus.IsAlreadyExists(err), msg)
		assert.False(t, incus.IsConflict(err))
	}
	srv, c := newFake(t)
	srv.Handle("POST /1.0/instances", func(w http.ResponseWriter, r *http.Request) {
		srv.Async(w, incustest.Op{Description: "Creating instance", Err: "Failed creating instance from image: Image not found"})
	})
	err := c.Instances().Create(testCtx(t), incus.InstancesPost{Name: "b1"})
	assert.False(t, incus.IsAlreadyExists(err), "another failure is not 'already exists'")
}

func TestWaitTimeoutCancelsOperation(t *testing.T) {
	srv, c := newFake(t)
	var opID string
	srv.Handle("POST /1.0/instances", func(w http.ResponseWriter, r *http.Request) {
		opID = srv.Async(w, incustest.Op{Description: "Creating instance", Hold: true, MayCancel: true})
	})
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := c.Instances().Create(ctx, incus.InstancesPost{Name: "slow"})
	require.Error(t, err)
	assert.Less(t, time.Since(start), 3*time.Second, "the deadline must bound the wait")
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Contains(t, err.Error(), opID)
	assert.Contains(t, err.Error(), "creating instance slow")
	assert.True(t, srv.CancelRequested(opID))
	assert.True(t, srv.Cancelled(opID))
}

func TestWaitOperation(t *testing.T) {
	t.Run("success after a long poll", func(t *testing.T) {
		srv, c := newFake(t)
		id := srv.AddOperation(incustest.Op{Description: "Exporting", Hold: true, Metadata: map[string]any{"k": "v"}})
		go func() {
			time.Sleep(100 * time.Millisecond)
			srv.Release(id)
		}()
		op, err := c.WaitOperation(testCtx(t), id)
		require.NoError(t, err)
		assert.Equal(t, id, op.ID)
		assert.Equal(t, "Success", op.Status)
		assert.Equal(t, 200, op.StatusCode)
		assert.Equal(t, "v", op.Metadata["k"])
		waits := srv.Find("GET", "/1.0/operations/"+id+"/wait")
		require.NotEmpty(t, waits)
		assert.Equal(t, "10", waits[0].Query.Get("timeout"), "the timeout follows the ctx deadline")
	})
	t.Run("deadline leaves it running", func(t *testing.T) {
		srv, c := newFake(t)
		id := srv.AddOperation(incustest.Op{Description: "Exporting", Hold: true, MayCancel: true})
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		_, err := c.WaitOperation(ctx, id)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		assert.Contains(t, err.Error(), id)
		assert.False(t, srv.CancelRequested(id), "WaitOperation only waits")
	})
	t.Run("cancelled", func(t *testing.T) {
		srv, c := newFake(t)
		id := srv.AddOperation(incustest.Op{Hold: true, MayCancel: true})
		require.NoError(t, c.CancelOperation(testCtx(t), id))
		_, err := c.WaitOperation(testCtx(t), id)
		var oe *incus.OperationError
		require.ErrorAs(t, err, &oe)
		assert.Equal(t, 401, oe.Code)
		assert.Contains(t, err.Error(), "was cancelled")
	})
	t.Run("unknown operation", func(t *testing.T) {
		_, c := newFake(t)
		_, err := c.WaitOperation(testCtx(t), "nope")
		assert.True(t, incus.IsNotFound(err))
	})
}

func TestErrorsAreWrapped(t *testing.T) {
	// errors.As must see through our context wrapping and the %w chains.
	err := error(&incus.StatusError{Method: "GET", Path: "/1.0", Code: 412})
	wrapped := errors.Join(errors.New("outer"), err)
	assert.True(t, incus.IsPreconditionFailed(wrapped))
	assert.Equal(t, "incus: GET /1.0: precondition failed (412)", err.Error())
}

// incusd before 6.12 answers a long poll that timed out with an error, and
// one whose operation failed with the operation's error: the wait reads
// the operation and goes on, or returns its failure, typed.
func TestWaitOnIncus60(t *testing.T) {
	defer incus.SetWaitChunk(time.Second)()
	t.Run("a long poll that times out", func(t *testing.T) {
		srv, c := newFake(t)
		srv.WaitLikeIncus60()
		id := srv.AddOperation(incustest.Op{Description: "Creating instance", Hold: true})
		released := make(chan struct{})
		go func() {
			// Release only once a poll has timed out.
			for len(srv.Find(http.MethodGet, "/1.0/operations/"+id)) == 0 {
				time.Sleep(10 * time.Millisecond)
			}
			srv.Release(id)
			close(released)
		}()
		op, err := c.WaitOperation(testCtx(t), id)
		require.NoError(t, err)
		<-released
		assert.Equal(t, "Success", op.Status)
		assert.GreaterOrEqual(t, len(srv.Find(http.MethodGet, "/1.0/operations/"+id+"/wait")), 2, "polled again after the timeout")
	})
	t.Run("a failed operation", func(t *testing.T) {
		srv, c := newFake(t)
		srv.WaitLikeIncus60()
		srv.Handle("POST /1.0/instances", func(w http.ResponseWriter, r *http.Request) {
			srv.Async(w, incustest.Op{Description: "Creating instance", Err: "Failed getting remote image info: boom"})
		})
		err := c.Instances().Create(testCtx(t), incus.InstancesPost{Name: "b"})
		var oe *incus.OperationError
		require.ErrorAs(t, err, &oe)
		assert.Equal(t, "Failed getting remote image info: boom", oe.Message)
		assert.Equal(t, 400, oe.Code)
	})
}

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
