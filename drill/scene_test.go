package drill

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestInputNotesAreTheClaims: what the drill could not read for the
// scene is noted under the IDs of the claims that need it, in their
// words of what it costs them, as the report always said it.
func TestInputNotesAreTheClaims(t *testing.T) {
	for _, tc := range []struct {
		in   sceneInput
		what string
		want []string
	}{
		{inputBridgeMAC, "the bridge's MAC was not read (no such link)", []string{string(SpoofID) + ": the bridge's MAC was not read (no such link): box-a's lies are not sent"}},
		{inputDHCPPool, "the bridge's DHCP pool was not read (denied)", []string{string(SpoofID) + ": the bridge's DHCP pool was not read (denied): the DHCP lies are not sent"}},
		{inputForwards, "the ports of x could not be listed, so they are not targets", []string{string(HostID) + ": the ports of x could not be listed, so they are not targets"}},
		{inputNames, "3 more names were not asked (at most 96 a run)", []string{string(NamesID) + ": 3 more names were not asked (at most 96 a run)"}},
	} {
		assert.Equal(t, tc.want, inputNotes(tc.in, tc.what), "%s", tc.in)
	}
}
