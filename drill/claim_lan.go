package drill

import "github.com/box-isolation/box/stack/model"

// LANID is C-LAN: nothing a box sends arrives at a private address, nor
// at any address the host routes elsewhere than by its default routes.
const LANID ClaimID = "C-LAN"

var claimLAN = Claim{
	ID: LANID, From: "box",
	To:       "every private address the host can reach, and every prefix it routes elsewhere than by its default routes, private or not: the world's LAN hosts (one in 198.18.0.0/16, routed to the LAN), or a host's route gateways and hosts, a sample of every prefix routed elsewhere, neighbours, resolvers, DHCP servers and a sample per private range",
	Channels: []Channel{ChannelTCP, ChannelUDP, ChannelICMP},
	Expect:   "nothing arrives (a LAN witness, or in host mode an outbound witness on the host's interfaces, proves it)",
	Layers:   []model.LayerID{model.LayerACL, model.LayerRoute, model.LayerGuard},
	Why:      "the LAN and the cloud metadata service are the first things a hostile agent looks for",
	Modes:    everywhere, Evidence: []Evidence{EvidenceProbes},
	// box-a to every LAN target, witnessed on the LAN or leaving the host
	// (scenario_lan.go).
	build: func(b *builder) { b.lanFrom(LANID, b.t.A) },
}
