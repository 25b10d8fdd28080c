package drill

import (
	"fmt"
	"net/netip"
	"slices"

	"github.com/box-isolation/box/drill/topo"
	"github.com/box-isolation/box/probes"
	"github.com/box-isolation/box/stack/model"
)

// The scenario "box to the LAN", shared by the claims that fire it (C-LAN
// from box-a, C-TIER from box-t): every private address the host can reach
// over TCP, UDP and ICMP. In the world a witness in the LAN namespace
// watches for the probe (by its nonce, or a SYN by its sources); on a real
// host, one outbound witness on the host's outward interfaces watches for
// it leaving, alive only if it saw the host's own echo to the same target
// leave.

// lanFrom probes every LAN target from one box for a claim.
func (b *builder) lanFrom(claim ClaimID, from BoxEnd) {
	t := b.t
	if !from.IP.IsValid() {
		return
	}
	srcs := []netip.Addr{from.IP}
	if t.LANNAT.IsValid() {
		srcs = append(srcs, t.LANNAT)
	}
	// Without a LAN namespace of our own (host mode), one outbound witness
	// on the host's outward interfaces watches every C-LAN probe leave, or
	// not; the host's own echo to each target, seen leaving, proves it
	// watched the way there.
	outbound := !t.LANVia.IsValid() && len(t.Outward) > 0
	var out []int // indexes into b.sc.Actions: b.probe's pointers go stale
	for _, h := range t.LANHosts {
		label := h.Name + " " + h.Addr.String()
		var ctl string
		if outbound {
			// One echo per target serves every source; it need only be
			// seen leaving, so its own answer is no control.
			echo := b.planProbe(PlaceHost, probes.ProbeSpec{ID: outControlID(h.Addr), Kind: probes.KindICMP, Target: h.Addr, Nonce: probes.NewNonce(),
				DelayMS: int(selfControlAt.Milliseconds()), DeadlineMS: int(selfControlDeadline.Milliseconds())})
			b.sc.References[echo.ID] = true
			ctl = echo.Nonce
		}
		for _, ch := range []struct {
			channel Channel
			kind    probes.Kind
			port    int
		}{{ChannelTCP, probes.KindTCP, h.TCPPort}, {ChannelUDP, probes.KindUDP, h.UDPPort}, {ChannelICMP, probes.KindICMP, 0}} {
			if ch.kind != probes.KindICMP && ch.port == 0 {
				continue
			}
			spec := probes.ProbeSpec{Kind: ch.kind, Target: h.Addr, Port: ch.port, Via: b.via(from), Nonce: probes.NewNonce()}
			if ch.kind == probes.KindTCP && t.LANVia.IsValid() {
				// A SYN carries no nonce, and every box's arrives from the
				// host's LAN address past the NAT: its pinned source port
				// tells whose it is.
				spec.SrcPort = b.srcPort()
			}
			a := b.probe(Action{Claim: claim, Channel: ch.channel, From: from.Place, Target: label, TargetKey: h.Name, Expect: ExpectBlocked, Provenance: h.Provenance}, spec)
			switch {
			case h.Uplink && t.Allow.InetVia.IsValid():
				b.witness(a, PlaceInet, probes.WitnessSpec{Via: t.Allow.InetVia, Nonces: []string{spec.Nonce}, SrcIPs: []netip.Addr{from.IP, t.Allow.InetNAT}, Proto: string(ch.channel), Port: ch.port, SrcPort: spec.SrcPort, DstIP: h.Addr})
			case t.LANVia.IsValid():
				b.witness(a, PlaceLAN, probes.WitnessSpec{Via: t.LANVia, Nonces: []string{spec.Nonce}, SrcIPs: srcs, Proto: string(ch.channel), Port: ch.port, SrcPort: spec.SrcPort, DstIP: h.Addr})
			case outbound:
				a.OutControl = ctl
				out = append(out, len(b.sc.Actions)-1)
			}
		}
	}
	if len(out) == 0 {
		return
	}
	// One witness per group of targets, so none holds more nonces than a
	// plan allows; a target's actions share one witness.
	var prefixes []netip.Prefix
	for _, r := range model.PrivateRanges {
		if r.Addr().Is4() {
			prefixes = append(prefixes, r.Masked())
		}
	}
	// A target the host routes elsewhere that is in no private range
	// (L-ROUTE's) is watched for by its own address.
	for _, h := range t.LANHosts {
		if !topo.Private(h.Addr) && len(prefixes) < probes.MaxDstPrefixes {
			prefixes = append(prefixes, netip.PrefixFrom(h.Addr, 32))
		}
	}
	var spec *probes.WitnessSpec
	for k, i := range out {
		a := &b.sc.Actions[i]
		if spec == nil || (a.OutControl != b.sc.Actions[out[k-1]].OutControl && len(spec.Nonces)+3 > probes.MaxMatchEntries) {
			p := b.plan(PlaceHost)
			p.Witnesses = append(p.Witnesses, probes.WitnessSpec{ID: fmt.Sprintf("w-outbound-%d", len(p.Witnesses)), Ifaces: t.Outward, DstPrefixes: prefixes, WindowMS: int(witnessWindow.Milliseconds())})
			spec = &p.Witnesses[len(p.Witnesses)-1]
		}
		if a.Probe.Kind != probes.KindTCP {
			spec.Nonces = append(spec.Nonces, a.Probe.Nonce)
		}
		if !slices.Contains(spec.Nonces, a.OutControl) {
			spec.Nonces = append(spec.Nonces, a.OutControl)
		}
	}
	// The actions point at their witness once every nonce is in.
	hp := b.plan(PlaceHost)
	for _, i := range out {
		a := &b.sc.Actions[i]
		for _, w := range hp.Witnesses {
			if len(w.Ifaces) > 0 && slices.Contains(w.Nonces, a.OutControl) && (a.Probe.Kind == probes.KindTCP || slices.Contains(w.Nonces, a.Probe.Nonce)) {
				a.WitnessAt, a.Witness = PlaceHost, &w
			}
		}
	}
}

// outControlID is the id of the host's own echo to a LAN target, which
// the outbound witness must see leave.
func outControlID(a netip.Addr) string { return outControlPrefix + a.String() }

const outControlPrefix = "ctl-out-"
