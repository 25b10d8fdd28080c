package drill

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/google/nftables"

	"github.com/box-isolation/box/probes"
	"github.com/box-isolation/box/stack"
)

// C-ALLOW: a box under an egress allowlist (box-w: the canary's name, and a
// name that resolves to a LAN host) reaches the allowed canary by name and
// nothing else: not the second canary by name or by address, not a public
// resolver directly, not the LAN host its allowed name resolves to (the
// allowlist only ever drops; the ACL still holds). An open box (box-a)
// reaches the second canary, by name and by address: that proves the
// canary is there to be blocked. box-w's own reach of the allowed canary
// is its control: if that fails the claim fails, and its blocks prove
// nothing.

// Places of C-ALLOW.
const (
	PlaceW    = "box-w" // the allowlisted box
	PlaceInet = "inet"  // the internet's namespace (witnesses at the second canary and the resolver)
)

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
var allowDeadline = 2500 * time.Millisecond

// allowSelected reports whether the run includes C-ALLOW.
func (r *run) allowSelected() bool {
	return slices.ContainsFunc(r.cfg.Claims, func(c Claim) bool { return c.ID == "C-ALLOW" }) && r.cfg.Topology.Allow.Valid()
}

// allowNames is box-w's allowlist.
func allowNames(t Scene) []string {
	return []string{strings.TrimSuffix(t.PublicName, "."), strings.TrimSuffix(t.Allow.RebindName, ".")}
}

// mintAllowBox mints box-w under its allowlist.
func (r *run) mintAllowBox(ctx context.Context, stamps map[string]string) error {
	cfg := &r.cfg
	names := allowNames(Scene{Topology: cfg.Topology})
	cfg.logf("allow: minting %s under the allowlist %s", r.names[PlaceW], strings.Join(names, " "))
	req := stack.MintRequest{Name: r.names[PlaceW], Image: cfg.Image, Type: probeType, Stamps: stamps, Egress: names, Target: r.localMember()}
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

// allow builds C-ALLOW's probes.
func (b *builder) allow() {
	t := b.t
	if !b.claims["C-ALLOW"] || !t.W.IP.IsValid() || !t.Allow.Valid() {
		return
	}
	al := t.Allow
	byName := func(from BoxEnd, name string, port int) probes.ProbeSpec {
		return probes.ProbeSpec{Kind: probes.KindTCP, Name: strings.TrimSuffix(name, "."), Resolver: t.Gateway, Port: port, Via: t.Subnet,
			DeadlineMS: int(allowDeadline.Milliseconds())}
	}
	probe := func(from BoxEnd, target, key string, e Expectation, spec probes.ProbeSpec) *Action {
		return b.probe(Action{ID: b.id(), Claim: "C-ALLOW", Channel: "tcp", From: from.Place, Target: target, TargetKey: key, Expect: e}, spec)
	}
	inetWitness := func(a *Action, dst netip.Addr, proto string, port int, nonce string) {
		w := probes.WitnessSpec{Via: al.InetVia, Proto: proto, Port: port, DstIP: dst}
		if nonce != "" {
			// By the nonce alone: the gateway's dnsmasq asks the same
			// resolver from the same (NATed) address.
			w.Nonces = []string{nonce}
		} else {
			// A SYN carries no nonce: by the host's NATed source and a
			// port only this probe uses.
			w.SrcIPs = []netip.Addr{al.InetNAT}
		}
		b.witness(a, PlaceInet, w)
	}

	// box-w's control: the allowed canary, by name.
	probe(t.W, "canary "+t.PublicName+" (allowed)", "internet", ExpectReach, byName(t.W, t.PublicName, t.CanaryTCP))
	// Not the other canary, by name or by address.
	a := probe(t.W, "second canary "+al.OtherName+" (not allowed)", "internet-2", ExpectBlocked, byName(t.W, al.OtherName, allowByNamePort))
	inetWitness(a, al.Other, "tcp", allowByNamePort, "")
	a = probe(t.W, fmt.Sprintf("second canary %s:%d by address", al.Other, allowByAddrPort), "internet-2", ExpectBlocked,
		probes.ProbeSpec{Kind: probes.KindTCP, Target: al.Other, Port: allowByAddrPort, Via: t.Subnet})
	inetWitness(a, al.Other, "tcp", allowByAddrPort, "")
	// Not a public resolver straight (only the gateway's, which the
	// allowlist works through).
	nonce := probes.NewNonce()
	a = b.probe(Action{ID: b.id(), Claim: "C-ALLOW", Channel: "udp", From: t.W.Place, Target: "public resolver " + t.Upstream.String() + ":53, straight", TargetKey: "resolver", Expect: ExpectBlocked},
		probes.ProbeSpec{Kind: probes.KindUDP, Target: t.Upstream, Port: 53, Payload: "nonce", Nonce: nonce, Via: t.Subnet})
	inetWitness(a, t.Upstream, "udp", 53, nonce)
	// An allowed name that resolves to a LAN host stays unreachable.
	if t.LANVia.IsValid() {
		a = probe(t.W, al.RebindName+" (allowed, resolves to "+al.RebindAddr.String()+")", "lan-rebind", ExpectBlocked, byName(t.W, al.RebindName, 80))
		b.witness(a, PlaceLAN, probes.WitnessSpec{Via: t.LANVia, SrcIPs: []netip.Addr{t.W.IP, t.LANNAT}, Proto: "tcp", Port: 80, DstIP: al.RebindAddr})
	}
	// box-a, open, reaches the second canary: it was there to be blocked.
	probe(t.A, "second canary "+al.OtherName+" (box-a is open)", "internet-2", ExpectReach, byName(t.A, al.OtherName, allowOpenPort))
	probe(t.A, fmt.Sprintf("second canary %s:%d by address (box-a is open)", al.Other, allowOpenPort), "internet-2", ExpectReach,
		probes.ProbeSpec{Kind: probes.KindTCP, Target: al.Other, Port: allowOpenPort, Via: t.Subnet})
}

// allowControlled makes box-w's blocks inconclusive unless its control,
// the allowed canary, was reached.
func allowControlled(rs []Result) []Result { return placeControlled(rs, PlaceW) }

// greetingOf is the greeting the canary at target answers with ("" when
// the world gives none: a real host's public canary).
func greetingOf(t Scene, target string) string {
	ap, err := netip.ParseAddrPort(target)
	if err != nil {
		return ""
	}
	switch ap.Addr() {
	case t.Canary:
		return t.CanaryGreeting
	case t.Allow.Other:
		return t.Allow.OtherGreeting
	}
	return ""
}

// dropEgressTable is the mutation "egress": no allowlist is enforced.
func dropEgressTable(ctx context.Context, h *stack.Host, _ []string) error {
	return deleteTable(h, nftables.TableFamilyINet, stack.Current.NFTTable+"_egress")
}
