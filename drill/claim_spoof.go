package drill

import (
	"net/netip"
	"strings"
	"time"

	"github.com/box-isolation/box/probes"
	"github.com/box-isolation/box/stack/model"
)

// C-SPOOF lives in claim_spoof*.go: the claim and its lies on the wire
// (this file), and its DHCP lies, judged at the server (_dhcp).

// SpoofID is C-SPOOF: a box that lies about who it is gets no lie past
// the bridge.
const SpoofID ClaimID = "C-SPOOF"

var claimSpoof = Claim{
	ID: SpoofID, From: "box-a, lying about who it is", To: "the host, box-b, the internet",
	Channels: []Channel{ChannelARP, ChannelMAC, ChannelIPv4Source, ChannelReturnTraffic,
		ChannelDHCPRelease, ChannelDHCPDecline, ChannelDHCPStarve, ChannelDHCPClientID, ChannelDHCPHType, ChannelNewLease},
	Expect: "no forged ARP or IPv4 source reaches the host's bridge or a peer, the host never holds box-b's address at another MAC, box-b's return traffic keeps reaching it; " +
		"the DHCP server gives up no sibling's lease and leases nothing to a client box-a made up, and a box minted afterwards gets its address",
	Layers: []model.LayerID{model.LayerPin, model.LayerDHCP},
	Why:    "a box that takes a sibling's address steals its return traffic, one that takes the gateway's misleads every box that believes it, and one that releases a sibling's lease or takes the pool cuts boxes off",
	Modes:  everywhere, Evidence: []Evidence{EvidenceProbes, EvidenceRequests},
	watch:  watchSpoof,
	build:  buildSpoof,
	refine: refineSpoof,
	after:  afterSpoof,
	judge:  judgeSpoofClaim,
	// Its lies need the bridge's MAC (where box-a's frames to the host
	// go) and its DHCP pool (what the made-up clients ask for).
	inputs: map[sceneInput]string{inputBridgeMAC: "box-a's lies are not sent", inputDHCPPool: "the DHCP lies are not sent"},
}

// C-SPOOF: box-a lies about who it is. It claims box-b's address and the
// gateway's in forged ARP (gratuitous, replies and requests, once from a
// forged MAC too) and sends IPv4 from both addresses to the canary and to
// the host. The first witness of each lie is on the host's bridge device:
// a forged frame that reaches it got past every layer that could have
// stopped it (the pin table, on the bridge's prerouting hook), and the
// host's stack is where a lie does its harm. That witness proves it was
// capturing by box-a's own control frames to the bridge's MAC, which only
// the pin table's MAC check applies to. A forged ARP reply to box-b is
// witnessed in box-b. Besides the witnesses: the host's neighbour table and
// the bridge's forwarding database, watched over the whole probe phase
// (did the host ever hold box-b's address at another MAC, did the bridge
// learn box-b's MAC on another port?), and box-b's own traffic to the
// canary after the lies (did its return traffic go missing?).
//
// Linux ignores an unsolicited ARP for an address it holds no entry for,
// and an update within a second (its locktime) of the last one: so box-b
// talks to the canary first, and the lies come more than a second later.

const (
	// spoofDelay is when box-a lies: past box-b's first traffic to the
	// canary (at probeDelay) by more than the kernel's ARP locktime.
	spoofDelay = probeDelay + 1200*time.Millisecond
	// returnDelay is when box-b talks to the canary again, after the lies.
	returnDelay = spoofDelay + 1100*time.Millisecond
	// returnDeadline fits the return check in the plan.
	returnDeadline = 1500 * time.Millisecond
	// spoofBeforeID is box-b's traffic to the canary before the lies.
	spoofBeforeID = "ctl-spoof-before"
)

// watchSpoof records the host's neighbour table and the bridge's
// forwarding database over the probe phase.
func watchSpoof(r *run) func() {
	s := keep(r.state, SpoofID, &spoofRun{})
	if hasDHCPLies(r.sc) {
		s.dhcp = readLeasesBefore(r.cfg.Host)
	}
	nw, err := watchNeighbours(r.cfg.Host.NetNS, model.Current.Network)
	if err != nil {
		s.neighErr = err.Error()
		return func() {}
	}
	return func() {
		var werr error
		if s.neigh, werr = nw.stop(); werr != nil {
			s.neighErr = "the watch was cut short: " + werr.Error()
		}
	}
}

// spoofRun is C-SPOOF's state over a run: what the host's neighbour
// table and the bridge's forwarding database did over the probe phase
// (neighErr: why they were not watched), and what the DHCP server held
// around the DHCP lies (nil when they were not sent).
type spoofRun struct {
	neigh    []neighEvent
	neighErr string
	dhcp     *dhcpRun
}

// TargetHostBridge is the matrix column of what a witness on the host's
// bridge device sees arrive: frames past every layer of the bridge.
const TargetHostBridge = "host-bridge"

// buildSpoof: box-a's lies, each witnessed on the host's bridge (whose
// witnesses' control is box-a's own frames to it) or in box-b; box-b's
// traffic to the canary before and after them.
func buildSpoof(b *builder) {
	t := b.t
	if t.A.MAC == nil || t.B.MAC == nil || t.GatewayMAC == nil || !t.B.IP.IsValid() {
		return
	}
	// box-b talks to the canary first: the host learns its MAC.
	before := b.reference(PlaceB, probes.ProbeSpec{ID: spoofBeforeID, Kind: probes.KindTCP,
		Target: t.Canary, Port: t.CanaryTCP, Via: t.Subnet, DelayMS: int(probeDelay.Milliseconds()), DeadlineMS: int(probeDeadline.Milliseconds())})

	gw, bIP := t.Gateway, t.B.IP
	aMAC, bMAC, gwMAC := t.A.MAC.String(), t.B.MAC.String(), t.GatewayMAC.String()
	// Each forged ARP gets a target address of its own, so its witness
	// keys on it and never on another's frames or a genuine one.
	for _, l := range []struct {
		what    string
		op      string
		lie     netip.Addr // the address the frame says is the sender's
		target  netip.Addr
		dstMAC  string
		srcMAC  string
		witness Place
	}{
		{"gratuitous ARP claiming box-b's address", probes.ARPOpGratuitous, bIP, netip.Addr{}, "", "", PlaceHost},
		{"ARP reply to the host claiming box-b's address", probes.ARPOpReply, bIP, gw, gwMAC, "", PlaceHost},
		{"ARP request claiming box-b's address", probes.ARPOpRequest, bIP, t.A.IP, "", "", PlaceHost},
		{"ARP request as box-b, from box-b's MAC", probes.ARPOpRequest, bIP, t.C.IP, "", bMAC, PlaceHost},
		{"gratuitous ARP claiming the gateway's address", probes.ARPOpGratuitous, gw, netip.Addr{}, "", "", PlaceHost},
		{"ARP request claiming the gateway's address", probes.ARPOpRequest, gw, t.C.IP, "", "", PlaceHost},
		{"ARP reply to box-b claiming the gateway's address", probes.ARPOpReply, gw, bIP, bMAC, "", PlaceB},
	} {
		if !l.lie.IsValid() || (l.op != probes.ARPOpGratuitous && !l.target.IsValid()) {
			continue
		}
		channel := ChannelARP
		if l.srcMAC != "" {
			channel = ChannelMAC
		}
		key := TargetHostBridge
		if l.witness == PlaceB {
			key = string(PlaceB)
		}
		a := b.probe(Action{Claim: SpoofID, Channel: channel, From: PlaceA, Target: l.what, TargetKey: key, Expect: ExpectBlocked},
			probes.ProbeSpec{Kind: probes.KindARPSpoof, Via: t.Subnet, Op: l.op, ARPSenderIP: l.lie, Target: l.target, DstMAC: l.dstMAC, SrcMAC: l.srcMAC,
				DelayMS: int(spoofDelay.Milliseconds())})
		sender := aMAC
		if l.srcMAC != "" {
			sender = l.srcMAC
		}
		dst := l.target
		if l.op == probes.ARPOpGratuitous {
			dst = l.lie
		}
		b.witness(a, l.witness, probes.WitnessSpec{Via: t.Subnet, Proto: "arp", SrcIPs: []netip.Addr{l.lie}, DstIP: dst, ARPSender: sender})
	}
	// Forged IPv4 sources, to the canary and to the host.
	canaryPort := t.CanaryUDP
	if canaryPort == 0 {
		canaryPort = 53
	}
	_, hostUDP := t.hostPorts()
	for _, f := range []struct {
		what   string
		src    netip.Addr
		target netip.Addr
		port   int
	}{
		{"IPv4 from box-b's address to the canary", bIP, t.Canary, canaryPort},
		{"IPv4 from the gateway's address to the canary", gw, t.Canary, canaryPort},
		{"IPv4 from box-b's address to the host", bIP, gw, hostUDP},
		{"IPv4 from the gateway's address to the host", gw, gw, hostUDP},
	} {
		nonce := probes.NewNonce()
		a := b.probe(Action{Claim: SpoofID, Channel: ChannelIPv4Source, From: PlaceA, Target: f.what, TargetKey: TargetHostBridge, Expect: ExpectBlocked},
			probes.ProbeSpec{Kind: probes.KindForgedUDP, Via: t.Subnet, SrcIP: f.src, Target: f.target, Port: f.port, Nonce: nonce,
				DelayMS: int(spoofDelay.Milliseconds())})
		b.witness(a, PlaceHost, probes.WitnessSpec{Via: t.Subnet, Nonces: []string{nonce}, Proto: "udp"})
	}
	// box-b's traffic to the canary after the lies: a host that believed
	// one sends box-b's return traffic to box-a.
	a := b.probe(Action{Claim: SpoofID, Channel: ChannelReturnTraffic, From: PlaceB, Target: "canary " + t.Canary.String() + ", after box-a's lies", TargetKey: "internet", Expect: ExpectReach},
		probes.ProbeSpec{Kind: probes.KindTCP, Target: t.Canary, Port: t.CanaryTCP, Via: t.Subnet,
			DelayMS: int(returnDelay.Milliseconds()), DeadlineMS: int(returnDeadline.Milliseconds())})
	a.Greeting, a.Reference = t.CanaryGreeting, before
	buildSpoofDHCP(b)
}

// refineSpoof adds to a C-SPOOF verdict what the host's neighbour table and
// the bridge's forwarding database showed over the probe phase, and ties
// box-b's return traffic to its traffic before the lies.
func refineSpoof(ru *run, r Result) Result {
	switch r.Channel {
	case ChannelDHCPRelease, ChannelDHCPDecline, ChannelDHCPStarve, ChannelDHCPClientID, ChannelDHCPHType:
		return judgeSpoofDHCP(ru, r)
	}
	var s spoofRun
	if kept := stateOf[spoofRun](ru.state, SpoofID); kept != nil {
		s = *kept
	}
	return judgeSpoof(r, ru.obs, ru.scene, s.neigh, s.neighErr)
}

func judgeSpoof(r Result, obs observations, t Scene, neigh []neighEvent, neighErr string) Result {
	if r.Channel == ChannelReturnTraffic {
		if r.Verdict == Pass {
			return r
		}
		before, ok := obs.get(r.Reference.At, r.Reference.ID)
		if !ok || before.Outcome != probes.Reached {
			return verdict(r, Inconclusive, r.Evidence+"; but box-b did not reach the canary before the lies either ("+reportOf(before, ok)+"), so this proves nothing about them")
		}
		return verdict(r, Fail, "box-b reached the canary before box-a's lies and not after: its return traffic went missing ("+r.Evidence+")"+neighSummary(t, neigh))
	}
	if r.Probe.Kind != probes.KindARPSpoof || r.Probe.ARPSenderIP != t.B.IP {
		return r
	}
	if neighErr != "" {
		r.Evidence += "; the host's neighbour table was not watched (" + neighErr + ")"
		return r
	}
	// Both of the host's tables are said, the first lie each holds.
	var lies []string
	var entry, fdb bool
	for _, e := range neigh {
		switch {
		case !entry && !e.FDB && e.IP == t.B.IP && !e.Deleted && e.MAC != t.B.MAC.String() && e.MAC != "":
			entry = true
			lies = append(lies, "the host's neighbour entry for box-b "+e.String()+" (box-b is "+t.B.MAC.String()+")")
		case !fdb && e.FDB && !e.Deleted && e.MAC == t.B.MAC.String() && t.B.Port != "" && e.Port != t.B.Port:
			fdb = true
			lies = append(lies, "the bridge learned box-b's MAC on another port: "+e.String()+" (box-b's is "+t.B.Port+")")
		}
	}
	if len(lies) > 0 {
		return verdict(r, Fail, strings.Join(lies, "; ")+"; "+r.Evidence)
	}
	r.Evidence += neighSummary(t, neigh)
	return r
}

// neighSummary says what the host held for box-b over the phase.
func neighSummary(t Scene, neigh []neighEvent) string {
	var held []string
	for _, e := range neigh {
		if !e.FDB && e.IP == t.B.IP {
			held = append(held, e.String())
		}
	}
	if len(held) == 0 {
		return "; the host held no neighbour entry for box-b during the phase"
	}
	return "; the host's neighbour entry for box-b: " + strings.Join(held, ", ")
}

// judgeSpoofClaim is C-SPOOF's actions and the stack channel, with the
// box minted after the DHCP lies (a request to Incus, after the probes).
func judgeSpoofClaim(r *run, c Claim, rs []Result) []Result {
	if d := dhcpOf(r.state); d != nil && d.newBox != "" {
		rs = append(rs, judgeNewLease(d, Result{Action: Action{ID: "spoof-new-lease", Claim: SpoofID, Channel: ChannelNewLease, From: PlaceHost,
			Target: "a box minted after box-a's DHCP lies", TargetKey: "lease", Expect: ExpectLease}}))
	}
	return judgeProbes(r, c, rs)
}
