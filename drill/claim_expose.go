package drill

import (
	"context"
	"fmt"
	"net/netip"

	"github.com/box-isolation/box/probes"
	"github.com/box-isolation/box/stack"
	"github.com/box-isolation/box/stack/boxes"
	"github.com/box-isolation/box/stack/model"
)

// ExposeID is C-EXPOSE: a door box opens answers on the host's loopback
// only.
const ExposeID ClaimID = "C-EXPOSE"

var claimExpose = Claim{
	ID: ExposeID, From: "the host's loopback, its other addresses, the LAN; box-a", To: "box expose's door from the host's 127.0.0.1 to box-a's listener",
	Channels: []Channel{ChannelTCP},
	Expect:   "the door answers on the host's loopback only (elsewhere the port is closed), and opens nothing inside the box",
	Layers:   []model.LayerID{model.LayerFleet},
	Why:      "a door is the one thing box puts between a box and the host: on any address but loopback it is a way in from the LAN, and a listener inside would be a way out",
	Modes:    everywhere, Evidence: []Evidence{EvidenceProbes},
	prepare: openDoor,
	build:   buildExpose,
	judge:   judgeExpose,
}

// C-EXPOSE: box expose's door (an Incus proxy device box makes) answers on
// the host's loopback and nowhere else: not on the host's other addresses,
// not from the LAN, and it opens nothing inside the box. The drill opens a
// door from the host's 127.0.0.1 to box-a's own TCP listener. "Not
// answering" is judged from an answer: the host's kernel (or the box's)
// resets a connection to a port nothing listens on, which tells a closed
// port from one a door holds; silence proves nothing either way.

// doorHostPort is the door's port on the host's loopback (nothing of the
// world listens there; box expose refuses a taken one).
const doorHostPort = 19100

// openDoor opens the door to box-a's listener. A door that cannot be
// opened here makes C-EXPOSE inconclusive, not the run fail.
func openDoor(ctx context.Context, r *run) error {
	d, err := boxes.NewDoors(r.cfg.Host).Expose(ctx, r.names[PlaceA], model.DoorSpec{Port: listenTCP, HostPort: doorHostPort, Kind: model.DoorTCP})
	if err != nil {
		keep(r.state, ExposeID, &exposeRun{doorErr: err.Error()})
		return nil
	}
	r.cfg.logf("expose: a door from 127.0.0.1:%d to %s's port %d (%s)", doorHostPort, r.names[PlaceA], listenTCP, d.Device)
	r.cfg.Topology.Door = netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), doorHostPort)
	return nil
}

// exposeRun is C-EXPOSE's state over a run: why no door could be opened.
type exposeRun struct{ doorErr string }

// judgeExpose: a door that could not be opened leaves the claim
// inconclusive, saying why.
func judgeExpose(r *run, c Claim, rs []Result) []Result {
	if e := stateOf[exposeRun](r.state, ExposeID); len(rs) == 0 && e != nil {
		a := Action{ID: "e-door", Claim: c.ID, Channel: ChannelTCP, From: PlaceDrill, Target: "a door to box-a", TargetKey: "door", Expect: ExpectReach}
		return []Result{{Action: a, Verdict: Inconclusive, Observed: "no door", Evidence: "box expose could not open the door here: " + e.doorErr}}
	}
	return judgeProbes(r, c, rs)
}

// buildExpose: the door from the host's loopback (box-a's listener
// answers, greeting with its name); every other host address, the LAN
// side and box-a's own loopback (refused: nothing there).
func buildExpose(b *builder) {
	t := b.t
	if !t.Door.IsValid() {
		return
	}
	port := int(t.Door.Port())
	probe := func(from Place, target, key string, e Expectation, spec probes.ProbeSpec) *Action {
		spec.Kind, spec.Port, spec.Nonce = probes.KindTCP, port, probes.NewNonce()
		return b.probe(Action{Claim: ExposeID, Channel: ChannelTCP, From: from, Target: target, TargetKey: key, Expect: e}, spec)
	}
	// The door, from the host's loopback: box-a's listener answers.
	door := probe(PlaceHost, "the door "+t.Door.String(), "door", ExpectReach, probes.ProbeSpec{Target: t.Door.Addr()})
	door.Greeting = probes.GreetPrefix + string(PlaceA)
	// Every other host address: nothing there.
	for _, h := range t.HostAddrs {
		probe(PlaceHost, fmt.Sprintf("host %s %s:%d", h.Name, h.Addr, port), "host-"+h.Name, ExpectClosed, probes.ProbeSpec{Target: h.Addr})
	}
	// From the LAN, at the host's address on the LAN's side.
	if t.LANNAT.IsValid() {
		for _, src := range t.LANSources {
			probe(PlaceLAN, fmt.Sprintf("host's LAN side %s:%d from %s", t.LANNAT, port, src), "host-lan-side", ExpectClosed,
				probes.ProbeSpec{Target: t.LANNAT, Via: netip.PrefixFrom(src, 32)})
		}
	}
	// Inside the box, the door opened nothing: its box side only connects.
	probe(PlaceA, fmt.Sprintf("box-a's own 127.0.0.1:%d", port), "box-a", ExpectClosed, probes.ProbeSpec{Target: t.Door.Addr()})
}

// judgeClosed: a refusal from the target is the pass (nothing listens), an
// answer the failure (a door where none may be), silence proves nothing.
func judgeClosed(r Result, o probes.Observation) Result {
	switch {
	case o.Outcome == probes.Reached || o.Evidence.Connected:
		return verdict(r, Fail, "answered: something listens there"+replyDetail(o))
	case o.Outcome == probes.Refused:
		return verdict(r, Pass, "refused: "+o.Reason)
	case o.Outcome == probes.Silent:
		return verdict(r, Inconclusive, "no answer at all: a port nothing listens on is refused, so this one was dropped on the way, which says nothing about a door")
	}
	return verdict(r, Inconclusive, o.Reason)
}

// widenDoor is the mutation "door-wide": box-a's door listens on every
// host address, as an operator's hand edit would make it.
func widenDoor(ctx context.Context, h *stack.Host, boxes []string) error {
	if len(boxes) == 0 {
		return fmt.Errorf("no box-a")
	}
	a := boxes[0]
	inst, etag, err := h.Incus.Instances().Get(ctx, a)
	if err != nil {
		return err
	}
	put := inst.Writable()
	dev := model.DoorDevice(listenTCP)
	d, ok := put.Devices[dev]
	if !ok {
		return fmt.Errorf("%s has no door %s (C-EXPOSE must be selected)", a, dev)
	}
	d["listen"] = fmt.Sprintf("tcp:0.0.0.0:%d", doorHostPort)
	return h.Incus.Instances().Update(ctx, a, put, etag)
}
