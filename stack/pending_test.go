package stack

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/box-isolation/box/stack/incus"
)

// TestPendingFindingNamesTheFix: doctor --fix where nothing is on the
// Pending bridge (box's profile naming it is box's to remake), the incus
// command where boxes are, and never "restart incusd".
func TestPendingFindingNamesTheFix(t *testing.T) {
	bare := pendingFinding(&incus.Network{Name: "boxnet", Status: networkPending,
		UsedBy: []string{"/1.0/profiles/box-net", "/1.0/profiles/box-net?project=user-1000"}})
	assert.Contains(t, bare.Fix, "box doctor --fix")
	assert.NotContains(t, bare.Fix, "restart incusd")

	used := pendingFinding(&incus.Network{Name: "boxnet", Status: networkPending,
		UsedBy: []string{"/1.0/profiles/box-net", "/1.0/instances/a1", "/1.0/instances/b2?project=user-1000"}})
	assert.Contains(t, used.Problem, "a1, b2 (project user-1000)")
	assert.Contains(t, used.Fix, `incus admin sql global "UPDATE networks_nodes SET state=1 WHERE network_id=(SELECT id FROM networks WHERE name='boxnet')"`)
}

func TestPendingUsers(t *testing.T) {
	inst, profs, refs := pendingUsers([]string{"/1.0/instances/a1", "/1.0/profiles/box-net?project=user-1000", "/1.0/profiles/mine"})
	assert.Equal(t, []string{"a1"}, inst)
	assert.Equal(t, []string{"box-net (project user-1000)", "mine"}, profs)
	assert.Equal(t, [][2]string{{"user-1000", "box-net"}, {"default", "mine"}}, refs)
}
