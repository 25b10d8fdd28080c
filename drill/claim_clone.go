package drill

import (
	"github.com/box-isolation/box/probes"
	"github.com/box-isolation/box/stack/model"
)

// CloneID is C-CLONE: a clone of a box is a box of its own on the wire.
const CloneID ClaimID = "C-CLONE"

var claimClone = Claim{
	ID: CloneID, From: "clone", To: "its source",
	Channels: []Channel{ChannelAddress, ChannelMAC, ChannelMachineID},
	Expect:   "distinct",
	Layers:   []model.LayerID{model.LayerStack},
	Why:      "two boxes with one identity share one lease and both lose the network",
	Modes:    everywhere, Evidence: []Evidence{EvidenceProbes},
	build: buildClone,
}

// buildClone: the clone reads its lease, compared with box-a's from the
// C-DHCP baseline (judgeDistinct).
func buildClone(b *builder) {
	lease, ok := b.lookup(DHCPID, ChannelDHCP, PlaceA)
	if !ok {
		return
	}
	a := b.probe(Action{Claim: CloneID, Channel: ChannelIdentity, From: PlaceC, Target: "clone-a vs box-a", TargetKey: string(PlaceA), Expect: ExpectDistinct},
		probes.ProbeSpec{Kind: probes.KindDHCPLease, Via: b.t.Subnet})
	a.Reference = ProbeRef{At: lease.From, ID: lease.ID}
}
