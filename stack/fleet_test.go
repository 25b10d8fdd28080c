package stack

import (
	"testing"

	"github.com/box-isolation/box/stack/stacktest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/model"
)

func TestCensusStartsFromTheBridge(t *testing.T) {
	elsewhere := stacktest.FleetInst("lan", func(i *incus.Instance) {
		i.ExpandedDevices["eth0"] = map[string]string{"type": "nic", "network": "incusbr0"}
	})
	c := model.TakeCensus("boxnet", []incus.Instance{stacktest.FleetInst("a", nil), elsewhere},
		[]string{"veth-a", "vethstray"}, map[string]model.KernelPort{"veth-a": {Exists: true, Master: "boxnet", Isolated: true}},
		[]string{"veth-a", "vethstray"}, true, "")
	require.Len(t, c.Siblings, 2, "the box on boxnet and the stray port; the instance on another bridge is none of the census's business")
	stray := c.Siblings[0]
	assert.Equal(t, "port vethstray", stray.Label())
	assert.Contains(t, stray.Problems[0].What, "no instance claims it")

	orphan := model.TakeCensus("boxnet", nil, []string{"vethleft"}, map[string]model.KernelPort{"vethleft": {Exists: true, Master: "boxnet", Isolated: true, Peer: "vethpeer"}}, nil, true, "")
	assert.Contains(t, orphan.Siblings[0].Problems[0].What, "its other end vethpeer is in the host's namespace")
	assert.Equal(t, "ip link del vethleft (removes both ends)", orphan.Siblings[0].Problems[0].Fix)

	boxes := []Box{{Name: "a"}, {Name: "lan"}}
	markOnStack(c, "", boxes)
	require.NotNil(t, boxes[0].OnStack)
	assert.True(t, *boxes[0].OnStack)
	require.NotNil(t, boxes[1].OnStack)
	assert.False(t, *boxes[1].OnStack)
	assert.Equal(t, []string{"has no NIC on boxnet"}, boxes[1].OffStack)
}
