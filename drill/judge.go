package drill

import (
	"cmp"
	"fmt"
	"maps"
	"net/netip"
	"strings"
	"time"

	"github.com/box-isolation/box/drill/verdicts"
	"github.com/box-isolation/box/probes"
)

// Verdict is the outcome of an action or a claim (verdicts.Verdict).
type Verdict = verdicts.Verdict

// The verdicts.
const (
	Pass         = verdicts.Pass
	Fail         = verdicts.Fail
	Inconclusive = verdicts.Inconclusive
	Skipped      = verdicts.Skipped
)

// Result is one judged action.
type Result struct {
	Action
	Verdict  Verdict `json:"verdict"`
	Observed string  `json:"observed"` // what the probe saw
	Evidence string  `json:"evidence"` // what the verdict rests on
	// AtTarget is what the target saw, when a witness or listener was there.
	AtTarget string              `json:"at_target,omitempty"`
	Obs      *probes.Observation `json:"observation,omitempty"`
}

// Reported is the result as a report carries it.
func (r Result) Reported() verdicts.Result {
	a := r.Action
	return verdicts.Result{ID: a.ID, Claim: a.Claim, Channel: a.Channel, From: a.From, Member: a.Member, Target: a.Target, TargetKey: a.TargetKey,
		Expect: a.Expect, Provenance: string(a.Provenance), Verdict: r.Verdict, Observed: r.Observed, Evidence: r.Evidence, AtTarget: r.AtTarget, Obs: r.Obs, Witnessed: a.Witness != nil}
}

// observations indexes every agent's report: place -> observation id.
type observations map[Place]map[string]probes.Observation

// merge adds another run's observations to o, place by place.
func (o observations) merge(more observations) {
	for place, m := range more {
		if o[place] == nil {
			o[place] = map[string]probes.Observation{}
		}
		maps.Copy(o[place], m)
	}
}

func (o observations) get(place Place, id string) (probes.Observation, bool) {
	m, ok := o[place]
	if !ok {
		return probes.Observation{}, false
	}
	v, ok := m[id]
	return v, ok
}

// judge decides one action. baselineOK says whether every positive
// control held; agentErr explains a missing observation.
func judge(a Action, obs observations, t Scene, baselineOK bool, agentErr map[Place]string) Result {
	r := Result{Action: a}
	o, ok := obs.get(a.From, a.ID)
	if !ok {
		r.Observed = "no observation"
		why := agentErr[a.From]
		if why == "" {
			why = "no reason given"
		}
		// Arrival beats error here too: what the target saw needs nothing
		// from the sender.
		if a.Expect == ExpectBlocked || a.Expect == ExpectNone {
			if arrived, _ := atTarget(&r, probes.Observation{}, obs, t); arrived {
				return verdict(r, Fail, "the agent at "+string(a.From)+" returned nothing ("+why+"), but the target saw the traffic arrive")
			}
			r.AtTarget = ""
		}
		return verdict(r, Inconclusive, "the agent at "+string(a.From)+" returned nothing for this probe ("+why+")")
	}
	r.Obs = &o
	r.Observed = describe(o)
	switch a.Expect {
	case ExpectReach:
		return judgeReach(r, o, t)
	case ExpectResolve:
		if o.Outcome == probes.Reached && o.Evidence.DNS != nil && o.Evidence.DNS.Resolved {
			answers := strings.Join(o.Evidence.DNS.Answers, ", ")
			// The name must resolve to what it is: an answer from anyone
			// else (a hijacking resolver) is no proof the path works.
			if t.PublicNameAddr.IsValid() && !answersHold(o.Evidence.DNS.Answers, t.PublicNameAddr) {
				return verdict(r, Fail, "resolved, but not to "+t.PublicNameAddr.String()+": "+answers)
			}
			return verdict(r, Pass, "resolved: "+answers)
		}
		return verdict(r, Fail, "did not resolve: "+o.Reason)
	case ExpectLease:
		if o.Outcome == probes.Reached && o.Evidence.Lease != nil {
			if p, err := netip.ParsePrefix(o.Evidence.Lease.Address); err == nil && t.Subnet.Contains(p.Addr()) {
				return verdict(r, Pass, "holds "+o.Evidence.Lease.Address)
			}
		}
		return verdict(r, Fail, "no address on "+t.Subnet.String()+": "+o.Reason)
	case ExpectBlocked:
		return judgeBlocked(r, o, obs, t, baselineOK)
	case ExpectNoName:
		return judgeNoName(r, o, obs, baselineOK)
	case ExpectNone:
		// The box's passive watch for IPv6 configuration first: what
		// arrived counts whatever the probe said.
		arrived, problem := atTarget(&r, o, obs, t)
		switch {
		case arrived:
			return verdict(r, Fail, "IPv6 configuration arrived at the box"+ipv6Detail(o))
		case o.Outcome == probes.Reached || o.Outcome == probes.Refused:
			return verdict(r, Fail, o.Reason+ipv6Detail(o))
		case o.Outcome != probes.Silent:
			return verdict(r, Inconclusive, o.Reason)
		case problem != "":
			return verdict(r, Inconclusive, o.Reason+", but "+problem)
		case o.Kind != probes.KindIPv6State && !watched(r.Action):
			// The box's own IPv6 state is read in the box: evidence in
			// itself. A solicitation nobody answered is silence.
			return verdict(r, Inconclusive, o.Reason+", but "+unwatched)
		case !baselineOK && o.Kind != probes.KindIPv6State:
			// A solicitation nobody answered proves little from a box
			// whose network is broken; the box's own IPv6 state does not
			// depend on it.
			return verdict(r, Inconclusive, o.Reason+", but a baseline failed")
		}
		return verdict(r, Pass, o.Reason)
	case ExpectDistinct:
		return judgeDistinct(r, o, obs)
	case ExpectClosed:
		return judgeClosed(r, o)
	case ExpectNotForwarded:
		if o.Outcome == probes.Reached {
			return verdict(r, Fail, "resolved a name it may not ask for: "+o.Reason)
		}
		// Whether the question left is said at the authoritative server,
		// which the claim reads (its refine).
		return verdict(r, Inconclusive, "not judged at the authoritative server")
	case ExpectNoLease:
		// The sender expects nothing back; the server's lease file is
		// the evidence, and the claim reads it (refine).
		return verdict(r, Inconclusive, "judged at the DHCP server: its lease file was not read")
	}
	return verdict(r, Inconclusive, "no rule to judge expectation "+string(a.Expect))
}

func verdict(r Result, v Verdict, evidence string) Result {
	r.Verdict = v
	r.Evidence = evidence
	return r
}

func judgeReach(r Result, o probes.Observation, t Scene) Result {
	// A public canary answers no nonce: a completed handshake with it is
	// the proof there is.
	if t.CanaryGreeting == "" && o.Kind == probes.KindTCP && o.Outcome == probes.Refused && o.Evidence.Connected {
		return verdict(r, Pass, "connected to "+o.Target+" (a public canary proves no more than the handshake)")
	}
	if o.Outcome != probes.Reached {
		return verdict(r, Fail, "not reached: "+o.Reason)
	}
	// The greeting proves the intended host answered (the world's canary,
	// box-a's listener behind a door), not something that merely echoes.
	if r.Greeting != "" && !strings.Contains(o.Evidence.Reply, r.Greeting) {
		return verdict(r, Fail, fmt.Sprintf("answered at %s, but not by whom it should be: reply %q lacks the greeting %q", o.Target, o.Evidence.Reply, r.Greeting))
	}
	ev := "reached " + o.Target
	if o.Evidence.Reply != "" {
		ev += fmt.Sprintf(": %q", o.Evidence.Reply)
	}
	return verdict(r, Pass, ev)
}

func judgeBlocked(r Result, o probes.Observation, obs observations, t Scene, baselineOK bool) Result {
	// The target's side first: it is evidence whatever the sender saw,
	// even when the sender's side errored.
	arrived, targetProblem := atTarget(&r, o, obs, t)
	switch o.Outcome {
	case probes.Reached:
		return verdict(r, Fail, "unexpected success: "+o.Reason+replyDetail(o))
	case probes.Refused:
		return verdict(r, Fail, "the packet arrived (the target answered without proof): "+o.Reason+replyDetail(o))
	}
	if arrived {
		if o.Outcome == probes.Error {
			return verdict(r, Fail, "the sender's side errored ("+o.Reason+"), but the target saw the traffic arrive")
		}
		return verdict(r, Fail, "the sender saw no answer ("+string(o.Outcome)+"), but the target saw the traffic arrive")
	}
	if o.Outcome == probes.Error {
		return verdict(r, Inconclusive, "the probe could not run: "+o.Reason)
	}
	if targetProblem != "" {
		return verdict(r, Inconclusive, targetProblem)
	}
	if !watched(r.Action) {
		return verdict(r, Inconclusive, unwatched)
	}
	if r.Pinned.IsValid() {
		if p, ok := obs.get(r.From, pinID(r.Pinned)); !ok || p.Outcome != probes.Reached {
			return verdict(r, Inconclusive, "the peer's neighbour entry was not pinned ("+reportOf(p, ok)+"), so this probe only repeats the ARP result")
		}
	}
	if !baselineOK {
		return verdict(r, Inconclusive, "looked blocked, but a baseline failed, so the block proves nothing")
	}
	if o.Outcome == probes.Rejected {
		// Stopped by the sender's own stack (EPERM/EACCES from its output
		// firewall, or an ICMP error it made itself). In a box that is the
		// box's doing, and the layer under test never met the packet. On
		// the host it is the host's netfilter, which is where Incus's ACL
		// acts on traffic the host itself sends to a box (C-INBOUND).
		local := (o.Evidence.ICMP == nil && (o.Evidence.Errno == "EPERM" || o.Evidence.Errno == "EACCES")) ||
			(o.Evidence.ICMP != nil && o.Evidence.ICMP.OffenderIsLocal)
		if local && isBox(r.From) {
			return verdict(r, Inconclusive, "stopped inside the sending box before it left: "+o.Reason)
		}
		by := "something in between"
		if o.Evidence.ICMP == nil && !local && o.Reason != "" {
			by += " (" + o.Reason + ")"
		}
		switch {
		case o.Evidence.ICMP != nil && !local:
			by = fmt.Sprintf("%s (%s)", o.Evidence.ICMP.Offender, o.Evidence.ICMP.Name)
		case local:
			by = "the host's own netfilter, where the ACL acts on what the host sends (" + o.Reason + ")"
		}
		return verdict(r, Pass, "blocked by policy: rejected by "+by)
	}
	return verdict(r, Pass, "dropped: "+o.Reason)
}

// atTarget reads the witness or listener at the action's target into
// r.AtTarget. arrived says the traffic reached the target; problem says why
// the target's side cannot be trusted (no report, a witness not armed for
// the whole probe).
func atTarget(r *Result, o probes.Observation, obs observations, t Scene) (arrived bool, problem string) {
	if r.Witness != nil && len(r.Witness.Ifaces) > 0 {
		return leftTheHost(r, o, obs)
	}
	if r.WitnessAt != "" {
		w, ok := obs.get(r.WitnessAt, r.Witness.ID)
		if !ok || w.Evidence.Witness == nil {
			return false, "no witness report from " + string(r.WitnessAt) + " (" + reportOf(w, ok) + ")"
		}
		we := w.Evidence.Witness
		// What it saw counts even if it failed later.
		if we.Count > 0 {
			r.AtTarget = fmt.Sprintf("the witness saw %d frame(s): %s", we.Count, frame(we.First))
			return true, ""
		}
		if w.Outcome == probes.Error {
			return false, "the witness at " + string(r.WitnessAt) + " failed: " + w.Reason
		}
		end := o.StartedAt.Add(time.Duration(o.ElapsedMS) * time.Millisecond)
		if we.ArmedAt.IsZero() || we.ArmedAt.After(o.StartedAt) || we.Until.Before(end) {
			r.AtTarget = fmt.Sprintf("witness armed %s..%s", we.ArmedAt.Format("15:04:05.000"), we.Until.Format("15:04:05.000"))
			return false, "the witness was not armed for the whole probe"
		}
		// Silence only counts from a witness that proved it was capturing:
		// its wire's control frame reached it after the probe started.
		switch {
		case r.Witness.Control == "":
			r.AtTarget = fmt.Sprintf("the witness saw nothing (%d frames read), with no control on its wire", we.Captured)
			return false, "the witness at " + string(r.WitnessAt) + " had no positive control, so its silence proves nothing"
		case we.Controls == 0 || we.ControlLast.Before(o.StartedAt):
			r.AtTarget = fmt.Sprintf("the witness saw nothing (%d frames read) and %d control frame(s), none after the probe started at %s", we.Captured, we.Controls, o.StartedAt.Format("15:04:05.000"))
			if we.Controls > 0 {
				r.AtTarget += ", the last at " + we.ControlLast.Format("15:04:05.000")
			}
			why := "the witness at " + string(r.WitnessAt) + " never saw its positive control after the probe started, so it may not have been capturing"
			// Blame the sender when the sender failed, not the witness.
			if c, ok := obs.get(PlaceHost, controlID(r.WitnessAt)); !ok || c.Outcome != probes.Reached {
				why += "; the control's sender: " + reportOf(c, ok)
			}
			return false, why
		}
		r.AtTarget = fmt.Sprintf("the witness saw nothing (%d frames read; alive: %d control frame(s), the last at %s)", we.Captured, we.Controls, we.ControlLast.Format("15:04:05.000"))
	}
	if r.Count != "" {
		return counted(r, obs)
	}
	if r.ListenerAt != "" {
		l, ok := obs.get(r.ListenerAt, r.ListenerID)
		if !ok || l.Evidence.Listener == nil {
			return false, "no listener report from " + string(r.ListenerAt) + " (" + reportOf(l, ok) + ")"
		}
		if !r.Source.Addr().IsValid() {
			return false, "the action does not say where its packets arrive from at the listener, so whose the listener served cannot be told"
		}
		var others []string
		for _, p := range l.Evidence.Listener.Peers {
			if fromSource(p, r.Source) {
				r.AtTarget = "the listener served " + p
				return true, ""
			}
			others = append(others, p)
		}
		r.AtTarget = fmt.Sprintf("the listener served nothing from %s (%d served in all)", sourceString(r.Source), l.Evidence.Listener.Served)
		if len(others) > 0 {
			r.AtTarget += ", only other senders: " + strings.Join(others, ", ")
		}
		if !r.SelfControl.Valid() {
			return false, "the listener at " + string(r.ListenerAt) + " had no positive control, so serving nobody proves nothing"
		}
	}
	if r.SelfControl.Valid() {
		// The target answers its own control (a listener serving, a kernel
		// answering echo), so its silence to the box is the path's doing.
		c, ok := obs.get(r.SelfControl.At, r.SelfControl.ID)
		if !ok || c.Outcome != probes.Reached {
			return false, "the target did not answer its own control probe from " + string(r.SelfControl.At) + " (" + reportOf(c, ok) + "), so its silence proves nothing"
		}
		r.AtTarget = strings.TrimPrefix(r.AtTarget+"; ", "; ") + "it answered its own control probe"
	}
	return false, ""
}

// watched reports whether something at the action's target (or on the
// way there) could have seen its packet arrive: a witness, a listener, a
// counter, or the target's answer to its own control. Without one, the
// sender's silence alone is no evidence of a block.
func watched(a Action) bool {
	return a.WitnessAt != "" || a.ListenerAt != "" || a.Count != "" || a.SelfControl.Valid()
}

// unwatched is the evidence of an action nothing at its target watched.
const unwatched = "nothing watched this target or the way to it (no witness, listener, counter or control), and silence from an address nobody answers for proves nothing"

// fromSource reports whether a listener's peer ("addr:port", or an
// address alone) is the action's sender: its address, and its port where
// it pinned one.
func fromSource(peer string, src netip.AddrPort) bool {
	if ap, err := netip.ParseAddrPort(peer); err == nil {
		return ap.Addr().Unmap() == src.Addr() && (src.Port() == 0 || ap.Port() == src.Port())
	}
	a, err := netip.ParseAddr(peer)
	return err == nil && src.Port() == 0 && a.Unmap() == src.Addr()
}

// sourceString says where an action's packets arrive from, for people.
func sourceString(src netip.AddrPort) string {
	if src.Port() == 0 {
		return src.Addr().String()
	}
	return src.String()
}

// leftTheHost reads the outbound witness on the host's outward interfaces
// (host mode): a probe's packet seen leaving toward its LAN target got past
// every layer. A UDP or ICMP packet is known by its nonce, a TCP SYN by
// its destination and the ISN the sender read. Its silence counts only if
// it saw the host's own echo to the same target leave: then it watched the
// way there.
func leftTheHost(r *Result, o probes.Observation, obs observations) (arrived bool, problem string) {
	w, ok := obs.get(r.WitnessAt, r.Witness.ID)
	if !ok || w.Evidence.Witness == nil {
		return false, "no report from the outbound witness at " + string(r.WitnessAt) + " (" + reportOf(w, ok) + ")"
	}
	we := w.Evidence.Witness
	target := r.Probe.Target.String()
	syn := func(p probes.PacketRecord) bool {
		return p.Proto == "tcp" && p.DstIP == target && p.DstPort == r.Probe.Port && p.TCPFlags == "S"
	}
	ctlSeen, synSeen := false, false
	for _, p := range we.Records {
		leaked := p.DstIP == target && p.Nonce != "" && p.Nonce == r.Probe.Nonce
		if r.Probe.Kind == probes.KindTCP && syn(p) {
			synSeen = true
			leaked = o.Evidence.ISNCaptured && p.Seq == o.Evidence.ISN
		}
		if leaked {
			r.AtTarget = fmt.Sprintf("seen leaving the host on %s: %s %s:%d -> %s:%d %s", p.Iface, p.Proto, p.SrcIP, p.SrcPort, p.DstIP, p.DstPort, p.TCPFlags)
			return true, ""
		}
		ctlSeen = ctlSeen || (p.Nonce != "" && p.Nonce == r.OutControl)
	}
	if w.Outcome == probes.Error {
		return false, "the outbound witness failed: " + w.Reason
	}
	end := o.StartedAt.Add(time.Duration(o.ElapsedMS) * time.Millisecond)
	if we.ArmedAt.IsZero() || we.ArmedAt.After(o.StartedAt) || we.Until.Before(end) {
		return false, "the outbound witness was not armed for the whole probe"
	}
	if we.Recorded > len(we.Records) {
		return false, fmt.Sprintf("the outbound witness listed %d of the %d packets it saw leave: this probe's may be among the others", len(we.Records), we.Recorded)
	}
	if !ctlSeen {
		c, ok := obs.get(PlaceHost, outControlID(r.Probe.Target))
		return false, "the outbound witness did not see the host's own echo to " + target + " leave (" + reportOf(c, ok) + "): the way there is not watched, so silence proves nothing"
	}
	if synSeen && !o.Evidence.ISNCaptured {
		return false, "a SYN to " + target + " left the host, and this probe's ISN is unknown (" + o.Evidence.ISNError + "), so whose it was cannot be told"
	}
	r.AtTarget = fmt.Sprintf("not seen leaving the host (%d packet(s) toward private ranges recorded; alive: the host's own echo to %s seen leaving)", we.Recorded, target)
	return false, ""
}

// counted reads the counting chain after the host's filter: a packet it
// counted got past every filter, whatever answered it. Its zero counts only
// if it counted its control, box-a's DNS to the gateway, which the filter
// lets through.
func counted(r *Result, obs observations) (arrived bool, problem string) {
	at := cmp.Or(r.CountAt, PlaceFilter)
	c, ok := obs.get(at, r.Count)
	if !ok {
		return false, "no count from the counting chain after the host's filter (" + reportOf(c, ok) + ")"
	}
	if c.Outcome == probes.Reached {
		r.AtTarget = c.Reason
		return true, ""
	}
	ctl, ok := obs.get(at, countControlID)
	if !ok || ctl.Outcome != probes.Reached {
		whose := "box-a's"
		if m := memberOfPlace(at); m != "" {
			whose = "member " + m + "'s box's"
		}
		return false, "the counting chain after the host's filter did not count its control, " + whose + " DNS to the gateway (" + reportOf(ctl, ok) + "), so its zero proves nothing"
	}
	r.AtTarget = "nothing counted after the host's filter (alive: " + ctl.Reason + ")"
	return false, ""
}

// countControlID is the observation id of the counting chain's control.
const countControlID = "count-control"

// pinID is the observation id under which an agent's report says whether
// it pinned a neighbour.
func pinID(a netip.Addr) string { return "pin-" + a.String() }

// controlID is the id of the host's control probe for the witnesses at a
// place (the probe boxes, or the LAN wire).
func controlID(place Place) string { return "ctl-" + string(place) }

// reportOf says what an observation reported, for an evidence line.
func reportOf(o probes.Observation, ok bool) string {
	if !ok {
		return "no report"
	}
	return string(o.Outcome) + ": " + o.Reason
}

func judgeDistinct(r Result, o probes.Observation, obs observations) Result {
	if !r.Reference.Valid() {
		return verdict(r, Inconclusive, "nothing to compare with")
	}
	src, ok := obs.get(r.Reference.At, r.Reference.ID)
	if !ok || src.Evidence.Lease == nil || o.Evidence.Lease == nil {
		return verdict(r, Inconclusive, "no lease evidence from both boxes")
	}
	a, c := src.Evidence.Lease, o.Evidence.Lease
	var same []string
	if a.Address == c.Address {
		same = append(same, "address "+a.Address)
	}
	if a.MAC != "" && a.MAC == c.MAC {
		same = append(same, "MAC "+a.MAC)
	}
	if a.MachineID != "" && a.MachineID == c.MachineID {
		same = append(same, "machine-id "+a.MachineID)
	}
	if len(same) > 0 {
		return verdict(r, Fail, "the clone shares its source's "+strings.Join(same, ", "))
	}
	if a.MachineID == "" || c.MachineID == "" || a.MAC == "" || c.MAC == "" {
		return verdict(r, Inconclusive, "a MAC or machine-id could not be read")
	}
	return verdict(r, Pass, fmt.Sprintf("address %s vs %s, MAC %s vs %s, machine-id %.8s.. vs %.8s..", c.Address, a.Address, c.MAC, a.MAC, c.MachineID, a.MachineID))
}

func describe(o probes.Observation) string {
	s := string(o.Outcome)
	if o.Outcome == probes.Rejected && o.Evidence.ICMP != nil {
		s += " by " + o.Evidence.ICMP.Offender
	}
	return s
}

func replyDetail(o probes.Observation) string {
	if o.Evidence.Reply != "" {
		return fmt.Sprintf(" (reply %q)", o.Evidence.Reply)
	}
	if len(o.Evidence.Responders) > 0 {
		return " (responders " + strings.Join(o.Evidence.Responders, ", ") + ")"
	}
	return ""
}

func ipv6Detail(o probes.Observation) string {
	if e := o.Evidence.IPv6; e != nil {
		return fmt.Sprintf(" (global %v, routes %v, router %s)", e.GlobalAddresses, e.DefaultRoutes, e.Router)
	}
	return ""
}

func frame(f *probes.FrameSummary) string {
	if f == nil {
		return "?"
	}
	s := f.EtherType + " " + f.SrcMAC + " -> " + f.DstMAC
	if f.SrcIP != "" {
		s += " " + f.SrcIP + " -> " + f.DstIP
	}
	if f.Proto != "" {
		s += " " + f.Proto
	}
	if f.DstPort != 0 {
		s += fmt.Sprintf(" port %d", f.DstPort)
	}
	return s + " (matched by " + f.MatchedBy + ")"
}

// aggregate gives a claim the worst verdict of its actions. A claim with
// no result was selected and built nothing: it is skipped, and unrun. A
// result with a verdict judging never gives is no pass.
func aggregate(c Claim, results []Result) ClaimResult {
	if len(results) == 0 {
		return ClaimResult{Claim: c.Reported(), Verdict: Skipped, Results: []verdicts.Result{}, Unrun: true,
			Reason: "selected, but it found nothing to probe here (its targets or boxes are not in this run)"}
	}
	cr := ClaimResult{Claim: c.Reported(), Verdict: Pass}
	for i, r := range results {
		switch r.Verdict {
		case Pass:
			continue
		case Fail:
			cr.Verdict = Fail
			continue
		case Inconclusive:
		default:
			results[i].Evidence = fmt.Sprintf("no verdict judging gives (%q): %s", r.Verdict, r.Evidence)
			results[i].Verdict = Inconclusive
		}
		if cr.Verdict != Fail {
			cr.Verdict = Inconclusive
		}
	}
	for _, r := range results {
		cr.Results = append(cr.Results, r.Reported())
	}
	return cr
}

// isBox reports whether a place is one of the probe boxes.
func isBox(place Place) bool {
	switch place {
	case PlaceA, PlaceB, PlaceC, PlaceT, PlaceW, PlaceN, PlaceNestNAT, PlaceNestMAC:
		return true
	}
	return isMemberBox(place)
}

// answersHold reports whether one of the DNS answer records (rendered as
// text, the address last) carries exactly addr.
func answersHold(answers []string, addr netip.Addr) bool {
	for _, a := range answers {
		f := strings.Fields(a)
		if len(f) > 0 && f[len(f)-1] == addr.String() {
			return true
		}
	}
	return false
}
