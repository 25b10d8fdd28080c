package drill

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/box-isolation/box/drill/topo"
	"github.com/box-isolation/box/internal/hostscan"
	"github.com/box-isolation/box/probes"
	"github.com/box-isolation/box/stack/model"
	"github.com/box-isolation/box/stack/nft"
)

// The scenario "box to its host", shared by the claims that fire it (C-HOST
// from box-a and from every cluster member's box, C-TIER from box-t): every
// host address over TCP and UDP to the drill's listeners there and ICMP,
// and every port the host really serves on it (its listening sockets, the
// ports it forwards, DNS and DHCP off the gateway). Each is judged at the
// host: by the listener (did it serve the sender?), the host's own probe of
// the same listener or kernel (the self-control: was the target
// answering?), or the counting chain after the host's filter (did the
// packet get past it?).

// hostFrom probes every host address from one box for a claim.
func (b *builder) hostFrom(claim ClaimID, from BoxEnd) {
	if !from.IP.IsValid() {
		return
	}
	b.hostAt(claim, from, b.t.localMember(), b.t.HostAddrs, from.IP, false)
}

// hostAt probes addrs, addresses of member m, from one box for a claim,
// judged at m: by its listeners, its own probes of them (the controls) and
// its counting chain. natSrc is where the box's packets come from at m (the
// box itself on its own member, its member's cluster address at another);
// cross pins each probe's source port, so m's chain counts that probe and
// nothing else from natSrc (the cluster's own traffic, say), and m's
// listeners tell it from other members' boxes.
func (b *builder) hostAt(claim ClaimID, from BoxEnd, m MemberScene, addrs []HostAddr, natSrc netip.Addr, cross bool) {
	t := b.t
	tcp, udp := t.hostPorts()
	member := m.Name
	for _, h := range addrs {
		b.hostListener(m, h)
		label := "host " + h.Name + " " + h.Addr.String()
		key := "host-" + h.Name
		if !m.Local {
			label = "member " + m.Name + " " + h.Name + " " + h.Addr.String()
			key = "member-" + h.Name
		}
		// The drill's listeners serve every sender: each probe is known at
		// the listener by where it arrives from (the box, or past a NAT its
		// member's address and the source port it pinned).
		for _, l := range []struct {
			channel Channel
			kind    probes.Kind
			port    int
			proto   string
		}{{ChannelTCP, probes.KindTCP, tcp, "tcp"}, {ChannelUDP, probes.KindUDP, udp, "udp"}} {
			spec := probes.ProbeSpec{Kind: l.kind, Target: h.Addr, Port: l.port, Via: b.via(from), Nonce: probes.NewNonce()}
			if cross {
				spec.SrcPort = b.srcPort()
			}
			a := b.probe(Action{Claim: claim, Channel: l.channel, From: from.Place, Member: member, Target: label, TargetKey: key, Expect: ExpectBlocked}, spec)
			a.ListenerAt, a.ListenerID = m.hostPlace(), "l-"+l.proto+"-"+h.Name
			a.Source = netip.AddrPortFrom(natSrc, uint16(spec.SrcPort))
			a.SelfControl = b.selfControl(m.hostPlace(), "ctl-"+l.proto+"-"+h.Name, l.kind, h.Addr, l.port)
		}
		// The host's kernel answers every echo that reaches it (its control:
		// it answers the host's own), so silence is the firewall's doing; a
		// capture on the box side would see the request before the
		// firewall drops it and prove nothing.
		a := b.probe(Action{Claim: claim, Channel: ChannelICMP, From: from.Place, Member: member, Target: label, TargetKey: key, Expect: ExpectBlocked},
			probes.ProbeSpec{Kind: probes.KindICMP, Target: h.Addr, Via: b.via(from), Nonce: probes.NewNonce()})
		a.SelfControl = b.selfControl(m.hostPlace(), "ctl-icmp-"+h.Name, probes.KindICMP, h.Addr, 0)
		for _, sv := range b.hostServices(h, m.Listeners, m.Forwards) {
			kind := probes.KindTCP
			if sv.proto == "udp" {
				kind = probes.KindUDP
			}
			spec := probes.ProbeSpec{Kind: kind, Target: h.Addr, Port: int(sv.port), Via: b.via(from), Nonce: probes.NewNonce()}
			k := nft.CountKey{Src: natSrc, Dst: h.Addr, Proto: sv.proto, Port: sv.port}
			if cross {
				spec.SrcPort = b.srcPort()
				k.SrcPort = uint16(spec.SrcPort)
			}
			a := b.probe(Action{Claim: claim, Channel: Channel(sv.proto), From: from.Place, Member: member, Target: fmt.Sprintf("%s %s/%d (%s)", label, sv.proto, sv.port, sv.what), TargetKey: key, Expect: ExpectBlocked, Provenance: sv.why}, spec)
			a.Count, a.CountAt = k.String(), m.filterPlace()
			a.Source = netip.AddrPortFrom(natSrc, uint16(spec.SrcPort))
			b.countAt(m.filterPlace(), k)
		}
	}
}

// hostService is one port a box aims at on a host address.
type hostService struct {
	proto string
	port  uint16
	what  string
	why   topo.Provenance
}

// hostServices lists what a box aims at on one host address, besides the
// drill's own listeners: every socket listening on it (or on every
// address) that a box could reach, and DNS and DHCP on every address but
// the gateway, where they are the only exceptions, listener or not.
func (b *builder) hostServices(h HostAddr, listeners []hostscan.Listener, forwards []hostscan.Forward) []hostService {
	t := b.t
	type key struct {
		proto string
		port  uint16
	}
	tcp, udp := t.hostPorts()
	// The drill's own listeners are probed on their own; DNS and DHCP at
	// the gateway are what a box may use.
	seen := map[key]bool{{"tcp", uint16(tcp)}: true, {"udp", uint16(udp)}: true}
	if h.Addr == t.Gateway {
		seen[key{"udp", 53}], seen[key{"tcp", 53}], seen[key{"udp", 67}] = true, true, true
	}
	var out []hostService
	add := func(proto string, port uint16, what string, why topo.Provenance) {
		if !seen[key{proto, port}] {
			seen[key{proto, port}] = true
			out = append(out, hostService{proto, port, what, why})
		}
	}
	for _, l := range listeners {
		if l.Loopback || (l.Family == 6 && !l.Addr.IsUnspecified()) || (!l.Addr.IsUnspecified() && l.Addr != h.Addr) {
			continue
		}
		what := "listener"
		if l.Process != "" {
			what = "listener " + l.Process
		}
		add(l.Proto, l.Port, what, topo.FromListener)
	}
	for _, f := range forwards {
		if !forwardsFromBoxes(f, h.Addr) {
			continue
		}
		for i, pr := range f.Ports {
			if i == maxForwardPorts {
				break
			}
			add(f.Proto, pr.First, "forwarded by "+f.String(), topo.FromForward)
		}
	}
	add("udp", 53, "DNS, only at the gateway", topo.FromInterface)
	add("tcp", 53, "DNS, only at the gateway", topo.FromInterface)
	add("udp", 67, "DHCP, only at the gateway", topo.FromInterface)
	return out
}

// maxForwardPorts bounds the ports probed per forwarding rule (a range's
// first port stands for it).
const maxForwardPorts = 8

// forwardsFromBoxes says whether a forwarding rule could apply to a box's
// TCP or UDP packet to addr: no other destination address, no input
// interface other than the box bridge.
func forwardsFromBoxes(f hostscan.Forward, addr netip.Addr) bool {
	if (f.Proto != "tcp" && f.Proto != "udp") || (f.Daddr.IsValid() && f.Daddr != addr) || f.InIfIndex != 0 {
		return false
	}
	if f.InIface == "" || f.InIfaceNot {
		return true
	}
	if p, ok := strings.CutSuffix(f.InIface, "*"); ok {
		return strings.HasPrefix(model.Current.Network, p)
	}
	return f.InIface == model.Current.Network
}

// selfControl has the host probe its own listener (or its own kernel, for
// ICMP) after the boxes' probes ended: a target that answers it was serving
// all along, so its silence to a box means something.
func (b *builder) selfControl(place Place, id string, kind probes.Kind, addr netip.Addr, port int) ProbeRef {
	// One control serves every source that aims at the target.
	b.planProbe(place, probes.ProbeSpec{ID: id, Kind: kind, Target: addr, Port: port, Nonce: probes.NewNonce(),
		DelayMS: int(selfControlAt.Milliseconds()), DeadlineMS: int(selfControlDeadline.Milliseconds())})
	return ProbeRef{At: place, ID: id}
}

// hostListener puts the drill's TCP greeter and UDP echo on one of a
// host's (or cluster member's) addresses, once, named after who answers.
func (b *builder) hostListener(m MemberScene, h HostAddr) {
	tcp, udp := b.t.hostPorts()
	p := b.plan(m.hostPlace())
	id := "l-tcp-" + h.Name
	if slices.ContainsFunc(p.Listeners, func(l probes.ListenerSpec) bool { return l.ID == id }) {
		return
	}
	who := "host-" + h.Name
	if !m.Local {
		who = m.Name + "-" + h.Name
	}
	window := int(witnessWindow.Milliseconds())
	p.Listeners = append(p.Listeners,
		probes.ListenerSpec{ID: id, Kind: probes.KindTCPGreeter, Name: who, Port: tcp, Via: h.Via, WindowMS: window},
		probes.ListenerSpec{ID: "l-udp-" + h.Name, Kind: probes.KindUDPEcho, Name: who, Port: udp, Via: h.Via, WindowMS: window})
}

// localMember is the host box-a runs on, as a member (named when on a
// cluster).
func (t Scene) localMember() MemberScene {
	m := MemberScene{Local: true, Listeners: t.Listeners, Forwards: t.Forwards, HostAddrs: t.HostAddrs}
	for _, c := range t.Members {
		if c.Local {
			m.Name, m.ClusterAddr, m.NetNS = c.Name, c.ClusterAddr, c.NetNS
		}
	}
	return m
}

// hostPorts are the ports of the drill's listeners on host addresses.
func (t Scene) hostPorts() (tcp, udp int) {
	tcp, udp = t.HostTCP, t.HostUDP
	if tcp == 0 {
		tcp = listenTCP
	}
	if udp == 0 {
		udp = listenUDP
	}
	return tcp, udp
}
