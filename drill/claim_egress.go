package drill

import (
	"github.com/box-isolation/box/probes"
	"github.com/box-isolation/box/stack/model"
)

// EgressID is C-EGRESS: a box reaches the internet. A positive control:
// if it fails, every "blocked" of the run proves nothing.
const EgressID ClaimID = "C-EGRESS"

var claimEgress = Claim{
	ID: EgressID, From: "box", To: "internet canary",
	Channels: []Channel{ChannelTCP, ChannelUDP, ChannelICMP},
	Expect:   "reachable (the canary's greeting proves who answered)",
	Layers:   []model.LayerID{model.LayerNAT}, Baseline: true,
	Why:   "a box that cannot reach the internet makes every 'blocked' meaningless",
	Modes: everywhere, Evidence: []Evidence{EvidenceProbes},
	build: buildEgress,
}

// buildEgress: box-a to the canary over TCP, UDP and ICMP; on a cluster,
// every other member's box to it over TCP (that box's own control).
func buildEgress(b *builder) {
	t := b.t
	canary := "canary " + t.Canary.String()
	for _, ch := range []struct {
		channel Channel
		kind    probes.Kind
		port    int
	}{{ChannelTCP, probes.KindTCP, t.CanaryTCP}, {ChannelUDP, probes.KindUDP, t.CanaryUDP}, {ChannelICMP, probes.KindICMP, 0}} {
		if ch.kind == probes.KindUDP && ch.port == 0 {
			// A public canary echoes nothing: UDP egress is a DNS question
			// sent straight to it (it is a public resolver).
			b.probe(Action{Claim: EgressID, Channel: ChannelUDP, From: PlaceA, Target: canary + ":53 " + t.PublicName, TargetKey: "internet", Expect: ExpectResolve, Baseline: true},
				probes.ProbeSpec{Kind: probes.KindDNS, Target: t.Canary, Port: 53, Name: t.PublicName, QType: "A", Via: t.Subnet})
			continue
		}
		a := b.probe(Action{Claim: EgressID, Channel: ch.channel, From: PlaceA, Target: canary, TargetKey: "internet", Expect: ExpectReach, Baseline: true},
			probes.ProbeSpec{Kind: ch.kind, Target: t.Canary, Port: ch.port, Via: t.Subnet})
		if ch.kind != probes.KindICMP {
			a.Greeting = t.CanaryGreeting
		}
	}
	for _, m := range t.Members {
		if m.Local || !m.Box.IP.IsValid() {
			continue
		}
		a := b.probe(Action{Claim: EgressID, Channel: ChannelTCP, From: m.Box.Place, Member: m.Name, Target: canary, TargetKey: "internet", Expect: ExpectReach, Baseline: true},
			probes.ProbeSpec{Kind: probes.KindTCP, Target: t.Canary, Port: t.CanaryTCP, Via: t.Subnet})
		a.Greeting = t.CanaryGreeting
	}
}
