// Package topo is what a drill run aims at, as one data value: the
// Topology. Two sources produce it: the hermetic world (its fixed plan
// and its state file, internal/worldstate) and a real host's discovery
// (Discover: its routes, neighbours, resolvers, hosts file and names).
// The drill package receives a Topology and never looks at where it came
// from; what only exists once the stack is up (the host's addresses on
// the bridge, its listening sockets) the drill reads itself, in the
// host's namespace, at probe time.
//
// Every target carries its provenance, so a report says why an address
// was probed: a route, a neighbour, a resolver, a sample.
package topo

import "net/netip"

// Sources of a Topology.
const (
	SourceWorld = "world"
	SourceHost  = "host"
)

// Provenance says why something is a target.
type Provenance string

// Provenances of targets and names.
const (
	FromWorld      Provenance = "world"       // a fixed target of the hermetic world
	FromInterface  Provenance = "interface"   // an address on one of the host's interfaces
	FromListener   Provenance = "listener"    // a socket listening in the host's namespace
	FromForward    Provenance = "forward"     // a port the host forwards (DNAT)
	FromRoute      Provenance = "route"       // a route's destination or gateway
	FromNeighbour  Provenance = "neighbour"   // the host's neighbour table
	FromResolver   Provenance = "resolver"    // a resolver the host uses
	FromDHCPServer Provenance = "dhcp-server" // the server the host leased from
	FromSample     Provenance = "sample"      // a guess inside a private range
	FromHostsFile  Provenance = "hosts-file"  // the hosts file the bridge's dnsmasq would read
	FromHostname   Provenance = "hostname"    // the host's own name and FQDN
	FromSearch     Provenance = "search"      // a name under the host's search domains
	FromPTR        Provenance = "ptr"         // a reverse name of a private address
	FromLANZone    Provenance = "lan-zone"    // a name a LAN resolver answers
	FromSibling    Provenance = "sibling"     // a probe box's own name
)

// Topology is everything about a run's surroundings that the scenario
// needs, from either source.
type Topology struct {
	// Source is SourceWorld or SourceHost.
	Source string `json:"source"`
	// LANNS, in the world, is the LAN namespace, where the witnesses at
	// LAN hosts run ("" where there is none). The host's own namespace is
	// the stack host's (stack.Host.NetNS).
	LANNS string `json:"lan_ns,omitempty"`

	// The internet canary: a world host that greets with CanaryGreeting,
	// or a public server (CanaryGreeting empty) whose handshake is the proof.
	Canary         netip.Addr `json:"canary"`
	CanaryTCP      int        `json:"canary_tcp"`
	CanaryUDP      int        `json:"canary_udp,omitempty"`
	CanaryGreeting string     `json:"-"`
	// PublicName must resolve through the box's resolver; PublicNameAddr is
	// what it must resolve to, when known.
	PublicName     string     `json:"public_name"`
	PublicNameAddr netip.Addr `json:"public_name_addr,omitzero"`
	// Upstream is the public resolver the stack pins, asked directly from
	// the host: a name the box's resolver answers and Upstream does not is
	// leaked (C-NAMES).
	Upstream netip.Addr `json:"upstream,omitzero"`

	// LANHosts are the addresses the host can reach that are not the
	// internet: private ones, and those it routes elsewhere than by its
	// default routes.
	LANHosts []Target `json:"lan_hosts"`
	// LANVia is the subnet the LAN namespace's witnesses capture on (the
	// world only); LANNAT the host address boxes' traffic to the LAN would
	// be NATed to; LANSources the addresses the LAN namespace probes boxes
	// from (in host mode, the drill's throwaway stand-in for the LAN).
	LANVia     netip.Prefix `json:"lan_via,omitzero"`
	LANNAT     netip.Addr   `json:"lan_nat,omitzero"`
	LANSources []netip.Addr `json:"lan_sources,omitempty"`
	// Outward are the host's interfaces its routes into private ranges,
	// its routes elsewhere than the default and its default routes leave by: where, in host mode, an outbound witness
	// watches for a box's packets to the LAN.
	Outward []string `json:"outward,omitempty"`

	// Names are asked from a box through its resolver (C-NAMES): none may
	// resolve unless Upstream answers it the same. The drill adds, at probe
	// time, every name in HostsFile (the hosts file the bridge's dnsmasq
	// would read), Hostname and its FQDN, names under SearchDomains, the
	// PTRs of the host's private addresses and of LANHosts, and the probe
	// boxes' own names.
	Names         []Name   `json:"names"`
	HostsFile     string   `json:"hosts_file,omitempty"`
	Hostname      string   `json:"hostname,omitempty"`
	FQDN          string   `json:"fqdn,omitempty"`
	SearchDomains []string `json:"search_domains,omitempty"`

	// Allow is what C-ALLOW needs (the world only; zero on a real host):
	// a second canary with a name of its own, a name that resolves to a
	// LAN host (DNS rebinding), and where a witness watches the internet.
	Allow AllowTargets `json:"allow,omitzero"`

	// Door is box-a's door on the host's loopback (box expose's, to its
	// listener) once C-EXPOSE opened it: the drill's own doing, as the LAN
	// stand-in's LANSources are in host mode; zero when there is none.
	Door netip.AddrPort `json:"door,omitzero"`

	// Notes are what the discovery could not read, for the report.
	Notes []string `json:"notes,omitempty"`
}

// AllowTargets are C-ALLOW's targets.
type AllowTargets struct {
	// OtherName resolves (through the stack's resolver) to Other, a second
	// canary greeting with OtherGreeting on CanaryTCP.
	OtherName     string     `json:"other_name"`
	Other         netip.Addr `json:"other"`
	OtherGreeting string     `json:"-"`
	// RebindName resolves to RebindAddr, a private address a LAN witness
	// watches.
	RebindName string     `json:"rebind_name"`
	RebindAddr netip.Addr `json:"rebind_addr"`
	// InetNS is the internet's namespace, where a witness on InetVia
	// watches for what a box sends there (after the host's NAT, from
	// InetNAT).
	InetNS  string       `json:"inet_ns"`
	InetVia netip.Prefix `json:"inet_via"`
	InetNAT netip.Addr   `json:"inet_nat"`
	// WitnessLog is the log of the internet's witness nameserver, which
	// is authoritative for AttackerZone and for the names under the
	// canaries' names (the world's resolver forwards them, uncached): a
	// question a box's resolver forwarded for one of them is a line there.
	WitnessLog   string `json:"witness_log,omitempty"`
	AttackerZone string `json:"attacker_zone,omitempty"`
	// AltPort is a TCP port where the canary greets besides 80 and 443
	// (an allowlisted box reaches it by its address, not through the
	// proxy); ResolverGreeting what the public resolver's port 443
	// greets with (where a DoH server would listen). The canary also
	// echoes UDP on 443 (QUIC's port).
	AltPort          int    `json:"alt_port,omitempty"`
	ResolverGreeting string `json:"-"`
}

// Valid reports whether the targets are there (the world's topology).
func (a AllowTargets) Valid() bool { return a.Other.IsValid() && a.InetVia.IsValid() }

// Target is a private address the drill probes but does not run.
type Target struct {
	Name       string     `json:"name"`
	Addr       netip.Addr `json:"addr"`
	TCPPort    int        `json:"tcp_port,omitempty"`
	UDPPort    int        `json:"udp_port,omitempty"`
	Provenance Provenance `json:"provenance"`
	// Uplink: the host reaches it by its default route (the world's
	// modem), so the world watches for it in the internet's namespace,
	// not the LAN's.
	Uplink bool `json:"uplink,omitempty"`
}

// HostAddr is one of the host's own addresses.
type HostAddr struct {
	Name string       // gateway, or interface-address
	Addr netip.Addr   // the address
	Via  netip.Prefix // what holds it, to bind a listener to it
}

// Name is one DNS question a box asks its resolver.
type Name struct {
	Name       string     `json:"name"`
	QType      string     `json:"qtype"` // A or PTR
	Provenance Provenance `json:"provenance"`
}
