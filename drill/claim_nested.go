package drill

import (
	"context"
	"fmt"
	"net"
	"net/netip"

	"github.com/box-isolation/box/probes"
	"github.com/box-isolation/box/stack/model"
)

// NestedID is C-NESTED: what an agent runs inside a box that may nest
// containers is no less isolated than the box.
const NestedID ClaimID = "C-NESTED"

var claimNested = Claim{
	ID: NestedID, From: "workloads nested in box-n, a box with nesting on (box new --nesting): one behind the box's NAT as Docker's default bridge puts a container, one on a macvlan child of the box's link with a MAC of its own",
	To:       "peer boxes, the host, the LAN, the resolver's private names; the host's bridge and the peers, at layer 2",
	Channels: []Channel{ChannelICMP, ChannelTCP, ChannelUDP, ChannelDNS, ChannelARP, ChannelBroadcast},
	Expect:   "blocked as from the box itself (the internet reachable); no frame with the nested MAC gets past the box's pins",
	Layers:   []model.LayerID{model.LayerPortIso, model.LayerBridgeDrop, model.LayerHostFW, model.LayerACL, model.LayerDNS, model.LayerPin},
	Why:      "an agent with Docker in its box starts containers of its own: behind the box's NAT they must meet every layer the box does, and one given the box's link must not pass as a host of its own",
	Modes:    everywhere, Evidence: []Evidence{EvidenceProbes},
	mint:  mintNestingBox,
	build: buildNested,
	// The NAT workload's blocks count only if it reaches what a box may
	// (the canary, the gateway's resolver): a workload the box's own
	// firewall stops would "block" everything.
	judge: func(r *run, c Claim, rs []Result) []Result {
		return judgeProbes(r, c, placeControlled(rs, PlaceNestNAT))
	},
}

// Places of C-NESTED's nested workloads, both in box-n.
const (
	PlaceN       Place = "box-n"      // the nesting box
	PlaceNestNAT Place = "nested-nat" // behind box-n's NAT
	PlaceNestMAC Place = "nested-mac" // on a macvlan child of box-n's link
)

// The nested workloads' addresses: the NAT one on a bridge in box-n (a
// subnet of its own, as Docker's default bridge), the macvlan one in the
// box subnet (its last address: the least likely to be another box's).
var (
	nestNATSubnet  = netip.MustParsePrefix("172.29.0.0/24")
	nestNATAddr    = netip.MustParsePrefix("172.29.0.2/24")
	nestNATGateway = netip.MustParseAddr("172.29.0.1")
	nestMAC        = net.HardwareAddr{0x02, 0xb0, 0xc5, 0x6e, 0x65, 0x73}
)

// mintNestingBox mints box-n with nesting on, as box new --nesting does.
func mintNestingBox(ctx context.Context, r *run) error {
	box := r.name(PlaceN, r.boxName("n"))
	req, err := r.mintRequest(box, r.members.local(), true)
	if err != nil {
		return fmt.Errorf("nested: %w", err)
	}
	req.Nesting = true
	r.cfg.logf("nested: minting %s with nesting on", box)
	if err := mintProbeBox(ctx, &r.cfg, req); err != nil {
		return fmt.Errorf("nested: %w", err)
	}
	e, err := boxEnd(ctx, r.cfg.Host, PlaceN, box)
	if err != nil {
		return fmt.Errorf("nested: %w", err)
	}
	if err := r.waitProvisioned(ctx, r.cfg.Host.Incus, box); err != nil {
		return fmt.Errorf("nested: %w", err)
	}
	r.addBox(e)
	// Its workloads' plans run in box-n itself.
	r.name(PlaceNestNAT, box)
	r.name(PlaceNestMAC, box)
	return nil
}

// buildNested: from the NAT workload, its controls (the canary, the
// gateway's resolver) and what box-a fires for C-SIBLING (by routing),
// C-HOST, C-LAN and C-NAMES, witnessed where its packets arrive, as box-n's;
// from the macvlan workload, ARP for the gateway and box-b and a
// broadcast, witnessed on the host's bridge and in box-b by its own MAC.
func buildNested(b *builder) {
	t := b.t
	n := t.N
	if !n.IP.IsValid() || n.MAC == nil {
		return
	}
	nat := BoxEnd{Place: PlaceNestNAT, Instance: n.Instance, IP: n.IP, MAC: n.MAC, Via: nestNATSubnet, Member: n.Member}
	b.plan(PlaceNestNAT).Nest = &probes.NestSpec{Kind: probes.NestNAT, Via: t.Subnet, Address: nestNATAddr, Gateway: nestNATGateway}
	b.probe(Action{Claim: NestedID, Channel: ChannelTCP, From: PlaceNestNAT, Target: "canary " + t.Canary.String(), TargetKey: "internet", Expect: ExpectReach},
		probes.ProbeSpec{Kind: probes.KindTCP, Target: t.Canary, Port: t.CanaryTCP, Via: nestNATSubnet}).Greeting = t.CanaryGreeting
	b.probe(Action{Claim: NestedID, Channel: ChannelDNS, From: PlaceNestNAT, Target: "gateway " + t.Gateway.String() + " " + t.PublicName, TargetKey: "gateway", Expect: ExpectResolve},
		probes.ProbeSpec{Kind: probes.KindDNS, Target: t.Gateway, Port: 53, Name: t.PublicName, QType: "A", Via: nestNATSubnet})
	b.siblingFrom(NestedID, nat)
	b.hostFrom(NestedID, nat)
	b.lanFrom(NestedID, nat)
	b.namesFrom(NestedID, nat)

	addr := t.Subnet.Addr()
	for range (1 << (32 - t.Subnet.Bits())) - 2 {
		addr = addr.Next()
	}
	mac := BoxEnd{Place: PlaceNestMAC, Instance: n.Instance, IP: addr, MAC: nestMAC, Member: n.Member}
	b.plan(PlaceNestMAC).Nest = &probes.NestSpec{Kind: probes.NestMACVLAN, Via: t.Subnet, Address: netip.PrefixFrom(addr, t.Subnet.Bits()), Gateway: t.Gateway, MAC: nestMAC.String()}
	label := "the nested MAC " + nestMAC.String() + " (" + addr.String() + ") "
	for _, to := range []struct {
		target netip.Addr
		place  Place
		key    string
		what   string
	}{{t.Gateway, PlaceHost, TargetHostBridge, "who-has the gateway, witnessed on the host's bridge"}, {t.B.IP, PlaceB, string(PlaceB), "who-has box-b, witnessed in box-b"}} {
		if !to.target.IsValid() {
			continue
		}
		a := b.probe(Action{Claim: NestedID, Channel: ChannelARP, From: PlaceNestMAC, Target: label + to.what, TargetKey: to.key, Expect: ExpectBlocked},
			probes.ProbeSpec{Kind: probes.KindARP, Target: to.target, Via: t.Subnet})
		b.witness(a, to.place, probes.WitnessSpec{Via: t.Subnet, SrcMACs: []string{mac.MAC.String()}, Proto: "arp"})
	}
	if t.B.IP.IsValid() {
		spec := probes.ProbeSpec{Kind: probes.KindBroadcast, Port: listenUDP, Via: t.Subnet, Nonce: probes.NewNonce()}
		a := b.probe(Action{Claim: NestedID, Channel: ChannelBroadcast, From: PlaceNestMAC, Target: label + "broadcast, witnessed on the host's bridge", TargetKey: TargetHostBridge, Expect: ExpectBlocked}, spec)
		b.witness(a, PlaceHost, probes.WitnessSpec{Via: t.Subnet, Nonces: []string{spec.Nonce}, SrcMACs: []string{mac.MAC.String()}, Proto: "udp", Port: listenUDP})
	}
}
