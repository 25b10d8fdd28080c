package drill

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/box-isolation/box/stack/model"
)

func TestTierBoxFindingsAreOnlyBoxTsIsolation(t *testing.T) {
	fs := []model.Finding{
		{Layer: model.LayerFleet, Object: "box drill-1-t (project user-993)", Problem: `NIC eth0 has port isolation off (security.port_isolation="false")`},
		{Layer: model.LayerFleet, Object: "box drill-1-t (project user-993)", Problem: "has a proxy device door"},
		{Layer: model.LayerFleet, Object: "box work (project user-993)", Problem: `NIC eth0 has port isolation off (security.port_isolation="false")`},
		{Layer: model.LayerFleet, Object: "box drill-1-t", Problem: `NIC eth0 has port isolation off (security.port_isolation="false")`},
		{Layer: "L-PORTISO", Object: "bridge port veth1 (drill-1-t, project user-993)", Problem: "port isolation off"},
	}
	got := tierBoxFindings(fs, "user-993", "drill-1-t")
	assert.Equal(t, fs[:1], got, "only the isolation the drill turned off on box-t, in its project, is C-TIER's")

	tr := &tierRun{project: "user-993", box: "drill-1-t"}
	assert.Equal(t, fs[:1], tr.boxFindings(fs), "the run's box-t only")
	assert.Empty(t, (&tierRun{project: "user-993"}).boxFindings(fs), "no box-t, no such finding")

	s := claimStates{TierID: tr}
	kept, why := keepTierFindings(s, fs)
	assert.Equal(t, fs[:1], kept)
	assert.Equal(t, fs[:1], stateOf[tierRun](s, TierID).findings, "kept as C-TIER's evidence")
	assert.Equal(t, "box-t's NIC has port isolation off, as the drill made it (the census named it: box drill-1-t (project user-993))", why)
	kept, _ = keepTierFindings(claimStates{}, fs)
	assert.Empty(t, kept, "C-TIER did not run")
}
