package stack

import (
	"context"
	"errors"
	"fmt"

	"github.com/box-isolation/box/stack/incus"
)

// undo is a step to back out if a later one fails.
type undo struct {
	what string
	fn   func(context.Context) error
}

// undoStack holds the back-out steps of a run, undone newest first.
type undoStack []undo

func (u *undoStack) push(what string, fn func(context.Context) error) {
	*u = append(*u, undo{what, fn})
}

// run backs out every step, newest first, and says which failed.
func (u undoStack) run(ctx context.Context) error {
	var errs []error
	for i := len(u) - 1; i >= 0; i-- {
		if err := u[i].fn(ctx); err != nil {
			errs = append(errs, fmt.Errorf("backing out (%s): %w", u[i].what, err))
		}
	}
	return errors.Join(errs...)
}

// incusObject is one Incus object a run makes what it should be (Ensure's
// ACL, bridge and profile; Grant's project and profiles): how to read it,
// create it, change it, and back out each.
type incusObject[T any] struct {
	what string // "profile box-net": in errors and back-out steps
	// read returns the object and its ETag; an absent object is a nil
	// object with a nil error or a not-found error.
	read   func(context.Context) (*T, string, error)
	create func(context.Context) error
	remove func(context.Context) error // backs out create
	// differs says how the live object differs from the wanted one; empty
	// leaves it alone.
	differs func(cur *T) []string
	// update makes it the wanted one, guarded by the ETag read. It must
	// not change cur: restore gets a copy of it taken before.
	update  func(ctx context.Context, cur *T, etag string) error
	restore func(ctx context.Context, old T) error // backs out update
}

// converge creates o where it is absent and updates it where it differs,
// and pushes onto undos the step that backs that out: a created object is
// removed, an updated one gets its old self back. It returns what it did
// ("created", "updated" or "") and, for an update, how the object differed.
func converge[T any](ctx context.Context, undos *undoStack, o incusObject[T]) (action string, diff []string, err error) {
	cur, etag, err := o.read(ctx)
	if err != nil && !incus.IsNotFound(err) {
		return "", nil, fmt.Errorf("reading %s: %w", o.what, err)
	}
	if err != nil || cur == nil {
		if err := o.create(ctx); err != nil {
			return "", nil, fmt.Errorf("creating %s: %w", o.what, err)
		}
		undos.push("deleting "+o.what, o.remove)
		return "created", nil, nil
	}
	if diff = o.differs(cur); len(diff) == 0 {
		return "", nil, nil
	}
	old := *cur
	if err := o.update(ctx, cur, etag); err != nil {
		return "", nil, fmt.Errorf("updating %s: %w", o.what, err)
	}
	undos.push("restoring "+o.what, func(ctx context.Context) error { return o.restore(ctx, old) })
	return "updated", diff, nil
}
