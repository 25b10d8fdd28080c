package drill

import (
	"github.com/box-isolation/box/probes"
	"github.com/box-isolation/box/stack/model"
)

// V6ID is C-V6: a box gets no IPv6 beyond the link-local it gives itself.
const V6ID ClaimID = "C-V6"

var claimV6 = Claim{
	ID: V6ID, From: "box", To: "IPv6",
	Channels: []Channel{ChannelGlobalAddress, ChannelDefaultRoute, ChannelRouterAdvert},
	Expect:   "none",
	Layers:   []model.LayerID{model.LayerV6, model.LayerGuard},
	Why:      "every other rule is IPv4-only: IPv6 would be an uncovered path",
	Modes:    everywhere, Evidence: []Evidence{EvidenceProbes},
	build: buildV6,
}

// buildV6: box-a solicits routers over rsWindow; every box watches for
// unsolicited configuration the whole time and reads its own IPv6 state
// at the end.
func buildV6(b *builder) {
	t := b.t
	watch := probes.WitnessSpec{Via: t.Subnet, Proto: probes.ProtoIPv6Config}
	a := b.probe(Action{Claim: V6ID, Channel: ChannelRouterAdvert, From: PlaceA, Target: "routers on " + t.Subnet.String(), TargetKey: "ipv6", Expect: ExpectNone},
		probes.ProbeSpec{Kind: probes.KindNDPRS, Via: t.Subnet, DelayMS: int(rsDelay.Milliseconds()), DeadlineMS: int(rsWindow.Milliseconds())})
	b.witness(a, PlaceA, watch)
	watchA := a.Witness
	for _, e := range []BoxEnd{t.A, t.B, t.C} {
		a := b.probe(Action{Claim: V6ID, Channel: ChannelV6State, From: e.Place, Target: string(e.Place) + " at the end of the probe phase", TargetKey: "ipv6", Expect: ExpectNone},
			probes.ProbeSpec{Kind: probes.KindIPv6State, DelayMS: int(stateAt.Milliseconds()), DeadlineMS: int(stateDeadline.Milliseconds())})
		if e.Place == PlaceA {
			// box-a already watches for the solicitation: one capture.
			a.WitnessAt, a.Witness = PlaceA, watchA
			continue
		}
		b.witness(a, e.Place, watch)
	}
}
