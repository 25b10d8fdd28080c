package drill

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/box-isolation/box/drill/topo"
	"github.com/box-isolation/box/internal/hostscan"
	"github.com/box-isolation/box/probes"
	"github.com/box-isolation/box/stack"
	"github.com/box-isolation/box/stack/nft"
)

// Places where plans run: the three probe boxes and the world's namespaces.
const (
	PlaceA    = "box-a"   // the prober
	PlaceB    = "box-b"   // its peer
	PlaceC    = "clone-a" // a clone of box-a
	PlaceT    = "box-t"   // a granted user's box (C-TIER)
	PlaceHost = "host"    // the host namespace (listeners on host addresses)
	PlaceLAN  = "lan"     // the LAN namespace (witnesses at LAN hosts)
	// PlaceFilter holds the counting chain's counts, read by the drill
	// itself after the probes (observation id: the count key).
	PlaceFilter = "host-filter"
)

// Ports the drill's own listeners use on boxes and host addresses.
const (
	listenTCP = 9100
	listenUDP = 9101
)

// Timing of one probe round, every clock starting when an agent starts.
// Witnesses and listeners arm at once; probes wait probeDelay so every
// witness is armed (agents in several boxes start within a few hundred
// milliseconds of each other); a blocked probe costs one probeDeadline, all
// of them together. Every window judged on silence outlasts the protocol's
// own timers:
//
//   - TCP: a SYN is retransmitted after 1 s (RFC 6298's initial RTO), so
//     probeDeadline (1.5 s) sees the first retransmission's answer too;
//     ICMP echo, UDP, ARP and broadcast send three times across it.
//   - Router solicitation: a router may delay a solicited advertisement by
//     MAX_RA_DELAY_TIME (0.5 s) and sends multicast advertisements at most
//     every MIN_DELAY_BETWEEN_RAS (3 s) (RFC 4861 section 10), so a router
//     busy with another box's solicitation answers within 3.5 s: rsWindow is
//     4 s, its three solicitations spread across it.
//   - Unsolicited IPv6 configuration (advertisements, redirects, DHCPv6)
//     is watched passively in every box for the whole plan, and the box's
//     IPv6 state (addresses from SLAAC, whose duplicate address detection
//     takes a second, and default routes) is read at stateAt, the end.
//   - Controls: the host sends each witness's control frames from
//     controlDelay until the witnesses' windows end, so a witness proves it
//     was capturing after every probe it judges had started. The agents
//     start within a few tens of milliseconds of each other on an idle
//     machine; the last probe a witness judges (the IPv6 state read) starts
//     about 600 ms before the last control frame, which is the skew the run
//     tolerates.
var (
	probeDelay    = 1000 * time.Millisecond
	probeDeadline = 1500 * time.Millisecond
	rsDelay       = 100 * time.Millisecond
	rsWindow      = 4000 * time.Millisecond
	stateAt       = rsDelay + rsWindow
	stateDeadline = 200 * time.Millisecond
	planDeadline  = stateAt + stateDeadline + 700*time.Millisecond
	controlDelay  = 500 * time.Millisecond
	// passiveCushion ends witnesses, listeners and control senders this
	// long before the agent collects its report: a task that ends right at
	// the collection is lost on a loaded machine (measured: twice in 45
	// soak runs with three other processes spinning, every host listener of
	// a run went missing when they ended 25 ms before it; once in CI, the
	// control senders, ending 140 ms before it).
	passiveCushion = 250 * time.Millisecond
	// selfControlAt is when the host checks its own listeners and echo:
	// after every box's blocked probes have ended, with the same skew
	// budget as the controls.
	selfControlAt = probeDelay + probeDeadline + 800*time.Millisecond
	// selfControlDeadline is ample for an answer over the host's loopback,
	// and ends the control while the listener still listens.
	selfControlDeadline = 1000 * time.Millisecond
)

// Expectation is what an action must observe to pass.
type Expectation string

const (
	ExpectReach    Expectation = "reached"         // reached, with proof of who answered
	ExpectBlocked  Expectation = "blocked"         // silent or rejected, and nothing arrived at the target
	ExpectResolve  Expectation = "resolves"        // the name resolves
	ExpectNoName   Expectation = "no sibling name" // the resolver answers, without a record
	ExpectNone     Expectation = "none"            // no IPv6 state, no router advertisement
	ExpectLease    Expectation = "lease"           // an address on the box subnet
	ExpectDistinct Expectation = "distinct"        // clone and source differ
	ExpectPresent  Expectation = "layer present"   // Verify finds the claim's layers as desired
)

// BoxEnd is one probe box as the drill knows it after minting.
type BoxEnd struct {
	Place     string           `json:"place"`
	Instance  string           `json:"instance"`
	IP        netip.Addr       `json:"ip"`
	MAC       net.HardwareAddr `json:"-"`
	LinkLocal netip.Addr       `json:"link_local"`
	// Type is the instance's type as Incus reports it; the report's
	// environment says it once for all the boxes.
	Type string `json:"-"`
	// Port is its port on the bridge, as the census met it.
	Port string `json:"-"`
	// Member is, on a cluster, the member it runs on.
	Member string `json:"member,omitempty"`
}

// HostAddr and Target are the topology's.
type (
	HostAddr = topo.HostAddr
	Target   = topo.Target
)

// Scene is everything the scenario needs to know about the run: the
// topology it was given, the stack as Verify found it, the probe boxes, and
// what the drill read in the host's namespace once the stack was up.
type Scene struct {
	topo.Topology

	Subnet  netip.Prefix
	Gateway netip.Addr
	// GatewayMAC is the bridge's own MAC, where a box's frames to the
	// host go.
	GatewayMAC net.HardwareAddr
	A, B, C    BoxEnd
	// T is the granted user's box (C-TIER), W the allowlisted one
	// (C-ALLOW); zero when their claim is not run.
	T, W BoxEnd
	// Door is box-a's door on the host's loopback (C-EXPOSE); zero when
	// there is none.
	Door      netip.AddrPort
	DNSDomain string // the bridge's DNS domain, for sibling name forms

	// HostAddrs are the host's own addresses, the gateway first.
	HostAddrs []HostAddr
	// Listeners are the sockets listening in the host's namespace once the
	// stack is up (read from the kernel): what a box would really aim at.
	Listeners []hostscan.Listener
	// Forwards are the host's DNAT and redirect rules (read from its
	// nftables ruleset): the ports they forward are targets too.
	Forwards []hostscan.Forward
	// questions are the names C-NAMES asks besides the siblings'
	// (nameQuestions).
	questions []topo.Name
	// Members are, on a cluster, its members the drill can enter (the
	// local one, where box-a runs, among them); empty off a cluster.
	Members []MemberScene
	// HostTCP and HostUDP are the ports of the drill's listeners on the
	// host's addresses (9100 and 9101 when zero); on a real host they are
	// picked per run, so a service of the host's own is never in the way.
	HostTCP, HostUDP int
}

// Action is one probe with its expected result.
type Action struct {
	ID      string `json:"id"`
	Claim   string `json:"claim"`
	Channel string `json:"channel"`
	From    string `json:"from"` // a place
	// Member is, on a cluster, the member whose host the probe is aimed
	// at (or, for a probe box's own controls, the member it runs on).
	Member string `json:"member,omitempty"`
	Target string `json:"target"` // who, for people: "box-b 10.88.0.12"
	// TargetKey is the matrix column: the target's name without its
	// address or port ("host-gateway", "lan-10"). In the JSON so that a
	// recorded report draws the same matrix.
	TargetKey string      `json:"target_key,omitempty"`
	Expect    Expectation `json:"expect"`
	// Provenance says why the target was probed (topo's provenances: a
	// listener, a route, a neighbour, a hosts file...), when it was found
	// rather than brought by the drill.
	Provenance topo.Provenance  `json:"provenance,omitempty"`
	Probe      probes.ProbeSpec `json:"-"`
	// WitnessAt runs Witness; ListenerAt names a listener whose service
	// counts as arrival (host addresses, where a capture on the wire would
	// see a packet the firewall drops later).
	WitnessAt  string              `json:"-"`
	Witness    *probes.WitnessSpec `json:"-"`
	ListenerAt string              `json:"-"`
	ListenerID string              `json:"-"`
	// ControlAt runs ControlID, the host's probe of its own listener or
	// kernel that proves the target was answering (its silence to a box
	// means nothing otherwise).
	ControlAt string `json:"-"`
	ControlID string `json:"-"`
	// Pinned is the peer address the sender pinned to its MAC, so the probe
	// tests L3 on its own; if pinning failed the probe only repeats ARP.
	Pinned netip.Addr `json:"-"`
	// Count is the key of the counting chain after the host's filter that
	// witnesses this probe (host addresses, where a service of the host's
	// own answers, or nothing does); CountAt the chain's place (a cluster
	// member's; PlaceFilter when empty).
	Count   string `json:"-"`
	CountAt string `json:"-"`
	// OutControl is the nonce of the host's own echo to the action's LAN
	// target: an outbound witness that saw it leave was watching the way
	// the action's packets would take.
	OutControl string `json:"-"`
	// Compare names the probes whose observations are compared (C-CLONE).
	Compare []string `json:"-"`
	// Baseline marks a positive control.
	Baseline bool `json:"-"`
}

// Scenario is the plans to run and the actions they serve.
type Scenario struct {
	Plans   map[string]*probes.Plan
	Actions []Action
	// Counters is what the counting chain after the host's filter counts:
	// the actions' keys, and CountControl, box-a's DNS question to the
	// gateway (the C-DNS baseline), which the filter lets through, so a
	// chain that counted nothing was not counting.
	Counters     []nft.CountKey
	CountControl nft.CountKey
	// MemberCounters and CountControls are, on a cluster, other members'
	// counting chains (by their filter place) and each one's control.
	MemberCounters map[string][]nft.CountKey
	CountControls  map[string]nft.CountKey
}

type builder struct {
	t      Scene
	sc     *Scenario
	n      int
	claims map[string]bool
	window int
	// sport is the last source port srcPort handed out (0: none yet).
	sport int
	// controls maps a place to the control nonce its witnesses look for
	// on the box subnet; lanControl is the LAN wire's.
	controls   map[string]string
	lanControl string
}

func (b *builder) plan(place string) *probes.Plan {
	p, ok := b.sc.Plans[place]
	if !ok {
		p = &probes.Plan{Version: probes.PlanVersion, DeadlineMS: int(planDeadline.Milliseconds())}
		b.sc.Plans[place] = p
	}
	return p
}

func (b *builder) id() string {
	b.n++
	return fmt.Sprintf("p%03d", b.n)
}

// probe adds an action and its probe. The returned pointer is only good
// until the next call.
func (b *builder) probe(a Action, spec probes.ProbeSpec) *Action {
	spec.ID = a.ID
	if spec.DeadlineMS == 0 {
		spec.DeadlineMS = int(probeDeadline.Milliseconds())
	}
	if spec.DelayMS == 0 {
		spec.DelayMS = int(probeDelay.Milliseconds())
	}
	p := b.plan(a.From)
	p.Probes = append(p.Probes, spec)
	a.Probe = spec
	b.sc.Actions = append(b.sc.Actions, a)
	return &b.sc.Actions[len(b.sc.Actions)-1]
}

// witness puts a capture at place for the action's traffic, with the
// control of its wire.
func (b *builder) witness(a *Action, place string, spec probes.WitnessSpec) {
	spec.ID = "w" + a.ID
	spec.WindowMS = b.window
	if place == PlaceLAN {
		spec.Control = b.lanControl
	} else {
		spec.Control = b.controls[place]
	}
	b.plan(place).Witnesses = append(b.plan(place).Witnesses, spec)
	a.WitnessAt = place
	a.Witness = &spec
}

// BuildScenario expands the selected claims into actions and per-place
// plans. Baseline claims are always built: without them no blocked verdict
// can be trusted.
func BuildScenario(t Scene, claims []Claim) *Scenario {
	b := &builder{t: t, sc: &Scenario{Plans: map[string]*probes.Plan{}, CountControls: map[string]nft.CountKey{}}, claims: map[string]bool{},
		window: int((planDeadline - probes.AgentMargin - passiveCushion).Milliseconds()), controls: map[string]string{}}
	for _, c := range claims {
		b.claims[c.ID] = true
	}
	for _, c := range Catalogue {
		if c.Baseline {
			b.claims[c.ID] = true
		}
	}
	// Listeners on every box and host address, so a probe that gets
	// through is answered and proves it.
	for _, place := range []string{PlaceA, PlaceB, PlaceC} {
		p := b.plan(place)
		p.Listeners = append(p.Listeners,
			probes.ListenerSpec{ID: "l-tcp", Kind: probes.KindTCPGreeter, Name: place, Port: listenTCP, WindowMS: b.window},
			probes.ListenerSpec{ID: "l-udp", Kind: probes.KindUDPEcho, Name: place, Port: listenUDP, WindowMS: b.window})
	}
	// Every box gets a usable IPv6 link-local address, as an attacker
	// would give itself one (SPEC 7c).
	for _, e := range []BoxEnd{t.A, t.B, t.C, t.T} {
		if e.LinkLocal.IsValid() {
			b.plan(e.Place).LinkLocal = &probes.LinkLocalSpec{Via: t.Subnet, Address: e.LinkLocal}
		}
	}
	if b.claims["C-HOST"] || (b.claims["C-TIER"] && t.T.IP.IsValid()) {
		b.hostListeners(PlaceHost, "host", t.HostAddrs)
	}
	b.controlFrames()
	b.pinPeers()
	b.baselines()
	b.sibling()
	b.host()
	b.cluster()
	b.lan()
	b.names()
	b.v6()
	b.inbound()
	b.clone()
	b.spoof()
	b.allow()
	b.expose()
	return b.sc
}

// hostListeners puts the drill's TCP greeter and UDP echo on every one of
// addrs, in the plan of the host (or cluster member) that holds them,
// each named after who answers.
func (b *builder) hostListeners(place, who string, addrs []HostAddr) {
	tcp, udp := b.t.hostPorts()
	p := b.plan(place)
	for _, h := range addrs {
		p.Listeners = append(p.Listeners,
			probes.ListenerSpec{ID: "l-tcp-" + h.Name, Kind: probes.KindTCPGreeter, Name: who + "-" + h.Name, Port: tcp, Via: h.Via, WindowMS: b.window},
			probes.ListenerSpec{ID: "l-udp-" + h.Name, Kind: probes.KindUDPEcho, Name: who + "-" + h.Name, Port: udp, Via: h.Via, WindowMS: b.window})
	}
}

// controlFrames has the host send each box's witnesses their positive
// control (frames to that box's MAC on the bridge) and, in the world, the
// LAN wire's witnesses theirs (broadcast on the host's LAN side). They are
// plan items, not actions: the witnesses' reports say whether they arrived.
func (b *builder) controlFrames() {
	// They end with the witnesses' windows: a task that ends right at the
	// agent's collection is lost on a loaded machine.
	dur := planDeadline - controlDelay - probes.AgentMargin - passiveCushion
	add := func(id string, via netip.Prefix, mac net.HardwareAddr) string {
		nonce := probes.NewNonce()
		spec := probes.ProbeSpec{ID: id, Kind: probes.KindControl, Via: via, Nonce: nonce,
			DelayMS: int(controlDelay.Milliseconds()), DeadlineMS: int(dur.Milliseconds())}
		if mac != nil {
			spec.DstMAC = mac.String()
		}
		p := b.plan(PlaceHost)
		p.Probes = append(p.Probes, spec)
		return nonce
	}
	for _, e := range []BoxEnd{b.t.A, b.t.B, b.t.C} {
		if e.MAC != nil {
			b.controls[e.Place] = add(controlID(e.Place), b.t.Subnet, e.MAC)
		}
	}
	if b.t.LANVia.IsValid() {
		b.lanControl = add(controlID(PlaceLAN), b.t.LANVia, nil)
	}
	if b.claims["C-ALLOW"] && b.t.W.IP.IsValid() && b.t.Allow.Valid() {
		b.controls[PlaceInet] = add(controlID(PlaceInet), b.t.Allow.InetVia, nil)
	}
}

// pinPeers has box-a pin its peers' addresses (IPv4 and the link-local
// ones the drill gives them) to their MACs, so the sibling probes over ICMP,
// TCP and UDP test the L3 path on their own, not ARP again.
func (b *builder) pinPeers() {
	if b.claims["C-SIBLING"] {
		b.pinPeersAt(PlaceA)
	}
	if b.claims["C-TIER"] && b.t.T.IP.IsValid() {
		b.pinPeersAt(PlaceT)
	}
}

// pinPeersAt pins the peers' addresses in one prober's neighbour table.
func (b *builder) pinPeersAt(place string) {
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

func (b *builder) baselines() {
	t := b.t
	canary := "canary " + t.Canary.String()
	for _, ch := range []struct {
		channel string
		kind    probes.Kind
		port    int
	}{{"tcp", probes.KindTCP, t.CanaryTCP}, {"udp", probes.KindUDP, t.CanaryUDP}, {"icmp", probes.KindICMP, 0}} {
		if ch.kind == probes.KindUDP && ch.port == 0 {
			// A public canary echoes nothing: UDP egress is a DNS question
			// sent straight to it (it is a public resolver).
			b.probe(Action{ID: b.id(), Claim: "C-EGRESS", Channel: "udp", From: PlaceA, Target: canary + ":53 " + t.PublicName, TargetKey: "internet", Expect: ExpectResolve, Baseline: true},
				probes.ProbeSpec{Kind: probes.KindDNS, Target: t.Canary, Port: 53, Name: t.PublicName, QType: "A", Via: t.Subnet})
			continue
		}
		b.probe(Action{ID: b.id(), Claim: "C-EGRESS", Channel: ch.channel, From: PlaceA, Target: canary, TargetKey: "internet", Expect: ExpectReach, Baseline: true},
			probes.ProbeSpec{Kind: ch.kind, Target: t.Canary, Port: ch.port, Via: t.Subnet})
	}
	b.probe(Action{ID: b.id(), Claim: "C-DNS", Channel: "dns", From: PlaceA, Target: "gateway " + t.Gateway.String() + " " + t.PublicName, TargetKey: "gateway", Expect: ExpectResolve, Baseline: true},
		probes.ProbeSpec{Kind: probes.KindDNS, Target: t.Gateway, Port: 53, Name: t.PublicName, QType: "A", Via: t.Subnet})
	b.probe(Action{ID: b.id(), Claim: "C-DHCP", Channel: "dhcp", From: PlaceA, Target: "lease on " + t.Subnet.String(), TargetKey: "lease", Expect: ExpectLease, Baseline: true},
		probes.ProbeSpec{Kind: probes.KindDHCPLease, Via: t.Subnet})
	if b.claims["C-TIER"] && t.T.IP.IsValid() {
		// box-t's own controls: its blocks prove something only if it can
		// reach what a box may (box-a's baselines say nothing about it).
		b.probe(Action{ID: b.id(), Claim: "C-TIER", Channel: "tcp", From: PlaceT, Target: canary, TargetKey: "internet", Expect: ExpectReach},
			probes.ProbeSpec{Kind: probes.KindTCP, Target: t.Canary, Port: t.CanaryTCP, Via: t.Subnet})
		b.probe(Action{ID: b.id(), Claim: "C-TIER", Channel: "dns", From: PlaceT, Target: "gateway " + t.Gateway.String() + " " + t.PublicName, TargetKey: "gateway", Expect: ExpectResolve},
			probes.ProbeSpec{Kind: probes.KindDNS, Target: t.Gateway, Port: 53, Name: t.PublicName, QType: "A", Via: t.Subnet})
	}
}

// toBox probes a peer box over ARP, ICMP, TCP, UDP and IPv6 link-local,
// each with a witness in the peer.
func (b *builder) toBox(claim string, from BoxEnd, to BoxEnd) {
	t := b.t
	label := to.Place + " " + to.IP.String()
	srcs := []netip.Addr{from.IP}
	if from.LinkLocal.IsValid() {
		srcs = append(srcs, from.LinkLocal)
	}
	macs := []string{from.MAC.String()}
	for _, ch := range []struct {
		channel string
		kind    probes.Kind
		port    int
		proto   string
		target  netip.Addr
	}{
		{"arp", probes.KindARP, 0, "arp", to.IP},
		{"icmp", probes.KindICMP, 0, "icmp", to.IP},
		{"tcp", probes.KindTCP, listenTCP, "tcp", to.IP},
		{"udp", probes.KindUDP, listenUDP, "udp", to.IP},
		{"icmpv6-link-local", probes.KindICMP, 0, "icmpv6", to.LinkLocal},
	} {
		if !ch.target.IsValid() {
			continue
		}
		nonce := probes.NewNonce()
		spec := probes.ProbeSpec{Kind: ch.kind, Target: ch.target, Port: ch.port, Via: t.Subnet}
		if ch.kind != probes.KindARP {
			spec.Nonce = nonce
		}
		a := b.probe(Action{ID: b.id(), Claim: claim, Channel: ch.channel, From: from.Place, Target: label, TargetKey: to.Place, Expect: ExpectBlocked}, spec)
		if ch.kind != probes.KindARP {
			a.Pinned = ch.target
		}
		w := probes.WitnessSpec{Via: t.Subnet, SrcIPs: srcs, SrcMACs: macs, Proto: ch.proto, Port: ch.port}
		if spec.Nonce != "" {
			w.Nonces = []string{nonce}
		}
		b.witness(a, to.Place, w)
	}
}

func (b *builder) sibling() {
	if b.claims["C-SIBLING"] {
		b.siblingFrom("C-SIBLING", b.t.A)
	}
	if b.claims["C-TIER"] && b.t.T.IP.IsValid() {
		b.siblingFrom("C-TIER", b.t.T)
	}
}

// siblingFrom probes every peer from one box for a claim.
func (b *builder) siblingFrom(claim string, from BoxEnd) {
	t := b.t
	b.toBox(claim, from, t.B)
	b.toBox(claim, from, t.C)
	// Broadcast and all-nodes multicast reach every peer at once; one probe
	// per peer, so each has its own nonce and its own witness there.
	for _, peer := range []BoxEnd{t.B, t.C} {
		for _, ch := range []struct {
			channel string
			spec    probes.ProbeSpec
			proto   string
		}{
			{"broadcast", probes.ProbeSpec{Kind: probes.KindBroadcast, Port: listenUDP, Via: t.Subnet}, "udp"},
			{"icmpv6-all-nodes", probes.ProbeSpec{Kind: probes.KindICMP, Target: netip.MustParseAddr("ff02::1"), Via: t.Subnet}, "icmpv6"},
		} {
			ch.spec.Nonce = probes.NewNonce()
			a := b.probe(Action{ID: b.id(), Claim: claim, Channel: ch.channel, From: from.Place, Target: "every peer on " + t.Subnet.String() + ", witnessed at " + peer.Place, TargetKey: peer.Place, Expect: ExpectBlocked}, ch.spec)
			b.witness(a, peer.Place, probes.WitnessSpec{Via: t.Subnet, Nonces: []string{ch.spec.Nonce}, SrcMACs: []string{from.MAC.String()}, Proto: ch.proto})
		}
	}
}

func (b *builder) host() {
	if b.claims["C-HOST"] {
		b.hostFrom("C-HOST", b.t.A)
	}
	if b.claims["C-TIER"] && b.t.T.IP.IsValid() {
		b.hostFrom("C-TIER", b.t.T)
	}
	if len(b.sc.Counters) > 0 {
		b.sc.CountControl = nft.CountKey{Src: b.t.A.IP, Dst: b.t.Gateway, Proto: "udp", Port: 53}
		b.sc.Counters = append(b.sc.Counters, b.sc.CountControl)
	}
}

// hostFrom probes every host address from one box for a claim.
func (b *builder) hostFrom(claim string, from BoxEnd) {
	b.hostAt(claim, from, b.t.localMember(), b.t.HostAddrs, from.IP, false)
}

// hostAt probes addrs, addresses of member m, from one box for a claim,
// judged at m: by its listeners, its own probes of them (the controls) and
// its counting chain. natSrc is where the box's packets come from at m (the
// box itself on its own member, its member's cluster address at another);
// cross pins each counted probe's source port, so m's chain counts that
// probe and nothing else from natSrc (the cluster's own traffic, say).
func (b *builder) hostAt(claim string, from BoxEnd, m MemberScene, addrs []HostAddr, natSrc netip.Addr, cross bool) {
	t := b.t
	tcp, udp := t.hostPorts()
	member := m.Name
	for _, h := range addrs {
		label := "host " + h.Name + " " + h.Addr.String()
		key := "host-" + h.Name
		if !m.Local {
			label = "member " + m.Name + " " + h.Name + " " + h.Addr.String()
			key = "member-" + h.Name
		}
		a := b.probe(Action{ID: b.id(), Claim: claim, Channel: "tcp", From: from.Place, Member: member, Target: label, TargetKey: key, Expect: ExpectBlocked},
			probes.ProbeSpec{Kind: probes.KindTCP, Target: h.Addr, Port: tcp, Via: t.Subnet, Nonce: probes.NewNonce()})
		a.ListenerAt, a.ListenerID = m.hostPlace(), "l-tcp-"+h.Name
		a.ControlAt, a.ControlID = m.hostPlace(), b.selfControl(m.hostPlace(), "ctl-tcp-"+h.Name, probes.KindTCP, h.Addr, tcp)
		a = b.probe(Action{ID: b.id(), Claim: claim, Channel: "udp", From: from.Place, Member: member, Target: label, TargetKey: key, Expect: ExpectBlocked},
			probes.ProbeSpec{Kind: probes.KindUDP, Target: h.Addr, Port: udp, Via: t.Subnet, Nonce: probes.NewNonce()})
		a.ListenerAt, a.ListenerID = m.hostPlace(), "l-udp-"+h.Name
		a.ControlAt, a.ControlID = m.hostPlace(), b.selfControl(m.hostPlace(), "ctl-udp-"+h.Name, probes.KindUDP, h.Addr, udp)
		// The host's kernel answers every echo that reaches it (its control:
		// it answers the host's own), so silence is the firewall's doing; a
		// capture on the box side would see the request before the
		// firewall drops it and prove nothing.
		a = b.probe(Action{ID: b.id(), Claim: claim, Channel: "icmp", From: from.Place, Member: member, Target: label, TargetKey: key, Expect: ExpectBlocked},
			probes.ProbeSpec{Kind: probes.KindICMP, Target: h.Addr, Via: t.Subnet, Nonce: probes.NewNonce()})
		a.ControlAt, a.ControlID = m.hostPlace(), b.selfControl(m.hostPlace(), "ctl-icmp-"+h.Name, probes.KindICMP, h.Addr, 0)
		for _, sv := range b.hostServices(h, m.Listeners, m.Forwards) {
			kind := probes.KindTCP
			if sv.proto == "udp" {
				kind = probes.KindUDP
			}
			spec := probes.ProbeSpec{Kind: kind, Target: h.Addr, Port: int(sv.port), Via: t.Subnet, Nonce: probes.NewNonce()}
			k := nft.CountKey{Src: natSrc, Dst: h.Addr, Proto: sv.proto, Port: sv.port}
			if cross {
				spec.SrcPort = b.srcPort()
				k.SrcPort = uint16(spec.SrcPort)
			}
			a := b.probe(Action{ID: b.id(), Claim: claim, Channel: sv.proto, From: from.Place, Member: member, Target: fmt.Sprintf("%s %s/%d (%s)", label, sv.proto, sv.port, sv.what), TargetKey: key, Expect: ExpectBlocked, Provenance: sv.why}, spec)
			a.Count, a.CountAt = k.String(), m.filterPlace()
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
		return strings.HasPrefix(stack.Current.Network, p)
	}
	return f.InIface == stack.Current.Network
}

// selfControl has the host probe its own listener (or its own kernel, for
// ICMP) after the boxes' probes ended: a target that answers it was serving
// all along, so its silence to a box means something.
func (b *builder) selfControl(place, id string, kind probes.Kind, addr netip.Addr, port int) string {
	p := b.plan(place)
	// One control serves every source that aims at the target.
	if slices.ContainsFunc(p.Probes, func(s probes.ProbeSpec) bool { return s.ID == id }) {
		return id
	}
	p.Probes = append(p.Probes, probes.ProbeSpec{ID: id, Kind: kind, Target: addr, Port: port, Nonce: probes.NewNonce(),
		DelayMS: int(selfControlAt.Milliseconds()), DeadlineMS: int(selfControlDeadline.Milliseconds())})
	return id
}

func (b *builder) lan() {
	if b.claims["C-LAN"] {
		b.lanFrom("C-LAN", b.t.A)
	}
	if b.claims["C-TIER"] && b.t.T.IP.IsValid() {
		b.lanFrom("C-TIER", b.t.T)
	}
}

// lanFrom probes every LAN target from one box for a claim.
func (b *builder) lanFrom(claim string, from BoxEnd) {
	t := b.t
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
			p := b.plan(PlaceHost)
			// One echo per target serves every source.
			if i := slices.IndexFunc(p.Probes, func(s probes.ProbeSpec) bool { return s.ID == outControlID(h.Addr) }); i >= 0 {
				ctl = p.Probes[i].Nonce
			} else {
				ctl = probes.NewNonce()
				p.Probes = append(p.Probes, probes.ProbeSpec{ID: outControlID(h.Addr), Kind: probes.KindICMP, Target: h.Addr, Nonce: ctl,
					DelayMS: int(selfControlAt.Milliseconds()), DeadlineMS: int(selfControlDeadline.Milliseconds())})
			}
		}
		for _, ch := range []struct {
			channel string
			kind    probes.Kind
			port    int
		}{{"tcp", probes.KindTCP, h.TCPPort}, {"udp", probes.KindUDP, h.UDPPort}, {"icmp", probes.KindICMP, 0}} {
			if ch.kind != probes.KindICMP && ch.port == 0 {
				continue
			}
			nonce := probes.NewNonce()
			a := b.probe(Action{ID: b.id(), Claim: claim, Channel: ch.channel, From: from.Place, Target: label, TargetKey: h.Name, Expect: ExpectBlocked, Provenance: h.Provenance},
				probes.ProbeSpec{Kind: ch.kind, Target: h.Addr, Port: ch.port, Via: t.Subnet, Nonce: nonce})
			switch {
			case t.LANVia.IsValid():
				b.witness(a, PlaceLAN, probes.WitnessSpec{Via: t.LANVia, Nonces: []string{nonce}, SrcIPs: srcs, Proto: ch.channel, Port: ch.port, DstIP: h.Addr})
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
	for _, r := range stack.PrivateRanges {
		if r.Addr().Is4() {
			prefixes = append(prefixes, r.Masked())
		}
	}
	var spec *probes.WitnessSpec
	for k, i := range out {
		a := &b.sc.Actions[i]
		if spec == nil || (a.OutControl != b.sc.Actions[out[k-1]].OutControl && len(spec.Nonces)+3 > probes.MaxMatchEntries) {
			p := b.plan(PlaceHost)
			p.Witnesses = append(p.Witnesses, probes.WitnessSpec{ID: fmt.Sprintf("w-outbound-%d", len(p.Witnesses)), Ifaces: t.Outward, DstPrefixes: prefixes, WindowMS: b.window})
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

func (b *builder) v6() {
	if !b.claims["C-V6"] {
		return
	}
	t := b.t
	watch := probes.WitnessSpec{Via: t.Subnet, Proto: probes.ProtoIPv6Config}
	// Solicit from box-a over rsWindow; every box watches for unsolicited
	// configuration the whole time and reads its own state at the end.
	a := b.probe(Action{ID: b.id(), Claim: "C-V6", Channel: "router-advertisement", From: PlaceA, Target: "routers on " + t.Subnet.String(), TargetKey: "ipv6", Expect: ExpectNone},
		probes.ProbeSpec{Kind: probes.KindNDPRS, Via: t.Subnet, DelayMS: int(rsDelay.Milliseconds()), DeadlineMS: int(rsWindow.Milliseconds())})
	b.witness(a, PlaceA, watch)
	watchA := a.Witness
	for _, e := range []BoxEnd{t.A, t.B, t.C} {
		a := b.probe(Action{ID: b.id(), Claim: "C-V6", Channel: "global-address+default-route", From: e.Place, Target: e.Place + " at the end of the probe phase", TargetKey: "ipv6", Expect: ExpectNone},
			probes.ProbeSpec{Kind: probes.KindIPv6State, DelayMS: int(stateAt.Milliseconds()), DeadlineMS: int(stateDeadline.Milliseconds())})
		if e.Place == PlaceA {
			// box-a already watches for the solicitation: one capture.
			a.WitnessAt, a.Witness = PlaceA, watchA
			continue
		}
		b.witness(a, e.Place, watch)
	}
}

func (b *builder) inbound() {
	if !b.claims["C-INBOUND"] {
		return
	}
	t := b.t
	label := t.A.Place + " " + t.A.IP.String()
	type from struct {
		place string
		src   netip.Addr
	}
	froms := []from{{PlaceHost, t.Gateway}}
	for _, s := range t.LANSources {
		froms = append(froms, from{PlaceLAN, s})
	}
	for _, f := range froms {
		for _, ch := range []struct {
			channel string
			kind    probes.Kind
			port    int
		}{{"tcp", probes.KindTCP, listenTCP}, {"icmp", probes.KindICMP, 0}} {
			nonce := probes.NewNonce()
			spec := probes.ProbeSpec{Kind: ch.kind, Target: t.A.IP, Port: ch.port, Nonce: nonce}
			target := label
			if f.place == PlaceLAN {
				// Sent from this source address, whatever else the LAN
				// namespace holds.
				spec.Via = netip.PrefixFrom(f.src, 32)
				target += " from " + f.src.String()
			}
			a := b.probe(Action{ID: b.id(), Claim: "C-INBOUND", Channel: ch.channel, From: f.place, Target: target, TargetKey: PlaceA, Expect: ExpectBlocked}, spec)
			w := probes.WitnessSpec{Via: t.Subnet, Nonces: []string{nonce}, Proto: ch.channel, Port: ch.port, DstIP: t.A.IP}
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

func (b *builder) clone() {
	if !b.claims["C-CLONE"] {
		return
	}
	t := b.t
	// The clone's lease; box-a's comes from the C-DHCP baseline.
	var lease string
	for _, a := range b.sc.Actions {
		if a.Claim == "C-DHCP" {
			lease = a.ID
		}
	}
	a := b.probe(Action{ID: b.id(), Claim: "C-CLONE", Channel: "address+mac+machine-id", From: PlaceC, Target: "clone-a vs box-a", TargetKey: PlaceA, Expect: ExpectDistinct},
		probes.ProbeSpec{Kind: probes.KindDHCPLease, Via: t.Subnet})
	a.Compare = []string{lease}
}

// hostPorts are the ports of the drill's listeners on host addresses.
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
