package drill

import "github.com/box-isolation/box/stack"

// LANID is C-LAN: nothing a box sends arrives at a private address.
const LANID ClaimID = "C-LAN"

var claimLAN = Claim{
	ID: LANID, From: "box",
	To:       "every private address the host can reach: the world's LAN hosts, or a host's route gateways and hosts, neighbours, resolvers, DHCP servers and a sample per private range",
	Channels: []Channel{ChannelTCP, ChannelUDP, ChannelICMP},
	Expect:   "nothing arrives (a LAN witness, or in host mode an outbound witness on the host's interfaces, proves it)",
	Layers:   []stack.LayerID{stack.LayerACL},
	Why:      "the LAN and the cloud metadata service are the first things a hostile agent looks for",
	Modes:    everywhere, Evidence: []Evidence{EvidenceProbes},
	// box-a to every LAN target, witnessed on the LAN or leaving the host
	// (scenario_lan.go).
	build: func(b *builder) { b.lanFrom(LANID, b.t.A) },
}
