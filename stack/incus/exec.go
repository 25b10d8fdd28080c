package incus

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"path"
	"strings"
	"time"
)

// DefaultExecTimeout bounds Exec when the caller's context has no deadline,
// so a hung command can never hang the caller.
const DefaultExecTimeout = 10 * time.Minute

// MaxExecOutput is how much of each of stdout and stderr Exec reads back;
// the rest is dropped and ExecResult.Truncated is set.
const MaxExecOutput = 16 << 20

// ExecRequest is a non-interactive command. User and Group are numeric ids
// inside the instance (0 is root). An empty Cwd is the user's home.
type ExecRequest struct {
	Command []string
	Env     map[string]string
	User    uint32
	Group   uint32
	Cwd     string
}

// ExecResult is a finished command. A non-zero ExitCode is not an error.
type ExecResult struct {
	ExitCode  int
	Stdout    []byte
	Stderr    []byte
	Truncated bool // stdout or stderr exceeded MaxExecOutput
}

// Exec runs a command in a running instance with no terminal and stdin
// closed, and returns its exit code and output. Incus records the output in
// log files on the host (record-output), which Exec reads and then deletes.
//
// The command must finish before ctx's deadline (DefaultExecTimeout if ctx
// has none). If it does not, Exec asks Incus to cancel the operation and
// returns an error wrapping context.DeadlineExceeded; Incus cannot cancel a
// recorded exec, so the command may go on running in the instance.
func (api Instances) Exec(ctx context.Context, name string, req ExecRequest) (*ExecResult, error) {
	c := api.c
	if len(req.Command) == 0 {
		return nil, fmt.Errorf("exec in %s: empty command", name)
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultExecTimeout)
		defer cancel()
	}
	body := map[string]any{
		"command":            req.Command,
		"environment":        req.Env,
		"interactive":        false,
		"wait-for-websocket": false,
		"record-output":      true,
		"user":               req.User,
		"group":              req.Group,
		"cwd":                req.Cwd,
	}
	what := fmt.Sprintf("exec %q in %s", strings.Join(req.Command, " "), name)

	op, err := c.start(ctx, request{method: http.MethodPost, path: apiPath("instances", name, "exec"), json: body})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	if !op.final() {
		var done *Operation
		// done is nil when no wait ever answered; keep the started op's id.
		if done, err = c.waitOrCancel(ctx, op); done != nil {
			op = done
		}
	} else {
		err = op.result()
	}
	logs := c.Instances().execLogs(name, op)
	if err != nil {
		// Whatever ran, the logs are ours to clean up; on a timeout the
		// command may still be writing to them, which unlinking tolerates.
		cctx, cancel := cleanupContext(ctx)
		defer cancel()
		c.Instances().deleteExecLogs(cctx, logs)
		if ctx.Err() != nil {
			return nil, fmt.Errorf("%s: %w; the command may still be running", what, err)
		}
		return nil, fmt.Errorf("%s: %w", what, err)
	}

	code, ok := op.Metadata["return"].(float64)
	if !ok {
		cctx, cancel := cleanupContext(ctx)
		defer cancel()
		c.Instances().deleteExecLogs(cctx, logs)
		return nil, fmt.Errorf("%s: %w", what, &MalformedError{
			Method: http.MethodGet, Path: apiPath("operations", op.ID, "wait"),
			Err: fmt.Errorf("no exit code in operation metadata (return=%v)", op.Metadata["return"]),
		})
	}
	res := &ExecResult{ExitCode: int(code)}
	var truncated [2]bool
	res.Stdout, truncated[0], err = c.Instances().readExecLog(ctx, logs[0])
	if err == nil {
		res.Stderr, truncated[1], err = c.Instances().readExecLog(ctx, logs[1])
	}
	res.Truncated = truncated[0] || truncated[1]
	// A log that fails to delete stays on the host; it does not cost the
	// caller a result they already have.
	cctx, cancel := cleanupContext(ctx)
	defer cancel()
	c.Instances().deleteExecLogs(cctx, logs)
	if err != nil {
		return nil, fmt.Errorf("%s: reading output: %w", what, err)
	}
	return res, nil
}

// execLogs are the API paths of the stdout and stderr logs. Only the file
// names are taken from the operation: the paths Incus reports carry no
// project, and a failed exec may report none, in which case the names are
// the ones Incus derives from the operation id.
func (api Instances) execLogs(inst string, op *Operation) [2]string {
	var out [2]string
	if op == nil {
		return out
	}
	reported, _ := op.Metadata["output"].(map[string]any)
	for i, fd := range []string{"1", "2"} {
		file := ""
		if p, ok := reported[fd].(string); ok && p != "" {
			file = path.Base(p)
		} else if op.ID != "" {
			file = "exec_" + op.ID + []string{".stdout", ".stderr"}[i]
		}
		if file != "" {
			out[i] = apiPath("instances", inst, "logs", "exec-output", file)
		}
	}
	return out
}

// readExecLog reads at most MaxExecOutput bytes of a log.
func (api Instances) readExecLog(ctx context.Context, p string) ([]byte, bool, error) {
	c := api.c
	if p == "" {
		return nil, false, nil
	}
	resp, err := c.roundTrip(ctx, request{method: http.MethodGet, path: p})
	if err != nil {
		return nil, false, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, err := decodeEnvelope(http.MethodGet, p, resp)
		if err == nil {
			err = &StatusError{Method: http.MethodGet, Path: p, Code: resp.StatusCode, Message: http.StatusText(resp.StatusCode)}
		}
		return nil, false, err
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, MaxExecOutput+1))
	if err != nil {
		return nil, false, fmt.Errorf("reading %s: %w", p, err)
	}
	if len(data) > MaxExecOutput {
		return data[:MaxExecOutput], true, nil
	}
	return data, false, nil
}

func (api Instances) deleteExecLogs(ctx context.Context, logs [2]string) {
	c := api.c
	for _, p := range logs {
		if p != "" {
			_, _, _ = c.call(ctx, request{method: http.MethodDelete, path: p})
		}
	}
}
