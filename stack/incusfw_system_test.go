package stack_test

import (
	"strings"
	"testing"

	"github.com/box-isolation/box/stack/stacktest/worldtest"

	"github.com/google/nftables"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/stack/model"
	"github.com/box-isolation/box/stack/nft"
)

// Incus's own table gone from the kernel (what another tool's flush ruleset
// leaves) is a finding per chain the stack needs, and Ensure has Incus write
// it again.
func TestSystemIncusFirewallGoneIsFoundAndHealed(t *testing.T) {
	ctx, h, st := worldtest.Host(t)
	_, err := h.Ensure(ctx)
	require.NoError(t, err)
	v, err := h.Verify(ctx)
	require.NoError(t, err)
	require.Empty(t, v.Findings, "clean after setup")

	conn, cfg := worldtest.NFT(t, st)
	before, present, err := nft.IncusChains(cfg)
	require.NoError(t, err)
	require.True(t, present, "Incus wrote inet incus")
	conn.DelTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: nft.IncusTable})
	require.NoError(t, conn.Flush(), "deleting table inet incus")

	v, err = h.Verify(ctx)
	require.NoError(t, err)
	found := map[string]model.LayerID{}
	for _, f := range v.Findings {
		t.Logf("finding: %s", f)
		found[f.Object] = f.Layer
		assert.Contains(t, f.Fix, "box doctor --fix", "finding %s names its fix", f)
	}
	for chain, layer := range map[string]model.LayerID{
		"acl.boxnet": model.LayerACL, "aclin.boxnet": model.LayerACL, "aclout.boxnet": model.LayerACL,
		"aclfwd.boxnet": model.LayerACL, "pstrt.boxnet": model.LayerNAT,
	} {
		assert.Equal(t, layer, found["nft chain inet incus "+chain], "Verify names the missing chain %s under its layer", chain)
	}

	rep, err := h.Ensure(ctx)
	require.NoError(t, err)
	var changed []string
	for _, c := range rep.Changes {
		changed = append(changed, c.String())
	}
	t.Logf("repairs:\n%s", strings.Join(changed, "\n"))
	assert.Contains(t, strings.Join(changed, "\n"), "inet incus", "Ensure says it had Incus rewrite its table")
	after, present, err := nft.IncusChains(cfg)
	require.NoError(t, err)
	require.True(t, present, "inet incus is back")
	assert.Equal(t, before, after, "the same chains with the same number of rules")
	v, err = h.Verify(ctx)
	require.NoError(t, err)
	assert.Empty(t, v.Findings, "clean after the repair")
}
