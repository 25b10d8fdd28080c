package drill

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/drill/topo"
	"github.com/box-isolation/box/internal/hostscan"
	"github.com/box-isolation/box/probes"
)

// In host mode the canary is a public server: a completed handshake is the
// proof, UDP egress is a DNS question to it, and the public name resolves
// to whatever it does.
func TestHostModeBaselines(t *testing.T) {
	top := Scene{
		Subnet: netip.MustParsePrefix("10.88.0.0/24"), Gateway: netip.MustParseAddr("10.88.0.1"),
		A: BoxEnd{Place: PlaceA}, Topology: topo.Topology{Source: topo.SourceHost, Canary: netip.MustParseAddr("1.1.1.1"), CanaryTCP: 443, PublicName: "example.com."},
	}
	sc := BuildScenario(top, []Claim{Catalogue[0]})
	var egress []Action
	for _, a := range sc.Actions {
		if a.Claim == "C-EGRESS" {
			egress = append(egress, a)
		}
	}
	assert.Len(t, egress, 3)
	for _, a := range egress {
		if a.Channel == "udp" {
			assert.Equal(t, ExpectResolve, a.Expect)
			assert.Equal(t, 53, a.Probe.Port)
			assert.Equal(t, top.Canary, a.Probe.Target)
		}
	}

	tcp := egress[0]
	connected := probes.Observation{ID: tcp.ID, Kind: probes.KindTCP, Outcome: probes.Refused, Target: "1.1.1.1:443",
		Reason: "connected but not reached", Evidence: probes.Evidence{Connected: true}}
	obs := observations{PlaceA: {tcp.ID: connected}}
	assert.Equal(t, Pass, judge(tcp, obs, top, true, nil).Verdict, "a handshake with a public canary is the proof")
	world := top
	world.CanaryGreeting = "BOXWORLD canary n"
	wtcp := BuildScenario(world, []Claim{Catalogue[0]}).Actions[0]
	require.Equal(t, world.CanaryGreeting, wtcp.Greeting, "the world's canary action carries its greeting")
	assert.Equal(t, Fail, judge(wtcp, observations{PlaceA: {wtcp.ID: connected}}, world, true, nil).Verdict, "the world's canary must greet")
	refused := connected
	refused.Evidence.Connected = false
	obs[PlaceA][tcp.ID] = refused
	assert.Equal(t, Fail, judge(tcp, obs, top, true, nil).Verdict, "a RST is no egress")
}

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

// C-NAMES asks what the host knows, each name once, never localhost, and
// compares every answer with the upstream asked from the host.
func TestNameQuestions(t *testing.T) {
	sc := testTopology()
	sc.Upstream = netip.MustParseAddr("203.0.113.53")
	sc.Hostname, sc.FQDN, sc.SearchDomains = "build7", "build7.corp.internal.", []string{"corp.internal"}
	sc.Names = []topo.Name{{Name: "git.corp.internal.", QType: "A", Provenance: topo.FromLANZone}}
	hosts := []hostscan.HostsEntry{
		{Addr: netip.MustParseAddr("127.0.0.1"), Name: "localhost"},
		{Addr: netip.MustParseAddr("192.168.20.30"), Name: "printer.corp.internal", Aliases: []string{"printer", "GIT.corp.internal."}},
	}
	qs, dropped := nameQuestions(sc, hosts)
	assert.Zero(t, dropped)
	var got []string
	for _, q := range qs {
		got = append(got, q.QType+" "+q.Name+" "+string(q.Provenance))
	}
	for _, want := range []string{
		"A git.corp.internal. lan-zone", "A printer.corp.internal. hosts-file", "A printer. hosts-file", "PTR 192.168.20.30 hosts-file",
		"A build7. hostname", "A build7.corp.internal. hostname", "A wiki.corp.internal. search", "PTR 192.168.20.1 ptr", "PTR 10.20.0.10 ptr",
	} {
		assert.Contains(t, got, want)
	}
	for _, q := range qs {
		assert.NotContains(t, strings.ToLower(q.Name), "localhost")
	}
	assert.NotContains(t, got, "A GIT.corp.internal. hosts-file", "a name is asked once, whatever its case")

	sc.questions = qs
	s := BuildScenario(sc, claimsByID(t, "C-NAMES"))
	upstream := map[string]probes.ProbeSpec{}
	for _, p := range s.Plans[PlaceHost].Probes {
		upstream[p.ID] = p
	}
	compared := 0
	for _, a := range actionsOf(s, "C-NAMES") {
		if a.Provenance == topo.FromSibling {
			assert.False(t, a.Reference.Valid(), "a sibling's name is never public")
			continue
		}
		up, ok := upstream[a.Reference.ID]
		require.True(t, ok, "%s is compared with the upstream", a.Target)
		assert.Equal(t, sc.Upstream, up.Target)
		assert.Equal(t, a.Probe.Name, up.Name)
		assert.Equal(t, a.Probe.QType, up.QType)
		compared++
	}
	assert.Equal(t, len(qs), compared)

	many := make([]hostscan.HostsEntry, 0, 200)
	for i := range 200 {
		many = append(many, hostscan.HostsEntry{Addr: netip.MustParseAddr("192.168.20.30"), Name: fmt.Sprintf("h%d.corp.internal", i)})
	}
	qs, dropped = nameQuestions(sc, many)
	assert.Len(t, qs, maxNames)
	assert.Positive(t, dropped, "the rest is counted, for the report's notes")
}

// In host mode one outbound witness on the host's outward interfaces
// watches every C-LAN probe, and the host's own echo to each target proves
// it watched the way there.
func TestHostModeLANIsWatchedLeaving(t *testing.T) {
	top := Scene{
		Subnet: netip.MustParsePrefix("10.88.0.0/24"), Gateway: netip.MustParseAddr("10.88.0.1"), A: BoxEnd{Place: PlaceA, IP: netip.MustParseAddr("10.88.0.11")},
		Topology: topo.Topology{Source: topo.SourceHost, Canary: netip.MustParseAddr("1.1.1.1"), CanaryTCP: 443, PublicName: "example.com.", Outward: []string{"eth0"},
			LANHosts: []Target{{Name: "router-192.168.1.1", Addr: netip.MustParseAddr("192.168.1.1"), TCPPort: 80, UDPPort: 53, Provenance: topo.FromRoute},
				{Name: "sample-10.0.0.1", Addr: netip.MustParseAddr("10.0.0.1"), TCPPort: 80, UDPPort: 53, Provenance: topo.FromSample}}},
	}
	sc := BuildScenario(top, claimsByID(t, "C-LAN"))
	hp := sc.Plans[PlaceHost]
	require.Len(t, hp.Witnesses, 1)
	w := hp.Witnesses[0]
	assert.Equal(t, []string{"eth0"}, w.Ifaces)
	assert.NotEmpty(t, w.DstPrefixes)
	assert.False(t, w.Via.IsValid())
	ctl := map[string]probes.ProbeSpec{}
	for _, p := range hp.Probes {
		ctl[p.ID] = p
	}
	lan := actionsOf(sc, "C-LAN")
	require.Len(t, lan, 6)
	for _, a := range lan {
		assert.Equal(t, PlaceHost, a.WitnessAt)
		c, ok := ctl[outControlID(a.Probe.Target)]
		require.True(t, ok, "the host echoes %s itself", a.Probe.Target)
		assert.Equal(t, a.OutControl, c.Nonce)
		assert.Contains(t, w.Nonces, c.Nonce, "the witness knows the control")
		if a.Probe.Kind == probes.KindTCP {
			assert.NotContains(t, w.Nonces, a.Probe.Nonce, "a SYN carries no nonce: it is known by its ISN")
		} else {
			assert.Contains(t, w.Nonces, a.Probe.Nonce)
		}
	}
	assert.Empty(t, failedControls(sc, observations{}), "an unanswered echo of the host's own is no failed control")

	// Many targets: several witnesses, none over the plan's limit, and
	// every action with the one that knows its nonces.
	top.LANHosts = nil
	for i := range 40 {
		a := netip.AddrFrom4([4]byte{192, 168, 1, byte(10 + i)})
		top.LANHosts = append(top.LANHosts, Target{Name: "neighbour-" + a.String(), Addr: a, TCPPort: 80, UDPPort: 53, Provenance: topo.FromNeighbour})
	}
	sc = BuildScenario(top, claimsByID(t, "C-LAN"))
	require.Greater(t, len(sc.Plans[PlaceHost].Witnesses), 1)
	for _, w := range sc.Plans[PlaceHost].Witnesses {
		assert.LessOrEqual(t, len(w.Nonces), probes.MaxMatchEntries)
	}
	for _, a := range actionsOf(sc, "C-LAN") {
		require.NotNil(t, a.Witness)
		assert.Contains(t, a.Witness.Nonces, a.OutControl)
		if a.Probe.Kind != probes.KindTCP {
			assert.Contains(t, a.Witness.Nonces, a.Probe.Nonce)
		}
	}
	for place, p := range sc.Plans {
		require.NoError(t, roundTrip(p), "the %s plan decodes", place)
	}
}

// roundTrip encodes a plan and decodes it as the agent does, strictly.
func roundTrip(p *probes.Plan) error {
	data, err := json.Marshal(p)
	if err != nil {
		return err
	}
	_, err = probes.DecodePlan(bytes.NewReader(data))
	return err
}

// TestInputNotesAreTheClaims: what the drill could not read for the
// scene is noted under the IDs of the claims that need it, in their
// words of what it costs them, as the report always said it.
func TestInputNotesAreTheClaims(t *testing.T) {
	for _, tc := range []struct {
		in   sceneInput
		what string
		want []string
	}{
		{inputBridgeMAC, "the bridge's MAC was not read (no such link)", []string{string(SpoofID) + ": the bridge's MAC was not read (no such link): box-a's lies are not sent"}},
		{inputDHCPPool, "the bridge's DHCP pool was not read (denied)", []string{string(SpoofID) + ": the bridge's DHCP pool was not read (denied): the DHCP lies are not sent"}},
		{inputForwards, "the ports of x could not be listed, so they are not targets", []string{string(HostID) + ": the ports of x could not be listed, so they are not targets"}},
		{inputNames, "3 more names were not asked (at most 96 a run)", []string{string(NamesID) + ": 3 more names were not asked (at most 96 a run)"}},
	} {
		assert.Equal(t, tc.want, inputNotes(tc.in, tc.what), "%s", tc.in)
	}
}
