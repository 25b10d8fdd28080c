package drill

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestJudgeEscape(t *testing.T) {
	a := Action{ID: "t-nic-decoy", Claim: "C-TIER", Channel: ChannelRestriction, Target: "a NIC on managed network decoy", Expect: ExpectRefused}
	reason := "Network not allowed in project"
	for _, tc := range []struct {
		name string
		err  error
		want Verdict
	}{
		{"allowed is a failure", nil, Fail},
		{"refused for the restriction", errors.New(`updating instance t: incus: PUT /1.0/instances/t: failed checking if instance update allowed: Invalid device "eth1": Network not allowed in project`), Pass},
		{"the reason is matched whatever its case", errors.New("creating network x: network not allowed in project"), Pass},
		{"refused for another reason proves nothing", errors.New(`Image "box-probe" not found`), Inconclusive},
		{"a dead daemon proves nothing", errors.New("incus: dial unix /var/lib/incus/unix.socket.user: connect: connection refused"), Inconclusive},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := judgeEscape(a, reason, tc.err)
			assert.Equal(t, tc.want, r.Verdict, r.Evidence)
			assert.Equal(t, a.ID, r.ID)
		})
	}
}
