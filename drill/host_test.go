package drill

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/box-isolation/box/probes"
)

func TestHostTargets(t *testing.T) {
	pfx := netip.MustParsePrefix
	addr := netip.MustParseAddr
	box := pfx("10.88.0.0/24")
	gw := addr("10.88.0.1")
	addrs := []IfaceAddr{
		{"lo", pfx("127.0.0.1/8")},
		{"eth0", pfx("192.168.1.20/24")},
		{"eth1", pfx("203.0.113.7/24")},
		{"boxnet", pfx("10.88.0.1/24")},
		{"veth1", pfx("10.88.0.55/24")}, // a box's address seen on the host: not a host target
		{"eth0", pfx("192.168.1.20/24")},
	}
	routes := []Route{
		{Gw: addr("192.168.1.1")}, // the default route
		{Dst: pfx("192.168.1.0/24")},
		{Dst: pfx("203.0.113.0/24")},
		{Dst: pfx("10.88.0.0/24")},
		{Dst: pfx("172.20.0.0/16"), Gw: addr("192.168.1.254")},
	}
	hosts, lan := HostTargets(addrs, routes, box, gw)

	var hostAddrs []string
	for _, h := range hosts {
		hostAddrs = append(hostAddrs, h.Addr.String())
		assert.Equal(t, netip.PrefixFrom(h.Addr, 32), h.Via, "listeners bind to the address itself")
	}
	assert.Equal(t, []string{"10.88.0.1", "192.168.1.20", "203.0.113.7"}, hostAddrs, "every own address, the gateway first, no loopback, no box")
	assert.Equal(t, "gateway", hosts[0].Name)

	got := map[string]bool{}
	for _, l := range lan {
		got[l.Addr.String()] = true
		assert.False(t, box.Contains(l.Addr), "no box is a LAN target")
	}
	for _, want := range []string{
		"192.168.1.1",     // the default gateway
		"192.168.1.254",   // a router for a private route
		"172.20.0.1",      // a routed private subnet
		"10.0.0.1",        // 10/8: no route into it, so a sample
		"100.64.0.1",      // the CGNAT range: a sample
		"169.254.169.254", // the metadata address, always
	} {
		assert.True(t, got[want], "LAN target %s", want)
	}
	for _, not := range []string{"192.168.1.20", "203.0.113.1", "192.168.0.1", "172.16.0.1"} {
		assert.False(t, got[not], "%s is no LAN target (own, public, or its range is already covered)", not)
	}
}

// In host mode the canary is a public server: a completed handshake is the
// proof, UDP egress is a DNS question to it, and the public name resolves
// to whatever it does.
func TestHostModeBaselines(t *testing.T) {
	top := Topology{
		Subnet: netip.MustParsePrefix("10.88.0.0/24"), Gateway: netip.MustParseAddr("10.88.0.1"),
		A: BoxEnd{Place: PlaceA}, Canary: netip.MustParseAddr("1.1.1.1"), CanaryTCP: 443, PublicName: "example.com.",
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
	assert.Equal(t, Fail, judge(tcp, obs, world, true, nil).Verdict, "the world's canary must greet")
	refused := connected
	refused.Evidence.Connected = false
	obs[PlaceA][tcp.ID] = refused
	assert.Equal(t, Fail, judge(tcp, obs, top, true, nil).Verdict, "a RST is no egress")
}

// Listener ports on host addresses follow the topology (picked per run on
// a real host), and probes aim at the same ports.
func TestHostListenerPorts(t *testing.T) {
	top := Topology{
		Subnet: netip.MustParsePrefix("10.88.0.0/24"), Gateway: netip.MustParseAddr("10.88.0.1"),
		A: BoxEnd{Place: PlaceA}, Canary: netip.MustParseAddr("1.1.1.1"), CanaryTCP: 443, PublicName: "example.com.",
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
