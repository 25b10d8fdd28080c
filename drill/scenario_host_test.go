package drill

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/box-isolation/box/drill/topo"
	"github.com/box-isolation/box/internal/hostscan"
)

// Listener ports on host addresses follow the topology (picked per run on
// a real host), and probes aim at the same ports.
func TestHostListenerPorts(t *testing.T) {
	top := Scene{
		Subnet: netip.MustParsePrefix("10.88.0.0/24"), Gateway: netip.MustParseAddr("10.88.0.1"),
		A: BoxEnd{Place: PlaceA, IP: netip.MustParseAddr("10.88.0.11")}, Topology: topo.Topology{Source: topo.SourceHost, Canary: netip.MustParseAddr("1.1.1.1"), CanaryTCP: 443, PublicName: "example.com."},
		HostAddrs: []HostAddr{{Name: "gateway", Addr: netip.MustParseAddr("10.88.0.1"), Via: netip.MustParsePrefix("10.88.0.1/32")}},
		HostTCP:   50123, HostUDP: 50124,
	}
	claim, _ := ClaimByID("C-HOST")
	sc := BuildScenario(top, []Claim{claim})
	ports := map[int]bool{}
	for _, l := range sc.Plans[PlaceHost].Listeners {
		ports[l.Port] = true
	}
	assert.Equal(t, map[int]bool{50123: true, 50124: true}, ports)
	for _, a := range sc.Actions {
		if a.Claim == "C-HOST" && a.Channel != "icmp" {
			assert.True(t, ports[a.Probe.Port], "%s probes port %d", a.Channel, a.Probe.Port)
		}
	}
}

// The host's real listeners become C-HOST targets on every address they
// are bound to, judged by the counting chain; DNS and DHCP are targets on
// every address but the gateway; loopback and the drill's own ports are
// not.
func TestHostListenersAreTargets(t *testing.T) {
	sc := testTopology()
	addr := netip.MustParseAddr
	sc.Listeners = []hostscan.Listener{
		{Proto: "tcp", Family: 4, Addr: netip.IPv4Unspecified(), Port: 22, Process: "sshd"},
		{Proto: "udp", Family: 4, Addr: addr("10.88.0.1"), Port: 53, Process: "dnsmasq"},
		{Proto: "udp", Family: 4, Addr: netip.IPv4Unspecified(), Port: 67, Process: "dnsmasq"},
		{Proto: "tcp", Family: 4, Addr: addr("192.168.20.1"), Port: 8080, Process: "devserver"},
		{Proto: "tcp", Family: 4, Addr: addr("127.0.0.1"), Port: 631, Loopback: true},
		{Proto: "tcp", Family: 6, Addr: addr("fe80::1"), Port: 5000},
		{Proto: "tcp", Family: 4, Addr: netip.IPv4Unspecified(), Port: listenTCP},
	}
	sc.Forwards = []hostscan.Forward{
		{Proto: "tcp", Ports: []hostscan.PortRange{{First: 2222, Last: 2222}}},                                    // every address
		{Proto: "tcp", Ports: []hostscan.PortRange{{First: 8443, Last: 8443}}, InIface: "eth0"},                   // only from eth0
		{Proto: "udp", Ports: []hostscan.PortRange{{First: 5000, Last: 5010}}, Daddr: addr("198.51.100.2")},       // one address
		{Proto: "tcp", Ports: []hostscan.PortRange{{First: 9443, Last: 9443}}, InIface: "box*"},                   // from the bridge
		{Proto: "tcp", Ports: []hostscan.PortRange{{First: 7443, Last: 7443}}, InIface: "eth0", InIfaceNot: true}, // from all but eth0
	}
	s := BuildScenario(sc, claimsByID(t, "C-HOST"))
	got := map[string][]string{}
	for _, a := range actionsOf(s, "C-HOST") {
		if a.Count == "" {
			continue
		}
		got[a.Probe.Target.String()] = append(got[a.Probe.Target.String()], fmt.Sprintf("%s/%d", a.Probe.Kind, a.Probe.Port))
		assert.Contains(t, keys(s.Counters), a.Count)
		assert.NotEmpty(t, a.Provenance)
	}
	assert.Equal(t, map[string][]string{
		"10.88.0.1":    {"tcp/22", "tcp/2222", "tcp/9443", "tcp/7443"},
		"192.168.20.1": {"tcp/22", "udp/67", "tcp/8080", "tcp/2222", "tcp/9443", "tcp/7443", "udp/53", "tcp/53"},
		"198.51.100.2": {"tcp/22", "udp/67", "tcp/2222", "udp/5000", "tcp/9443", "tcp/7443", "udp/53", "tcp/53"},
	}, got)
	assert.Equal(t, "udp 10.88.0.11>10.88.0.1:53", s.CountControl.String(), "the chain's control is box-a's DNS to the gateway")
}
