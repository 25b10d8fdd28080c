package drill

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/stack/model"
)

func TestFleetResults(t *testing.T) {
	c := claimFor(t, "C-FLEET")
	boxes := map[Place]string{PlaceA: "drill-a", PlaceB: "drill-b"}
	met := &model.Census{Bridge: "boxnet", Ports: []string{"veth1", "veth2"}, SetChecked: true, Siblings: []model.Sibling{
		{Name: "drill-a", Project: "default", Status: "Running", Box: true, Port: "veth1", Problems: []model.Problem{}},
		{Name: "drill-b", Project: "default", Status: "Running", Box: true, Port: "veth2", Problems: []model.Problem{}},
		{Name: "old", Project: "default", Status: "Stopped", Box: true, Problems: []model.Problem{}},
	}}
	blind := &model.Census{Bridge: "boxnet", Ports: []string{"veth1"}, Siblings: met.Siblings[:1]}
	offStack := model.Finding{Layer: model.LayerFleet, Object: "box old", Problem: "has a second NIC eth1 on network lanbr", Fix: "incus config device remove old eth1"}
	for _, tc := range []struct {
		name     string
		census   *model.Census
		findings []model.Finding
		want     Verdict
		evidence string
	}{
		{name: "the census met the drill's boxes and found nothing", census: met, want: Pass, evidence: "3 instances (2 running, 1 not)"},
		{name: "a box off the stack fails it, named", census: met, findings: []model.Finding{offStack}, want: Fail, evidence: "box old: has a second NIC"},
		{name: "no census proves nothing", want: Inconclusive, evidence: "no census"},
		{name: "a census blind to the drill's own box proves nothing", census: blind, want: Inconclusive, evidence: "drill-b (not met)"},
		{name: "another layer's finding is not the census's", census: met, findings: []model.Finding{{Layer: "L-ACL", Object: "acl box-isolate", Problem: "missing"}}, want: Pass},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rs := fleetResults(c, tc.census, "", boxes, tc.findings)
			cr := aggregate(c, rs)
			require.NotEmpty(t, rs)
			assert.Equal(t, tc.want, cr.Verdict)
			all := ""
			for _, r := range rs {
				all += r.Evidence + "\n"
			}
			assert.Contains(t, all, tc.evidence)
		})
	}
}
