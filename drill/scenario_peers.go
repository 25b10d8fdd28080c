package drill

import (
	"net/netip"

	"github.com/box-isolation/box/probes"
)

// The scenario "box to its peers", shared by the claims that fire it from
// a box of theirs (C-SIBLING from box-a, C-TIER from box-t): every peer
// (box-b and the clone) over ARP, ICMP, TCP, UDP, IPv6 link-local,
// broadcast, all-nodes multicast and the discovery multicast a
// distribution sends (mDNS, LLMNR, SSDP), each witnessed in the peer by its
// nonce or the sender's addresses.

// siblingFrom probes every peer from one box for a claim; a box the run
// did not mint probes nothing.
func (b *builder) siblingFrom(claim ClaimID, from BoxEnd) {
	t := b.t
	if !from.IP.IsValid() || from.MAC == nil {
		return
	}
	b.toBox(claim, from, t.B)
	b.toBox(claim, from, t.C)
	if routed(from) {
		return // nothing of layer 2 leaves a routed sender's own bridge
	}
	b.pinPeers(from.Place)
	// Broadcast and all-nodes multicast reach every peer at once; one probe
	// per peer, so each has its own nonce and its own witness there.
	for _, peer := range []BoxEnd{t.B, t.C} {
		if !peer.IP.IsValid() {
			continue
		}
		for _, ch := range []struct {
			channel Channel
			spec    probes.ProbeSpec
			proto   string
		}{
			{ChannelBroadcast, probes.ProbeSpec{Kind: probes.KindBroadcast, Port: listenUDP, Via: t.Subnet}, "udp"},
			{ChannelV6AllNodes, probes.ProbeSpec{Kind: probes.KindICMP, Target: netip.MustParseAddr("ff02::1"), Via: t.Subnet}, "icmpv6"},
			// What a desktop or server distribution multicasts on its own,
			// each as its protocol's request with the nonce in it.
			{ChannelMDNS, probes.ProbeSpec{Kind: probes.KindBroadcast, Target: netip.MustParseAddr("224.0.0.251"), Port: 5353, Via: t.Subnet}, "udp"},
			{ChannelLLMNR, probes.ProbeSpec{Kind: probes.KindBroadcast, Target: netip.MustParseAddr("224.0.0.252"), Port: 5355, Via: t.Subnet}, "udp"},
			{ChannelSSDP, probes.ProbeSpec{Kind: probes.KindBroadcast, Target: netip.MustParseAddr("239.255.255.250"), Port: 1900, Via: t.Subnet}, "udp"},
		} {
			ch.spec.Nonce = probes.NewNonce()
			a := b.probe(Action{Claim: claim, Channel: ch.channel, From: from.Place, Target: "every peer on " + t.Subnet.String() + ", witnessed at " + string(peer.Place), TargetKey: string(peer.Place), Expect: ExpectBlocked}, ch.spec)
			b.witness(a, peer.Place, probes.WitnessSpec{Via: t.Subnet, Nonces: []string{ch.spec.Nonce}, SrcMACs: []string{from.MAC.String()}, Proto: ch.proto, Port: ch.spec.Port})
		}
	}
}

// toBox probes a peer box over ARP, ICMP, TCP, UDP and IPv6 link-local,
// each with a witness in the peer.
func (b *builder) toBox(claim ClaimID, from BoxEnd, to BoxEnd) {
	t := b.t
	if !to.IP.IsValid() {
		return
	}
	label := string(to.Place) + " " + to.IP.String()
	srcs := []netip.Addr{from.IP}
	if from.LinkLocal.IsValid() {
		srcs = append(srcs, from.LinkLocal)
	}
	macs := []string{from.MAC.String()}
	for _, ch := range []struct {
		channel Channel
		kind    probes.Kind
		port    int
		proto   string
		target  netip.Addr
	}{
		{ChannelARP, probes.KindARP, 0, "arp", to.IP},
		{ChannelICMP, probes.KindICMP, 0, "icmp", to.IP},
		{ChannelTCP, probes.KindTCP, listenTCP, "tcp", to.IP},
		{ChannelUDP, probes.KindUDP, listenUDP, "udp", to.IP},
		{ChannelV6LinkLocal, probes.KindICMP, 0, "icmpv6", to.LinkLocal},
	} {
		if !ch.target.IsValid() || (routed(from) && (ch.kind == probes.KindARP || !ch.target.Is4())) {
			continue
		}
		spec := probes.ProbeSpec{Kind: ch.kind, Target: ch.target, Port: ch.port, Via: b.via(from)}
		if ch.kind != probes.KindARP {
			spec.Nonce = probes.NewNonce()
		}
		a := b.probe(Action{Claim: claim, Channel: ch.channel, From: from.Place, Target: label, TargetKey: string(to.Place), Expect: ExpectBlocked}, spec)
		if ch.kind != probes.KindARP && !routed(from) {
			// A routed sender's box resolves the peer itself: there is
			// no neighbour of its own to pin.
			a.Pinned = ch.target
		}
		w := probes.WitnessSpec{Via: t.Subnet, SrcIPs: srcs, SrcMACs: macs, Proto: ch.proto, Port: ch.port}
		if spec.Nonce != "" {
			w.Nonces = []string{spec.Nonce}
		}
		b.witness(a, to.Place, w)
	}
}

// pinPeers has a prober pin its peers' addresses (IPv4 and the link-local
// ones the drill gives them) to their MACs, once, so the sibling probes
// over ICMP, TCP and UDP test the L3 path on their own, not ARP again.
func (b *builder) pinPeers(place Place) {
	if b.pinned[place] {
		return
	}
	b.pinned[place] = true
	p := b.plan(place)
	for _, e := range []BoxEnd{b.t.B, b.t.C} {
		if e.MAC == nil {
			continue
		}
		for _, a := range []netip.Addr{e.IP, e.LinkLocal} {
			if a.IsValid() {
				p.Neighbors = append(p.Neighbors, probes.NeighborSpec{Via: b.t.Subnet, Address: a, MAC: e.MAC.String()})
			}
		}
	}
}
