package boxes_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/drill/image"
	"github.com/box-isolation/box/stack"
	"github.com/box-isolation/box/stack/boxes"
	"github.com/box-isolation/box/stack/hostns"
	"github.com/box-isolation/box/stack/model"
	"github.com/box-isolation/box/stack/stacktest"
	"github.com/box-isolation/box/stack/stacktest/worldtest"
)

// A new box's address is picked from what the kernel holds (the pins,
// dnsmasq's leases), not from a list of every instance: a stopped box's
// fixed address is in neither once its lease is gone. The new box must
// still never get it, and the stopped box must start again at its own.
func TestSystemMintSkipsAStoppedBoxsAddress(t *testing.T) {
	ctx, h, _ := worldtest.Host(t)
	_, err := h.Ensure(ctx)
	require.NoError(t, err)
	mgr := boxes.NewManager(h)
	mint := func(prefix string) (string, *stack.Box) {
		name := stacktest.Name(t, prefix)
		t.Cleanup(func() { _ = mgr.Remove(context.Background(), name) })
		b, err := mgr.Mint(ctx, boxes.MintRequest{Name: name, Image: image.DefaultAlias})
		require.NoError(t, err)
		return name, b
	}
	fixed := func(name string) string {
		inst, _, err := h.Incus.Instances().Get(ctx, name)
		require.NoError(t, err)
		return model.FixedAddressOf(inst).String()
	}
	stopped, _ := mint("t-stopped-")
	addr := fixed(stopped)
	_, err = h.Addresses().Wait(ctx, stopped, 30*time.Second)
	require.NoError(t, err)
	require.NoError(t, mgr.Stop(ctx, stopped, true))
	// Its lease released too, as its lease time running out would: the
	// kernel then holds nothing of its address.
	pool, err := h.Addresses().DHCPLeases()
	require.NoError(t, err)
	var its []stack.DHCPLease
	for _, l := range pool.Leases {
		if l.Address.String() == addr {
			its = append(its, l)
		}
	}
	left, err := h.Addresses().ReleaseLeases(ctx, its)
	require.NoError(t, err)
	require.Empty(t, left, "the stopped box's lease is released")

	// As another process's mint would, knowing nothing of what this one
	// handed out.
	hostns.ForgetGiven(h.NetNS)
	newer, _ := mint("t-newer-")
	assert.NotEqual(t, addr, fixed(newer), "the new box never gets the stopped box's fixed address")
	require.NoError(t, mgr.Start(ctx, stopped))
	assert.Equal(t, addr, fixed(stopped), "the stopped box starts again at its own address")
	got, err := h.Addresses().Wait(ctx, stopped, 30*time.Second)
	require.NoError(t, err)
	assert.Equal(t, addr, got.String())
}
