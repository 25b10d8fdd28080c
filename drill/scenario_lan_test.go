package drill

import (
	"bytes"
	"encoding/json"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/drill/topo"
	"github.com/box-isolation/box/probes"
)

// In host mode one outbound witness on the host's outward interfaces
// watches every C-LAN probe, and the host's own echo to each target proves
// it watched the way there.
func TestHostModeLANIsWatchedLeaving(t *testing.T) {
	top := Scene{
		Subnet: netip.MustParsePrefix("10.88.0.0/24"), Gateway: netip.MustParseAddr("10.88.0.1"), A: BoxEnd{Place: PlaceA, IP: netip.MustParseAddr("10.88.0.11")},
		Topology: topo.Topology{Source: topo.SourceHost, Canary: netip.MustParseAddr("1.1.1.1"), CanaryTCP: 443, PublicName: "example.com.", Outward: []string{"eth0"},
			LANHosts: []Target{{Name: "router-192.168.1.1", Addr: netip.MustParseAddr("192.168.1.1"), TCPPort: 80, UDPPort: 53, Provenance: topo.FromRoute},
				{Name: "sample-10.0.0.1", Addr: netip.MustParseAddr("10.0.0.1"), TCPPort: 80, UDPPort: 53, Provenance: topo.FromSample}}},
	}
	sc := BuildScenario(top, claimsByID(t, "C-LAN"))
	hp := sc.Plans[PlaceHost]
	require.Len(t, hp.Witnesses, 1)
	w := hp.Witnesses[0]
	assert.Equal(t, []string{"eth0"}, w.Ifaces)
	assert.NotEmpty(t, w.DstPrefixes)
	assert.False(t, w.Via.IsValid())
	ctl := map[string]probes.ProbeSpec{}
	for _, p := range hp.Probes {
		ctl[p.ID] = p
	}
	lan := actionsOf(sc, "C-LAN")
	require.Len(t, lan, 6)
	for _, a := range lan {
		assert.Equal(t, PlaceHost, a.WitnessAt)
		c, ok := ctl[outControlID(a.Probe.Target)]
		require.True(t, ok, "the host echoes %s itself", a.Probe.Target)
		assert.Equal(t, a.OutControl, c.Nonce)
		assert.Contains(t, w.Nonces, c.Nonce, "the witness knows the control")
		if a.Probe.Kind == probes.KindTCP {
			assert.NotContains(t, w.Nonces, a.Probe.Nonce, "a SYN carries no nonce: it is known by its ISN")
		} else {
			assert.Contains(t, w.Nonces, a.Probe.Nonce)
		}
	}
	assert.Empty(t, failedControls(sc, observations{}), "an unanswered echo of the host's own is no failed control")

	// Many targets: several witnesses, none over the plan's limit, and
	// every action with the one that knows its nonces.
	top.LANHosts = nil
	for i := range 40 {
		a := netip.AddrFrom4([4]byte{192, 168, 1, byte(10 + i)})
		top.LANHosts = append(top.LANHosts, Target{Name: "neighbour-" + a.String(), Addr: a, TCPPort: 80, UDPPort: 53, Provenance: topo.FromNeighbour})
	}
	sc = BuildScenario(top, claimsByID(t, "C-LAN"))
	require.Greater(t, len(sc.Plans[PlaceHost].Witnesses), 1)
	for _, w := range sc.Plans[PlaceHost].Witnesses {
		assert.LessOrEqual(t, len(w.Nonces), probes.MaxMatchEntries)
	}
	for _, a := range actionsOf(sc, "C-LAN") {
		require.NotNil(t, a.Witness)
		assert.Contains(t, a.Witness.Nonces, a.OutControl)
		if a.Probe.Kind != probes.KindTCP {
			assert.Contains(t, a.Witness.Nonces, a.Probe.Nonce)
		}
	}
	for place, p := range sc.Plans {
		require.NoError(t, roundTrip(p), "the %s plan decodes", place)
	}
}

// roundTrip encodes a plan and decodes it as the agent does, strictly.
func roundTrip(p *probes.Plan) error {
	data, err := json.Marshal(p)
	if err != nil {
		return err
	}
	_, err = probes.DecodePlan(bytes.NewReader(data))
	return err
}
