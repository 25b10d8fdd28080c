package drill

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/drill/topo"
	"github.com/box-isolation/box/probes"
)

// In host mode the canary is a public server: a completed handshake is the
// proof, UDP egress is a DNS question to it, and the public name resolves
// to whatever it does.
func TestHostModeBaselines(t *testing.T) {
	top := Scene{
		Subnet: netip.MustParsePrefix("10.88.0.0/24"), Gateway: netip.MustParseAddr("10.88.0.1"),
		A: BoxEnd{Place: PlaceA}, Topology: topo.Topology{Source: topo.SourceHost, Canary: netip.MustParseAddr("1.1.1.1"), CanaryTCP: 443, PublicName: "example.com."},
	}
	sc := BuildScenario(top, []Claim{Catalogue[0]})
	var egress []Action
	for _, a := range sc.Actions {
		if a.Claim == "C-EGRESS" {
			egress = append(egress, a)
		}
	}
	assert.Len(t, egress, 3)
	for _, a := range egress {
		if a.Channel == "udp" {
			assert.Equal(t, ExpectResolve, a.Expect)
			assert.Equal(t, 53, a.Probe.Port)
			assert.Equal(t, top.Canary, a.Probe.Target)
		}
	}

	tcp := egress[0]
	connected := probes.Observation{ID: tcp.ID, Kind: probes.KindTCP, Outcome: probes.Refused, Target: "1.1.1.1:443",
		Reason: "connected but not reached", Evidence: probes.Evidence{Connected: true}}
	obs := observations{PlaceA: {tcp.ID: connected}}
	assert.Equal(t, Pass, judge(tcp, obs, top, true, nil).Verdict, "a handshake with a public canary is the proof")
	world := top
	world.CanaryGreeting = "BOXWORLD canary n"
	wtcp := BuildScenario(world, []Claim{Catalogue[0]}).Actions[0]
	require.Equal(t, world.CanaryGreeting, wtcp.Greeting, "the world's canary action carries its greeting")
	assert.Equal(t, Fail, judge(wtcp, observations{PlaceA: {wtcp.ID: connected}}, world, true, nil).Verdict, "the world's canary must greet")
	refused := connected
	refused.Evidence.Connected = false
	obs[PlaceA][tcp.ID] = refused
	assert.Equal(t, Fail, judge(tcp, obs, top, true, nil).Verdict, "a RST is no egress")
}
