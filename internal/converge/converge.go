// Package converge makes Incus objects what a run wants them to be and
// backs a failed run out: an object absent is created, one that differs is
// updated, and each step pushes the step that undoes it, so a later
// failure leaves the host as it was (Undos.Run, newest first).
package converge

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

// Undos holds the back-out steps of a run, undone newest first.
type Undos []undo

// Push adds a back-out step.
func (u *Undos) Push(what string, fn func(context.Context) error) {
	*u = append(*u, undo{what, fn})
}

// Run backs out every step, newest first, and says which failed.
func (u Undos) Run(ctx context.Context) error {
	var errs []error
	for i := len(u) - 1; i >= 0; i-- {
		if err := u[i].fn(ctx); err != nil {
			errs = append(errs, fmt.Errorf("backing out (%s): %w", u[i].what, err))
		}
	}
	return errors.Join(errs...)
}

// Object is one Incus object a run makes what it should be (Ensure's
// ACL, bridge and profile; Grant's project and profiles): how to read it,
// create it, change it, and back out each.
type Object[T any] struct {
	What string // "profile box-net": in errors and back-out steps
	// read returns the object and its ETag; an absent object is a nil
	// object with a nil error or a not-found error.
	Read   func(context.Context) (*T, string, error)
	Create func(context.Context) error
	Remove func(context.Context) error // backs out create
	// differs says how the live object differs from the wanted one; empty
	// leaves it alone.
	Differs func(cur *T) []string
	// update makes it the wanted one, guarded by the ETag read. It must
	// not change cur: restore gets a copy of it taken before.
	Update  func(ctx context.Context, cur *T, etag string) error
	Restore func(ctx context.Context, old T) error // backs out update
}

// Do creates o where it is absent and updates it where it differs,
// and pushes onto undos the step that backs that out: a created object is
// removed, an updated one gets its old self back. It returns what it did
// ("created", "updated" or "") and, for an update, how the object differed.
func Do[T any](ctx context.Context, undos *Undos, o Object[T]) (action string, diff []string, err error) {
	cur, etag, err := o.Read(ctx)
	if err != nil && !incus.IsNotFound(err) {
		return "", nil, fmt.Errorf("reading %s: %w", o.What, err)
	}
	if err != nil || cur == nil {
		if err := o.Create(ctx); err != nil {
			return "", nil, fmt.Errorf("creating %s: %w", o.What, err)
		}
		undos.Push("deleting "+o.What, o.Remove)
		return "created", nil, nil
	}
	if diff = o.Differs(cur); len(diff) == 0 {
		return "", nil, nil
	}
	old := *cur
	if err := o.Update(ctx, cur, etag); err != nil {
		return "", nil, fmt.Errorf("updating %s: %w", o.What, err)
	}
	undos.Push("restoring "+o.What, func(ctx context.Context) error { return o.Restore(ctx, old) })
	return "updated", diff, nil
}
