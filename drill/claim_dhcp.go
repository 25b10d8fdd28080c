package drill

import (
	"github.com/box-isolation/box/probes"
	"github.com/box-isolation/box/stack/model"
)

// DHCPID is C-DHCP: a box holds a lease on the box subnet. A positive
// control.
const DHCPID ClaimID = "C-DHCP"

var claimDHCP = Claim{
	ID: DHCPID, From: "box", To: "lease",
	Channels: []Channel{ChannelDHCP}, Expect: "a lease on the box subnet",
	Layers: []model.LayerID{model.LayerNAT}, Baseline: true,
	Why:   "without a lease no probe leaves from the address the rules are written for",
	Modes: everywhere, Evidence: []Evidence{EvidenceProbes},
	build: buildDHCP,
}

// buildDHCP: box-a reads its lease (address, MAC, machine-id: C-CLONE
// compares the clone's with it).
func buildDHCP(b *builder) {
	t := b.t
	b.probe(Action{Claim: DHCPID, Channel: ChannelDHCP, From: PlaceA, Target: "lease on " + t.Subnet.String(), TargetKey: "lease", Expect: ExpectLease, Baseline: true},
		probes.ProbeSpec{Kind: probes.KindDHCPLease, Via: t.Subnet})
}
