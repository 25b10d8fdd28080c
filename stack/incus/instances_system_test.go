package incus_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/drill/image"
	"github.com/box-isolation/box/internal/testenv"
	"github.com/box-isolation/box/stack/incus"
)

// System tier: the client against the hermetic world's real incusd.

func systemClient(t *testing.T) (context.Context, *incus.Client, string) {
	t.Helper()
	_, c := testenv.Incus(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	_, err := image.Ensure(ctx, c, image.DefaultAlias, image.Options{})
	require.NoError(t, err)
	b := make([]byte, 3)
	_, err = rand.Read(b)
	require.NoError(t, err)
	return ctx, c, "t-inc-" + hex.EncodeToString(b)
}

// removeInstances deletes test instances whatever state they are in.
func removeInstances(t *testing.T, c *incus.Client, names ...string) {
	t.Helper()
	t.Cleanup(func() {
		ctx := context.Background()
		for _, n := range names {
			c.Instances().SetState(ctx, n, "stop", 0, true) //nolint:errcheck
			if err := c.Instances().Delete(ctx, n); err != nil && !incus.IsNotFound(err) {
				t.Errorf("cleanup: %v", err)
			}
		}
	})
}

func TestSystemInstanceLifecycle(t *testing.T) {
	ctx, c, name := systemClient(t)
	clone, renamed := name+"-copy", name+"-moved"
	removeInstances(t, c, name, clone, renamed)

	tag := map[string]string{"user.box-test": name}
	require.NoError(t, c.Instances().Create(ctx, incus.InstancesPost{
		Name: name, Type: "container", Start: true, Config: tag,
		Source: incus.InstanceSource{Type: "image", Alias: image.DefaultAlias},
	}))
	err := c.Instances().Create(ctx, incus.InstancesPost{
		Name: name, Type: "container", Source: incus.InstanceSource{Type: "image", Alias: image.DefaultAlias},
	})
	assert.True(t, incus.IsAlreadyExists(err), "creating it twice: %v", err)

	// The server-side filter finds exactly this instance.
	list, err := c.Instances().List(ctx, tag)
	require.NoError(t, err)
	require.Len(t, list, 1)
	assert.Equal(t, name, list[0].Name)
	assert.Equal(t, "Running", list[0].Status)

	// Exec: exit code, stdout and stderr kept apart; the user is honoured.
	res, err := c.Instances().Exec(ctx, name, incus.ExecRequest{Command: []string{"sh", "-c", "echo out; echo err >&2; exit 3"}})
	require.NoError(t, err)
	assert.Equal(t, 3, res.ExitCode)
	assert.Equal(t, "out\n", string(res.Stdout))
	assert.Equal(t, "err\n", string(res.Stderr))
	res, err = c.Instances().Exec(ctx, name, incus.ExecRequest{Command: []string{"id", "-u"}, User: 1000, Group: 1000})
	require.NoError(t, err)
	assert.Equal(t, "1000\n", string(res.Stdout))
	res, err = c.Instances().Exec(ctx, name, incus.ExecRequest{Command: []string{"sh", "-c", "cat; echo eof"}})
	require.NoError(t, err)
	assert.Equal(t, "eof\n", string(res.Stdout), "stdin is closed")

	// A command past its deadline is abandoned with DeadlineExceeded.
	short, cancel := context.WithTimeout(ctx, time.Second)
	_, err = c.Instances().Exec(short, name, incus.ExecRequest{Command: []string{"sleep", "30"}})
	cancel()
	assert.True(t, errors.Is(err, context.DeadlineExceeded), "exec past its deadline: %v", err)

	// Push a binary file with mode and owner, then read it back.
	payload := append([]byte("box\x00probe\n"), bytes.Repeat([]byte{0xff, 0x00}, 4096)...)
	require.NoError(t, c.Instances().PushFile(ctx, name, "/home/box/payload", bytes.NewReader(payload), 0o640, 1000, 1000))
	got, err := c.Instances().PullFile(ctx, name, "/home/box/payload")
	require.NoError(t, err)
	assert.Equal(t, payload, got)
	res, err = c.Instances().Exec(ctx, name, incus.ExecRequest{Command: []string{"stat", "-c", "%a %u %g", "/home/box/payload"}})
	require.NoError(t, err)
	assert.Equal(t, "640 1000 1000\n", string(res.Stdout))
	_, err = c.Instances().PullFile(ctx, name, "/home/box/nothing-here")
	assert.True(t, incus.IsNotFound(err), "pulling a missing file: %v", err)

	// Snapshot, then change the box, then copy from the snapshot: the copy
	// has the file as it was at the snapshot. The snapshot is taken stopped:
	// a running container's snapshot freezes it first, and these machines
	// have no usable freezer cgroup (incusd: "freezing the container
	// failed").
	require.NoError(t, c.Instances().SetState(ctx, name, "stop", 30*time.Second, false))
	require.NoError(t, c.Instances().CreateSnapshot(ctx, name, "snap0"))
	require.NoError(t, c.Instances().SetState(ctx, name, "start", 0, false))
	snaps, err := c.Instances().Snapshots(ctx, name)
	require.NoError(t, err)
	require.Len(t, snaps, 1)
	assert.Equal(t, "snap0", snaps[0].Name)
	require.NoError(t, c.Instances().PushFile(ctx, name, "/home/box/after", strings.NewReader("after\n"), 0o644, 0, 0))

	require.NoError(t, c.Instances().Create(ctx, incus.InstancesPost{
		Name: clone, Type: "container", Start: true,
		Source: incus.InstanceSource{Type: "copy", Source: name + "/snap0"},
	}))
	got, err = c.Instances().PullFile(ctx, clone, "/home/box/payload")
	require.NoError(t, err)
	assert.Equal(t, payload, got, "the copy carries the snapshot's file")
	_, err = c.Instances().PullFile(ctx, clone, "/home/box/after")
	assert.True(t, incus.IsNotFound(err), "the copy is from before the change: %v", err)

	// Restore brings the box back to the snapshot.
	require.NoError(t, c.Instances().RestoreSnapshot(ctx, name, "snap0"))
	_, err = c.Instances().PullFile(ctx, name, "/home/box/after")
	assert.True(t, incus.IsNotFound(err), "restored: %v", err)

	// Rename: a conflict while running, done once stopped.
	err = c.Instances().Rename(ctx, name, renamed)
	require.Error(t, err)
	assert.True(t, incus.IsConflict(err), "renaming a running instance: %v", err)
	require.NoError(t, c.Instances().SetState(ctx, name, "stop", 30*time.Second, false))
	require.NoError(t, c.Instances().Rename(ctx, name, renamed))
	_, _, err = c.Instances().Get(ctx, name)
	assert.True(t, incus.IsNotFound(err), "the old name is gone: %v", err)
	moved, etag, err := c.Instances().Get(ctx, renamed)
	require.NoError(t, err)
	assert.Equal(t, "Stopped", moved.Status)
	snaps, err = c.Instances().Snapshots(ctx, renamed)
	require.NoError(t, err)
	require.Len(t, snaps, 1, "the snapshot follows the rename")

	// Update config with the ETag; a stale ETag is refused.
	put := moved.Writable()
	put.Config["user.box-test-note"] = "updated"
	require.NoError(t, c.Instances().Update(ctx, renamed, put, etag))
	err = c.Instances().Update(ctx, renamed, put, etag)
	assert.True(t, incus.IsPreconditionFailed(err), "a stale etag: %v", err)
	after, _, err := c.Instances().Get(ctx, renamed)
	require.NoError(t, err)
	assert.Equal(t, "updated", after.Config["user.box-test-note"])

	// Delete: the snapshot first, then both instances.
	require.NoError(t, c.Instances().DeleteSnapshot(ctx, renamed, "snap0"))
	require.NoError(t, c.Instances().Delete(ctx, renamed))
	require.NoError(t, c.Instances().SetState(ctx, clone, "stop", 0, true))
	require.NoError(t, c.Instances().Delete(ctx, clone))
	for _, n := range []string{renamed, clone} {
		_, _, err := c.Instances().Get(ctx, n)
		assert.True(t, incus.IsNotFound(err), "%s deleted: %v", n, err)
	}
	err = c.Instances().Delete(ctx, renamed)
	assert.True(t, incus.IsNotFound(err), "deleting twice: %v", err)
}
