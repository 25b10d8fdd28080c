package probes

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/sys/unix"

	"github.com/box-isolation/box/probes/observation"
)

// PlanVersion is the only plan version this agent runs.
const PlanVersion = 1

// Limits on a plan. They keep a malformed or hostile plan from making the
// agent allocate, spin or wait without bound.
const (
	MaxPlanBytes     = 1 << 20
	MaxProbes        = 1024
	MaxWitnesses     = 64
	MaxListeners     = 64
	MaxNeighbors     = 16
	MaxMatchEntries  = 64  // nonces, src_ips or src_macs in one witness
	MaxWitnessIfaces = 16  // ifaces in one outbound witness
	MaxDstPrefixes   = 64  // dst_prefixes in one outbound witness
	MaxStringLen     = 253 // a DNS name's length, the longest string a plan needs
	MaxIDLen         = 64
	MinNonceLen      = 8
	MaxNonceLen      = 64
	MinPlanDeadline  = 100 * time.Millisecond
	MaxPlanDeadline  = 120 * time.Second
	MinProbeDeadline = 50 * time.Millisecond
	// MaxStartWait bounds how long an agent waits for its plan's start_at:
	// a plan whose start lies further ahead starts at once after it.
	MaxStartWait = 30 * time.Second
	// AgentMargin is kept free at the end of a plan's deadline for cleanup
	// and writing the report, so the agent returns within the deadline.
	AgentMargin = 50 * time.Millisecond
)

// Kind names a probe, witness or listener (observation.Kind: an
// observation says the kind it is of).
type Kind = observation.Kind

// Probe kinds.
const (
	KindARP       Kind = "arp"        // ARP who-has for an on-link IPv4 target
	KindICMP      Kind = "icmp"       // ICMP or ICMPv6 echo, unicast or multicast
	KindTCP       Kind = "tcp"        // TCP connect, then a nonce line
	KindUDP       Kind = "udp"        // UDP datagram with a nonce
	KindBroadcast Kind = "broadcast"  // UDP to the subnet's broadcast address, or a multicast group
	KindDNS       Kind = "dns"        // one DNS question to one resolver
	KindIPv6State Kind = "ipv6_state" // global IPv6 addresses and default routes
	KindNDPRS     Kind = "ndp_rs"     // router solicitation, expecting no RA
	KindDHCPLease Kind = "dhcp_lease" // the address held on the box subnet
	KindControl   Kind = "control"    // control frames for the witnesses on a wire
	KindARPSpoof  Kind = "arp_spoof"  // forged ARP: claims an address that is not ours
	KindForgedUDP Kind = "forged_udp" // IPv4 UDP from a source address that is not ours
	KindDHCPForge Kind = "dhcp_forge" // a DHCP message naming a client that need not be us
	KindDHCPFlood Kind = "dhcp_flood" // DHCP for many made-up clients
)

// The ARP frames an arp_spoof probe forges (its "op").
const (
	// ARPOpGratuitous is an ARP request whose sender and target protocol
	// addresses are both the claim, to broadcast: "claim is at my MAC".
	ARPOpGratuitous = "gratuitous"
	// ARPOpReply is an ARP reply from the claim to target at dst_mac.
	ARPOpReply = "reply"
	// ARPOpRequest is an ARP request from the claim asking for target.
	ARPOpRequest = "request"
)

// Witness and listener kinds (they appear in observations too).
const (
	KindWitness    Kind = "witness"
	KindTCPGreeter Kind = "tcp_greeter"
	KindUDPEcho    Kind = "udp_echo"
)

// Plan is what RunAgent reads on stdin.
//
// All durations are whole milliseconds. DeadlineMS bounds the whole run:
// the agent writes its report and returns within it. Every probe's
// delay_ms+deadline_ms and every witness's and listener's window_ms must
// fit in deadline_ms minus AgentMargin.
type Plan struct {
	Version    int `json:"version"`
	DeadlineMS int `json:"deadline_ms"`
	// StartAt, when set, is the wall-clock instant the agent starts its
	// clocks at (every delay and window, and the deadline, count from it):
	// agents started one after another in several places, some through a
	// slow exec, then measure from the same instant. An agent that begins
	// after it starts at once, and its report's started_at says how late
	// it was; it never waits more than MaxStartWait.
	StartAt time.Time `json:"start_at,omitzero"`
	// Nest, when set, runs the plan in a workload nested in the box
	// (nest.go) instead of in the box itself.
	Nest      *NestSpec      `json:"nest,omitempty"`
	LinkLocal *LinkLocalSpec `json:"link_local,omitempty"`
	Neighbors []NeighborSpec `json:"neighbors,omitempty"`
	Listeners []ListenerSpec `json:"listeners,omitempty"`
	Witnesses []WitnessSpec  `json:"witnesses,omitempty"`
	Probes    []ProbeSpec    `json:"probes,omitempty"`
}

// LinkLocalSpec asks the agent to make sure the interface on Via has an
// IPv6 link-local address before anything runs, and to remove it afterwards
// if the agent added it (a container's interface may have none: docs/world.md, "These machines").
type LinkLocalSpec struct {
	Via netip.Prefix `json:"via"`
	// Address is the fe80::/64 address to add; by default one is derived
	// from the interface's MAC (EUI-64).
	Address netip.Addr `json:"address,omitzero"`
}

// ListenerSpec is a peer-side listener that lets other boxes be probed.
type ListenerSpec struct {
	ID   string `json:"id"`
	Kind Kind   `json:"kind"` // tcp_greeter or udp_echo
	// Name is put in every reply so the prober can tell which host answered.
	Name string `json:"name,omitempty"`
	Port int    `json:"port"`
	// Via binds the listener to our address in that subnet; empty listens on
	// every address.
	Via netip.Prefix `json:"via,omitzero"`
	// WindowMS is how long to listen; 0 means until the plan's end.
	WindowMS int `json:"window_ms,omitempty"`
}

// WitnessSpec is a passive capture on the interface holding an address in
// Via. A frame matches when it carries one of Nonces anywhere in its bytes,
// or comes from one of SrcIPs (IPv4/IPv6 source or ARP sender) or SrcMACs;
// Proto, Port, DstIP and ARPSender, when set, narrow every match to that
// protocol, destination port, destination address and ARP sender
// hardware address. Proto "ipv6-config" matches
// every frame that configures IPv6 (a router advertisement, a redirect, a
// DHCPv6 message to a client) with no other key.
//
// Control is the nonce of the positive control on this wire (a control
// probe's frames): frames carrying it are counted apart, never matched,
// and prove the capture was alive.
//
// An outbound witness (host mode) names Ifaces instead of Via, the host's
// outward interfaces, and DstPrefixes (IPv4 only, e.g. the private
// ranges): it records every IPv4 packet this host sends out of one of
// Ifaces (PACKET_OUTGOING, forwarded packets included) toward an address in
// DstPrefixes, narrowed by Proto, Port and DstIP when set. A recorded
// packet matches when it carries one of Nonces (anywhere in the frame) or
// comes from SrcIPs or SrcMACs; with none of those keys every recorded
// packet matches. The first MaxWitnessRecords recorded packets are listed
// in the evidence (a packet with a nonce, a match or a TCP SYN displaces a
// plain one once the list is full), each with its source port and, for
// TCP, flags and sequence number: a probe's SYN carries no nonce, but its
// source port and ISN (evidence of a tcp probe) survive a NAT. Control
// works as for any witness when the control probe runs on this host with
// via on the outward interface's subnet: its frames leave the interface
// and are seen going out.
type WitnessSpec struct {
	ID     string       `json:"id"`
	Via    netip.Prefix `json:"via,omitzero"`
	Ifaces []string     `json:"ifaces,omitempty"`
	// DstPrefixes narrows an outbound witness to packets toward them
	// (ifaces only).
	DstPrefixes []netip.Prefix `json:"dst_prefixes,omitempty"`
	WindowMS    int            `json:"window_ms"`
	Nonces      []string       `json:"nonces,omitempty"`
	SrcIPs      []netip.Addr   `json:"src_ips,omitempty"`
	SrcMACs     []string       `json:"src_macs,omitempty"`
	Proto       string         `json:"proto,omitempty"` // arp, icmp, icmpv6, tcp, udp
	Port        int            `json:"port,omitempty"`
	// SrcPort, when set (tcp or udp only), narrows every match to packets
	// from that source port: two senders behind one NAT address (a SYN
	// carries no nonce) are told apart by the ports they pinned.
	SrcPort int `json:"src_port,omitempty"`
	// DstIP, when set, narrows every match to frames for that address (the
	// ARP target for ARP), so witnesses for several hosts behind one
	// interface never take each other's frames.
	DstIP netip.Addr `json:"dst_ip,omitzero"`
	// ARPSender, when set (proto arp only), narrows every match to ARP
	// frames whose sender hardware address it is: a forged ARP from one
	// box tells from the genuine ARP of the box whose address it claims.
	ARPSender string `json:"arp_sender,omitempty"`
	Control   string `json:"control,omitempty"`
}

// ProbeSpec is one probe. Which fields apply depends on Kind; a field a
// kind does not use is an error, so a typo'd plan never runs a different
// probe than the one its author meant.
type ProbeSpec struct {
	ID     string     `json:"id"`
	Kind   Kind       `json:"kind"`
	Target netip.Addr `json:"target,omitzero"`
	Port   int        `json:"port,omitempty"`
	// Nonce proves the answer came from the target; generated when empty.
	// Give it when a witness at the target must look for it.
	Nonce string `json:"nonce,omitempty"`
	// Via picks the interface (and source address) by the subnet it holds.
	Via        netip.Prefix `json:"via,omitzero"`
	DeadlineMS int          `json:"deadline_ms"`
	DelayMS    int          `json:"delay_ms,omitempty"`
	// Name and QType are the DNS question (dns only). A PTR question may
	// give an IP address as Name; it is turned into its reverse name.
	// A tcp probe with a Name and a Resolver (and no Target) asks Resolver
	// for Name's A record first and connects to the first address: a
	// connection by name, as a program makes it.
	Name     string     `json:"name,omitempty"`
	QType    string     `json:"qtype,omitempty"`
	Resolver netip.Addr `json:"resolver,omitzero"`
	// DstMAC is where a control or arp_spoof probe sends its frames;
	// broadcast when empty. For an arp_spoof reply it is also the target
	// hardware address, and required.
	DstMAC string `json:"dst_mac,omitempty"`
	// ARPSenderIP is the address an arp_spoof probe lies about: the sender
	// protocol address of its frames (arp_spoof only).
	ARPSenderIP netip.Addr `json:"arp_sender_ip,omitzero"`
	// Op is which ARP frame an arp_spoof probe forges: gratuitous, reply
	// or request (ARPOpGratuitous, ARPOpReply, ARPOpRequest).
	Op string `json:"op,omitempty"`
	// SrcMAC forges an arp_spoof probe's Ethernet source and ARP sender
	// hardware address; our interface's MAC when empty (arp_spoof only).
	SrcMAC string `json:"src_mac,omitempty"`
	// SrcIP is the forged IPv4 source of a forged_udp probe (required,
	// forged_udp only).
	SrcIP netip.Addr `json:"src_ip,omitzero"`
	// SrcPort is the source port a tcp or udp probe binds (0: the
	// kernel's pick): a witness past a NAT, which keeps the port, can then
	// count this probe's packets and no one else's.
	SrcPort int `json:"src_port,omitempty"`
	// Speak picks what a tcp probe sends once connected (tcp only): the
	// nonce line when empty; "http" a request (GET /<nonce>) whose Host
	// is ServerName; "tls" a TLS ClientHello whose server name is
	// ServerName (none when empty) and whose random is the nonce. A proxy
	// that reads either must see the name; a greeter that echoes its first
	// line echoes the nonce (SpeakHTTP, SpeakTLS).
	Speak string `json:"speak,omitempty"`
	// ServerName is the name a tcp probe that speaks http or tls sends:
	// by default the name it resolved (Name).
	ServerName string `json:"server_name,omitempty"`
	// DHCP is the message a dhcp_forge probe sends: release, decline,
	// discover or request (DHCPRelease ...). Target is the address it
	// names: a release's ciaddr, a decline's or request's requested
	// address (a dhcp_flood's first requested address).
	DHCP string `json:"dhcp,omitempty"`
	// ClientHW is the client hardware address (chaddr) a dhcp_forge probe
	// names, 1 to 16 colon-separated hex bytes (our interface's MAC when
	// empty), HType its hardware type (Ethernet, 1, when 0).
	ClientHW string `json:"client_hw,omitempty"`
	HType    int    `json:"htype,omitempty"`
	// ClientID is the client identifier (option 61, hex bytes) a
	// dhcp_forge probe sends; for a dhcp_flood, the prefix of its made-up
	// identifiers.
	ClientID string `json:"client_id,omitempty"`
	// ServerID is the server a dhcp_forge release or decline names
	// (option 54), and where a release goes.
	ServerID netip.Addr `json:"server_id,omitzero"`
	// Count and HWPrefix: a dhcp_flood asks for Count leases, each for a
	// made-up client whose hardware address is HWPrefix (3 bytes) and a
	// 3-byte index (or, with ClientID instead, our own hardware address
	// and that identifier with the index).
	Count    int    `json:"count,omitempty"`
	HWPrefix string `json:"hw_prefix,omitempty"`
	// Payload picks what a udp probe sends (udp only). Empty chooses by
	// destination port: a minimal valid request of the port's protocol
	// for the well-known ports in udpproto.go (53, 5353, 67, 69, 123, 137,
	// 161, 1900), the nonce line for every other. "nonce" forces the nonce
	// line (for an echo listener on a well-known port); a request name
	// (dns, dhcp, tftp, ntp, netbios, snmp, ssdp) forces that request on
	// any port.
	Payload string `json:"payload,omitempty"`
	// Paths are what a write_open or read_files probe opens (absolute;
	// write_open only under /proc and /sys), the URL paths a unix_http
	// probe GETs, and the one directory a load_disk probe writes in.
	Paths []string `json:"paths,omitempty"`
	// Socket is the unix socket a unix_http probe talks to.
	Socket string `json:"socket,omitempty"`
	// Max is a load probe's own cap (kernel.go): processes, MiB of memory
	// or disk, or spinning threads; a limit that does not hold stops the
	// load there.
	Max int `json:"max,omitempty"`
}

// Deadline is the plan's deadline as a duration.
func (p *Plan) Deadline() time.Duration { return ms(p.DeadlineMS) }

// Start is when an agent begun at now starts the plan's clocks: now, or
// StartAt if that is later (never more than MaxStartWait later).
func (p *Plan) Start(now time.Time) time.Time {
	switch {
	case !p.StartAt.After(now):
		return now
	case p.StartAt.Sub(now) > MaxStartWait:
		return now.Add(MaxStartWait)
	}
	return p.StartAt
}

// Deadline is the probe's deadline as a duration.
func (s *ProbeSpec) Deadline() time.Duration { return ms(s.DeadlineMS) }

func ms(n int) time.Duration { return time.Duration(n) * time.Millisecond }

// DecodePlan reads a plan strictly: at most MaxPlanBytes, exactly one JSON
// document, no unknown fields, version 1, and every limit and per-kind rule
// checked. A malformed plan gets an error that says what is wrong and where.
func DecodePlan(r io.Reader) (*Plan, error) {
	data, err := readBounded(r, MaxPlanBytes, "plan")
	if err != nil {
		return nil, fmt.Errorf("decode plan: %w", err)
	}
	// The version is read on its own first so a newer plan gets "unsupported
	// version" rather than a confusing unknown-field error.
	if len(bytes.TrimSpace(data)) == 0 {
		return nil, errors.New("decode plan: empty input (expected one JSON object)")
	}
	var head struct {
		Version *int `json:"version"`
	}
	if err := json.NewDecoder(bytes.NewReader(data)).Decode(&head); err != nil {
		return nil, fmt.Errorf("decode plan: %w", err)
	}
	if head.Version == nil {
		return nil, errors.New("decode plan: missing \"version\" (this agent runs version 1)")
	}
	if *head.Version != PlanVersion {
		return nil, fmt.Errorf("decode plan: unsupported version %d (this agent runs version %d)", *head.Version, PlanVersion)
	}
	var p Plan
	if err := strictUnmarshal(data, &p); err != nil {
		return nil, fmt.Errorf("decode plan: %w", err)
	}
	if err := p.Validate(); err != nil {
		return nil, fmt.Errorf("decode plan: %w", err)
	}
	return &p, nil
}

// Validate checks every limit and per-kind rule.
func (p *Plan) Validate() error {
	if p.Version != PlanVersion {
		return fmt.Errorf("unsupported version %d (this agent runs version %d)", p.Version, PlanVersion)
	}
	d := p.Deadline()
	if d < MinPlanDeadline || d > MaxPlanDeadline {
		return fmt.Errorf("deadline_ms %d out of range %d..%d", p.DeadlineMS, MinPlanDeadline.Milliseconds(), MaxPlanDeadline.Milliseconds())
	}
	if len(p.Probes) > MaxProbes {
		return fmt.Errorf("%d probes, more than the limit of %d", len(p.Probes), MaxProbes)
	}
	if len(p.Witnesses) > MaxWitnesses {
		return fmt.Errorf("%d witnesses, more than the limit of %d", len(p.Witnesses), MaxWitnesses)
	}
	if len(p.Listeners) > MaxListeners {
		return fmt.Errorf("%d listeners, more than the limit of %d", len(p.Listeners), MaxListeners)
	}
	if p.Nest != nil {
		if err := p.Nest.validate(); err != nil {
			return fmt.Errorf("nest: %w", err)
		}
	}
	if len(p.Neighbors) > MaxNeighbors {
		return fmt.Errorf("%d neighbors, more than the limit of %d", len(p.Neighbors), MaxNeighbors)
	}
	for i := range p.Neighbors {
		if err := p.Neighbors[i].validate(); err != nil {
			return fmt.Errorf("neighbor %d: %w", i, err)
		}
	}
	budget := d - AgentMargin
	if p.LinkLocal != nil {
		if err := p.LinkLocal.validate(); err != nil {
			return fmt.Errorf("link_local: %w", err)
		}
	}
	ids := map[string]bool{}
	seen := func(id string) error {
		if err := checkID(id); err != nil {
			return err
		}
		if ids[id] {
			return fmt.Errorf("duplicate id %q", id)
		}
		ids[id] = true
		return nil
	}
	for i := range p.Listeners {
		l := &p.Listeners[i]
		if err := seen(l.ID); err != nil {
			return fmt.Errorf("listener %d: %w", i, err)
		}
		if err := l.validate(budget); err != nil {
			return fmt.Errorf("listener %d (%s): %w", i, l.ID, err)
		}
	}
	for i := range p.Witnesses {
		w := &p.Witnesses[i]
		if err := seen(w.ID); err != nil {
			return fmt.Errorf("witness %d: %w", i, err)
		}
		if err := w.validate(budget); err != nil {
			return fmt.Errorf("witness %d (%s): %w", i, w.ID, err)
		}
	}
	nonces := map[string]bool{}
	for i := range p.Probes {
		s := &p.Probes[i]
		if err := seen(s.ID); err != nil {
			return fmt.Errorf("probe %d: %w", i, err)
		}
		if err := s.Validate(); err != nil {
			return fmt.Errorf("probe %d (%s): %w", i, s.ID, err)
		}
		if total := ms(s.DelayMS) + s.Deadline(); total > budget {
			return fmt.Errorf("probe %d (%s): delay_ms+deadline_ms %d does not fit in deadline_ms %d minus %d ms for the report",
				i, s.ID, total.Milliseconds(), p.DeadlineMS, AgentMargin.Milliseconds())
		}
		if s.Nonce != "" {
			// One nonce per probe, or a witness could credit one probe's
			// frame to another.
			if nonces[s.Nonce] {
				return fmt.Errorf("probe %d (%s): nonce %q used by another probe", i, s.ID, s.Nonce)
			}
			nonces[s.Nonce] = true
		}
	}
	return nil
}

func (l *LinkLocalSpec) validate() error {
	if !l.Via.IsValid() {
		return errors.New("via: a subnet is required")
	}
	if l.Address.IsValid() && (!l.Address.Is6() || !l.Address.IsLinkLocalUnicast() || l.Address.Zone() != "") {
		return fmt.Errorf("address %s is not an fe80::/10 address without a zone", l.Address)
	}
	return nil
}

func (l *ListenerSpec) validate(budget time.Duration) error {
	switch l.Kind {
	case KindTCPGreeter, KindUDPEcho:
	default:
		return fmt.Errorf("kind %q is not a listener kind (tcp_greeter, udp_echo)", observation.Truncate(string(l.Kind), 32))
	}
	if l.Port < 1 || l.Port > 65535 {
		return fmt.Errorf("port %d out of range 1..65535", l.Port)
	}
	if err := checkText("name", l.Name, MaxIDLen); err != nil {
		return err
	}
	if l.WindowMS < 0 || ms(l.WindowMS) > budget {
		return fmt.Errorf("window_ms %d out of range 0..%d", l.WindowMS, budget.Milliseconds())
	}
	return nil
}

func (w *WitnessSpec) validate(budget time.Duration) error {
	outbound := len(w.Ifaces) > 0
	switch {
	case outbound && w.Via.IsValid():
		return errors.New("via and ifaces are mutually exclusive: a witness captures on the interface found by subnet, or outbound on named interfaces")
	case !outbound && !w.Via.IsValid():
		return errors.New("via: a subnet is required (the witness's interface is found by subnet), or ifaces for an outbound witness")
	case !outbound && len(w.DstPrefixes) > 0:
		return errors.New("dst_prefixes is for an outbound witness (ifaces)")
	}
	if ms(w.WindowMS) < MinProbeDeadline || ms(w.WindowMS) > budget {
		return fmt.Errorf("window_ms %d out of range %d..%d", w.WindowMS, MinProbeDeadline.Milliseconds(), budget.Milliseconds())
	}
	if outbound {
		if err := w.validateOutbound(); err != nil {
			return err
		}
	} else if len(w.Nonces)+len(w.SrcIPs)+len(w.SrcMACs) == 0 && w.Proto != ProtoIPv6Config {
		return errors.New("nothing to match: give nonces, src_ips or src_macs")
	}
	if w.Control != "" {
		if err := checkNonce(w.Control); err != nil {
			return fmt.Errorf("control: %w", err)
		}
	}
	if len(w.Nonces) > MaxMatchEntries || len(w.SrcIPs) > MaxMatchEntries || len(w.SrcMACs) > MaxMatchEntries {
		return fmt.Errorf("more than %d entries in nonces, src_ips or src_macs", MaxMatchEntries)
	}
	for _, n := range w.Nonces {
		if err := checkNonce(n); err != nil {
			return err
		}
	}
	for _, a := range w.SrcIPs {
		if !a.IsValid() {
			return errors.New("src_ips: empty address")
		}
	}
	for _, m := range w.SrcMACs {
		if err := checkMAC(m); err != nil {
			return fmt.Errorf("src_macs: %w", err)
		}
	}
	switch w.Proto {
	case "", "arp", "icmp", "icmpv6", "tcp", "udp", ProtoIPv6Config:
	default:
		return fmt.Errorf("proto %q is not one of arp, icmp, icmpv6, tcp, udp, %s", observation.Truncate(w.Proto, 32), ProtoIPv6Config)
	}
	if w.Port < 0 || w.Port > 65535 {
		return fmt.Errorf("port %d out of range 0..65535", w.Port)
	}
	if w.Port != 0 && w.Proto != "tcp" && w.Proto != "udp" {
		return errors.New("port needs proto tcp or udp")
	}
	if w.SrcPort < 0 || w.SrcPort > 65535 {
		return fmt.Errorf("src_port %d out of range 0..65535", w.SrcPort)
	}
	if w.SrcPort != 0 && w.Proto != "tcp" && w.Proto != "udp" {
		return errors.New("src_port needs proto tcp or udp")
	}
	if w.ARPSender != "" {
		if w.Proto != "arp" {
			return errors.New("arp_sender needs proto arp")
		}
		if err := checkMAC(w.ARPSender); err != nil {
			return fmt.Errorf("arp_sender: %w", err)
		}
	}
	return nil
}

// validateOutbound checks what only an outbound witness has.
func (w *WitnessSpec) validateOutbound() error {
	if len(w.Ifaces) > MaxWitnessIfaces {
		return fmt.Errorf("%d ifaces, more than the limit of %d", len(w.Ifaces), MaxWitnessIfaces)
	}
	seen := map[string]bool{}
	for _, n := range w.Ifaces {
		if err := checkIfaceName(n); err != nil {
			return fmt.Errorf("ifaces: %w", err)
		}
		if seen[n] {
			return fmt.Errorf("ifaces: %q given twice", n)
		}
		seen[n] = true
	}
	if len(w.DstPrefixes) == 0 {
		return errors.New("ifaces needs dst_prefixes (the destinations whose packets are recorded)")
	}
	if len(w.DstPrefixes) > MaxDstPrefixes {
		return fmt.Errorf("%d dst_prefixes, more than the limit of %d", len(w.DstPrefixes), MaxDstPrefixes)
	}
	for _, p := range w.DstPrefixes {
		if !p.IsValid() || !p.Addr().Is4() {
			return fmt.Errorf("dst_prefixes: %s is not an IPv4 prefix", p)
		}
		if p != p.Masked() {
			return fmt.Errorf("dst_prefixes: %s has host bits set (%s?)", p, p.Masked())
		}
	}
	switch w.Proto {
	case "", "icmp", "tcp", "udp":
	default:
		return fmt.Errorf("proto %q: an outbound witness records IPv4 only (icmp, tcp, udp)", observation.Truncate(w.Proto, 32))
	}
	if w.DstIP.IsValid() && !w.DstIP.Is4() {
		return fmt.Errorf("dst_ip %s: an outbound witness records IPv4 only", w.DstIP)
	}
	return nil
}

// checkIfaceName checks an interface name as Linux would take it.
func checkIfaceName(n string) error {
	if n == "" || len(n) >= unix.IFNAMSIZ || n == "." || n == ".." {
		return fmt.Errorf("%q is not an interface name (1..%d bytes)", observation.Truncate(n, 32), unix.IFNAMSIZ-1)
	}
	if err := checkText("interface name", n, unix.IFNAMSIZ-1); err != nil {
		return err
	}
	if strings.ContainsAny(n, "/:") {
		return fmt.Errorf("%q is not an interface name (no / or :)", n)
	}
	return nil
}

// Validate checks one probe on its own (RunProbe calls it too).
func (s *ProbeSpec) Validate() error {
	if err := s.validateCommon(); err != nil {
		return err
	}
	if kernelKinds[s.Kind] {
		return s.validateKernel()
	}
	if len(s.Paths) > 0 || s.Socket != "" || s.Max != 0 {
		return fmt.Errorf("paths, socket and max are for kernel and load probes, not %s", s.Kind)
	}
	var err error
	switch s.Kind {
	case KindARP:
		err = s.validateARP()
	case KindICMP:
		err = s.validateICMP()
	case KindTCP, KindUDP:
		err = s.validateTCPOrUDP()
	case KindBroadcast:
		err = s.validateBroadcast()
	case KindDNS:
		err = s.validateDNS()
	case KindControl:
		err = s.validateControl()
	case KindARPSpoof:
		err = s.validateARPSpoof()
	case KindForgedUDP:
		err = s.validateForgedUDP()
	case KindDHCPForge, KindDHCPFlood:
		err = s.validateDHCP()
	case KindIPv6State, KindNDPRS, KindDHCPLease:
		err = s.validateState()
	default:
		err = fmt.Errorf("kind %q is not a probe kind", observation.Truncate(string(s.Kind), 32))
	}
	if err != nil {
		return err
	}
	if !nonceKinds[s.Kind] && s.Nonce != "" {
		return fmt.Errorf("%s carries no nonce", s.Kind)
	}
	return s.validateOtherKindsFields()
}

// nonceKinds are the probe kinds whose packets carry the nonce; any other
// kind given one is an error, lest a witness wait for a nonce never sent.
var nonceKinds = map[Kind]bool{
	KindICMP: true, KindTCP: true, KindUDP: true, KindBroadcast: true, KindControl: true, KindForgedUDP: true,
}

// validateCommon checks the fields every kind reads the same way, before
// any kind's own rules.
func (s *ProbeSpec) validateCommon() error {
	if d := s.Deadline(); d < MinProbeDeadline || d > MaxPlanDeadline {
		return fmt.Errorf("deadline_ms %d out of range %d..%d", s.DeadlineMS, MinProbeDeadline.Milliseconds(), MaxPlanDeadline.Milliseconds())
	}
	if s.DelayMS < 0 || ms(s.DelayMS) > MaxPlanDeadline {
		return fmt.Errorf("delay_ms %d out of range 0..%d", s.DelayMS, MaxPlanDeadline.Milliseconds())
	}
	if s.Port < 0 || s.Port > 65535 {
		return fmt.Errorf("port %d out of range", s.Port)
	}
	if s.Nonce != "" {
		if err := checkNonce(s.Nonce); err != nil {
			return err
		}
	}
	if err := checkText("name", s.Name, MaxStringLen); err != nil {
		return err
	}
	if s.Target.IsValid() && s.Target.Zone() != "" {
		// The zone comes from Via, never from the plan, so an interface is
		// always found by subnet.
		return errors.New("target: no zone; give via instead")
	}
	return nil
}

// validateARP checks an arp probe: who-has goes out of one IPv4 subnet's
// interface and names no port or nonce.
func (s *ProbeSpec) validateARP() error {
	if !s.Target.Is4() {
		return errors.New("arp needs an IPv4 target")
	}
	if !s.Via.IsValid() || !s.Via.Addr().Is4() {
		return errors.New("arp needs via, an IPv4 subnet")
	}
	if s.Port != 0 || s.Nonce != "" {
		return errors.New("arp takes no port and carries no nonce")
	}
	return nil
}

// validateICMP checks an icmp probe: a link-local or multicast target is
// only reachable through the interface via names.
func (s *ProbeSpec) validateICMP() error {
	if !s.Target.IsValid() {
		return errors.New("icmp needs a target")
	}
	if s.Port != 0 {
		return errors.New("icmp takes no port")
	}
	if needsZone(s.Target) && !s.Via.IsValid() {
		return errors.New("a link-local or multicast target needs via (the interface's subnet)")
	}
	if s.Target.Is4() && s.Target.IsMulticast() {
		return errors.New("IPv4 multicast targets are not supported; use broadcast")
	}
	return nil
}

// validateTCPOrUDP checks a tcp or udp probe: a unicast target and a port,
// or, for a tcp probe with a resolver, a name to look up first.
func (s *ProbeSpec) validateTCPOrUDP() error {
	if s.Kind == KindTCP {
		if err := s.validateSpeak(); err != nil {
			return err
		}
	}
	if s.Kind == KindTCP && s.Resolver.IsValid() {
		if s.Name == "" || s.Target.IsValid() || s.QType != "" {
			return errors.New("a tcp probe with a resolver is one by name: it needs a name, and no target or qtype")
		}
		if s.Port == 0 {
			return fmt.Errorf("%s needs a port", s.Kind)
		}
		return nil
	}
	if !s.Target.IsValid() {
		return fmt.Errorf("%s needs a target", s.Kind)
	}
	if s.Target.IsMulticast() || s.Target.IsUnspecified() {
		return fmt.Errorf("%s needs a unicast target", s.Kind)
	}
	if s.Port == 0 {
		return fmt.Errorf("%s needs a port", s.Kind)
	}
	if s.Target.IsLinkLocalUnicast() && !s.Via.IsValid() {
		return errors.New("a link-local target needs via (the interface's subnet)")
	}
	if s.Kind == KindUDP && s.Payload != "" {
		if err := checkPayload(s.Payload); err != nil {
			return err
		}
		if s.Payload == RequestDHCP && !s.Target.Unmap().Is4() {
			return errors.New("payload dhcp needs an IPv4 target")
		}
	}
	return nil
}

// validateBroadcast checks a broadcast probe: it leaves one IPv4 subnet's
// interface, and a DHCP request is for a udp probe, which hears its server.
func (s *ProbeSpec) validateBroadcast() error {
	if !s.Via.IsValid() || !s.Via.Addr().Is4() {
		return errors.New("broadcast needs via, an IPv4 subnet")
	}
	if s.Port == 0 {
		return errors.New("broadcast needs a port")
	}
	if s.Target.IsValid() && !s.Target.Is4() {
		return errors.New("broadcast target must be an IPv4 broadcast or multicast address")
	}
	if s.Payload != "" {
		if err := checkPayload(s.Payload); err != nil {
			return err
		}
		if s.Payload == RequestDHCP {
			return errors.New("payload dhcp is for a udp probe to a server")
		}
	}
	return nil
}

// validateDNS checks a dns probe: its question must be one the agent can
// send, and its query id, not a nonce, proves the answer.
func (s *ProbeSpec) validateDNS() error {
	if !s.Target.IsValid() {
		return errors.New("dns needs a target (the resolver)")
	}
	if s.Name == "" {
		return errors.New("dns needs a name")
	}
	if s.Nonce != "" {
		return errors.New("dns carries no nonce (the query id and question are its proof)")
	}
	if _, err := dnsQuestion(s.Name, s.QType); err != nil {
		return err
	}
	return nil
}

// validateControl checks a control probe: its frames go to a MAC on the
// wire, and its nonce is what the witnesses there look for.
func (s *ProbeSpec) validateControl() error {
	if !s.Via.IsValid() {
		return errors.New("control needs via (the wire's subnet)")
	}
	if s.Target.IsValid() || s.Port != 0 {
		return errors.New("control takes no target or port (dst_mac names where its frames go)")
	}
	if s.Nonce == "" {
		return errors.New("control needs a nonce (the witnesses look for it)")
	}
	if s.DstMAC != "" {
		if err := checkMAC(s.DstMAC); err != nil {
			return fmt.Errorf("dst_mac: %w", err)
		}
	}
	return nil
}

// validateForgedUDP checks a forged_udp probe: both the target and the
// forged source must be IPv4 addresses a host can hold.
func (s *ProbeSpec) validateForgedUDP() error {
	if !s.Target.IsValid() || !isUnicast4(s.Target) {
		return errors.New("forged_udp needs an IPv4 unicast target")
	}
	if s.Port == 0 {
		return errors.New("forged_udp needs a port")
	}
	if !s.SrcIP.IsValid() {
		return errors.New("forged_udp needs src_ip (the forged source)")
	}
	if !isUnicast4(s.SrcIP) {
		return fmt.Errorf("src_ip %s is not an IPv4 unicast address", s.SrcIP)
	}
	if s.Via.IsValid() && !s.Via.Addr().Is4() {
		return errors.New("forged_udp via must be an IPv4 subnet")
	}
	return nil
}

// validateState checks an ipv6_state, ndp_rs or dhcp_lease probe: they
// read or ask about the box subnet itself, so they aim at no target.
func (s *ProbeSpec) validateState() error {
	if s.Target.IsValid() || s.Port != 0 || s.Nonce != "" {
		return fmt.Errorf("%s takes no target, port or nonce", s.Kind)
	}
	if s.Kind != KindIPv6State && !s.Via.IsValid() {
		return fmt.Errorf("%s needs via (the box subnet)", s.Kind)
	}
	return nil
}

// validateOtherKindsFields refuses a field that only other kinds use, so a
// field meant for one kind never rides silently on another.
func (s *ProbeSpec) validateOtherKindsFields() error {
	if s.Kind != KindControl && s.Kind != KindARPSpoof && s.Kind != KindDHCPForge && s.DstMAC != "" {
		return fmt.Errorf("dst_mac is for control, arp_spoof and dhcp_forge probes, not %s", s.Kind)
	}
	if s.Kind != KindDHCPForge && s.Kind != KindDHCPFlood &&
		(s.DHCP != "" || s.ClientHW != "" || s.HType != 0 || s.ClientID != "" || s.ServerID.IsValid() || s.Count != 0 || s.HWPrefix != "") {
		return fmt.Errorf("dhcp, client_hw, htype, client_id, server_id, count and hw_prefix are for dhcp_forge and dhcp_flood probes, not %s", s.Kind)
	}
	if s.Kind != KindARPSpoof && (s.ARPSenderIP.IsValid() || s.Op != "" || s.SrcMAC != "") {
		return fmt.Errorf("arp_sender_ip, op and src_mac are for arp_spoof probes, not %s", s.Kind)
	}
	if s.Kind != KindForgedUDP && s.SrcIP.IsValid() {
		return fmt.Errorf("src_ip is for forged_udp probes, not %s", s.Kind)
	}
	if s.Kind != KindTCP && (s.Speak != "" || s.ServerName != "") {
		return fmt.Errorf("speak and server_name are for tcp probes, not %s", s.Kind)
	}
	if s.Kind != KindUDP && s.Kind != KindBroadcast && s.Payload != "" {
		return fmt.Errorf("payload is for udp and broadcast probes, not %s", s.Kind)
	}
	if s.Kind != KindDNS && !(s.Kind == KindTCP && s.Resolver.IsValid()) && (s.Name != "" || s.QType != "") {
		return fmt.Errorf("name and qtype are for dns probes (and a name for a tcp probe with a resolver), not %s", s.Kind)
	}
	if s.Resolver.IsValid() && s.Kind != KindTCP {
		return fmt.Errorf("resolver is for a tcp probe by name, not %s", s.Kind)
	}
	return nil
}

// What a tcp probe may speak.
const (
	SpeakHTTP = "http"
	SpeakTLS  = "tls"
)

// validateSpeak checks a tcp probe's speak and server_name.
func (s *ProbeSpec) validateSpeak() error {
	switch s.Speak {
	case "", SpeakHTTP, SpeakTLS:
	default:
		return fmt.Errorf("speak %q is not one of %s, %s", observation.Truncate(s.Speak, 16), SpeakHTTP, SpeakTLS)
	}
	if s.ServerName != "" && s.Speak == "" {
		return errors.New("server_name needs speak (http or tls)")
	}
	if err := checkText("server_name", s.ServerName, MaxStringLen); err != nil {
		return err
	}
	if strings.ContainsAny(s.ServerName, " \t\r\n/:") {
		return fmt.Errorf("server_name %q is not a name", observation.Truncate(s.ServerName, 32))
	}
	return nil
}

// validateARPSpoof checks what only an arp_spoof probe has.
func (s *ProbeSpec) validateARPSpoof() error {
	if !s.Via.IsValid() || !s.Via.Addr().Is4() {
		return errors.New("arp_spoof needs via, an IPv4 subnet (its interface sends the frames)")
	}
	if !s.ARPSenderIP.IsValid() {
		return errors.New("arp_spoof needs arp_sender_ip (the address it lies about)")
	}
	if !isUnicast4(s.ARPSenderIP) {
		return fmt.Errorf("arp_sender_ip %s is not an IPv4 unicast address", s.ARPSenderIP)
	}
	if s.Port != 0 || s.Nonce != "" {
		return errors.New("arp_spoof takes no port and carries no nonce")
	}
	switch s.Op {
	case ARPOpGratuitous:
		if s.Target.IsValid() && s.Target != s.ARPSenderIP {
			return errors.New("a gratuitous arp_spoof asks for its sender address itself: give no target, or arp_sender_ip")
		}
	case ARPOpReply, ARPOpRequest:
		if !s.Target.IsValid() || !s.Target.Is4() {
			return fmt.Errorf("an arp_spoof %s needs an IPv4 target (the ARP target protocol address)", s.Op)
		}
		if s.Op == ARPOpReply && s.DstMAC == "" {
			return errors.New("an arp_spoof reply needs dst_mac (its Ethernet destination and target hardware address)")
		}
	case "":
		return errors.New("arp_spoof needs op: gratuitous, reply or request")
	default:
		return fmt.Errorf("op %q is not one of gratuitous, reply, request", observation.Truncate(s.Op, 32))
	}
	if s.DstMAC != "" {
		if _, err := ethernetMAC(s.DstMAC); err != nil {
			return fmt.Errorf("dst_mac: %w", err)
		}
	}
	if s.SrcMAC != "" {
		hw, err := ethernetMAC(s.SrcMAC)
		if err != nil {
			return fmt.Errorf("src_mac: %w", err)
		}
		// A bridge drops a frame from a group or all-zero address.
		if hw[0]&1 != 0 || bytes.Equal(hw, make(net.HardwareAddr, 6)) {
			return fmt.Errorf("src_mac %s is not a unicast Ethernet address", hw)
		}
	}
	return nil
}

// ethernetMAC parses a 6-byte hardware address from a plan.
func ethernetMAC(m string) (net.HardwareAddr, error) {
	if err := checkMAC(m); err != nil {
		return nil, err
	}
	hw, _ := net.ParseMAC(m)
	if len(hw) != 6 {
		return nil, fmt.Errorf("%s is not an Ethernet (6-byte) address", hw)
	}
	return hw, nil
}

// isUnicast4 reports whether a is an IPv4 address a host can hold.
func isUnicast4(a netip.Addr) bool {
	return a.Is4() && !a.IsUnspecified() && !a.IsMulticast() && a != netip.AddrFrom4([4]byte{255, 255, 255, 255})
}

// dnsQuestion turns a plan's name and qtype into a DNS question.
func dnsQuestion(name, qtype string) (dns.Question, error) {
	if qtype == "" {
		qtype = "A"
	}
	t, ok := map[string]uint16{
		"A": dns.TypeA, "AAAA": dns.TypeAAAA, "PTR": dns.TypePTR, "TXT": dns.TypeTXT,
		"CNAME": dns.TypeCNAME, "SRV": dns.TypeSRV, "MX": dns.TypeMX, "NS": dns.TypeNS,
		"SOA": dns.TypeSOA, "ANY": dns.TypeANY,
	}[qtype]
	if !ok {
		return dns.Question{}, fmt.Errorf("qtype %q is not one of A, AAAA, PTR, TXT, CNAME, SRV, MX, NS, SOA, ANY", observation.Truncate(qtype, 16))
	}
	if t == dns.TypePTR {
		if ip, err := netip.ParseAddr(name); err == nil {
			rev, err := dns.ReverseAddr(ip.String())
			if err != nil {
				return dns.Question{}, fmt.Errorf("reverse name of %s: %w", ip, err)
			}
			name = rev
		}
	}
	fq := dns.Fqdn(name)
	if _, ok := dns.IsDomainName(fq); !ok || len(fq) > 254 {
		return dns.Question{}, fmt.Errorf("name %q is not a domain name", observation.Truncate(name, 64))
	}
	return dns.Question{Name: fq, Qtype: t, Qclass: dns.ClassINET}, nil
}

func needsZone(a netip.Addr) bool {
	return a.Is6() && (a.IsLinkLocalUnicast() || a.IsLinkLocalMulticast() || a.IsInterfaceLocalMulticast())
}

func checkID(id string) error {
	if id == "" {
		return errors.New("id is empty")
	}
	if len(id) > MaxIDLen {
		return fmt.Errorf("id %q longer than %d", observation.Truncate(id, 32), MaxIDLen)
	}
	for _, c := range id {
		if !isIDChar(c) {
			return fmt.Errorf("id %q: only letters, digits and . _ : - are allowed", observation.Truncate(id, 32))
		}
	}
	return nil
}

// checkMAC checks a hardware address from a plan, bounded before parsing.
func checkMAC(m string) error {
	if len(m) > 32 {
		return fmt.Errorf("%q is too long", observation.Truncate(m, 32))
	}
	_, err := net.ParseMAC(m)
	return err
}

func checkNonce(n string) error {
	if len(n) < MinNonceLen || len(n) > MaxNonceLen {
		return fmt.Errorf("nonce %q: length must be %d..%d", observation.Truncate(n, 32), MinNonceLen, MaxNonceLen)
	}
	for _, c := range n {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return fmt.Errorf("nonce %q: only letters, digits, - and _ are allowed", observation.Truncate(n, 32))
		}
	}
	return nil
}

func checkText(field, v string, max int) error {
	if len(v) > max {
		return fmt.Errorf("%s longer than %d", field, max)
	}
	for _, c := range v {
		if c < 0x21 || c > 0x7e {
			return fmt.Errorf("%s: only printable ASCII without spaces is allowed", field)
		}
	}
	return nil
}

func isIDChar(c rune) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.ContainsRune("._:-", c)
}
