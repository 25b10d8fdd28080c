package incus_test

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/incus/incustest"
)

// execFake serves exec the way incusd does with record-output: an operation
// whose metadata names two log files, which can be read and deleted.
type execFake struct {
	srv *incustest.Server

	mu      sync.Mutex
	logs    map[string]string // file name -> content
	deleted []string
}

func newExecFake(t *testing.T, op func(id string) incustest.Op, stdout, stderr string) (*execFake, *incus.Client) {
	t.Helper()
	srv, c := newFake(t)
	f := &execFake{srv: srv, logs: map[string]string{}}
	srv.Handle("POST /1.0/instances/{name}/exec", func(w http.ResponseWriter, r *http.Request) {
		// Incus names the logs after the operation it is about to start.
		id := srv.NextOperationID()
		f.mu.Lock()
		f.logs["exec_"+id+".stdout"] = stdout
		f.logs["exec_"+id+".stderr"] = stderr
		f.mu.Unlock()
		srv.Async(w, op(id))
	})
	srv.Handle("GET /1.0/instances/{name}/logs/exec-output/{file}", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		content, ok := f.logs[r.PathValue("file")]
		f.mu.Unlock()
		if !ok {
			incustest.Error(w, http.StatusNotFound, "Log file not found")
			return
		}
		w.Header().Set("Content-Type", "application/octet-stream")
		_, _ = w.Write([]byte(content))
	})
	srv.Handle("DELETE /1.0/instances/{name}/logs/exec-output/{file}", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		defer f.mu.Unlock()
		if _, ok := f.logs[r.PathValue("file")]; !ok {
			incustest.Error(w, http.StatusNotFound, "Log file not found")
			return
		}
		delete(f.logs, r.PathValue("file"))
		f.deleted = append(f.deleted, r.PathValue("file"))
		incustest.Sync(w, nil)
	})
	return f, c
}

func (f *execFake) remaining() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for k := range f.logs {
		out = append(out, k)
	}
	return out
}

func TestExec(t *testing.T) {
	f, c := newExecFake(t, func(id string) incustest.Op {
		return incustest.Op{Description: "Executing command", Metadata: map[string]any{
			"return": 3,
			"output": map[string]any{
				"1": "/1.0/instances/b1/logs/exec-output/exec_" + id + ".stdout",
				"2": "/1.0/instances/b1/logs/exec-output/exec_" + id + ".stderr",
			},
		}}
	}, "hello\n", "oops\n")

	res, err := c.Project("box-alice").Instances().Exec(testCtx(t), "b1", incus.ExecRequest{
		Command: []string{"sh", "-c", "echo hello; echo oops >&2; exit 3"},
		Env:     map[string]string{"HOME": "/home/u"},
		User:    1000, Group: 1000, Cwd: "/home/u",
	})
	require.NoError(t, err)
	assert.Equal(t, 3, res.ExitCode, "a non-zero exit is a result, not an error")
	assert.Equal(t, "hello\n", string(res.Stdout))
	assert.Equal(t, "oops\n", string(res.Stderr))
	assert.False(t, res.Truncated)

	posts := f.srv.Find("POST", "/1.0/instances/b1/exec")
	require.Len(t, posts, 1)
	assert.Equal(t, map[string]any{
		"command":            []any{"sh", "-c", "echo hello; echo oops >&2; exit 3"},
		"environment":        map[string]any{"HOME": "/home/u"},
		"interactive":        false,
		"wait-for-websocket": false,
		"record-output":      true,
		"user":               float64(1000),
		"group":              float64(1000),
		"cwd":                "/home/u",
	}, jsonBody(t, posts[0]))
	assert.Len(t, f.deleted, 2, "both logs deleted")
	assert.Empty(t, f.remaining(), "no logs left behind")
	for _, r := range f.srv.Requests() {
		assert.Equal(t, "box-alice", r.Query.Get("project"), "%s %s", r.Method, r.Path)
	}
}

func TestExecOperationFails(t *testing.T) {
	f, c := newExecFake(t, func(id string) incustest.Op {
		// A command that cannot start fails the operation before Incus
		// reports the log paths; the logs exist all the same.
		return incustest.Op{Description: "Executing command", Err: `Command not found`}
	}, "", "")
	_, err := c.Instances().Exec(testCtx(t), "b1", incus.ExecRequest{Command: []string{"nope"}})
	require.Error(t, err)
	var oe *incus.OperationError
	require.ErrorAs(t, err, &oe)
	assert.Equal(t, "Command not found", oe.Message)
	assert.Contains(t, err.Error(), `exec "nope" in b1`)
	assert.Empty(t, f.remaining(), "the logs of a failed exec are deleted too")
}

func TestExecTimeout(t *testing.T) {
	var opID string
	f, c := newExecFake(t, func(id string) incustest.Op {
		opID = id
		return incustest.Op{Description: "Executing command", Hold: true} // like Incus: not cancellable
	}, "partial", "")
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := c.Instances().Exec(ctx, "b1", incus.ExecRequest{Command: []string{"sleep", "1000"}})
	require.Error(t, err)
	assert.Less(t, time.Since(start), 3*time.Second)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Contains(t, err.Error(), opID, "the error names the operation")
	assert.Contains(t, err.Error(), "may still be running")
	assert.True(t, f.srv.CancelRequested(opID), "the client tried to cancel")
	assert.Empty(t, f.remaining(), "the logs are deleted even on a timeout")
}

func TestExecTruncatesOutput(t *testing.T) {
	big := strings.Repeat("x", incus.MaxExecOutput+10)
	_, c := newExecFake(t, func(id string) incustest.Op {
		return incustest.Op{Metadata: map[string]any{"return": 0}}
	}, big, "")
	res, err := c.Instances().Exec(testCtx(t), "b1", incus.ExecRequest{Command: []string{"yes"}})
	require.NoError(t, err)
	assert.Len(t, res.Stdout, incus.MaxExecOutput)
	assert.True(t, res.Truncated)
}

func TestExecMissingExitCode(t *testing.T) {
	f, c := newExecFake(t, func(id string) incustest.Op {
		return incustest.Op{Metadata: map[string]any{}}
	}, "", "")
	_, err := c.Instances().Exec(testCtx(t), "b1", incus.ExecRequest{Command: []string{"true"}})
	var me *incus.MalformedError
	require.ErrorAs(t, err, &me)
	assert.Empty(t, f.remaining())
}

func TestExecEmptyCommand(t *testing.T) {
	srv, c := newFake(t)
	_, err := c.Instances().Exec(testCtx(t), "b1", incus.ExecRequest{})
	require.ErrorContains(t, err, "empty command")
	assert.Empty(t, srv.Requests())
}
