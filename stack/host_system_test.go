package stack_test

import (
	"strings"
	"testing"

	"github.com/box-isolation/box/stack/stacktest/worldtest"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/stack/model"
)

// TestSystemDockerForwardDrop: a Docker-style FORWARD drop policy in the
// host namespace is found by Verify and announced by Ensure, with the
// commands that let boxes out, and nothing of Docker's is changed.
func TestSystemDockerForwardDrop(t *testing.T) {
	ctx, h, st := worldtest.Host(t)
	conn, _ := worldtest.NFT(t, st)
	filter := conn.AddTable(&nftables.Table{Family: nftables.TableFamilyIPv4, Name: "filter"})
	drop := nftables.ChainPolicyDrop
	conn.AddChain(&nftables.Chain{Name: "FORWARD", Table: filter, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &drop})
	conn.AddChain(&nftables.Chain{Name: "DOCKER-USER", Table: filter})
	require.NoError(t, conn.Flush())
	t.Cleanup(func() {
		conn.DelTable(filter)
		conn.Flush() //nolint:errcheck
	})

	rep, err := h.Ensure(ctx)
	require.NoError(t, err)
	notes := strings.Join(rep.Notes, "\n")
	assert.Contains(t, notes, "table ip filter chain FORWARD (policy drop) set by docker")
	assert.Contains(t, notes, "iptables -I DOCKER-USER -i boxnet -j ACCEPT")
	v, err := h.Verify(ctx)
	require.NoError(t, err)
	found := false
	for _, f := range v.Findings {
		if strings.Contains(f.Object, "chain FORWARD") {
			found = true
			assert.Equal(t, model.LayerNAT, f.Layer)
		}
	}
	assert.True(t, found, "Verify names the blocker: %v", v.Findings)
	chains, err := conn.ListChainsOfTableFamily(nftables.TableFamilyIPv4)
	require.NoError(t, err)
	assert.Len(t, chains, 2, "Docker's chains are untouched")

	// The operator lets boxnet through in DOCKER-USER: no more finding.
	var user *nftables.Chain
	for _, ch := range chains {
		if ch.Name == "DOCKER-USER" {
			user = ch
		}
	}
	require.NotNil(t, user)
	conn.AddRule(&nftables.Rule{Table: filter, Chain: user, Exprs: []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte("boxnet\x00")},
		&expr.Verdict{Kind: expr.VerdictAccept},
	}})
	require.NoError(t, conn.Flush())
	v, err = h.Verify(ctx)
	require.NoError(t, err)
	for _, f := range v.Findings {
		assert.NotContains(t, f.Object, "chain FORWARD", "boxnet is let through now")
	}
}
