package boxes_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/box-isolation/box/stack/stacktest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/drill/image"
	"github.com/box-isolation/box/internal/testenv"
	"github.com/box-isolation/box/stack"
	"github.com/box-isolation/box/stack/boxes"
	"github.com/box-isolation/box/stack/incus"
)

// TestSystemMachineIDTemplate proves on this machine's incusd the template
// a VM clone gets its machine-id from (VMs cannot run here): Incus takes
// it, and renders the instance's own UUID into /etc/machine-id at the
// first start after a copy, and, as for an import, at the next start of
// an instance that is no fresh copy. In a container Incus writes it itself;
// in a VM its agent would (not proven here).
func TestSystemMachineIDTemplate(t *testing.T) {
	_, c := testenv.Incus(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	_, err := image.Ensure(ctx, c, image.DefaultAlias, image.Options{})
	require.NoError(t, err)
	src, dst := stacktest.Name(t, "t-mid-"), stacktest.Name(t, "t-mid-")
	for _, n := range []string{src, dst} {
		t.Cleanup(func() {
			_ = c.Instances().SetState(context.Background(), n, "stop", 0, true)
			_ = c.Instances().Delete(context.Background(), n)
		})
	}
	// No network: the template is all this is about.
	require.NoError(t, c.Instances().Create(ctx, incus.InstancesPost{Name: src, Type: "container", Profiles: []string{},
		Devices: map[string]map[string]string{"root": {"type": "disk", "path": "/", "pool": "default"}},
		Source:  incus.InstanceSource{Type: "image", Alias: image.DefaultAlias}}))
	require.NoError(t, c.Instances().Create(ctx, incus.InstancesPost{Name: dst, Type: "container", Profiles: []string{},
		Source: incus.InstanceSource{Type: "copy", Source: src}}))
	h := &stack.Host{Incus: c}

	ownID := func(name string) (uuid, mid string) {
		t.Helper()
		require.NoError(t, c.Instances().SetState(ctx, name, "start", 0, false))
		inst, _, err := c.Instances().Get(ctx, name)
		require.NoError(t, err)
		b, err := c.Instances().PullFile(ctx, name, "/etc/machine-id")
		require.NoError(t, err)
		require.NoError(t, c.Instances().SetState(ctx, name, "stop", 0, true))
		return inst.Config["volatile.uuid"], strings.TrimSpace(string(b))
	}

	require.NoError(t, boxes.MachineIDTemplateOf(h)(ctx, dst))
	md, _, err := c.Instances().Metadata(ctx, dst)
	require.NoError(t, err)
	assert.Equal(t, []string{"copy"}, md.Templates["/etc/machine-id"].When)
	uuid, mid := ownID(dst)
	require.NotEmpty(t, uuid)
	assert.Equal(t, strings.ReplaceAll(uuid, "-", ""), mid, "the copy's machine-id is its own UUID")

	// src has started once (its create templates ran): like an import, no
	// copy is pending; the template still runs at its next start.
	// (The probe image's init makes up a machine-id when it has none.)
	srcUUID, before := ownID(src)
	require.NoError(t, boxes.MachineIDTemplateOf(h)(ctx, src))
	_, after := ownID(src)
	assert.Equal(t, strings.ReplaceAll(srcUUID, "-", ""), after)
	assert.NotEqual(t, before, after)
	assert.NotEqual(t, mid, after, "source and copy differ")
}
