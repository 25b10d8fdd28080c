// Package observation is what a probe, witness or listener of the agent
// saw, as the agent reports it and a drill report carries it
// (docs/drill-report.md, "observation"): pure data, with the few rules
// that read it. The probes (package probes) make observations; a report
// of a drill run holds them, and whoever reads one (drill/report) needs
// nothing of the probes themselves.
package observation

import (
	"time"
)

// Kind names a probe, witness or listener (package probes lists them).
type Kind string

// Observation is one probe's, witness's or listener's result.
//
// ElapsedMS is the wall time the probe ran, in whole milliseconds, measured
// from its first packet (after any delay the plan asked for) to its verdict.
// StartedAt is when that clock started, so a drill can check that a
// witness at the target was armed before the probe fired and still armed
// when the probe gave up.
type Observation struct {
	ID        string    `json:"id"`
	Kind      Kind      `json:"kind"`
	Target    string    `json:"target"`
	Outcome   Outcome   `json:"outcome"`
	Reason    string    `json:"reason"`
	Nonce     string    `json:"nonce,omitempty"`
	Evidence  Evidence  `json:"evidence"`
	StartedAt time.Time `json:"started_at"`
	ElapsedMS int64     `json:"elapsed_ms"`
}

// Evidence is what an outcome rests on. Only the fields a probe kind fills
// are present in JSON.
type Evidence struct {
	// Interface and Source: where the probe left from (found by subnet).
	// For arp_spoof and forged_udp, Source is the address claimed or
	// forged, never ours.
	Interface string `json:"interface,omitempty"`
	Source    string `json:"source,omitempty"`
	// From is the address that answered; Responders lists every answerer
	// for multicast and broadcast probes (never our own addresses).
	From       string   `json:"from,omitempty"`
	Responders []string `json:"responders,omitempty"`
	// Reply is the start of the peer's reply, printable ASCII only.
	Reply string `json:"reply,omitempty"`
	// MAC is the hardware address an ARP reply gave, or the one an
	// arp_spoof probe's frames came from.
	MAC string `json:"mac,omitempty"`
	// Sent is how many packets the probe sent (UDP and ICMP retransmit;
	// the forging probes send three).
	Sent int `json:"sent,omitempty"`
	// Errno is the socket error the probe saw, e.g. "ECONNREFUSED".
	Errno string `json:"errno,omitempty"`
	// Connected says a TCP handshake completed: the peer's address
	// accepted the connection, whatever it said afterwards.
	Connected bool `json:"connected,omitempty"`
	// Request names what a udp probe sent: "nonce" (the nonce line) or the
	// protocol request chosen for its port ("dns", "dhcp", "tftp", "ntp",
	// "netbios", "snmp", "ssdp"; udpproto.go has the table).
	Request string `json:"request,omitempty"`
	// SrcPort is a tcp probe's source port, bound before its SYN left, or
	// the random source port of a forged_udp probe's datagrams.
	// ISN is the initial sequence number of that SYN, read from a capture
	// of the SYN as it left (ISNCaptured true); a SYN carries no nonce, so
	// port and ISN are how a witness past a NAT recognises it. When the
	// ISN could not be learned, ISNError says why; the probe's outcome
	// never depends on it. (An ISN of 0 is written as isn_captured with no
	// isn.)
	SrcPort     int    `json:"src_port,omitempty"`
	ISN         uint32 `json:"isn,omitempty"`
	ISNCaptured bool   `json:"isn_captured,omitempty"`
	ISNError    string `json:"isn_error,omitempty"`
	// ICMP is the ICMP error that decided the outcome, with who sent it.
	ICMP     *ICMPEvidence     `json:"icmp,omitempty"`
	DNS      *DNSEvidence      `json:"dns,omitempty"`
	IPv6     *IPv6Evidence     `json:"ipv6,omitempty"`
	Lease    *LeaseEvidence    `json:"lease,omitempty"`
	Witness  *WitnessEvidence  `json:"witness,omitempty"`
	Listener *ListenerEvidence `json:"listener,omitempty"`
	// The kernel and load probes' (kernel.go): the id maps, capability
	// sets, system call filter, mounts, device nodes, files opened or
	// read, release_agents, HTTP answers and how far a load got.
	IDMap        *IDMapEvidence        `json:"id_map,omitempty"`
	Caps         *CapsEvidence         `json:"capabilities,omitempty"`
	Seccomp      *SeccompEvidence      `json:"seccomp,omitempty"`
	Mounts       *MountsEvidence       `json:"mounts,omitempty"`
	Devices      []DeviceNode          `json:"devices,omitempty"`
	Files        []FileAttempt         `json:"files,omitempty"`
	ReleaseAgent *ReleaseAgentEvidence `json:"release_agent,omitempty"`
	HTTP         []HTTPAnswer          `json:"http,omitempty"`
	Load         *LoadEvidence         `json:"load,omitempty"`
}

// ICMPEvidence is one ICMP error, as read from the socket error queue or a
// raw ICMP socket, matched to the probe's own packet.
type ICMPEvidence struct {
	Family   int    `json:"family"` // 4 or 6
	Type     int    `json:"type"`
	Code     int    `json:"code"`
	Name     string `json:"name"`
	Offender string `json:"offender"`
	// OffenderIsTarget is true when the target itself sent the error.
	OffenderIsTarget bool `json:"offender_is_target"`
	// OffenderIsLocal is true when our own stack generated it (for example
	// no ARP reply for an on-link target).
	OffenderIsLocal bool `json:"offender_is_local"`
}

// DNSEvidence is a DNS exchange. Rcode is present only when the resolver
// replied at the DNS level; Resolved says whether the reply carried records
// of the asked type for the name.
type DNSEvidence struct {
	Name     string   `json:"name"`
	QType    string   `json:"qtype"`
	Rcode    string   `json:"rcode,omitempty"`
	Resolved bool     `json:"resolved"`
	Answers  []string `json:"answers,omitempty"`
	// Addresses are the answer's A records, in order (a by-name tcp
	// probe connects to the first).
	Addresses []string `json:"addresses,omitempty"`
	// EDE is the reply's Extended DNS Error (RFC 8914), its code and text:
	// why a resolver would not answer.
	EDE string `json:"ede,omitempty"`
}

// IPv6Evidence is the box's IPv6 state or a router solicitation's result.
type IPv6Evidence struct {
	GlobalAddresses []string `json:"global_addresses,omitempty"`
	DefaultRoutes   []string `json:"default_routes,omitempty"`
	LinkLocal       []string `json:"link_local,omitempty"`
	Router          string   `json:"router,omitempty"`
	Prefixes        []string `json:"prefixes,omitempty"`
}

// LeaseEvidence is the box's address on its subnet, with what tells a clone
// from its source.
type LeaseEvidence struct {
	Address string `json:"address"`
	// Dynamic is true when the kernel holds the address with a finite
	// lifetime, as a DHCP client installs it.
	Dynamic      bool   `json:"dynamic"`
	ValidLftSec  int    `json:"valid_lft_sec,omitempty"`
	MAC          string `json:"mac,omitempty"`
	MachineID    string `json:"machine_id,omitempty"`
	Hostname     string `json:"hostname,omitempty"`
	DefaultRoute string `json:"default_route,omitempty"`
}

// WitnessEvidence is what a passive capture saw during its window.
type WitnessEvidence struct {
	ArmedAt  time.Time     `json:"armed_at"`
	Until    time.Time     `json:"until"`
	Count    int           `json:"count"`
	First    *FrameSummary `json:"first,omitempty"`
	Captured int           `json:"captured"` // every frame read, matched or not
	// Controls counts the positive-control frames seen (never matched);
	// ControlLast is when the last one arrived.
	Controls    int       `json:"controls"`
	ControlLast time.Time `json:"control_last,omitzero"`
	// Recorded counts the packets an outbound witness recorded (every
	// IPv4 packet out of its interfaces toward its prefixes); Records
	// lists up to probes.MaxWitnessRecords of them.
	Recorded int            `json:"recorded,omitempty"`
	Records  []PacketRecord `json:"records,omitempty"`
}

// PacketRecord is one IPv4 packet an outbound witness saw leave.
type PacketRecord struct {
	At      time.Time `json:"at"`
	Iface   string    `json:"iface"`
	SrcIP   string    `json:"src_ip"`
	DstIP   string    `json:"dst_ip"`
	Proto   string    `json:"proto"` // tcp, udp, icmp or ip-proto-N
	SrcPort int       `json:"src_port,omitempty"`
	DstPort int       `json:"dst_port,omitempty"`
	// TCPFlags are spelled as tcpdump does ("S" is a SYN, "S." a SYN-ACK);
	// Seq is the TCP sequence number (a SYN's is its ISN).
	TCPFlags string `json:"tcp_flags,omitempty"`
	Seq      uint32 `json:"seq,omitempty"`
	// Nonce is the witness's nonce the packet carried, if any.
	Nonce string `json:"nonce,omitempty"`
	// Matched says the packet counted as a match.
	Matched bool `json:"matched,omitempty"`
}

// FrameSummary describes one captured frame. For an ARP frame SrcIP is
// the sender protocol address and DstIP the target's, ARPOp the operation
// ("request", "reply", or "op-N") and ARPSenderMAC the sender hardware
// address: a frame whose sender is not the frame's source, or whose
// sender address is not that host's own, is a forgery or a proxy.
type FrameSummary struct {
	At           time.Time `json:"at"`
	EtherType    string    `json:"ethertype"`
	SrcMAC       string    `json:"src_mac"`
	DstMAC       string    `json:"dst_mac"`
	SrcIP        string    `json:"src_ip,omitempty"`
	DstIP        string    `json:"dst_ip,omitempty"`
	Proto        string    `json:"proto,omitempty"`
	DstPort      int       `json:"dst_port,omitempty"`
	ARPOp        string    `json:"arp_op,omitempty"`
	ARPSenderMAC string    `json:"arp_sender_mac,omitempty"`
	MatchedBy    string    `json:"matched_by"`
}

// ListenerEvidence is what a listener served.
type ListenerEvidence struct {
	Address string   `json:"address"`
	Served  int      `json:"served"`
	Peers   []string `json:"peers,omitempty"`
}
