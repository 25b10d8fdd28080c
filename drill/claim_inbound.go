package drill

import (
	"context"
	"fmt"
	"net/netip"
	"slices"

	"github.com/box-isolation/box/drill/topo"
	"github.com/box-isolation/box/internal/hostscan"
	"github.com/box-isolation/box/internal/nsrun"
	"github.com/box-isolation/box/probes"
	"github.com/box-isolation/box/stack/model"
)

// InboundID is C-INBOUND: nothing outside opens a connection into a box.
const InboundID ClaimID = "C-INBOUND"

var claimInbound = Claim{
	ID: InboundID, From: "host, LAN (in host mode a throwaway namespace behind the host, one source per private range)", To: "box",
	Channels: []Channel{ChannelTCP, ChannelICMP},
	Expect:   "dropped",
	Layers:   []model.LayerID{model.LayerACL},
	Why:      "nothing outside may open a connection into a box",
	Modes:    everywhere, Evidence: []Evidence{EvidenceProbes},
	prepare: prepareInbound,
	build:   buildInbound,
	clean:   cleanLANSims,
}

// prepareInbound stands a throwaway namespace in for the LAN on a real
// host (the world has its own LAN namespace), behind the host: one source
// in each of the host's LAN prefixes (lanSimSources), then one in each
// private range they leave uncovered.
func prepareInbound(_ context.Context, r *run) error {
	if len(r.cfg.Topology.LANSources) > 0 {
		return nil
	}
	addrs, routes, err := topo.ReadInterfaces(r.cfg.Host.NetNS)
	if err != nil {
		return err
	}
	taken := takenBy(addrs, routes)
	var neigh []hostscan.Neighbour
	if err := nsrun.Do(r.cfg.Host.NetNS, func() error {
		var err error
		neigh, err = hostscan.Neighbours()
		return err
	}); err != nil {
		return fmt.Errorf("%s: reading the neighbour table for the LAN stand-in's sources: %w", InboundID, err)
	}
	used := func(a netip.Addr) bool {
		return taken(a) || slices.ContainsFunc(neigh, func(n hostscan.Neighbour) bool { return n.Addr == a })
	}
	var boxSubnet netip.Prefix
	if r.v != nil {
		boxSubnet = r.v.Subnet
	}
	sources := lanSimSources(routes, boxSubnet, used)
	sim, err := newLANSim(r.cfg.Host.NetNS, r.rep.RunID, r.ends[PlaceA].IP, sources)
	if err != nil {
		r.rep.Problems = append(r.rep.Problems, fmt.Sprintf("the LAN stand-in for %s: %v", InboundID, err))
		r.rep.Notes = append(r.rep.Notes, string(InboundID)+": nothing probes a box from the LAN here: its LAN side rests on Verify alone (the stack channel, "+string(model.LayerACL)+")")
		return nil
	}
	r.later(func(context.Context) error { return sim.remove() })
	r.cfg.Topology.LANNS, r.cfg.Topology.LANSources = sim.ns, sim.sources
	return nil
}

// buildInbound: the host (from the gateway) and every LAN source to box-a's
// listener over TCP and ICMP, witnessed in box-a.
func buildInbound(b *builder) {
	t := b.t
	label := string(t.A.Place) + " " + t.A.IP.String()
	type from struct {
		place Place
		src   netip.Addr
	}
	froms := []from{{PlaceHost, t.Gateway}}
	for _, s := range t.LANSources {
		froms = append(froms, from{PlaceLAN, s})
	}
	for _, f := range froms {
		for _, ch := range []struct {
			channel Channel
			kind    probes.Kind
			port    int
		}{{ChannelTCP, probes.KindTCP, listenTCP}, {ChannelICMP, probes.KindICMP, 0}} {
			nonce := probes.NewNonce()
			spec := probes.ProbeSpec{Kind: ch.kind, Target: t.A.IP, Port: ch.port, Nonce: nonce}
			target := label
			if f.place == PlaceLAN {
				// Sent from this source address, whatever else the LAN
				// namespace holds.
				spec.Via = netip.PrefixFrom(f.src, 32)
				target += " from " + f.src.String()
			}
			a := b.probe(Action{Claim: InboundID, Channel: ch.channel, From: f.place, Target: target, TargetKey: string(PlaceA), Expect: ExpectBlocked}, spec)
			w := probes.WitnessSpec{Via: t.Subnet, Nonces: []string{nonce}, Proto: string(ch.channel), Port: ch.port, DstIP: t.A.IP}
			if ch.kind == probes.KindTCP {
				// A SYN carries no nonce: match its source, narrowed to the
				// listener's port so replies to box-a's own probes of the
				// host never count. An echo request carries the nonce, and
				// matching the source there would take the gateway's replies
				// to box-a's C-HOST pings for inbound traffic.
				w.SrcIPs = []netip.Addr{f.src}
			}
			b.witness(a, PlaceA, w)
		}
	}
}
