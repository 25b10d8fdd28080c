package worldstate

import (
	"net/netip"
	"path/filepath"
)

// The world's plan: its fixed addresses, names and ports, the same in
// every world (docs/world.md).

// Names the world's resolvers answer.
const (
	// PublicName is the test name the world's resolver answers.
	PublicName = "canary.example.net."
	// OtherName is the second canary's name (an egress allowlist's other
	// name), RebindName a public name that resolves to a LAN host.
	OtherName  = "other.example.net."
	RebindName = "rebind.example.net."
	// AttackerZone is a zone nothing allows, whose authoritative server
	// is the witness nameserver.
	AttackerZone = "attacker.example."
	// WitnessLogName is the witness nameserver's log, in the world's state
	// folder (internal/witnesslog reads it).
	WitnessLogName = "dns-witness.log"
)

// WitnessLog is the witness's log of a world whose state folder is dir.
func WitnessLog(dir string) string { return filepath.Join(dir, WitnessLogName) }

// Fixed addresses of the world.
var (
	UplinkHost = netip.MustParsePrefix("198.51.100.2/24")
	UplinkInet = netip.MustParsePrefix("198.51.100.1/24")
	Canary     = netip.MustParseAddr("203.0.113.10")
	// Canary2 is the second canary (OtherName), RebindAddr what RebindName
	// resolves to: lan-192, a LAN host.
	Canary2    = netip.MustParseAddr("203.0.113.20")
	RebindAddr = netip.MustParseAddr("192.168.20.10")
	Resolver   = netip.MustParseAddr("203.0.113.53")
	// Modem is a private address the host reaches by its default route,
	// as a cable modem's management address is: it lives in the internet
	// namespace (TCP greeter, UDP echo), and only the ACL (L-ACL) keeps
	// boxes from it, L-ROUTE letting the default way through.
	Modem       = netip.MustParseAddr("192.168.100.1")
	LANHostSide = netip.MustParsePrefix("192.168.20.1/24")
	LANRouter   = netip.MustParsePrefix("192.168.20.2/24")
	// BoxSubnets is what the LAN routes back through the host, so that a LAN
	// host can try to reach a box (C-INBOUND); it covers every subnet the
	// stack may pick (10.88.0.0/24 .. 10.127.0.0/24).
	BoxSubnets = netip.MustParsePrefix("10.64.0.0/10")
)

// Canary ports.
const (
	CanaryTCPPort = 80
	CanaryTLSPort = 443
	EchoUDPPort   = 7
	// Canary2AltPort is the second canary's third port (it also greets on
	// the canary's two), so C-ALLOW's probes to it are told apart.
	Canary2AltPort = 8080
	LANTCPPort     = 80
)

// ModemRole is the modem's greeting role and its name as a LAN target.
const ModemRole = "modem"

// LANHost is one host in a private range, living in the LAN namespace.
type LANHost struct {
	Name  string     `json:"name"`
	Addr  netip.Addr `json:"addr"`
	Route string     `json:"route"` // what the host namespace routes to it
}

// LANHosts is one host in every private range C-LAN names (docs/claims.md), and
// one in a prefix the host routes to its LAN that is not private
// (RoutedPublic): L-ROUTE's target.
var LANHosts = []LANHost{
	{Name: "lan-10", Addr: netip.MustParseAddr("10.20.0.10"), Route: "10.20.0.0/24"},
	{Name: "lan-172", Addr: netip.MustParseAddr("172.16.20.10"), Route: "172.16.20.0/24"},
	{Name: "lan-192", Addr: netip.MustParseAddr("192.168.20.10"), Route: ""}, // on the LAN link itself
	{Name: "lan-cgnat", Addr: netip.MustParseAddr("100.64.20.10"), Route: "100.64.20.0/24"},
	{Name: "lan-metadata", Addr: netip.MustParseAddr("169.254.169.254"), Route: "169.254.169.254/32"},
	{Name: "lan-bench", Addr: netip.MustParseAddr("198.18.20.10"), Route: "198.18.20.0/24"},
}

// InternalZone is the LAN's internal DNS zone.
const InternalZone = "corp.internal."

// InternalName is a name and the address it stands for. Names are fully
// qualified, with the trailing dot.
type InternalName struct {
	Name string     `json:"name"`
	Addr netip.Addr `json:"addr"`
}

// InternalNames are the LAN resolver's fixed names, each a LAN host. The
// zone also holds the host's own name (Names.HostFQDN); Names.ZoneNames
// lists both.
var InternalNames = []InternalName{
	{Name: "git." + InternalZone, Addr: netip.MustParseAddr("10.20.0.10")},
	{Name: "wiki." + InternalZone, Addr: netip.MustParseAddr("172.16.20.10")},
	{Name: "nas." + InternalZone, Addr: netip.MustParseAddr("192.168.20.10")},
}
