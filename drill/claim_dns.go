package drill

import (
	"github.com/box-isolation/box/probes"
	"github.com/box-isolation/box/stack/model"
)

// DNSID is C-DNS: a box's resolver, the gateway, resolves a public name.
// A positive control.
const DNSID ClaimID = "C-DNS"

var claimDNS = Claim{
	ID: DNSID, From: "box", To: "gateway resolver",
	Channels: []Channel{ChannelDNS}, Expect: "a public name resolves",
	Layers: []model.LayerID{model.LayerDNS}, Baseline: true,
	Why:   "the resolver is the one host service a box may use",
	Modes: everywhere, Evidence: []Evidence{EvidenceProbes},
	build: buildDNS,
}

// buildDNS: box-a asks the gateway for the public name (judged by the
// answer: it must be the name's own address); on a cluster, every other
// member's box asks its own gateway, its control (and its member's
// counting chain's, see crossMember).
func buildDNS(b *builder) {
	t := b.t
	b.probe(Action{Claim: DNSID, Channel: ChannelDNS, From: PlaceA, Target: "gateway " + t.Gateway.String() + " " + t.PublicName, TargetKey: "gateway", Expect: ExpectResolve, Baseline: true},
		probes.ProbeSpec{Kind: probes.KindDNS, Target: t.Gateway, Port: 53, Name: t.PublicName, QType: "A", Via: t.Subnet})
	for _, m := range t.Members {
		if m.Local || !m.Box.IP.IsValid() {
			continue
		}
		b.probe(Action{Claim: DNSID, Channel: ChannelUDP, From: m.Box.Place, Member: m.Name, Target: "gateway " + t.Gateway.String() + ":53 " + t.PublicName, TargetKey: "host-gateway", Expect: ExpectResolve},
			probes.ProbeSpec{Kind: probes.KindDNS, Target: t.Gateway, Port: 53, Name: t.PublicName, QType: "A", Via: t.Subnet})
	}
}
