package drill

import "github.com/box-isolation/box/stack/model"

// SiblingID is C-SIBLING: no frame of a box reaches a peer, a clone of
// itself included.
const SiblingID ClaimID = "C-SIBLING"

var claimSibling = Claim{
	ID: SiblingID, From: "box", To: "peer box and a clone",
	Channels: []Channel{ChannelARP, ChannelICMP, ChannelTCP, ChannelUDP, ChannelBroadcast, ChannelV6LinkLocal, ChannelV6AllNodes, ChannelMDNS, ChannelLLMNR, ChannelSSDP},
	Expect:   "no frame reaches the peer",
	Layers:   []model.LayerID{model.LayerPortIso, model.LayerBridgeDrop},
	Why:      "two boxes on one bridge exchange frames below netfilter's L3 hooks unless the bridge itself refuses",
	Modes:    everywhere, Evidence: []Evidence{EvidenceProbes},
	// box-a to box-b and clone-a, witnessed in each (scenario_peers.go).
	build: func(b *builder) { b.siblingFrom(SiblingID, b.t.A) },
}
