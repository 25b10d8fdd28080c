package boxes_test

import (
	"context"
	"errors"
	"testing"

	"github.com/box-isolation/box/stack/stacktest/worldtest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/drill/image"
	"github.com/box-isolation/box/stack"
	"github.com/box-isolation/box/stack/boxes"
	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/stacktest"
)

func TestSystemBoundary(t *testing.T) {
	ctx, h, _ := worldtest.Host(t)
	_, err := h.Ensure(ctx)
	require.NoError(t, err)
	name := stacktest.Name(t, "t-stranger-")
	require.NoError(t, h.Incus.Instances().Create(ctx, incus.InstancesPost{
		Name: name, Type: "container", Start: true, Profiles: []string{"box-net"},
		Config: map[string]string{"user.other": "1"},
		Source: incus.InstanceSource{Type: "image", Alias: image.DefaultAlias},
	}))
	t.Cleanup(func() {
		h.Incus.Instances().SetState(context.Background(), name, "stop", 0, true) //nolint:errcheck
		h.Incus.Instances().Delete(context.Background(), name)                    //nolint:errcheck
	})
	before, _, err := h.Incus.Instances().Get(ctx, name)
	require.NoError(t, err)

	ops := []struct {
		name string
		call func() error
	}{
		{"stop", func() error { return boxes.NewManager(h).Stop(ctx, name, true) }},
		{"start", func() error { return boxes.NewManager(h).Start(ctx, name) }},
		{"rename", func() error { return boxes.NewManager(h).Rename(ctx, name, name+"-x") }},
		{"snapshot", func() error { _, err := boxes.NewManager(h).Snapshot(ctx, name, "s"); return err }},
		{"restore", func() error { _, err := boxes.NewManager(h).Restore(ctx, name, "s", false); return err }},
		{"remove", func() error { return boxes.NewManager(h).Remove(ctx, name) }},
		{"clone", func() error { _, err := boxes.NewManager(h).Clone(ctx, name, "", name+"-c"); return err }},
		{"migrate", func() error { _, err := h.Migrate(ctx, stack.MigrateRequest{Box: name}); return err }},
	}
	for _, op := range ops {
		err := op.call()
		var nab *stack.NotABoxError
		assert.True(t, errors.As(err, &nab), "%s: %v", op.name, err)
		if err != nil {
			assert.Contains(t, err.Error(), "no user.box=1 tag", op.name)
		}
	}
	after, _, err := h.Incus.Instances().Get(ctx, name)
	require.NoError(t, err)
	assert.Equal(t, "Running", after.Status, "still running")
	assert.Equal(t, before.Config, after.Config, "config untouched")
	snaps, err := h.Incus.Instances().Snapshots(ctx, name)
	require.NoError(t, err)
	assert.Empty(t, snaps)
	boxes, err := stack.Boxes(ctx, h.Incus)
	require.NoError(t, err)
	for _, b := range boxes {
		assert.NotEqual(t, name, b.Name, "an untagged instance is never listed as a box")
	}
}
