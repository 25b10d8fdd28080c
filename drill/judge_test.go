package drill

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/probes"
)

// Actions judged by comparison or by the counting chain.
var (
	actNameUp = Action{ID: "p031", Claim: "C-NAMES", Channel: "dns", From: PlaceA, Target: "git.example.org.", TargetKey: "gateway", Expect: ExpectNoName,
		Reference: ProbeRef{At: PlaceHost, ID: "up-p031"}}
	actHostSSH = Action{ID: "p025", Claim: "C-HOST", Channel: "tcp", From: PlaceA, Target: "host gateway 10.88.0.1 tcp/22 (listener sshd)", TargetKey: "host-gateway", Expect: ExpectBlocked,
		Count: "tcp 10.88.0.11>10.88.0.1:22"}
)

// actLANOut is a host-mode C-LAN action judged by the outbound witness.
func actLANOut(kind probes.Kind) Action {
	port := 53
	if kind == probes.KindTCP {
		port = 80
	}
	return Action{ID: "p050", Claim: "C-LAN", Channel: Channel(kind), From: PlaceA, Target: "router-192.168.1.1 192.168.1.1", TargetKey: "router-192.168.1.1", Expect: ExpectBlocked,
		Probe:     probes.ProbeSpec{Kind: kind, Target: netip.MustParseAddr("192.168.1.1"), Port: port, Nonce: "lanudpnonce"},
		WitnessAt: PlaceHost, Witness: &probes.WitnessSpec{ID: "w-outbound", Ifaces: []string{"eth0"}}, OutControl: "ctloutnonce"}
}

// rec is one packet the outbound witness saw leave toward 192.168.1.1.
func rec(proto string, port int, flags string, seq uint32, nonce string) probes.PacketRecord {
	return probes.PacketRecord{At: t0.Add(probeDelay), Iface: "eth0", SrcIP: "192.168.1.20", DstIP: "192.168.1.1", Proto: proto,
		SrcPort: 40001, DstPort: port, TCPFlags: flags, Seq: seq, Nonce: nonce}
}

// outSeen is the outbound witness's observation, armed for the whole plan.
func outSeen(recs ...probes.PacketRecord) *probes.Observation {
	o := seen("w-outbound", 0, 4500*time.Millisecond, 0)
	o.Evidence.Witness.Records, o.Evidence.Witness.Recorded = recs, len(recs)
	return o
}

// counts is the counting chain's observation of one key.
func counts(id string, n int) *probes.Observation {
	o := &probes.Observation{ID: id, Kind: "counter", Outcome: probes.Silent, Reason: "no packet counted after the filter"}
	if n > 0 {
		o.Outcome, o.Reason = probes.Reached, fmt.Sprintf("%d packet(s) %s counted after the host's filter", n, id)
	}
	return o
}

// t0 is when the agents started; probes fire probeDelay later.
var t0 = time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)

// Actions as BuildScenario makes them, trimmed to what judge reads.
var (
	actSiblingTCP = Action{ID: "p010", Claim: "C-SIBLING", Channel: "tcp", From: PlaceA, Target: "box-b 10.88.0.12", TargetKey: string(PlaceB), Expect: ExpectBlocked,
		WitnessAt: PlaceB, Witness: &probes.WitnessSpec{ID: "wp010", Control: "ctlnonce0b"}, Pinned: netip.MustParseAddr("10.88.0.12")}
	actHostTCP = Action{ID: "p020", Claim: "C-HOST", Channel: "tcp", From: PlaceA, Target: "host gateway 10.88.0.1", TargetKey: "host-gateway", Expect: ExpectBlocked,
		ListenerAt: PlaceHost, ListenerID: "l-tcp-gateway", SelfControl: ProbeRef{At: PlaceHost, ID: "ctl-tcp-gateway"},
		Source: netip.AddrPortFrom(netip.MustParseAddr("10.88.0.11"), 0)}
	actInboundICMP = Action{ID: "p070", Claim: "C-INBOUND", Channel: "icmp", From: PlaceHost, Target: "box-a 10.88.0.11", TargetKey: string(PlaceA), Expect: ExpectBlocked,
		WitnessAt: PlaceA, Witness: &probes.WitnessSpec{ID: "wp070", Control: "ctlnonce0a"}}
	actHostICMP           = Action{ID: "p021", Claim: "C-HOST", Channel: "icmp", From: PlaceA, Target: "host gateway 10.88.0.1", TargetKey: "host-gateway", Expect: ExpectBlocked}
	actHostICMPControlled = func() Action {
		a := actHostICMP
		a.SelfControl = ProbeRef{At: PlaceHost, ID: "ctl-icmp-gateway"}
		return a
	}()
	actEgress = func(ch Channel, kind probes.Kind) Action {
		a := Action{ID: "p001", Claim: "C-EGRESS", Channel: ch, From: PlaceA, Target: "canary 203.0.113.10", TargetKey: "internet", Expect: ExpectReach, Baseline: true,
			Probe: probes.ProbeSpec{Kind: kind}}
		if kind != probes.KindICMP {
			a.Greeting = testTopology().CanaryGreeting
		}
		return a
	}
	actDNS     = Action{ID: "p004", Claim: "C-DNS", Channel: "dns", From: PlaceA, TargetKey: "gateway", Expect: ExpectResolve, Baseline: true}
	actDHCP    = Action{ID: "p005", Claim: "C-DHCP", Channel: "dhcp", From: PlaceA, TargetKey: "lease", Expect: ExpectLease, Baseline: true}
	actEnum    = Action{ID: "p030", Claim: "C-NAMES", Channel: "dns", From: PlaceA, Target: "drill-0a1b2c-b. (box-b)", TargetKey: "gateway", Expect: ExpectNoName}
	actV6      = Action{ID: "p040", Claim: "C-V6", Channel: "global-address+default-route", From: PlaceA, TargetKey: "ipv6", Expect: ExpectNone}
	actV6Watch = Action{ID: "p041", Claim: "C-V6", Channel: "router-advertisement", From: PlaceA, TargetKey: "ipv6", Expect: ExpectNone,
		WitnessAt: PlaceA, Witness: &probes.WitnessSpec{ID: "wp041", Control: "ctlnonce0a", Proto: probes.ProtoIPv6Config}}
	actClone   = Action{ID: "p050", Claim: "C-CLONE", Channel: "address+mac+machine-id", From: PlaceC, TargetKey: string(PlaceA), Expect: ExpectDistinct, Reference: ProbeRef{At: PlaceA, ID: "p005"}}
	actUnknown = Action{ID: "p060", Claim: "C-X", Channel: "x", From: PlaceA, Expect: Expectation("teleported")}
)

// sent is a probe's observation: it fired at t0+probeDelay and took its
// deadline (or less).
func sent(id string, kind probes.Kind, o probes.Outcome, reason string, ev probes.Evidence) *probes.Observation {
	return &probes.Observation{ID: id, Kind: kind, Target: "10.88.0.12", Outcome: o, Reason: reason, Evidence: ev,
		StartedAt: t0.Add(probeDelay), ElapsedMS: probeDeadline.Milliseconds()}
}

// seen is a witness's observation, armed from..until (offsets from t0),
// that saw its wire's control frames up to a second before it stopped.
func seen(id string, from, until time.Duration, count int) *probes.Observation {
	we := &probes.WitnessEvidence{ArmedAt: t0.Add(from), Until: t0.Add(until), Count: count, Captured: 7,
		Controls: 5, ControlLast: t0.Add(until - time.Second)}
	if count > 0 {
		we.First = &probes.FrameSummary{At: t0.Add(probeDelay), EtherType: "IPv4", SrcMAC: "00:16:3e:00:00:0a", DstMAC: "00:16:3e:00:00:0b",
			SrcIP: "10.88.0.11", DstIP: "10.88.0.12", Proto: "tcp", DstPort: 9100, MatchedBy: "nonce"}
	}
	return &probes.Observation{ID: id, Kind: probes.KindWitness, Outcome: probes.Silent, Evidence: probes.Evidence{Witness: we}}
}

func served(id string, peers ...string) *probes.Observation {
	return &probes.Observation{ID: id, Kind: probes.KindTCPGreeter, Outcome: probes.Silent,
		Evidence: probes.Evidence{Listener: &probes.ListenerEvidence{Address: "10.88.0.1:9100", Served: len(peers), Peers: peers}}}
}

func lease(id, addr, mac, machineID string) *probes.Observation {
	return &probes.Observation{ID: id, Kind: probes.KindDHCPLease, Outcome: probes.Reached, Reason: "eth0 holds " + addr,
		Evidence: probes.Evidence{Lease: &probes.LeaseEvidence{Address: addr, Dynamic: true, MAC: mac, MachineID: machineID}}}
}

func dnsEv(rcode string, resolved bool, answers ...string) probes.Evidence {
	return probes.Evidence{DNS: &probes.DNSEvidence{Name: "x.", QType: "A", Rcode: rcode, Resolved: resolved, Answers: answers}}
}

// placed is an observation at a place.
type placed struct {
	place Place
	obs   *probes.Observation
}

// controlled is a witness's observation with its control frames changed.
func controlled(o *probes.Observation, n int, last time.Duration) *probes.Observation {
	o.Evidence.Witness.Controls, o.Evidence.Witness.ControlLast = n, t0.Add(last)
	return o
}

// answered is a control probe's (or a pin's) observation.
func answered(id string, o probes.Outcome) *probes.Observation {
	return &probes.Observation{ID: id, Kind: probes.KindTCP, Outcome: o, Reason: "control " + string(o)}
}

var (
	cleanWitness = placed{PlaceB, seen("wp010", 0, 3550*time.Millisecond, 0)}
	pinnedB      = placed{PlaceA, answered(pinID(netip.MustParseAddr("10.88.0.12")), probes.Reached)}
	hostControl  = placed{PlaceHost, answered("ctl-tcp-gateway", probes.Reached)}
	rejectByGW   = probes.Evidence{ICMP: &probes.ICMPEvidence{Family: 4, Type: 3, Code: 13, Name: "admin-prohibited", Offender: "10.88.0.1"}}
	sourceLease  = placed{PlaceA, lease("p005", "10.88.0.11/24", "00:16:3e:00:00:0a", "0123456789abcdef0123456789abcdef")}
)

func TestJudge(t *testing.T) {
	topo := testTopology()
	tests := []struct {
		name       string
		action     Action
		probe      *probes.Observation // at action.From; nil: the agent returned nothing
		others     []placed            // witnesses, listeners, compared probes
		baselineOK bool
		want       Verdict
		evidence   []string // substrings of Evidence
		atTarget   string   // substring of AtTarget
	}{
		// Blocked, at a peer box with a witness.
		{name: "blocked: reached is an unexpected success", action: actSiblingTCP,
			probe:  sent("p010", probes.KindTCP, probes.Reached, "connected and the peer echoed the nonce", probes.Evidence{Reply: "box-b 9f2c"}),
			others: []placed{cleanWitness, pinnedB}, baselineOK: true, want: Fail, evidence: []string{"unexpected success", `"box-b 9f2c"`}},
		{name: "blocked: reached fails even with a broken baseline", action: actSiblingTCP,
			probe:  sent("p010", probes.KindTCP, probes.Reached, "connected", probes.Evidence{}),
			others: []placed{cleanWitness, pinnedB}, baselineOK: false, want: Fail, evidence: []string{"unexpected success"}},
		{name: "blocked: RST from the target means it arrived", action: actSiblingTCP,
			probe:  sent("p010", probes.KindTCP, probes.Refused, "TCP RST from the target's address: the packet arrived, nothing listens", probes.Evidence{Errno: "ECONNREFUSED"}),
			others: []placed{cleanWitness, pinnedB}, baselineOK: true, want: Fail, evidence: []string{"arrived"}},
		{name: "blocked: port unreachable from the target means it arrived", action: actSiblingTCP,
			probe: sent("p010", probes.KindUDP, probes.Refused, "ICMP port-unreachable from the target",
				probes.Evidence{ICMP: &probes.ICMPEvidence{Family: 4, Type: 3, Code: 3, Name: "port-unreachable", Offender: "10.88.0.12", OffenderIsTarget: true}}),
			others: []placed{cleanWitness, pinnedB}, baselineOK: true, want: Fail, evidence: []string{"arrived"}},
		{name: "blocked: silent but the witness saw the frame", action: actSiblingTCP,
			probe:  sent("p010", probes.KindTCP, probes.Silent, "no SYN-ACK, RST or ICMP error before the deadline", probes.Evidence{}),
			others: []placed{{PlaceB, seen("wp010", 0, 3550*time.Millisecond, 1)}}, baselineOK: true,
			want: Fail, evidence: []string{"the sender saw no answer (silent)", "arrive"}, atTarget: "saw 1 frame(s): IPv4 00:16:3e:00:00:0a -> 00:16:3e:00:00:0b 10.88.0.11 -> 10.88.0.12 tcp port 9100 (matched by nonce)"},
		{name: "blocked: silent and a clean armed witness", action: actSiblingTCP,
			probe:  sent("p010", probes.KindTCP, probes.Silent, "no SYN-ACK, RST or ICMP error before the deadline", probes.Evidence{}),
			others: []placed{cleanWitness, pinnedB}, baselineOK: true, want: Pass, evidence: []string{"dropped", "no SYN-ACK"}, atTarget: "saw nothing (7 frames read; alive: 5 control frame(s)"},
		{name: "blocked: rejected by a middle box is blocked by policy", action: actSiblingTCP,
			probe:  sent("p010", probes.KindTCP, probes.Rejected, "ICMP admin-prohibited from 10.88.0.1", rejectByGW),
			others: []placed{cleanWitness, pinnedB}, baselineOK: true, want: Pass, evidence: []string{"blocked by policy", "10.88.0.1", "admin-prohibited"}},
		{name: "blocked: rejected, but the witness saw it", action: actSiblingTCP,
			probe:  sent("p010", probes.KindTCP, probes.Rejected, "ICMP admin-prohibited from 10.88.0.1", rejectByGW),
			others: []placed{{PlaceB, seen("wp010", 0, 3550*time.Millisecond, 2)}}, baselineOK: true, want: Fail, evidence: []string{"arrive"}, atTarget: "saw 2 frame(s)"},
		{name: "blocked: a probe error is inconclusive", action: actSiblingTCP,
			probe:  sent("p010", probes.KindTCP, probes.Error, "no interface holds an address in 10.88.0.0/24", probes.Evidence{}),
			others: []placed{cleanWitness, pinnedB}, baselineOK: true, want: Inconclusive, evidence: []string{"could not run", "no interface"}},
		{name: "blocked: witness armed after the probe started", action: actSiblingTCP,
			probe:  sent("p010", probes.KindTCP, probes.Silent, "no SYN-ACK", probes.Evidence{}),
			others: []placed{{PlaceB, seen("wp010", probeDelay+200*time.Millisecond, 4*time.Second, 0)}}, baselineOK: true,
			want: Inconclusive, evidence: []string{"not armed for the whole probe"}, atTarget: "armed 12:00:01.200"},
		{name: "blocked: witness gave up before the probe did", action: actSiblingTCP,
			probe:  sent("p010", probes.KindTCP, probes.Silent, "no SYN-ACK", probes.Evidence{}),
			others: []placed{{PlaceB, seen("wp010", 0, probeDelay+probeDeadline/2, 0)}}, baselineOK: true,
			want: Inconclusive, evidence: []string{"not armed for the whole probe"}},
		{name: "blocked: witness failed", action: actSiblingTCP,
			probe: sent("p010", probes.KindTCP, probes.Silent, "no SYN-ACK", probes.Evidence{}),
			others: []placed{{PlaceB, &probes.Observation{ID: "wp010", Kind: probes.KindWitness, Outcome: probes.Error, Reason: "capture: read error",
				Evidence: probes.Evidence{Witness: &probes.WitnessEvidence{}}}}}, baselineOK: true,
			want: Inconclusive, evidence: []string{"witness at box-b failed", "read error"}},
		{name: "blocked: witness never armed", action: actSiblingTCP,
			probe: sent("p010", probes.KindTCP, probes.Silent, "no SYN-ACK", probes.Evidence{}),
			others: []placed{{PlaceB, &probes.Observation{ID: "wp010", Kind: probes.KindWitness, Outcome: probes.Silent,
				Evidence: probes.Evidence{Witness: &probes.WitnessEvidence{}}}}}, baselineOK: true,
			want: Inconclusive, evidence: []string{"not armed"}},
		{name: "blocked: rejected inside the sending box", action: actSiblingTCP,
			probe:  sent("p010", probes.KindTCP, probes.Rejected, "connect: operation not permitted", probes.Evidence{Errno: "EPERM"}),
			others: []placed{cleanWitness, pinnedB}, baselineOK: true,
			want: Inconclusive, evidence: []string{"stopped inside the sending box"}},
		{name: "inbound: the host's own netfilter refuses to send", action: actInboundICMP,
			probe:      &probes.Observation{ID: "p070", Kind: probes.KindICMP, Outcome: probes.Rejected, Reason: "our own firewall refused to send it (EPERM)", Evidence: probes.Evidence{Errno: "EPERM"}, StartedAt: t0.Add(probeDelay), ElapsedMS: 5},
			others:     []placed{{PlaceA, seen("wp070", 0, 3550*time.Millisecond, 0)}},
			baselineOK: true, want: Pass, evidence: []string{"blocked by policy", "host's own netfilter"}},
		{name: "blocked: an ICMP reject from the gateway, with the socket's errno", action: actSiblingTCP,
			probe: sent("p010", probes.KindTCP, probes.Rejected, "ICMP admin-prohibited from 10.88.0.1",
				probes.Evidence{Errno: "EHOSTUNREACH", ICMP: rejectByGW.ICMP}),
			others: []placed{cleanWitness, pinnedB}, baselineOK: true, want: Pass, evidence: []string{"blocked by policy", "10.88.0.1"}},
		{name: "blocked: the witness saw frames, then failed", action: actSiblingTCP,
			probe: sent("p010", probes.KindTCP, probes.Silent, "no SYN-ACK", probes.Evidence{}),
			others: []placed{{PlaceB, func() *probes.Observation {
				o := seen("wp010", 0, 3550*time.Millisecond, 1)
				o.Outcome, o.Reason = probes.Error, "read error"
				return o
			}()}}, baselineOK: true, want: Fail, evidence: []string{"arrive"}},
		{name: "blocked: missing witness report", action: actSiblingTCP,
			probe:      sent("p010", probes.KindTCP, probes.Silent, "no SYN-ACK", probes.Evidence{}),
			baselineOK: true, want: Inconclusive, evidence: []string{"no witness report from box-b"}},
		{name: "blocked: witness report without witness evidence", action: actSiblingTCP,
			probe:      sent("p010", probes.KindTCP, probes.Silent, "no SYN-ACK", probes.Evidence{}),
			others:     []placed{{PlaceB, &probes.Observation{ID: "wp010", Kind: probes.KindWitness, Outcome: probes.Error, Reason: "capture failed"}}},
			baselineOK: true, want: Inconclusive, evidence: []string{"no witness report"}},
		{name: "blocked: no sender report, but the witness saw the frame", action: actSiblingTCP,
			others: []placed{{PlaceB, seen("wp010", 0, 3550*time.Millisecond, 1)}, pinnedB}, baselineOK: true,
			want: Fail, evidence: []string{"returned nothing", "exec: deadline exceeded", "saw the traffic arrive"}, atTarget: "saw 1 frame(s)"},
		{name: "blocked: missing probe observation", action: actSiblingTCP,
			others: []placed{cleanWitness, pinnedB}, baselineOK: true, want: Inconclusive, evidence: []string{"returned nothing", "box-a", "exec: deadline exceeded"}},
		{name: "blocked: silent and clean, but a baseline failed", action: actSiblingTCP,
			probe:  sent("p010", probes.KindTCP, probes.Silent, "no SYN-ACK", probes.Evidence{}),
			others: []placed{cleanWitness, pinnedB}, baselineOK: false, want: Inconclusive, evidence: []string{"baseline failed"}},
		{name: "blocked: rejected, but a baseline failed", action: actSiblingTCP,
			probe:  sent("p010", probes.KindTCP, probes.Rejected, "ICMP admin-prohibited", rejectByGW),
			others: []placed{cleanWitness, pinnedB}, baselineOK: false, want: Inconclusive, evidence: []string{"baseline failed"}},

		// Witnesses prove they were alive; arrival beats error; L3 past ARP.
		{name: "blocked: a witness that never saw its control proves nothing", action: actSiblingTCP,
			probe:  sent("p010", probes.KindTCP, probes.Silent, "no SYN-ACK", probes.Evidence{}),
			others: []placed{{PlaceB, controlled(seen("wp010", 0, 3550*time.Millisecond, 0), 0, 0)}, pinnedB}, baselineOK: true,
			want: Inconclusive, evidence: []string{"never saw its positive control"}, atTarget: "0 control frame(s)"},
		{name: "blocked: controls only before the probe started prove nothing", action: actSiblingTCP,
			probe:  sent("p010", probes.KindTCP, probes.Silent, "no SYN-ACK", probes.Evidence{}),
			others: []placed{{PlaceB, controlled(seen("wp010", 0, 3550*time.Millisecond, 0), 2, probeDelay-time.Millisecond)}, pinnedB}, baselineOK: true,
			want: Inconclusive, evidence: []string{"never saw its positive control after the probe started"}},
		{name: "blocked: a witness with no control on its wire proves nothing", action: func() Action {
			a := actSiblingTCP
			a.Witness = &probes.WitnessSpec{ID: "wp010"}
			return a
		}(),
			probe:  sent("p010", probes.KindTCP, probes.Silent, "no SYN-ACK", probes.Evidence{}),
			others: []placed{cleanWitness, pinnedB}, baselineOK: true, want: Inconclusive, evidence: []string{"no positive control"}},
		{name: "blocked: arrival beats a sender's error", action: actSiblingTCP,
			probe:  sent("p010", probes.KindTCP, probes.Error, "tcp probe: bind: address in use", probes.Evidence{}),
			others: []placed{{PlaceB, seen("wp010", 0, 3550*time.Millisecond, 1)}, pinnedB}, baselineOK: true,
			want: Fail, evidence: []string{"errored", "bind", "saw the traffic arrive"}},
		{name: "blocked: our own stack gave up is never silence", action: actSiblingTCP,
			probe:  sent("p010", probes.KindTCP, probes.Error, "our own stack gave up (EHOSTUNREACH): no ARP/NDP answer for the next hop, so the packet never left and proves nothing", probes.Evidence{Errno: "EHOSTUNREACH"}),
			others: []placed{cleanWitness, pinnedB}, baselineOK: true, want: Inconclusive, evidence: []string{"never left"}},
		{name: "blocked: a peer that could not be pinned only repeats ARP", action: actSiblingTCP,
			probe:  sent("p010", probes.KindTCP, probes.Silent, "no SYN-ACK", probes.Evidence{}),
			others: []placed{cleanWitness, {PlaceA, answered(pinID(netip.MustParseAddr("10.88.0.12")), probes.Error)}}, baselineOK: true,
			want: Inconclusive, evidence: []string{"not pinned", "repeats the ARP result"}},
		{name: "blocked: no pin report at all", action: actSiblingTCP,
			probe:  sent("p010", probes.KindTCP, probes.Silent, "no SYN-ACK", probes.Evidence{}),
			others: []placed{cleanWitness}, baselineOK: true, want: Inconclusive, evidence: []string{"not pinned (no report)"}},
		{name: "host: a listener that did not answer its control proves nothing", action: actHostTCP,
			probe:  sent("p020", probes.KindTCP, probes.Silent, "no SYN-ACK", probes.Evidence{}),
			others: []placed{{PlaceHost, served("l-tcp-gateway")}, {PlaceHost, answered("ctl-tcp-gateway", probes.Silent)}}, baselineOK: true,
			want: Inconclusive, evidence: []string{"did not answer its own control probe", "silent"}},
		{name: "host: icmp silence from a kernel that does not answer its own echo proves nothing", action: actHostICMPControlled,
			probe:  sent("p021", probes.KindICMP, probes.Silent, "no echo reply", probes.Evidence{}),
			others: []placed{{PlaceHost, answered("ctl-icmp-gateway", probes.Silent)}}, baselineOK: true,
			want: Inconclusive, evidence: []string{"did not answer its own control probe", "proves nothing"}},
		{name: "host: icmp silence from a kernel that answers its own echo", action: actHostICMPControlled,
			probe:  sent("p021", probes.KindICMP, probes.Silent, "no echo reply", probes.Evidence{}),
			others: []placed{{PlaceHost, answered("ctl-icmp-gateway", probes.Reached)}}, baselineOK: true,
			want: Pass, evidence: []string{"dropped"}, atTarget: "it answered its own control probe"},
		{name: "host: a listener with no control report proves nothing", action: actHostTCP,
			probe:  sent("p020", probes.KindTCP, probes.Silent, "no SYN-ACK", probes.Evidence{}),
			others: []placed{{PlaceHost, served("l-tcp-gateway")}}, baselineOK: true,
			want: Inconclusive, evidence: []string{"did not answer its own control probe", "(no report)"}},

		// Blocked, at a host address with a listener.
		{name: "host: the listener served box-a", action: actHostTCP,
			probe:  sent("p020", probes.KindTCP, probes.Silent, "no SYN-ACK", probes.Evidence{}),
			others: []placed{{PlaceHost, served("l-tcp-gateway", "10.88.0.11:41234")}}, baselineOK: true,
			want: Fail, evidence: []string{"the target"}, atTarget: "listener served 10.88.0.11:41234"},
		{name: "host: the listener served only others", action: actHostTCP,
			probe: sent("p020", probes.KindTCP, probes.Silent, "no SYN-ACK", probes.Evidence{}),
			// 10.88.0.111 starts with box-a's 10.88.0.11 as text.
			others:     []placed{{PlaceHost, served("l-tcp-gateway", "10.88.0.111:5000", "192.168.20.2:6000")}, hostControl},
			baselineOK: true, want: Pass, evidence: []string{"dropped"}, atTarget: "served nothing from 10.88.0.11 (2 served in all)"},
		{name: "host: missing listener report", action: actHostTCP,
			probe:      sent("p020", probes.KindTCP, probes.Silent, "no SYN-ACK", probes.Evidence{}),
			baselineOK: true, want: Inconclusive, evidence: []string{"no listener report from host"}},
		{name: "host: rejected by the host firewall", action: actHostTCP,
			probe: sent("p020", probes.KindTCP, probes.Rejected, "ICMP admin-prohibited from 10.88.0.1",
				probes.Evidence{ICMP: &probes.ICMPEvidence{Family: 4, Type: 3, Code: 13, Name: "admin-prohibited", Offender: "10.88.0.1", OffenderIsTarget: true}}),
			others: []placed{{PlaceHost, served("l-tcp-gateway")}, hostControl}, baselineOK: true, want: Pass, evidence: []string{"blocked by policy", "10.88.0.1 (admin-prohibited)"}},
		{name: "host: icmp silent, nothing to witness, is no pass", action: actHostICMP,
			probe:      sent("p021", probes.KindICMP, probes.Silent, "no echo reply", probes.Evidence{}),
			baselineOK: true, want: Inconclusive, evidence: []string{"nothing watched this target"}},
		{name: "host: icmp echo reply", action: actHostICMP,
			probe:      sent("p021", probes.KindICMP, probes.Reached, "echo reply from the target with the nonce", probes.Evidence{From: "10.88.0.1"}),
			baselineOK: true, want: Fail, evidence: []string{"unexpected success"}},

		// The canary.
		{name: "egress: tcp with the greeting", action: actEgress("tcp", probes.KindTCP),
			probe:      &probes.Observation{ID: "p001", Kind: probes.KindTCP, Outcome: probes.Reached, Target: "203.0.113.10:80", Evidence: probes.Evidence{Reply: "hello from canary 5f3e abcd"}},
			baselineOK: true, want: Pass, evidence: []string{"reached 203.0.113.10:80", "hello from canary 5f3e"}},
		{name: "egress: reached without the canary's greeting", action: actEgress("tcp", probes.KindTCP),
			probe:      &probes.Observation{ID: "p001", Kind: probes.KindTCP, Outcome: probes.Reached, Evidence: probes.Evidence{Reply: "HTTP/1.1 400 Bad Request"}},
			baselineOK: true, want: Fail, evidence: []string{"lacks the greeting", "HTTP/1.1 400"}},
		{name: "egress: udp without the greeting", action: actEgress("udp", probes.KindUDP),
			probe:      &probes.Observation{ID: "p001", Kind: probes.KindUDP, Outcome: probes.Reached, Evidence: probes.Evidence{Reply: "abcd"}},
			baselineOK: true, want: Fail, evidence: []string{"lacks the greeting"}},
		{name: "egress: icmp needs no greeting", action: actEgress("icmp", probes.KindICMP),
			probe:      &probes.Observation{ID: "p001", Kind: probes.KindICMP, Outcome: probes.Reached, Target: "203.0.113.10"},
			baselineOK: true, want: Pass, evidence: []string{"reached 203.0.113.10"}},
		{name: "egress: silent", action: actEgress("tcp", probes.KindTCP),
			probe:      &probes.Observation{ID: "p001", Kind: probes.KindTCP, Outcome: probes.Silent, Reason: "no SYN-ACK"},
			baselineOK: true, want: Fail, evidence: []string{"not reached", "no SYN-ACK"}},
		{name: "egress: refused", action: actEgress("tcp", probes.KindTCP),
			probe:      &probes.Observation{ID: "p001", Kind: probes.KindTCP, Outcome: probes.Refused, Reason: "TCP RST"},
			baselineOK: true, want: Fail, evidence: []string{"not reached"}},

		// Resolver.
		{name: "dns: resolves", action: actDNS,
			probe:      &probes.Observation{ID: "p004", Kind: probes.KindDNS, Outcome: probes.Reached, Evidence: dnsEv("NOERROR", true, "canary.example.net. 60 IN A 203.0.113.10")},
			baselineOK: true, want: Pass, evidence: []string{"resolved", "203.0.113.10"}},
		{name: "dns: resolves to a look-alike address", action: actDNS,
			probe:      &probes.Observation{ID: "p004", Kind: probes.KindDNS, Outcome: probes.Reached, Evidence: dnsEv("NOERROR", true, "canary.example.net. 60 IN A 203.0.113.1")},
			baselineOK: true, want: Fail, evidence: []string{"not to 203.0.113.10"}},
		{name: "dns: NXDOMAIN for the public name", action: actDNS,
			probe:      &probes.Observation{ID: "p004", Kind: probes.KindDNS, Outcome: probes.Refused, Reason: "the resolver answered NXDOMAIN", Evidence: dnsEv("NXDOMAIN", false)},
			baselineOK: true, want: Fail, evidence: []string{"did not resolve", "NXDOMAIN"}},
		{name: "dns: silent", action: actDNS,
			probe:      &probes.Observation{ID: "p004", Kind: probes.KindDNS, Outcome: probes.Silent, Reason: "no reply"},
			baselineOK: true, want: Fail, evidence: []string{"did not resolve"}},

		// Lease.
		{name: "dhcp: a lease on the subnet", action: actDHCP, probe: lease("p005", "10.88.0.11/24", "", ""),
			baselineOK: true, want: Pass, evidence: []string{"holds 10.88.0.11/24"}},
		{name: "dhcp: an address elsewhere", action: actDHCP, probe: lease("p005", "10.99.0.11/24", "", ""),
			baselineOK: true, want: Fail, evidence: []string{"no address on 10.88.0.0/24"}},
		{name: "dhcp: no lease", action: actDHCP,
			probe:      &probes.Observation{ID: "p005", Kind: probes.KindDHCPLease, Outcome: probes.Silent, Reason: "no interface holds an address in 10.88.0.0/24: no lease"},
			baselineOK: true, want: Fail, evidence: []string{"no lease"}},

		// Sibling names.
		{name: "no-sibling-name: NXDOMAIN", action: actEnum,
			probe:      &probes.Observation{ID: "p030", Kind: probes.KindDNS, Outcome: probes.Refused, Evidence: dnsEv("NXDOMAIN", false)},
			baselineOK: true, want: Pass, evidence: []string{"NXDOMAIN", "no record"}},
		{name: "no-sibling-name: NXDOMAIN, but a baseline failed", action: actEnum,
			probe:      &probes.Observation{ID: "p030", Kind: probes.KindDNS, Outcome: probes.Refused, Evidence: dnsEv("NXDOMAIN", false)},
			baselineOK: false, want: Inconclusive, evidence: []string{"baseline failed"}},
		{name: "no-sibling-name: resolved", action: actEnum,
			probe:      &probes.Observation{ID: "p030", Kind: probes.KindDNS, Outcome: probes.Reached, Evidence: dnsEv("NOERROR", true, "drill-0a1b2c-b. 0 IN A 10.88.0.12")},
			baselineOK: true, want: Fail, evidence: []string{"answered a private name", "10.88.0.12"}},
		{name: "no-sibling-name: silent", action: actEnum,
			probe:      &probes.Observation{ID: "p030", Kind: probes.KindDNS, Outcome: probes.Silent, Reason: "no reply before the deadline"},
			baselineOK: true, want: Inconclusive, evidence: []string{"no DNS answer", "no reply"}},
		{name: "no-sibling-name: a reply that does not answer the query", action: actEnum,
			probe:      &probes.Observation{ID: "p030", Kind: probes.KindDNS, Outcome: probes.Refused, Reason: "id or question differs", Evidence: probes.Evidence{DNS: &probes.DNSEvidence{Name: "x.", QType: "A"}}},
			baselineOK: true, want: Inconclusive, evidence: []string{"no DNS answer"}},
		// An agent report is decoded strictly but not checked for evidence
		// per outcome: a reached DNS observation without DNS evidence must
		// be judged, not crash the drill.
		{name: "no-sibling-name: reached without DNS evidence", action: actEnum,
			probe:      &probes.Observation{ID: "p030", Kind: probes.KindDNS, Outcome: probes.Reached, Reason: "the resolver answered with records for the name"},
			baselineOK: true, want: Fail, evidence: []string{"answered a private name"}},

		// A name compared with the public upstream asked from the host.
		{name: "names: the upstream answers the same (a public name)", action: actNameUp,
			probe:      &probes.Observation{ID: "p031", Kind: probes.KindDNS, Outcome: probes.Reached, Evidence: dnsEv("NOERROR", true, "git.example.org. 300 IN A 192.0.2.7")},
			others:     []placed{{PlaceHost, &probes.Observation{ID: "up-p031", Kind: probes.KindDNS, Outcome: probes.Reached, Evidence: dnsEv("NOERROR", true, "GIT.example.org. 3600 IN A 192.0.2.7")}}},
			baselineOK: true, want: Pass, evidence: []string{"a public name"}, atTarget: "answers the same"},
		{name: "names: the upstream knows no such name (leaked)", action: actNameUp,
			probe:      &probes.Observation{ID: "p031", Kind: probes.KindDNS, Outcome: probes.Reached, Evidence: dnsEv("NOERROR", true, "printer.corp.internal. 0 IN A 192.168.20.30")},
			others:     []placed{{PlaceHost, &probes.Observation{ID: "up-p031", Kind: probes.KindDNS, Outcome: probes.Refused, Evidence: dnsEv("NXDOMAIN", false)}}},
			baselineOK: true, want: Fail, evidence: []string{"leaked", "192.168.20.30"}},
		{name: "names: the upstream answers differently (leaked)", action: actNameUp,
			probe:      &probes.Observation{ID: "p031", Kind: probes.KindDNS, Outcome: probes.Reached, Evidence: dnsEv("NOERROR", true, "git.example.org. 0 IN A 10.20.0.10")},
			others:     []placed{{PlaceHost, &probes.Observation{ID: "up-p031", Kind: probes.KindDNS, Outcome: probes.Reached, Evidence: dnsEv("NOERROR", true, "git.example.org. 300 IN A 192.0.2.7")}}},
			baselineOK: true, want: Fail, evidence: []string{"differently"}},
		{name: "names: nothing to compare with", action: actNameUp,
			probe:      &probes.Observation{ID: "p031", Kind: probes.KindDNS, Outcome: probes.Reached, Evidence: dnsEv("NOERROR", true, "git.example.org. 0 IN A 10.20.0.10")},
			others:     []placed{{PlaceHost, &probes.Observation{ID: "up-p031", Kind: probes.KindDNS, Outcome: probes.Silent, Reason: "no reply"}}},
			baselineOK: true, want: Inconclusive, evidence: []string{"nothing to compare with"}},

		// Host mode: the outbound witness on the host's outward interfaces.
		{name: "outbound: the probe's nonce seen leaving", action: actLANOut(probes.KindUDP),
			probe:      sent("p050", probes.KindUDP, probes.Silent, "no reply", probes.Evidence{}),
			others:     []placed{{PlaceHost, outSeen(rec("udp", 53, "", 0, "lanudpnonce"), rec("icmp", 0, "", 0, "ctloutnonce"))}},
			baselineOK: true, want: Fail, evidence: []string{"the target saw the traffic arrive"}, atTarget: "seen leaving the host on eth0"},
		{name: "outbound: the SYN with the probe's ISN seen leaving", action: actLANOut(probes.KindTCP),
			probe:      sent("p050", probes.KindTCP, probes.Silent, "no SYN-ACK", probes.Evidence{SrcPort: 40001, ISN: 777, ISNCaptured: true}),
			others:     []placed{{PlaceHost, outSeen(rec("tcp", 80, "S", 777, ""), rec("icmp", 0, "", 0, "ctloutnonce"))}},
			baselineOK: true, want: Fail, atTarget: "tcp"},
		{name: "outbound: another SYN is not the probe's", action: actLANOut(probes.KindTCP),
			probe:      sent("p050", probes.KindTCP, probes.Silent, "no SYN-ACK", probes.Evidence{SrcPort: 40001, ISN: 777, ISNCaptured: true}),
			others:     []placed{{PlaceHost, outSeen(rec("tcp", 80, "S", 12345, ""), rec("icmp", 0, "", 0, "ctloutnonce"))}},
			baselineOK: true, want: Pass, atTarget: "not seen leaving"},
		{name: "outbound: a SYN left and the probe's ISN is unknown", action: actLANOut(probes.KindTCP),
			probe:      sent("p050", probes.KindTCP, probes.Silent, "no SYN-ACK", probes.Evidence{ISNError: "no capture"}),
			others:     []placed{{PlaceHost, outSeen(rec("tcp", 80, "S", 12345, ""), rec("icmp", 0, "", 0, "ctloutnonce"))}},
			baselineOK: true, want: Inconclusive, evidence: []string{"ISN is unknown"}},
		{name: "outbound: nothing left and the host's echo was seen", action: actLANOut(probes.KindUDP),
			probe:      sent("p050", probes.KindUDP, probes.Silent, "no reply", probes.Evidence{}),
			others:     []placed{{PlaceHost, outSeen(rec("icmp", 0, "", 0, "ctloutnonce"))}},
			baselineOK: true, want: Pass, atTarget: "alive: the host's own echo"},
		{name: "outbound: the host's echo was not seen (the way is not watched)", action: actLANOut(probes.KindUDP),
			probe:      sent("p050", probes.KindUDP, probes.Silent, "no reply", probes.Evidence{}),
			others:     []placed{{PlaceHost, outSeen()}},
			baselineOK: true, want: Inconclusive, evidence: []string{"not watched"}},
		{name: "outbound: the list was cut short", action: actLANOut(probes.KindUDP),
			probe: sent("p050", probes.KindUDP, probes.Silent, "no reply", probes.Evidence{}),
			others: []placed{{PlaceHost, func() *probes.Observation {
				o := outSeen(rec("icmp", 0, "", 0, "ctloutnonce"))
				o.Evidence.Witness.Recorded = 90
				return o
			}()}},
			baselineOK: true, want: Inconclusive, evidence: []string{"listed 1 of the 90"}},
		{name: "outbound: a LAN target nothing watches", action: func() Action { a := actLANOut(probes.KindUDP); a.WitnessAt, a.Witness = "", nil; return a }(),
			probe:      sent("p050", probes.KindUDP, probes.Silent, "no reply", probes.Evidence{}),
			baselineOK: true, want: Inconclusive, evidence: []string{"nothing watched"}},

		// A host service, judged by the counting chain after the filter.
		{name: "counted: packets after the filter fail the probe", action: actHostSSH,
			probe:      sent("p025", probes.KindTCP, probes.Silent, "no SYN-ACK, RST or ICMP error before the deadline", probes.Evidence{}),
			others:     []placed{{PlaceFilter, counts("tcp 10.88.0.11>10.88.0.1:22", 2)}, {PlaceFilter, counts(countControlID, 4)}},
			baselineOK: true, want: Fail, evidence: []string{"the target saw the traffic arrive"}, atTarget: "2 packet(s)"},
		{name: "counted: zero with a live chain passes", action: actHostSSH,
			probe:      sent("p025", probes.KindTCP, probes.Silent, "no SYN-ACK, RST or ICMP error before the deadline", probes.Evidence{}),
			others:     []placed{{PlaceFilter, counts("tcp 10.88.0.11>10.88.0.1:22", 0)}, {PlaceFilter, counts(countControlID, 4)}},
			baselineOK: true, want: Pass, evidence: []string{"dropped"}, atTarget: "nothing counted"},
		{name: "counted: zero from a chain that counted not even its control", action: actHostSSH,
			probe:      sent("p025", probes.KindTCP, probes.Silent, "no SYN-ACK, RST or ICMP error before the deadline", probes.Evidence{}),
			others:     []placed{{PlaceFilter, counts("tcp 10.88.0.11>10.88.0.1:22", 0)}, {PlaceFilter, counts(countControlID, 0)}},
			baselineOK: true, want: Inconclusive, evidence: []string{"did not count its control"}},
		{name: "counted: no count at all", action: actHostSSH,
			probe:      sent("p025", probes.KindTCP, probes.Silent, "no SYN-ACK, RST or ICMP error before the deadline", probes.Evidence{}),
			baselineOK: true, want: Inconclusive, evidence: []string{"no count"}},

		// No IPv6.
		{name: "none: silent", action: actV6,
			probe:      &probes.Observation{ID: "p040", Kind: probes.KindIPv6State, Outcome: probes.Silent, Reason: "no global IPv6 address and no IPv6 default route"},
			baselineOK: true, want: Pass, evidence: []string{"no global IPv6 address"}},
		{name: "none: reached", action: actV6,
			probe: &probes.Observation{ID: "p040", Kind: probes.KindIPv6State, Outcome: probes.Reached, Reason: "1 global IPv6 address(es) and 1 IPv6 default route(s)",
				Evidence: probes.Evidence{IPv6: &probes.IPv6Evidence{GlobalAddresses: []string{"fd42:b0c5::17/64"}, DefaultRoutes: []string{"via fe80::1"}}}},
			baselineOK: true, want: Fail, evidence: []string{"1 global IPv6", "fd42:b0c5::17/64"}},
		{name: "none: a router advertisement reached the box's passive watch", action: actV6Watch,
			probe: &probes.Observation{ID: "p041", Kind: probes.KindNDPRS, Outcome: probes.Silent, Reason: "no router advertisement to 3 solicitations before the deadline",
				StartedAt: t0.Add(rsDelay), ElapsedMS: rsWindow.Milliseconds()},
			others:     []placed{{PlaceA, seen("wp041", 0, planDeadline-150*time.Millisecond, 1)}},
			baselineOK: true, want: Fail, evidence: []string{"IPv6 configuration arrived"}, atTarget: "saw 1 frame(s)"},
		{name: "none: silent, but the passive watch never saw its control", action: actV6Watch,
			probe: &probes.Observation{ID: "p041", Kind: probes.KindNDPRS, Outcome: probes.Silent, Reason: "no router advertisement to 3 solicitations before the deadline",
				StartedAt: t0.Add(rsDelay), ElapsedMS: rsWindow.Milliseconds()},
			others:     []placed{{PlaceA, controlled(seen("wp041", 0, planDeadline-150*time.Millisecond, 0), 0, 0)}},
			baselineOK: true, want: Inconclusive, evidence: []string{"never saw its positive control"}},
		{name: "none: silent with a live passive watch", action: actV6Watch,
			probe: &probes.Observation{ID: "p041", Kind: probes.KindNDPRS, Outcome: probes.Silent, Reason: "no router advertisement to 3 solicitations before the deadline",
				StartedAt: t0.Add(rsDelay), ElapsedMS: rsWindow.Milliseconds()},
			others:     []placed{{PlaceA, seen("wp041", 0, planDeadline-150*time.Millisecond, 0)}},
			baselineOK: true, want: Pass, evidence: []string{"no router advertisement"}, atTarget: "alive"},
		{name: "none: error", action: actV6,
			probe:      &probes.Observation{ID: "p040", Kind: probes.KindIPv6State, Outcome: probes.Error, Reason: "netlink: permission denied"},
			baselineOK: true, want: Inconclusive, evidence: []string{"permission denied"}},

		// Clone identity.
		{name: "distinct: all different", action: actClone,
			probe:  lease("p050", "10.88.0.13/24", "00:16:3e:00:00:0c", "fedcba9876543210fedcba9876543210"),
			others: []placed{sourceLease}, baselineOK: true, want: Pass, evidence: []string{"10.88.0.13/24 vs 10.88.0.11/24", "00:16:3e:00:00:0c vs 00:16:3e:00:00:0a"}},
		{name: "distinct: same MAC", action: actClone,
			probe:  lease("p050", "10.88.0.13/24", "00:16:3e:00:00:0a", "fedcba9876543210fedcba9876543210"),
			others: []placed{sourceLease}, baselineOK: true, want: Fail, evidence: []string{"MAC 00:16:3e:00:00:0a"}},
		{name: "distinct: same address and machine-id", action: actClone,
			probe:  lease("p050", "10.88.0.11/24", "00:16:3e:00:00:0c", "0123456789abcdef0123456789abcdef"),
			others: []placed{sourceLease}, baselineOK: true, want: Fail, evidence: []string{"address 10.88.0.11/24", "machine-id 0123456789abcdef"}},
		{name: "distinct: machine-id unreadable", action: actClone,
			probe:  lease("p050", "10.88.0.13/24", "00:16:3e:00:00:0c", ""),
			others: []placed{sourceLease}, baselineOK: true, want: Inconclusive, evidence: []string{"could not be read"}},
		{name: "distinct: no source lease", action: actClone,
			probe:      lease("p050", "10.88.0.13/24", "00:16:3e:00:00:0c", "fedcba9876543210fedcba9876543210"),
			baselineOK: true, want: Inconclusive, evidence: []string{"no lease evidence"}},
		{name: "distinct: nothing to compare", action: func() Action { a := actClone; a.Reference = ProbeRef{}; return a }(),
			probe:      lease("p050", "10.88.0.13/24", "00:16:3e:00:00:0c", "fedcba9876543210fedcba9876543210"),
			baselineOK: true, want: Inconclusive, evidence: []string{"nothing to compare"}},

		{name: "an unknown expectation is inconclusive", action: actUnknown,
			probe:      &probes.Observation{ID: "p060", Kind: probes.KindTCP, Outcome: probes.Reached},
			baselineOK: true, want: Inconclusive, evidence: []string{"no rule", "teleported"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			obs := observations{}
			add := func(place Place, o *probes.Observation) {
				if obs[place] == nil {
					obs[place] = map[string]probes.Observation{}
				}
				obs[place][o.ID] = *o
			}
			if tt.probe != nil {
				add(tt.action.From, tt.probe)
			}
			for _, o := range tt.others {
				add(o.place, o.obs)
			}
			agentErr := map[Place]string{}
			if tt.probe == nil {
				agentErr[tt.action.From] = "exec: deadline exceeded"
			}
			var r Result
			require.NotPanics(t, func() { r = judge(tt.action, obs, topo, tt.baselineOK, agentErr) })
			assert.Equal(t, tt.want, r.Verdict, "evidence: %s; at target: %s", r.Evidence, r.AtTarget)
			for _, s := range tt.evidence {
				assert.Contains(t, r.Evidence, s)
			}
			if tt.atTarget != "" {
				assert.Contains(t, r.AtTarget, tt.atTarget)
			}
			assert.Equal(t, tt.action.ID, r.ID, "the result carries its action")
			assert.NotEmpty(t, r.Observed)
			if tt.probe != nil {
				require.NotNil(t, r.Obs)
				assert.Equal(t, tt.probe.Outcome, r.Obs.Outcome)
			} else {
				assert.Nil(t, r.Obs)
			}
		})
	}
}

func TestAggregate(t *testing.T) {
	c, _ := ClaimByID("C-SIBLING")
	res := func(vs ...Verdict) []Result {
		var out []Result
		for _, v := range vs {
			out = append(out, Result{Verdict: v})
		}
		return out
	}
	tests := []struct {
		name string
		in   []Result
		want Verdict
	}{
		{"no results is skipped", nil, Skipped},
		{"all pass", res(Pass, Pass, Pass), Pass},
		{"one inconclusive", res(Pass, Inconclusive, Pass), Inconclusive},
		{"one fail", res(Pass, Fail, Pass), Fail},
		{"fail beats an inconclusive after it", res(Fail, Inconclusive), Fail},
		{"fail beats an inconclusive before it", res(Inconclusive, Pass, Fail), Fail},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cr := aggregate(c, tt.in)
			assert.Equal(t, tt.want, cr.Verdict)
			assert.Equal(t, c.ID, cr.ID)
			assert.Len(t, cr.Results, len(tt.in))
		})
	}
}

// TestListenerEvidenceIsTheSenders: a listener many senders aim at (the
// drill's listeners on host addresses) counts as arrival for an action only
// when it served that action's own sender, as its packets arrive there: a
// probe box's address on its own member, its member's address and pinned
// source port past another member's NAT.
func TestListenerEvidenceIsTheSenders(t *testing.T) {
	boxA, boxT := netip.MustParseAddr("10.88.0.11"), netip.MustParseAddr("10.88.0.14")
	memberBox := netip.MustParseAddr("10.88.0.21") // box@m2, on its own member
	m2 := netip.MustParseAddr("192.168.40.12")     // m2's cluster address: box@m2 past its NAT
	act := func(from Place, src netip.AddrPort) Action {
		a := actHostTCP
		a.From, a.Source = from, src
		return a
	}
	silent := func(a Action) *probes.Observation {
		return sent(a.ID, probes.KindTCP, probes.Silent, "no SYN-ACK", probes.Evidence{})
	}
	cases := []struct {
		name  string
		a     Action
		peers []string
		want  Verdict
		at    string
	}{
		{"box-a: served box-a", act(PlaceA, netip.AddrPortFrom(boxA, 0)), []string{"10.88.0.11:40001"}, Fail, "served 10.88.0.11:40001"},
		{"box-a: served only box-t", act(PlaceA, netip.AddrPortFrom(boxA, 0)), []string{"10.88.0.14:40001"}, Pass, "only other senders: 10.88.0.14:40001"},
		{"box-t: served box-t", act(PlaceT, netip.AddrPortFrom(boxT, 0)), []string{"10.88.0.14:40001"}, Fail, "served 10.88.0.14:40001"},
		{"box-t: served only box-a", act(PlaceT, netip.AddrPortFrom(boxT, 0)), []string{"10.88.0.11:40001"}, Pass, "only other senders: 10.88.0.11:40001"},
		{"a member's box, on its member: served it", act(memberBoxPlace("m2"), netip.AddrPortFrom(memberBox, 0)), []string{"10.88.0.21:40001"}, Fail, "served 10.88.0.21"},
		{"across members: served its member's address and its port", act(memberBoxPlace("m2"), netip.AddrPortFrom(m2, 21001)), []string{"192.168.40.12:21001"}, Fail, "served 192.168.40.12:21001"},
		{"across members: the same address, another box's port", act(memberBoxPlace("m2"), netip.AddrPortFrom(m2, 21001)), []string{"192.168.40.12:21002"}, Pass, "only other senders: 192.168.40.12:21002"},
		{"across members: box-a past m1's NAT is not m2's", act(PlaceA, netip.AddrPortFrom(netip.MustParseAddr("192.168.40.11"), 21003)), []string{"192.168.40.12:21003"}, Pass, "only other senders"},
		{"an action that does not say where it comes from proves nothing", act(PlaceA, netip.AddrPort{}), []string{"10.88.0.11:40001"}, Inconclusive, ""},
	}
	for _, tt := range cases {
		t.Run(tt.name, func(t *testing.T) {
			obs := observations{
				tt.a.From: {tt.a.ID: *silent(tt.a)},
				PlaceHost: {"l-tcp-gateway": *served("l-tcp-gateway", tt.peers...), hostControl.obs.ID: *hostControl.obs},
			}
			r := judge(tt.a, obs, testTopology(), true, nil)
			assert.Equal(t, tt.want, r.Verdict, "%s; at the target: %s", r.Evidence, r.AtTarget)
			assert.Contains(t, r.AtTarget, tt.at)
		})
	}
}

// TestAggregateRejectsWhatJudgingNeverGives: a selected claim that built
// nothing is skipped with a reason and unrun; a verdict judging never
// gives (an empty one) is no pass.
func TestAggregateRejectsWhatJudgingNeverGives(t *testing.T) {
	c := claimFor(t, "C-SIBLING")
	r := func(v Verdict) Result { return Result{Action: Action{ID: "p1"}, Verdict: v, Evidence: "e"} }
	assert.Equal(t, Pass, aggregate(c, []Result{r(Pass), r(Pass)}).Verdict)
	assert.Equal(t, Inconclusive, aggregate(c, []Result{r(Pass), r(Inconclusive)}).Verdict)
	assert.Equal(t, Fail, aggregate(c, []Result{r(Inconclusive), r(Fail)}).Verdict)
	none := aggregate(c, nil)
	assert.Equal(t, Skipped, none.Verdict)
	assert.True(t, none.Unrun, "selected, and it proved nothing")
	assert.Contains(t, none.Reason, "found nothing to probe here")
	for _, v := range []Verdict{"", "passed", Skipped} {
		cr := aggregate(c, []Result{r(Pass), r(v)})
		assert.Equal(t, Inconclusive, cr.Verdict, "a result with verdict %q is no pass", v)
		assert.Equal(t, Inconclusive, cr.Results[1].Verdict)
		assert.Contains(t, cr.Results[1].Evidence, "no verdict judging gives")
	}
}

// TestSilenceAloneIsNeverAPass: for every blocked action of every
// topology, the sender's silence with nothing reported at the target is
// never a pass. Either the action has evidence at its target (a witness,
// a listener, a counter or the target's own control) and its absence makes
// it inconclusive, or it has none and is inconclusive by design.
func TestSilenceAloneIsNeverAPass(t *testing.T) {
	for name, tp := range topologies(t) {
		t.Run(name, func(t *testing.T) {
			sc := BuildScenario(tp.scene, tp.claims)
			blocked := 0
			for _, a := range sc.Actions {
				if a.Expect != ExpectBlocked && !(a.Expect == ExpectNone && a.Probe.Kind != probes.KindIPv6State) {
					continue
				}
				blocked++
				silent := probes.Observation{ID: a.ID, Kind: a.Probe.Kind, Outcome: probes.Silent, Reason: "nothing came back",
					StartedAt: t0.Add(probeDelay), ElapsedMS: 1500}
				r := judge(a, observations{a.From: {a.ID: silent}}, tp.scene, true, nil)
				assert.NotEqual(t, Pass, r.Verdict, "%s %s %s from %s to %s: passed on the sender's silence alone: %s",
					a.ID, a.Claim, a.Channel, a.From, a.Target, r.Evidence)
			}
			assert.NotZero(t, blocked)
		})
	}
}

// TestBlockedActionsAreWatched: in the world every blocked action has
// evidence at its target; on a real host, every one but those no watcher
// could be put beside (a LAN target on a host without an outward
// interface: judged inconclusive, and the claim says so).
func TestBlockedActionsAreWatched(t *testing.T) {
	for name, tp := range topologies(t) {
		t.Run(name, func(t *testing.T) {
			sc := BuildScenario(tp.scene, tp.claims)
			for _, a := range sc.Actions {
				if a.Expect != ExpectBlocked {
					continue
				}
				lanUnwatchable := !tp.scene.LANVia.IsValid() && len(tp.scene.Outward) == 0 &&
					slices.ContainsFunc(tp.scene.LANHosts, func(h Target) bool { return h.Addr == a.Probe.Target })
				if lanUnwatchable {
					assert.False(t, watched(a), "%s", a.ID)
					continue
				}
				assert.True(t, watched(a), "%s %s %s from %s to %s has nothing at its target", a.ID, a.Claim, a.Channel, a.From, a.Target)
			}
		})
	}
}
