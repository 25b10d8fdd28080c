package drill

import "github.com/box-isolation/box/stack/model"

// HostID is C-HOST: a box reaches none of the host's own addresses but
// for DNS and DHCP at the gateway.
const HostID ClaimID = "C-HOST"

var claimHost = Claim{
	ID: HostID, From: "box",
	To:       "every host address: the drill's listeners, every socket the host listens on (read from the kernel), DNS and DHCP off the gateway",
	Channels: []Channel{ChannelTCP, ChannelUDP, ChannelICMP},
	Expect:   "dropped (DNS and DHCP to the gateway are the only exceptions; router solicitations reach an IPv6 stack the bridge must not have)",
	Layers:   []model.LayerID{model.LayerHostFW, model.LayerACL, model.LayerGuard},
	Why:      "the host's own services, including those on its public address, are not the box's",
	Modes:    everywhere, Evidence: []Evidence{EvidenceProbes},
	build: buildHost,
	judge: judgeHost,
	// The host's forwarded ports are targets: rules the drill could not
	// read are ports it did not probe (the note says so).
	inputs: map[sceneInput]string{inputForwards: ""},
}

// buildHost: box-a to every host address (scenario_host.go); on a
// cluster, every member's box to its own member and to every other
// member's cluster address (cluster.go).
func buildHost(b *builder) {
	b.hostFrom(HostID, b.t.A)
	b.crossMember(HostID)
}

// judgeHost: on a cluster, another member's box's blocks count only if
// its own controls (its C-EGRESS and C-DNS probes) held.
func judgeHost(r *run, c Claim, rs []Result) []Result {
	for _, p := range r.members.boxPlaces() {
		rs = controlledBy(rs, r.judged, p)
	}
	return judgeProbes(r, c, rs)
}
