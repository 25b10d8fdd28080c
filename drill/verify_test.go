package drill

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/stack/model"
)

func claimFor(t *testing.T, id ClaimID) Claim {
	t.Helper()
	c, ok := ClaimByID(id)
	require.True(t, ok, id)
	return c
}

func TestStackResults(t *testing.T) {
	bridgeGone := model.Finding{Layer: "L-BRIDGEDROP", Object: "nft table bridge box", Problem: "missing", Fix: "box doctor --fix"}
	dockerFwd := model.Finding{Layer: "L-NAT", Object: "nft ip filter FORWARD", Problem: "drops forwarded traffic", Fix: "iptables -I DOCKER-USER ...", Advisory: true}
	legacy := model.Finding{Layer: model.LayerStack, Object: "profile claude-dev", Problem: "legacy generation still present", Fix: "box migrate-host", Advisory: true}
	profileDevice := model.Finding{Layer: model.LayerStack, Object: "profile box-net", Problem: "device gpu is not in the desired profile", Fix: "box doctor --fix"}
	all := []model.Finding{bridgeGone, dockerFwd, legacy, profileDevice}

	sib := stackResults(claimFor(t, "C-SIBLING"), all)
	require.Len(t, sib, 1)
	assert.Equal(t, Fail, sib[0].Verdict)
	assert.Equal(t, ChannelStack, sib[0].Channel)
	assert.Contains(t, sib[0].Evidence, "nft table bridge box: missing (fix: box doctor --fix)")
	assert.Equal(t, "s-C-SIBLING-1", sib[0].ID)

	egress := stackResults(claimFor(t, "C-EGRESS"), all)
	require.Len(t, egress, 1)
	assert.Equal(t, Pass, egress[0].Verdict, "another firewall's forward policy is advisory: it fails no claim")

	clone := stackResults(claimFor(t, "C-CLONE"), all)
	require.Len(t, clone, 1, "the legacy leftover is advisory, the profile's extra device is not")
	assert.Equal(t, Fail, clone[0].Verdict)
	assert.Contains(t, clone[0].Evidence, "device gpu")

	host := stackResults(claimFor(t, "C-HOST"), nil)
	require.Len(t, host, 1)
	assert.Equal(t, Pass, host[0].Verdict)
	assert.Contains(t, host[0].Evidence, "L-HOSTFW, L-ACL")

	// Two findings on one claim's layers are two failed results.
	two := stackResults(claimFor(t, "C-SIBLING"), []model.Finding{bridgeGone, {Layer: "L-PORTISO", Object: "bridge port veth1", Problem: "isolated is off"}})
	require.Len(t, two, 2)
	assert.NotEqual(t, two[0].ID, two[1].ID)

	// Aggregated with passing probes, a stack failure fails the claim.
	cr := aggregate(claimFor(t, "C-SIBLING"), append([]Result{{Action: Action{ID: "p010", Channel: "tcp"}, Verdict: Pass}}, sib...))
	assert.Equal(t, Fail, cr.Verdict)
}

func TestStackRuleSaysWhatFailsAClaim(t *testing.T) {
	assert.Contains(t, claimFor(t, "C-SIBLING").StackRule(), "L-PORTISO or L-BRIDGEDROP")
	assert.Contains(t, claimFor(t, "C-CLONE").StackRule(), "the stack as a whole")
	for _, c := range Catalogue {
		assert.Contains(t, c.StackRule(), "advisory findings", c.ID)
	}
}

func TestMergeFindings(t *testing.T) {
	a := model.Finding{Layer: "L-V6", Object: "network boxnet", Problem: "ipv6.address is set", Fix: "box doctor --fix"}
	b := model.Finding{Layer: "L-ACL", Object: "acl box-isolate", Problem: "missing", Fix: "box doctor --fix"}
	assert.Equal(t, []model.Finding{a, b}, mergeFindings([]model.Finding{a}, []model.Finding{a, b}), "a finding of either pass, each once")
	assert.Equal(t, []model.Finding{}, mergeFindings(nil, nil))
}
