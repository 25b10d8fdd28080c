package boxes

import (
	"context"
	"errors"
	"io"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/stack"
	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/incus/incustest"
	"github.com/box-isolation/box/stack/model"
)

// boundaryOps is every stack operation that takes a box by name.
var boundaryOps = []struct {
	name string
	call func(ctx context.Context, h *stack.Host, box string) error
}{
	{"start", func(ctx context.Context, h *stack.Host, b string) error { return (&Manager{host: h}).Start(ctx, b) }},
	{"stop", func(ctx context.Context, h *stack.Host, b string) error {
		return (&Manager{host: h}).Stop(ctx, b, true)
	}},
	{"rename", func(ctx context.Context, h *stack.Host, b string) error {
		return (&Manager{host: h}).Rename(ctx, b, b+"-new")
	}},
	{"move", func(ctx context.Context, h *stack.Host, b string) error {
		_, err := (&Manager{host: h}).Move(ctx, b, "m2")
		return err
	}},
	{"snapshot", func(ctx context.Context, h *stack.Host, b string) error {
		_, err := (&Manager{host: h}).Snapshot(ctx, b, "s")
		return err
	}},
	{"snapshots", func(ctx context.Context, h *stack.Host, b string) error {
		_, err := (&Manager{host: h}).Snapshots(ctx, b)
		return err
	}},
	{"restore", func(ctx context.Context, h *stack.Host, b string) error {
		return (&Manager{host: h}).Restore(ctx, b, "s")
	}},
	{"remove", func(ctx context.Context, h *stack.Host, b string) error { return (&Manager{host: h}).Remove(ctx, b) }},
	{"clone", func(ctx context.Context, h *stack.Host, b string) error {
		_, err := (&Manager{host: h}).Clone(ctx, b, "", b+"-copy")
		return err
	}},
	{"info", func(ctx context.Context, h *stack.Host, b string) error {
		_, err := stack.Info(ctx, h.Incus, b)
		return err
	}},
	{"expose", func(ctx context.Context, h *stack.Host, b string) error {
		_, err := (&Doors{host: h}).Expose(ctx, b, model.DoorSpec{Port: 80, Kind: model.DoorTCP})
		return err
	}},
	{"doors", func(ctx context.Context, h *stack.Host, b string) error {
		_, err := (&Doors{host: h}).ListDoors(ctx, b)
		return err
	}},
	{"unexpose", func(ctx context.Context, h *stack.Host, b string) error {
		return (&Doors{host: h}).Unexpose(ctx, b, 80)
	}},
	{"export", func(ctx context.Context, h *stack.Host, b string) error {
		_, err := (&Manager{host: h}).Export(ctx, b, io.Discard)
		return err
	}},
	{"migrate", func(ctx context.Context, h *stack.Host, b string) error {
		_, err := h.Migrate(ctx, stack.MigrateRequest{Box: b})
		return err
	}},
}

// TestBoundaryUnit: against a fake incusd, every operation on an untagged
// instance is refused with the reason, and nothing but reads reaches the
// daemon.
func TestBoundaryUnit(t *testing.T) {
	for _, op := range boundaryOps {
		t.Run(op.name, func(t *testing.T) {
			srv := incustest.New(t)
			srv.Handle("GET /1.0/instances/{name}", func(w http.ResponseWriter, r *http.Request) {
				if r.PathValue("name") != "stranger" {
					incustest.Error(w, http.StatusNotFound, "Instance not found")
					return
				}
				incustest.SyncETag(w, `"e1"`, map[string]any{"name": "stranger", "status": "Running", "config": map[string]string{"user.other": "1"}})
			})
			h := &stack.Host{Incus: incus.New(srv.Socket())}
			err := op.call(context.Background(), h, "stranger")
			var nab *stack.NotABoxError
			require.True(t, errors.As(err, &nab), "%s on an untagged instance: %v", op.name, err)
			assert.Contains(t, err.Error(), "user.box=1")
			for _, r := range srv.Requests() {
				assert.Equal(t, http.MethodGet, r.Method, "%s sent %s %s to an instance it did not mint", op.name, r.Method, r.Path)
			}

			err = op.call(context.Background(), h, "nobody")
			var nsb *stack.NoSuchBoxError
			assert.True(t, errors.As(err, &nsb), "%s on a missing instance: %v", op.name, err)
		})
	}
}
