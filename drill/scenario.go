package drill

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"time"

	"github.com/box-isolation/box/drill/topo"
	"github.com/box-isolation/box/drill/verdicts"
	"github.com/box-isolation/box/probes"
	"github.com/box-isolation/box/stack/nft"
)

// Ports the drill's own listeners use on boxes and host addresses.
const (
	listenTCP = 9100
	listenUDP = 9101
)

// Timing of one probe round, every clock starting at the agents' common
// start (agentLead after the run launches them; an agent that begins late
// starts its clocks then, and the report says how late). Witnesses and
// listeners arm at once; probes wait probeDelay so every witness is armed
// even if its agent was a little late; a blocked probe costs one
// probeDeadline, all of them together. Every window judged on silence
// outlasts the protocol's own timers:
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
//     was capturing after every probe it judges had started. The last probe
//     a witness judges (the IPv6 state read) starts about 600 ms before the
//     last control frame, which is how much later than the host's agent a
//     box's may start its clocks (CI's machine once went past it on every
//     run, before the agents had a common start).
const (
	// agentLead is how far ahead the agents' common start is set when
	// several places run at once (runPlans): on this project's 2-CPU
	// machine the boxes' agents, each after a plan push and an exec
	// through incusd, began 0.2-0.8 s after the run launched them, the
	// host's 0.1-0.5 s (docs/measurements.md). lateBy is the lateness a
	// run logs.
	agentLead     = 1500 * time.Millisecond
	lateBy        = 50 * time.Millisecond
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
	// the collection is lost on a loaded machine (docs/measurements.md,
	// "The drill's timing").
	passiveCushion = 250 * time.Millisecond
	// selfControlAt is when the host checks its own listeners and echo:
	// after every box's blocked probes have ended, with the same skew
	// budget as the controls.
	selfControlAt = probeDelay + probeDeadline + 800*time.Millisecond
	// selfControlDeadline is ample for an answer over the host's loopback,
	// and ends the control while the listener still listens.
	selfControlDeadline = 1000 * time.Millisecond
	// witnessWindow is how long witnesses and listeners capture.
	witnessWindow = planDeadline - probes.AgentMargin - passiveCushion
	// controlSpan is how long control senders send: they end with the
	// witnesses' windows.
	controlSpan = planDeadline - controlDelay - probes.AgentMargin - passiveCushion
)

// Expectation is what an action must observe to pass
// (verdicts.Expectation).
type Expectation = verdicts.Expectation

const (
	ExpectReach    Expectation = "reached"         // reached, with proof of who answered
	ExpectBlocked  Expectation = "blocked"         // silent or rejected, and nothing arrived at the target
	ExpectResolve  Expectation = "resolves"        // the name resolves
	ExpectNoName   Expectation = "no sibling name" // the resolver answers, without a record
	ExpectNone     Expectation = "none"            // no IPv6 state, no router advertisement
	ExpectLease    Expectation = "lease"           // an address on the box subnet
	ExpectDistinct Expectation = "distinct"        // clone and source differ
	ExpectPresent  Expectation = "layer present"   // Verify finds the claim's layers as desired
	ExpectRefused  Expectation = "refused for the restriction"
	// ExpectClosed: the target's kernel refused the connection (nothing listens).
	ExpectClosed Expectation = "closed (refused: nothing listens)"
	// ExpectNotForwarded: a DNS question answered at the gateway without
	// a record, that never reached the name's authoritative server (C-ALLOW
	// judges it at the world's witness nameserver).
	ExpectNotForwarded Expectation = "not forwarded"
	// ExpectNoLease: the DHCP server took no lease for a lie, nor gave
	// one up (judged at the server, refineSpoof).
	ExpectNoLease Expectation = "no lease taken or released"
)

// via is the subnet a sender's probes leave by.
func (b *builder) via(from BoxEnd) netip.Prefix {
	if from.Via.IsValid() {
		return from.Via
	}
	return b.t.Subnet
}

// Action is one probe with its expected result.
type Action struct {
	ID      string  `json:"id"`
	Claim   ClaimID `json:"claim"`
	Channel Channel `json:"channel"`
	From    Place   `json:"from"`
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
	// Greeting is what a target that answers must say (a canary's
	// greeting, box-a's listener's name): an answer without it came from
	// someone else.
	Greeting string `json:"-"`
	// WitnessAt runs Witness; ListenerAt names a listener whose service
	// counts as arrival (host addresses, where a capture on the wire would
	// see a packet the firewall drops later).
	WitnessAt  Place               `json:"-"`
	Witness    *probes.WitnessSpec `json:"-"`
	ListenerAt Place               `json:"-"`
	ListenerID string              `json:"-"`
	// Source is where the action's packets come from as they arrive at its
	// target: the sender's address (past a NAT, its member's) and the
	// source port it pinned (0: none). Evidence at a target several
	// senders aim at (a listener) counts for the action only from there.
	Source netip.AddrPort `json:"-"`
	// SelfControl is the host's probe of its own listener or kernel at the
	// target, which proves the target was answering (its silence to a box
	// means nothing otherwise).
	SelfControl ProbeRef `json:"-"`
	// Reference is a probe whose answer this one's is compared with: the
	// public upstream asked the same name (C-NAMES), the source's lease
	// (C-CLONE), the sender's own traffic before a lie (C-SPOOF).
	Reference ProbeRef `json:"-"`
	// Pinned is the peer address the sender pinned to its MAC, so the probe
	// tests L3 on its own; if pinning failed the probe only repeats ARP.
	Pinned netip.Addr `json:"-"`
	// Count is the key of the counting chain after the host's filter that
	// witnesses this probe (host addresses, where a service of the host's
	// own answers, or nothing does); CountAt the chain's place (a cluster
	// member's; PlaceFilter when empty).
	Count   string `json:"-"`
	CountAt Place  `json:"-"`
	// OutControl is the nonce of the host's own echo to the action's LAN
	// target: an outbound witness that saw it leave was watching the way
	// the action's packets would take.
	OutControl string `json:"-"`
	// Baseline marks a positive control.
	Baseline bool `json:"-"`
}

// Scenario is the plans to run and the actions they serve.
type Scenario struct {
	Plans   map[Place]*probes.Plan
	Actions []Action
	// Counters is what the counting chain after the host's filter counts:
	// the actions' keys, and CountControl, box-a's DNS question to the
	// gateway (the C-DNS baseline), which the filter lets through, so a
	// chain that counted nothing was not counting.
	Counters     []nft.CountKey
	CountControl nft.CountKey
	// MemberCounters and CountControls are, on a cluster, other members'
	// counting chains (by their filter place) and each one's control.
	MemberCounters map[Place][]nft.CountKey
	CountControls  map[Place]nft.CountKey
	// References are the plan probes whose answers are compared with a
	// box's, whatever they are: no positive control, so no failure of
	// theirs is one.
	References map[string]bool
}

// builder expands claims into a Scenario. Claims call its helpers; what
// several claims share (a listener, a witness's control, a pinned peer) is
// added once, the first time one asks for it.
type builder struct {
	t  Scene
	sc *Scenario
	n  int
	// sport is the last source port srcPort handed out (0: none yet).
	sport int
	// controls maps a place to the control nonce its witnesses look for
	// on the wire they capture on.
	controls map[Place]string
	// pinned are the probers whose peers are pinned already.
	pinned map[Place]bool
}

func (b *builder) plan(place Place) *probes.Plan {
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

// probe adds an action and its probe, with a fresh id. The returned pointer
// is only good until the next call.
func (b *builder) probe(a Action, spec probes.ProbeSpec) *Action {
	a.ID = b.id()
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

// planProbe adds a probe that serves no action of its own (a control, a
// reference), once: a second call with the same id gets the first back.
func (b *builder) planProbe(place Place, spec probes.ProbeSpec) probes.ProbeSpec {
	p := b.plan(place)
	if i := slices.IndexFunc(p.Probes, func(s probes.ProbeSpec) bool { return s.ID == spec.ID }); i >= 0 {
		return p.Probes[i]
	}
	p.Probes = append(p.Probes, spec)
	return spec
}

// reference adds a probe whose answer an action's is compared with,
// whatever it is.
func (b *builder) reference(place Place, spec probes.ProbeSpec) ProbeRef {
	b.sc.References[spec.ID] = true
	return ProbeRef{At: place, ID: b.planProbe(place, spec).ID}
}

// witness puts a capture at place for the action's traffic, with the
// control of its wire.
func (b *builder) witness(a *Action, place Place, spec probes.WitnessSpec) {
	spec.ID = "w" + a.ID
	spec.WindowMS = int(witnessWindow.Milliseconds())
	spec.Control = b.control(place)
	b.plan(place).Witnesses = append(b.plan(place).Witnesses, spec)
	a.WitnessAt = place
	a.Witness = &spec
}

// control is the nonce of the control frames the witnesses at place
// look for, sent from controlDelay until their windows end: to a probe
// box's MAC from the host, on the LAN's and the internet's wires from the
// host's side, and to the host's bridge from box-a (a frame the pin
// table's MAC check applies to). "" when the place's wire has no control:
// its witnesses' silence then proves nothing, and judging says so.
func (b *builder) control(place Place) string {
	if n, ok := b.controls[place]; ok {
		return n
	}
	t := b.t
	send := func(from Place, via netip.Prefix, mac net.HardwareAddr) string {
		spec := probes.ProbeSpec{ID: controlID(place), Kind: probes.KindControl, Via: via, Nonce: probes.NewNonce(),
			DelayMS: int(controlDelay.Milliseconds()), DeadlineMS: int(controlSpan.Milliseconds())}
		if mac != nil {
			spec.DstMAC = mac.String()
		}
		return b.planProbe(from, spec).Nonce
	}
	var nonce string
	switch place {
	case PlaceLAN:
		if t.LANVia.IsValid() {
			nonce = send(PlaceHost, t.LANVia, nil)
		}
	case PlaceInet:
		if t.Allow.InetVia.IsValid() {
			nonce = send(PlaceHost, t.Allow.InetVia, nil)
		}
	case PlaceHost:
		if t.A.MAC != nil && t.GatewayMAC != nil {
			nonce = send(PlaceA, t.Subnet, t.GatewayMAC)
		}
	default:
		if e, ok := t.box(place); ok && e.MAC != nil {
			nonce = send(PlaceHost, t.Subnet, e.MAC)
		}
	}
	b.controls[place] = nonce
	return nonce
}

// BuildScenario expands the selected claims into actions and per-place
// plans, in the catalogue's order. Baseline claims are always built:
// without them no blocked verdict can be trusted.
func BuildScenario(t Scene, claims []Claim) *Scenario {
	b := &builder{t: t, sc: &Scenario{Plans: map[Place]*probes.Plan{}, CountControls: map[Place]nft.CountKey{}, References: map[string]bool{}},
		controls: map[Place]string{}, pinned: map[Place]bool{}}
	selected := map[ClaimID]bool{}
	for _, c := range claims {
		selected[c.ID] = true
	}
	// Listeners on every probe box, so a probe that gets through is
	// answered and proves it.
	for _, place := range []Place{PlaceA, PlaceB, PlaceC} {
		p := b.plan(place)
		p.Listeners = append(p.Listeners,
			probes.ListenerSpec{ID: "l-tcp", Kind: probes.KindTCPGreeter, Name: string(place), Port: listenTCP, WindowMS: int(witnessWindow.Milliseconds())},
			probes.ListenerSpec{ID: "l-udp", Kind: probes.KindUDPEcho, Name: string(place), Port: listenUDP, WindowMS: int(witnessWindow.Milliseconds())})
	}
	// Every box gets a usable IPv6 link-local address, as an attacker
	// would give itself one (docs/world.md, "These machines").
	for _, e := range []BoxEnd{t.A, t.B, t.C, t.T} {
		if e.LinkLocal.IsValid() {
			b.plan(e.Place).LinkLocal = &probes.LinkLocalSpec{Via: t.Subnet, Address: e.LinkLocal}
		}
	}
	for _, c := range Catalogue {
		if (selected[c.ID] || c.Baseline) && c.build != nil {
			c.build(b)
		}
	}
	if len(b.sc.Counters) > 0 {
		// The local chain's control: box-a's DNS question to the gateway
		// (C-DNS's baseline), which the host's filter lets through.
		b.sc.CountControl = nft.CountKey{Src: t.A.IP, Dst: t.Gateway, Proto: "udp", Port: 53}
		b.sc.Counters = append(b.sc.Counters, b.sc.CountControl)
	}
	return b.sc
}

// lookup finds the first action of a claim on a channel.
func (b *builder) lookup(claim ClaimID, ch Channel, from Place) (Action, bool) {
	i := slices.IndexFunc(b.sc.Actions, func(a Action) bool { return a.Claim == claim && a.Channel == ch && a.From == from })
	if i < 0 {
		return Action{}, false
	}
	return b.sc.Actions[i], true
}
