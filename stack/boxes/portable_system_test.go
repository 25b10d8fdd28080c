package boxes_test

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/drill/image"
	"github.com/box-isolation/box/stack/boxes"
	"github.com/box-isolation/box/stack/stacktest"
)

// An import lands on the member box runs on and gets an address of its
// slice, also beside its source, whose address its file carries.
func TestSystemClusterImportBesideItsSource(t *testing.T) {
	ctx, h, st := clusterWorld(t)
	sl := memberSlices(t, ctx, h)
	src, imp := stacktest.Name(t, "ca-exp-"), stacktest.Name(t, "ca-imp-")
	removeAtEnd(t, h, src, imp)
	_, err := boxes.NewManager(h).Mint(ctx, boxes.MintRequest{Name: src, Image: image.DefaultAlias, Target: st.Members[0].Name})
	require.NoError(t, err)
	srcAddr, _ := fixedAddress(t, ctx, h, src)

	file := filepath.Join(t.TempDir(), src+".tar.gz")
	w, err := os.Create(file)
	require.NoError(t, err)
	_, err = boxes.NewManager(h).Export(ctx, src, w)
	require.NoError(t, err)
	require.NoError(t, w.Close())
	start := time.Now()
	res, err := boxes.NewManager(h).Import(ctx, file, imp)
	require.NoError(t, err)
	t.Logf("imported beside its source in %s, on %s", time.Since(start).Round(time.Millisecond), res.Box.Member)
	a, inst := fixedAddress(t, ctx, h, imp)
	assert.True(t, sl[inst.Location].Contains(a), "%s is in %s's slice", a, inst.Location)
	assert.NotEqual(t, srcAddr, a, "not its source's")
	got, err := h.Addresses().Wait(ctx, imp, 30*time.Second)
	require.NoError(t, err)
	assert.Equal(t, a, got)
	srcGot, err := h.Addresses().Wait(ctx, src, 30*time.Second)
	require.NoError(t, err)
	assert.Equal(t, srcAddr, srcGot, "its source runs on with its own")
	assertClean(t, ctx, h)
}
