package incus

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Operation status codes Incus uses for the final states.
const (
	operationSuccess   = 200
	operationFailure   = 400
	operationCancelled = 401
)

// waitChunk is the longest single /wait long-poll. Long polls are kept short
// so a dropped connection or a lost wake-up costs at most this much.
var waitChunk = 30 * time.Second

// Operation is a background task in incusd (GET /1.0/operations/{id}).
type Operation struct {
	ID          string              `json:"id"`
	Class       string              `json:"class"`
	Description string              `json:"description"`
	Status      string              `json:"status"`
	StatusCode  int                 `json:"status_code"`
	Err         string              `json:"err"`
	Metadata    map[string]any      `json:"metadata"`
	Resources   map[string][]string `json:"resources"`
	MayCancel   bool                `json:"may_cancel"`
	CreatedAt   time.Time           `json:"created_at"`
	UpdatedAt   time.Time           `json:"updated_at"`
}

// final reports whether the operation has ended; Incus codes every final
// state 200 or above.
func (op *Operation) final() bool {
	if op == nil {
		return true
	}
	if op.StatusCode == 0 {
		switch op.Status {
		case "Success", "Failure", "Cancelled":
			return true
		}
		return false
	}
	return op.StatusCode >= 200
}

// result turns a final operation into nil or an *OperationError.
func (op *Operation) result() error {
	code := op.StatusCode
	if code == 0 {
		switch op.Status {
		case "Failure":
			code = operationFailure
		case "Cancelled":
			code = operationCancelled
		default:
			code = operationSuccess
		}
	}
	if code == operationSuccess {
		return nil
	}
	msg := op.Err
	if msg == "" {
		msg = op.Status
	}
	return &OperationError{ID: op.ID, Description: op.Description, Code: code, Message: msg}
}

// Operation fetches the current state of an operation without waiting.
func (c *Client) Operation(ctx context.Context, id string) (*Operation, error) {
	var op Operation
	if _, err := c.get(ctx, apiPath("operations", id), nil, &op); err != nil {
		return nil, fmt.Errorf("getting operation %s: %w", id, err)
	}
	return &op, nil
}

// WaitOperation long-polls until the operation ends or ctx is done. A failed
// or cancelled operation is returned together with an *OperationError. When
// ctx ends first the error wraps ctx.Err() (so errors.Is(err,
// context.DeadlineExceeded) holds) and names the operation; the operation is
// left running, since a wait is only a wait (the client's own methods do
// cancel what they started, see do).
func (c *Client) WaitOperation(ctx context.Context, id string) (*Operation, error) {
	return c.wait(ctx, id, nil)
}

// wait is WaitOperation starting from what is already known of the
// operation (its description, for errors), if anything.
func (c *Client) wait(ctx context.Context, id string, last *Operation) (*Operation, error) {
	for {
		if err := ctx.Err(); err != nil {
			return last, waitAbandoned(id, last, err)
		}
		chunk := waitChunk
		if dl, ok := ctx.Deadline(); ok {
			chunk = min(chunk, time.Until(dl))
		}
		// Incus takes whole seconds; round up so we never spin on timeout=0.
		secs := max(1, int(math.Ceil(chunk.Seconds())))
		var op Operation
		_, err := c.get(ctx, apiPath("operations", id, "wait"), url.Values{"timeout": {strconv.Itoa(secs)}}, &op)
		var se *StatusError
		if errors.As(err, &se) && ctx.Err() == nil {
			// incusd before 6.12 (Debian's 6.0.4, measured) answers a
			// long poll that timed out, and one whose operation failed,
			// with an error ("context deadline exceeded", or the
			// operation's own error): the operation itself says which.
			if now, gerr := c.Operation(ctx, id); gerr == nil {
				op, err = *now, nil
			}
		}
		if err != nil {
			if ctx.Err() != nil {
				return last, waitAbandoned(id, last, ctx.Err())
			}
			return last, fmt.Errorf("waiting for operation %s: %w", id, err)
		}
		if op.ID == "" {
			op.ID = id
		}
		last = &op
		if op.final() {
			return &op, op.result()
		}
	}
}

func waitAbandoned(id string, last *Operation, err error) error {
	if last != nil && last.Description != "" {
		return fmt.Errorf("incus: gave up waiting for operation %s (%s): %w", id, lowerFirst(last.Description), err)
	}
	return fmt.Errorf("incus: gave up waiting for operation %s: %w", id, err)
}

// CancelOperation asks incusd to cancel an operation. Many operations cannot
// be cancelled (Incus answers with an error); the caller decides whether that
// matters.
func (c *Client) CancelOperation(ctx context.Context, id string) error {
	if _, _, err := c.call(ctx, request{method: http.MethodDelete, path: apiPath("operations", id)}); err != nil {
		return fmt.Errorf("cancelling operation %s: %w", id, err)
	}
	return nil
}

// waitOrCancel waits for an operation this client started. If the caller
// gives up first, the operation is cancelled (best effort, on a short
// context of its own) so work nobody waits for does not keep running.
func (c *Client) waitOrCancel(ctx context.Context, op *Operation) (*Operation, error) {
	done, err := c.wait(ctx, op.ID, op)
	if err != nil && ctx.Err() != nil && !isOperationError(err) {
		cctx, cancel := cleanupContext(ctx)
		defer cancel()
		cerr := c.CancelOperation(cctx, op.ID)
		var se *StatusError
		switch {
		case cerr == nil:
			return done, fmt.Errorf("%w (operation cancelled)", err)
		case errors.As(cerr, &se):
			return done, fmt.Errorf("%w (could not cancel it: %s)", err, lowerFirst(se.Message))
		default:
			return done, fmt.Errorf("%w (could not cancel it: %v)", err, cerr)
		}
	}
	return done, err
}

func isOperationError(err error) bool {
	var oe *OperationError
	return errors.As(err, &oe)
}

// progressPoll is how often a watched operation is read for its progress.
const progressPoll = 500 * time.Millisecond

// DownloadProgress is the operation metadata key in which incusd reports
// an image it pulls from an image server ("rootfs: 45% (12.34MB/s)").
const DownloadProgress = "download_progress"

// ProgressText is what a running operation says of its progress: Incus
// keeps one line per stage in its metadata under a key ending in
// "_progress", DownloadProgress while it pulls an image, then
// "create_instance_from_image_unpack_progress" while it unpacks it. The
// download's line stays after it is done, so a later stage's wins; ""
// when there is none.
func ProgressText(meta map[string]any) string {
	var keys []string
	for k, v := range meta {
		if _, ok := v.(string); ok && strings.HasSuffix(k, "_progress") && k != DownloadProgress {
			keys = append(keys, k)
		}
	}
	if len(keys) == 0 {
		s, _ := meta[DownloadProgress].(string)
		return s
	}
	slices.Sort(keys)
	return meta[keys[0]].(string)
}

// doWatched is do, telling progress each new ProgressText of the
// operation while it runs (read every progressPoll; a long poll would only
// answer at its end). progress is not called once doWatched has returned.
func (c *Client) doWatched(ctx context.Context, r request, progress func(string)) (*Operation, error) {
	if progress == nil {
		return c.do(ctx, r)
	}
	op, err := c.start(ctx, r)
	if err != nil || op.final() {
		return op, err
	}
	wctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		last := ""
		t := time.NewTicker(progressPoll)
		defer t.Stop()
		for {
			select {
			case <-wctx.Done():
				return
			case <-t.C:
			}
			now, err := c.Operation(wctx, op.ID)
			if err != nil {
				continue // the wait reports what matters
			}
			if s := ProgressText(now.Metadata); s != "" && s != last && wctx.Err() == nil {
				last = s
				progress(s)
			}
		}
	}()
	defer func() { stop(); <-done }()
	return c.waitOrCancel(ctx, op)
}
