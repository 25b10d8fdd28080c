package converge

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/stack/incus"
)

// fakeObject is one object of a fake Incus, with a log of the calls made.
type fakeObject struct {
	cur      *incus.Profile
	readErr  error
	writeErr error
	want     map[string]string
	calls    []string
}

func (f *fakeObject) object() Object[incus.Profile] {
	return Object[incus.Profile]{
		What: "profile p",
		Read: func(context.Context) (*incus.Profile, string, error) {
			f.calls = append(f.calls, "read")
			if f.readErr != nil {
				return nil, "", f.readErr
			}
			if f.cur == nil {
				return nil, "", fmt.Errorf("getting profile p: %w", &incus.StatusError{Method: "GET", Path: "/1.0/profiles/p", Code: 404, Message: "not found"})
			}
			c := *f.cur
			return &c, "etag-1", nil
		},
		Create: func(context.Context) error {
			f.calls = append(f.calls, "create")
			if f.writeErr != nil {
				return f.writeErr
			}
			f.cur = &incus.Profile{Name: "p", Config: maps.Clone(f.want)}
			return nil
		},
		Remove: func(context.Context) error {
			f.calls = append(f.calls, "remove")
			f.cur = nil
			return nil
		},
		Differs: func(cur *incus.Profile) []string {
			if maps.Equal(cur.Config, f.want) {
				return nil
			}
			return []string{"config differs"}
		},
		Update: func(_ context.Context, _ *incus.Profile, etag string) error {
			f.calls = append(f.calls, "update "+etag)
			if f.writeErr != nil {
				return f.writeErr
			}
			f.cur = &incus.Profile{Name: "p", Config: maps.Clone(f.want)}
			return nil
		},
		Restore: func(_ context.Context, old incus.Profile) error {
			f.calls = append(f.calls, "restore")
			f.cur = &old
			return nil
		},
	}
}

// TestConverge: what converge does to one object, and that what it
// pushes backs exactly that out.
func TestConverge(t *testing.T) {
	want := map[string]string{"k": "v"}
	before := map[string]string{"k": "old", "other": "x"}
	for _, tc := range []struct {
		name       string
		cur        *incus.Profile
		readErr    error
		writeErr   error
		wantAction string
		wantDiff   []string
		wantErr    string
		wantCalls  []string
		undone     []string       // calls the back-out makes
		after      *incus.Profile // the object once backed out
	}{
		{name: "absent: created, and removed on a back-out",
			wantAction: "created", wantCalls: []string{"read", "create"}, undone: []string{"remove"}},
		{name: "as it should be: left alone, nothing to back out",
			cur: &incus.Profile{Name: "p", Config: want}, wantCalls: []string{"read"},
			after: &incus.Profile{Name: "p", Config: want}},
		{name: "differs: updated under the ETag read, and restored on a back-out",
			cur: &incus.Profile{Name: "p", Config: before}, wantAction: "updated", wantDiff: []string{"config differs"},
			wantCalls: []string{"read", "update etag-1"}, undone: []string{"restore"},
			after: &incus.Profile{Name: "p", Config: before}},
		{name: "a read that fails is an error, nothing done",
			readErr: errors.New("boom"), wantErr: "reading profile p: boom", wantCalls: []string{"read"}},
		{name: "a create that fails pushes nothing",
			writeErr: errors.New("refused"), wantErr: "creating profile p: refused", wantCalls: []string{"read", "create"}},
		{name: "an update that fails pushes nothing",
			cur: &incus.Profile{Name: "p", Config: before}, writeErr: errors.New("refused"), wantErr: "updating profile p: refused",
			wantCalls: []string{"read", "update etag-1"}, after: &incus.Profile{Name: "p", Config: before}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &fakeObject{cur: tc.cur, readErr: tc.readErr, writeErr: tc.writeErr, want: want}
			var undos Undos
			action, diff, err := Do(context.Background(), &undos, f.object())
			if tc.wantErr != "" {
				require.EqualError(t, err, tc.wantErr)
			} else {
				require.NoError(t, err)
			}
			assert.Equal(t, tc.wantAction, action)
			assert.Equal(t, tc.wantDiff, diff)
			assert.Equal(t, tc.wantCalls, f.calls)
			if tc.wantErr == "" && tc.wantAction != "" {
				assert.Equal(t, want, f.cur.Config, "converged")
			}

			f.calls = nil
			require.NoError(t, undos.Run(context.Background()))
			assert.Equal(t, tc.undone, f.calls, "the back-out")
			assert.Equal(t, tc.after, f.cur, "backed out, the object is as it was")
		})
	}
}

// TestUndoStackRunsNewestFirst: a back-out undoes the later steps first
// and runs every step even when one fails, naming it.
func TestUndoStackRunsNewestFirst(t *testing.T) {
	var order []string
	var u Undos
	for _, s := range []string{"a", "b", "c"} {
		u.Push("step "+s, func(context.Context) error {
			order = append(order, s)
			if s == "b" {
				return errors.New("stuck")
			}
			return nil
		})
	}
	err := u.Run(context.Background())
	assert.Equal(t, []string{"c", "b", "a"}, order)
	assert.EqualError(t, err, "backing out (step b): stuck")
}
