package drill

import "github.com/box-isolation/box/drill/verdicts"

// The words that travel through a run: typed (their types are the
// report's, drill/verdicts'), so a claim's ID is never taken for a
// place's name or a channel's, and each listed once.

// ClaimID names a claim (docs/claims.md): "C-" and a word. The IDs are
// constants in the claims' own files, and nowhere else.
type ClaimID = verdicts.ClaimID

// Channel is what an action probes over (a protocol, or a kind of
// evidence that is not a packet: the stack, the census, a request).
type Channel = verdicts.Channel

// Channels of packets an agent sends.
const (
	ChannelTCP           Channel = "tcp"
	ChannelUDP           Channel = "udp"
	ChannelICMP          Channel = "icmp"
	ChannelARP           Channel = "arp"
	ChannelBroadcast     Channel = "broadcast"
	ChannelV6LinkLocal   Channel = "icmpv6-link-local"
	ChannelV6AllNodes    Channel = "icmpv6-all-nodes"
	ChannelMDNS          Channel = "mdns"  // multicast DNS, as a distribution's own resolver sends it
	ChannelLLMNR         Channel = "llmnr" // link-local multicast name resolution
	ChannelSSDP          Channel = "ssdp"  // UPnP discovery
	ChannelDNS           Channel = "dns"
	ChannelDHCP          Channel = "dhcp"
	ChannelRouterAdvert  Channel = "router-advertisement"
	ChannelGlobalAddress Channel = "global-address"
	ChannelDefaultRoute  Channel = "default-route"
	ChannelV6State       Channel = "global-address+default-route"
	ChannelAddress       Channel = "address"
	ChannelMAC           Channel = "mac"
	ChannelMachineID     Channel = "machine-id"
	ChannelIdentity      Channel = "address+mac+machine-id"
	ChannelIPv4Source    Channel = "ipv4-source"
	ChannelReturnTraffic Channel = "return-traffic"
	// C-ALLOW's names at the connection: a TLS server name, an HTTP Host,
	// QUIC (UDP 443) and DNS over HTTPS.
	ChannelTLS  Channel = "tls-sni"
	ChannelHTTP Channel = "http-host"
	ChannelQUIC Channel = "quic"
	ChannelDoH  Channel = "doh"
	// The DHCP lies of C-SPOOF, judged at the server (its lease file), and
	// a box minted after them.
	ChannelDHCPRelease  Channel = "dhcp-release"   // a release naming a sibling
	ChannelDHCPDecline  Channel = "dhcp-decline"   // a decline naming a sibling
	ChannelDHCPStarve   Channel = "dhcp-starve"    // made-up hardware addresses
	ChannelDHCPClientID Channel = "dhcp-client-id" // made-up client identifiers
	ChannelDHCPHType    Channel = "dhcp-htype"     // another hardware type or length
	ChannelNewLease     Channel = "new-lease"      // a box minted after the lies
)

// Channels of evidence that is no packet: Verify's findings, the census of
// every instance and port, and requests to Incus. A mutation is proven by
// packets alone (docs/claims.md, "Mutations"), so these never count as its detection.
const (
	ChannelStack       Channel = "stack"
	ChannelCensus      Channel = "census"
	ChannelIsolOff     Channel = "isolation-off" // the granted user turning port isolation off
	ChannelRestriction Channel = "restriction"   // an attempt to leave boxnet
)

// evidenceOf is the kind of evidence a channel's results are: packets an
// agent sent (EvidenceProbes), judged where they would land, or another;
// "" for the stack channel (Verify's findings, which prove no mutation).
func evidenceOf(c Channel) Evidence {
	switch c {
	case ChannelStack:
		return ""
	case ChannelCensus:
		return EvidenceCensus
	case ChannelIsolOff, ChannelRestriction, ChannelNewLease:
		return EvidenceRequests
	}
	return EvidenceProbes
}

// Place is where a plan runs or a result comes from: a probe box, a
// namespace of the world, the host, or a source that is no agent
// ("verify", the granted user).
type Place = verdicts.Place

// Places where plans run: the probe boxes and the world's namespaces.
const (
	PlaceA    Place = "box-a"   // the prober
	PlaceB    Place = "box-b"   // its peer
	PlaceC    Place = "clone-a" // a clone of box-a
	PlaceT    Place = "box-t"   // a granted user's box (C-TIER)
	PlaceW    Place = "box-w"   // the allowlisted box (C-ALLOW)
	PlaceHost Place = "host"    // the host namespace (listeners on host addresses)
	PlaceLAN  Place = "lan"     // the LAN namespace (witnesses at LAN hosts)
	PlaceInet Place = "inet"    // the internet's namespace (witnesses at the second canary and the resolver)
	// PlaceFilter holds the counting chain's counts, read by the drill
	// itself after the probes (observation id: the count key).
	PlaceFilter Place = "host-filter"
	// Sources of results that are no agent's.
	PlaceVerify       = verdicts.PlaceVerify // the stack's Verify and census
	PlaceDrill  Place = "drill"              // the drill itself (a door it could not open)
	placeUser   Place = "granted-user"       // C-TIER's requests, through incus-user
)

// ProbeRef names one plan probe by where it runs and its id.
type ProbeRef struct {
	At Place
	ID string
}

// Valid reports whether the reference names a probe.
func (p ProbeRef) Valid() bool { return p.ID != "" }

// Evidence is where a claim's verdict comes from. Every claim has Verify's
// findings besides (the stack channel).
type Evidence = verdicts.Evidence

const (
	EvidenceProbes   = verdicts.EvidenceProbes   // packets the agents sent, judged at their targets
	EvidenceCensus   = verdicts.EvidenceCensus   // the stack's census of every instance and port on the bridge
	EvidenceRequests = verdicts.EvidenceRequests // requests to Incus, and whether it refused them
)

// Availability says whether a claim runs in one mode.
type Availability int

const (
	// Runs: selected unless a pattern leaves it out.
	Runs Availability = iota
	// OptIn: runs only when a --claim pattern names it (matches it and no
	// other), or in a recorded run (--record), for a claim that changes the
	// host (C-TIER makes a user).
	OptIn
	// Never: the mode cannot run it; naming it is an error.
	Never
)

// Modes says where a claim runs: the hermetic world, a real host.
type Modes struct {
	World, Host Availability
	// Why says, for people, why a mode is OptIn or Never.
	Why string
}

// everywhere is the modes of a claim that runs in the world and on a host.
var everywhere = Modes{World: Runs, Host: Runs}

// Strings turns typed words (claim IDs, channels, places, layers) into
// plain strings, for output.
func Strings[T ~string](ws []T) []string { return verdicts.Strings(ws) }
