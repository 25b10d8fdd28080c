package drill

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/google/nftables"

	"github.com/box-isolation/box/probes"
	"github.com/box-isolation/box/stack"
)

// AllowID is C-ALLOW: a box under an egress allowlist reaches what it
// allows and nothing else.
const AllowID ClaimID = "C-ALLOW"

var claimAllow = Claim{
	ID: AllowID, From: "box-w, under an egress allowlist (the canary's name, and a name that resolves to a LAN host); box-a, open",
	To:       "the allowed canary by name; a second canary by name and by address; a public resolver straight; the LAN host the allowed name resolves to",
	Channels: []Channel{ChannelTCP, ChannelUDP},
	Expect:   "box-w reaches the allowed canary by name and nothing else; box-a reaches the second canary (it was there to be blocked)",
	Layers:   []stack.LayerID{stack.LayerEgress},
	Why:      "an allowlist that leaks is a false sense of safety, and one that lets an allowed name point at the LAN is a way in (DNS rebinding); it must only ever drop",
	Modes:    Modes{World: Runs, Host: Never, Why: "it needs the world's second canary and a witness in its internet"},
	Evidence: []Evidence{EvidenceProbes},
	prepare:  mintAllowBox,
	build:    buildAllow,
	// box-w's blocks count only if its control, the allowed canary, was
	// reached.
	judge: func(r *run, c Claim, rs []Result) []Result { return judgeProbes(r, c, placeControlled(rs, PlaceW)) },
}

// C-ALLOW: a box under an egress allowlist (box-w: the canary's name, and a
// name that resolves to a LAN host) reaches the allowed canary by name and
// nothing else: not the second canary by name or by address, not a public
// resolver directly, not the LAN host its allowed name resolves to (the
// allowlist only ever drops; the ACL still holds). An open box (box-a)
// reaches the second canary, by name and by address: that proves the
// canary is there to be blocked. box-w's own reach of the allowed canary
// is its control: if that fails the claim fails, and its blocks prove
// nothing.

// Ports of the second canary: box-w's probes by name and by address, and
// box-a's, each on its own, so a witness that sees a SYN (which carries no
// nonce) knows whose it was after the host's NAT.
const (
	allowByNamePort = 80
	allowByAddrPort = 8080 // the world's Canary2AltPort
	allowOpenPort   = 443
)

// allowDeadline gives a probe by name the time to ask the resolver and
// still see TCP's first retransmission.
const allowDeadline = 2500 * time.Millisecond

// allowNames is box-w's allowlist.
func allowNames(t Scene) []string {
	return []string{strings.TrimSuffix(t.PublicName, "."), strings.TrimSuffix(t.Allow.RebindName, ".")}
}

// mintAllowBox mints box-w under its allowlist; without the world's
// second canary there is nothing to allow or deny.
func mintAllowBox(ctx context.Context, r *run) error {
	cfg := &r.cfg
	if !cfg.Topology.Allow.Valid() {
		r.skip(AllowID, "the topology has no second canary and internet witness (the hermetic world's)")
		return nil
	}
	r.names[PlaceW] = r.boxName("w")
	names := allowNames(Scene{Topology: cfg.Topology})
	cfg.logf("allow: minting %s under the allowlist %s", r.names[PlaceW], strings.Join(names, " "))
	// Not provisioned: under its allowlist it reaches no package mirror.
	req, err := r.mintRequest(r.names[PlaceW], r.localMember(), false)
	if err != nil {
		return fmt.Errorf("allow: %w", err)
	}
	req.Egress = names
	if err := mintProbeBox(ctx, cfg, req); err != nil {
		return fmt.Errorf("allow: %w", err)
	}
	e, err := boxEnd(ctx, cfg.Host, PlaceW, r.names[PlaceW])
	if err != nil {
		return fmt.Errorf("allow: %w", err)
	}
	r.ends[PlaceW] = e
	r.rep.Boxes = append(r.rep.Boxes, *e)
	return nil
}

// buildAllow: box-w to the allowed canary by name (its control, which
// must greet as the canary), to the second canary by name and address, to
// a public resolver straight and to the LAN host an allowed name resolves
// to, each witnessed in the internet's namespace or on the LAN; box-a,
// open, reaches the second canary.
func buildAllow(b *builder) {
	t := b.t
	if !t.W.IP.IsValid() || !t.Allow.Valid() {
		return
	}
	al := t.Allow
	byName := func(from BoxEnd, name string, port int) probes.ProbeSpec {
		return probes.ProbeSpec{Kind: probes.KindTCP, Name: strings.TrimSuffix(name, "."), Resolver: t.Gateway, Port: port, Via: t.Subnet,
			DeadlineMS: int(allowDeadline.Milliseconds())}
	}
	probe := func(from BoxEnd, target, key string, e Expectation, spec probes.ProbeSpec) *Action {
		return b.probe(Action{Claim: AllowID, Channel: ChannelTCP, From: from.Place, Target: target, TargetKey: key, Expect: e}, spec)
	}
	inetWitness := func(a *Action, dst netip.Addr, proto string, port int, nonce string) {
		w := probes.WitnessSpec{Via: al.InetVia, Proto: proto, Port: port, DstIP: dst}
		if nonce != "" {
			// By the nonce alone: the gateway's dnsmasq asks the same
			// resolver from the same (NATed) address.
			w.Nonces = []string{nonce}
		} else {
			// A SYN carries no nonce: by the host's NATed source and the
			// source port this probe pinned.
			w.SrcIPs, w.SrcPort = []netip.Addr{al.InetNAT}, a.Probe.SrcPort
		}
		b.witness(a, PlaceInet, w)
	}
	// pinned is a blocked probe's spec with a source port of its own.
	pinned := func(spec probes.ProbeSpec) probes.ProbeSpec {
		spec.SrcPort = b.srcPort()
		return spec
	}

	// box-w's control: the allowed canary, by name.
	probe(t.W, "canary "+t.PublicName+" (allowed)", "internet", ExpectReach, byName(t.W, t.PublicName, t.CanaryTCP)).Greeting = t.CanaryGreeting
	// Not the other canary, by name or by address.
	a := probe(t.W, "second canary "+al.OtherName+" (not allowed)", "internet-2", ExpectBlocked, pinned(byName(t.W, al.OtherName, allowByNamePort)))
	inetWitness(a, al.Other, "tcp", allowByNamePort, "")
	a = probe(t.W, fmt.Sprintf("second canary %s:%d by address", al.Other, allowByAddrPort), "internet-2", ExpectBlocked,
		pinned(probes.ProbeSpec{Kind: probes.KindTCP, Target: al.Other, Port: allowByAddrPort, Via: t.Subnet}))
	inetWitness(a, al.Other, "tcp", allowByAddrPort, "")
	// Not a public resolver straight (only the gateway's, which the
	// allowlist works through).
	nonce := probes.NewNonce()
	a = b.probe(Action{Claim: AllowID, Channel: ChannelUDP, From: t.W.Place, Target: "public resolver " + t.Upstream.String() + ":53, straight", TargetKey: "resolver", Expect: ExpectBlocked},
		probes.ProbeSpec{Kind: probes.KindUDP, Target: t.Upstream, Port: 53, Payload: "nonce", Nonce: nonce, Via: t.Subnet})
	inetWitness(a, t.Upstream, "udp", 53, nonce)
	// An allowed name that resolves to a LAN host stays unreachable.
	if t.LANVia.IsValid() {
		a = probe(t.W, al.RebindName+" (allowed, resolves to "+al.RebindAddr.String()+")", "lan-rebind", ExpectBlocked, pinned(byName(t.W, al.RebindName, 80)))
		b.witness(a, PlaceLAN, probes.WitnessSpec{Via: t.LANVia, SrcIPs: []netip.Addr{t.W.IP, t.LANNAT}, Proto: "tcp", Port: 80, SrcPort: a.Probe.SrcPort, DstIP: al.RebindAddr})
	}
	// box-a, open, reaches the second canary: it was there to be blocked.
	probe(t.A, "second canary "+al.OtherName+" (box-a is open)", "internet-2", ExpectReach, byName(t.A, al.OtherName, allowOpenPort)).Greeting = al.OtherGreeting
	probe(t.A, fmt.Sprintf("second canary %s:%d by address (box-a is open)", al.Other, allowOpenPort), "internet-2", ExpectReach,
		probes.ProbeSpec{Kind: probes.KindTCP, Target: al.Other, Port: allowOpenPort, Via: t.Subnet}).Greeting = al.OtherGreeting
}

// dropEgressTable is the mutation "egress": no allowlist is enforced.
func dropEgressTable(ctx context.Context, h *stack.Host, _ []string) error {
	return deleteTable(h, nftables.TableFamilyINet, stack.Current.NFTTable+"_egress")
}
