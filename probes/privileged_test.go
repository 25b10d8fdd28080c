package probes

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

const (
	greetPort  = 7000
	echoPort   = 7001
	closedPort = 7999
	// probeDeadlineMS is long enough for a veth round trip many times over
	// and short enough that the silent rows stay quick.
	probeDeadlineMS = 800
)

// TestPrivilegedProbeTable measures the same target through a router with
// an accept rule, a drop rule, a reject rule (ICMP port-unreachable from the
// router), an admin-prohibited reject, and a closed port, for ICMP, TCP and
// UDP over IPv4 and IPv6. It checks each outcome and that the witness at the
// target saw the probe exactly when it arrived.
func TestPrivilegedProbeTable(t *testing.T) {
	w := newRoutedWorld(t)
	startListener(t, w.tgt, ListenerSpec{ID: "greet", Kind: KindTCPGreeter, Name: "target", Port: greetPort})
	startListener(t, w.tgt, ListenerSpec{ID: "echo", Kind: KindUDPEcho, Name: "target", Port: echoPort})

	type row struct {
		kind    Kind
		port    int
		rule    rule
		want    Outcome
		arrived bool
		why     string
	}
	var rows []row
	for _, k := range []Kind{KindICMP, KindTCP, KindUDP} {
		port := map[Kind]int{KindICMP: 0, KindTCP: greetPort, KindUDP: echoPort}[k]
		rows = append(rows,
			row{k, port, ruleAccept, Reached, true, ""},
			row{k, port, ruleDrop, Silent, false, ""},
			row{k, port, ruleReject, Rejected, false, "port-unreachable from"},
			row{k, port, ruleAdmin, Rejected, false, "admin-prohibited"},
		)
		if k != KindICMP {
			rows = append(rows, row{k, closedPort, ruleAccept, Refused, true, ""})
		}
	}
	// The documented limitation: a router's forged RST reads refused at the
	// sender, and only the witness (which saw nothing) shows it never
	// arrived.
	rows = append(rows, row{KindTCP, greetPort, ruleTCPReset, Refused, false, "RST"})

	for _, fam := range []int{4, 6} {
		src, dst, rtr := w.sndIP, w.tgtIP, w.rtrIP
		if fam == 6 {
			src, dst, rtr = w.sndIP6, w.tgtIP6, w.rtrIP6
		}
		for _, r := range rows {
			name := fmt.Sprintf("v%d/%s/port-%d/%s", fam, r.kind, r.port, r.rule)
			t.Run(name, func(t *testing.T) {
				w.setRule(t, dst, r.rule)
				nonce := NewNonce()
				ws := WitnessSpec{ID: "w", Via: w.tgtNet, WindowMS: 10000, Nonces: []string{nonce}}
				if r.kind == KindTCP {
					// A SYN carries no payload: key on the sender and port.
					ws.SrcIPs, ws.Proto, ws.Port = []netip.Addr{src}, "tcp", r.port
				}
				wit := startWitness(t, w.tgt, ws)
				o := probeIn(t, w.snd, ProbeSpec{ID: "p", Kind: r.kind, Target: dst, Port: r.port, Nonce: nonce, DeadlineMS: probeDeadlineMS})
				seen := wit.Stop()
				t.Logf("probe: %s %s (%s) evidence=%+v icmp=%+v", o.Outcome, o.Reason, o.Target, o.Evidence, o.Evidence.ICMP)
				t.Logf("witness: %s %s", seen.Outcome, seen.Reason)
				require.Equal(t, r.want, o.Outcome, o.Reason)
				require.Contains(t, o.Reason, r.why)
				if r.want == Rejected {
					require.NotNil(t, o.Evidence.ICMP)
					require.Equal(t, rtr.String(), o.Evidence.ICMP.Offender, "the reject is named as the router's")
					require.False(t, o.Evidence.ICMP.OffenderIsTarget)
				}
				if r.want == Silent {
					require.GreaterOrEqual(t, o.ElapsedMS, int64(probeDeadlineMS-5), "silence means the whole deadline passed")
				}
				if r.arrived {
					require.Equal(t, Reached, seen.Outcome, "the witness must see a probe that arrived")
					require.NotNil(t, seen.Evidence.Witness.First)
				} else {
					require.Equal(t, Silent, seen.Outcome, "the witness must see nothing of a probe that never arrived: %+v", seen.Evidence.Witness.First)
				}
				if r.want == Reached && r.kind != KindICMP {
					require.Contains(t, o.Evidence.Reply, "target", "the greeting names who answered")
				}
			})
		}
	}
}

// TestPrivilegedTCPConnectedNoEcho: a listener that accepts and never
// echoes is refused (arrived, not proven), never reached.
func TestPrivilegedTCPConnectedNoEcho(t *testing.T) {
	w := newRoutedWorld(t)
	var closeFn func()
	err := w.tgt.Run(func() error {
		lc, err := listenTCP(netip.AddrPortFrom(w.tgtIP, 7100))
		if err != nil {
			return err
		}
		closeFn = lc
		return nil
	})
	require.NoError(t, err)
	t.Cleanup(closeFn)
	o := probeIn(t, w.snd, ProbeSpec{ID: "p", Kind: KindTCP, Target: w.tgtIP, Port: 7100, DeadlineMS: 300})
	require.Equal(t, Refused, o.Outcome, o.Reason)
	require.Contains(t, o.Reason, "connected")
}

// TestPrivilegedBridgeARP: an ARP who-has across a bridge is answered
// without the bridge drop and meets silence with it, and the witness on
// the far port sees the request exactly when no drop is in place. The same
// holds for a subnet broadcast.
func TestPrivilegedBridgeARP(t *testing.T) {
	w := newBridgeWorld(t)
	startListener(t, w.b, ListenerSpec{ID: "echo", Kind: KindUDPEcho, Name: "peer-b", Port: echoPort})
	for _, drop := range []bool{false, true} {
		t.Run(fmt.Sprintf("arp/drop=%v", drop), func(t *testing.T) {
			w.setDrop(t, drop)
			wit := startWitness(t, w.b, WitnessSpec{ID: "w", Via: w.subnet, WindowMS: 10000,
				SrcMACs: []string{w.aMAC.String()}, SrcIPs: []netip.Addr{w.aIP}, Proto: "arp"})
			o := probeIn(t, w.a, ProbeSpec{ID: "arp", Kind: KindARP, Target: w.bIP, Via: w.subnet, DeadlineMS: probeDeadlineMS})
			seen := wit.Stop()
			t.Logf("probe: %s %s; witness: %s %s", o.Outcome, o.Reason, seen.Outcome, seen.Reason)
			if drop {
				require.Equal(t, Silent, o.Outcome, o.Reason)
				require.Equal(t, Silent, seen.Outcome, "no ARP from a may reach b's port")
			} else {
				require.Equal(t, Reached, o.Outcome, o.Reason)
				require.Equal(t, w.bMAC.String(), o.Evidence.MAC)
				require.Equal(t, Reached, seen.Outcome)
				require.Equal(t, "arp", seen.Evidence.Witness.First.EtherType)
			}
		})
		t.Run(fmt.Sprintf("broadcast/drop=%v", drop), func(t *testing.T) {
			w.setDrop(t, drop)
			nonce := NewNonce()
			wit := startWitness(t, w.b, WitnessSpec{ID: "w", Via: w.subnet, WindowMS: 10000, Nonces: []string{nonce}})
			o := probeIn(t, w.a, ProbeSpec{ID: "bc", Kind: KindBroadcast, Port: echoPort, Via: w.subnet, Nonce: nonce, DeadlineMS: probeDeadlineMS})
			seen := wit.Stop()
			t.Logf("probe: %s %s %v; witness: %s", o.Outcome, o.Reason, o.Evidence.Responders, seen.Outcome)
			if drop {
				require.Equal(t, Silent, o.Outcome, o.Reason)
				require.Equal(t, Silent, seen.Outcome)
			} else {
				require.Equal(t, Reached, o.Outcome, o.Reason)
				require.Equal(t, []string{w.bIP.String()}, o.Evidence.Responders)
				require.Equal(t, Reached, seen.Outcome)
			}
		})
	}
}

// TestPrivilegedMulticastDiscovery: the multicast a distribution sends on
// its own (mDNS, LLMNR, SSDP) goes out as that protocol's request with the
// nonce in it; the witness on the far port sees each exactly when no
// bridge drop is in place.
func TestPrivilegedMulticastDiscovery(t *testing.T) {
	w := newBridgeWorld(t)
	for _, g := range []struct {
		name    string
		group   string
		port    int
		request string
	}{
		{"mdns", "224.0.0.251", 5353, RequestDNS},
		{"llmnr", "224.0.0.252", 5355, RequestDNS},
		{"ssdp", "239.255.255.250", 1900, RequestSSDP},
	} {
		for _, drop := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/drop=%v", g.name, drop), func(t *testing.T) {
				w.setDrop(t, drop)
				nonce := NewNonce()
				wit := startWitness(t, w.b, WitnessSpec{ID: "w", Via: w.subnet, WindowMS: 10000, Nonces: []string{nonce}, Proto: "udp", Port: g.port})
				o := probeIn(t, w.a, ProbeSpec{ID: g.name, Kind: KindBroadcast, Target: netip.MustParseAddr(g.group), Port: g.port, Via: w.subnet, Nonce: nonce, DeadlineMS: probeDeadlineMS})
				seen := wit.Stop()
				t.Logf("probe: %s %s; witness: %s %s", o.Outcome, o.Reason, seen.Outcome, seen.Reason)
				require.Equal(t, g.request, o.Evidence.Request, "sent as the protocol's own request")
				require.Equal(t, Silent, o.Outcome, "nobody answers a name nobody owns: %s", o.Reason)
				if drop {
					require.Equal(t, Silent, seen.Outcome, "no multicast from a may reach b's port")
				} else {
					require.Equal(t, Reached, seen.Outcome, "the group's frame reached b's port, the nonce in it")
					require.Equal(t, g.group, seen.Evidence.Witness.First.DstIP)
				}
			})
		}
	}
}

// TestPrivilegedLinkLocalMulticast: b has IPv6 on but no link-local address
// (docs/world.md, "These machines"); EnsureLinkLocal adds one and removes it. A multicast echo to
// ff02::1 from a names b as a responder without the bridge drop and gets
// silence with it.
func TestPrivilegedLinkLocalMulticast(t *testing.T) {
	w := newBridgeWorld(t)
	var st LinkLocalState
	var remove func() LinkLocalState
	require.NoError(t, w.b.Run(func() (err error) { st, remove, err = EnsureLinkLocal(w.subnet, netip.Addr{}); return err }))
	require.True(t, st.Added, "%+v", st)
	bLL := netip.MustParseAddr(st.Address)
	require.True(t, bLL.IsLinkLocalUnicast())
	// The address is listed, not tentative, the moment EnsureLinkLocal
	// returns, but until addrconf's work has run b drops a's neighbour
	// advertisement and unicast echo to it: wait for that, not for time.
	w.b.waitLinkLocal(t, "veth-b", bLL)

	// A second call finds the address and adds nothing.
	var again LinkLocalState
	require.NoError(t, w.b.Run(func() (err error) { again, _, err = EnsureLinkLocal(w.subnet, netip.Addr{}); return err }))
	require.False(t, again.Added)
	require.Equal(t, st.Address, again.Address)

	ff02 := netip.MustParseAddr("ff02::1")
	for _, drop := range []bool{false, true} {
		t.Run(fmt.Sprintf("drop=%v", drop), func(t *testing.T) {
			w.setDrop(t, drop)
			o := probeIn(t, w.a, ProbeSpec{ID: "mc", Kind: KindICMP, Target: ff02, Via: w.subnet, DeadlineMS: probeDeadlineMS})
			t.Logf("probe: %s %s %v", o.Outcome, o.Reason, o.Evidence.Responders)
			if drop {
				require.Equal(t, Silent, o.Outcome, o.Reason)
			} else {
				require.Equal(t, Reached, o.Outcome, o.Reason)
				require.Equal(t, []string{bLL.String()}, o.Evidence.Responders, "only b answers; a never counts itself")
			}
			// Unicast to b's link-local, zone from the subnet.
			u := probeIn(t, w.a, ProbeSpec{ID: "ll", Kind: KindICMP, Target: bLL, Via: w.subnet, DeadlineMS: probeDeadlineMS})
			if drop {
				require.Equal(t, Silent, u.Outcome, u.Reason)
			} else {
				require.Equal(t, Reached, u.Outcome, u.Reason)
			}
		})
	}
	var gone LinkLocalState
	require.NoError(t, w.b.Run(func() error { gone = remove(); return nil }))
	require.True(t, gone.Removed, gone.Error)
	require.NoError(t, w.b.Run(func() error {
		ifi, _, err := InterfaceForSubnet(w.subnet)
		if err != nil {
			return err
		}
		for _, a := range interfaceAddrs(ifi) {
			if a.Addr().IsLinkLocalUnicast() {
				return fmt.Errorf("link-local %s still on %s", a, ifi.Name)
			}
		}
		return nil
	}))
}

func TestPrivilegedDHCPLeaseAndIPv6State(t *testing.T) {
	w := newRoutedWorld(t)
	o := probeIn(t, w.snd, ProbeSpec{ID: "lease", Kind: KindDHCPLease, Via: w.sndNet, DeadlineMS: 100})
	require.Equal(t, Reached, o.Outcome, o.Reason)
	require.Equal(t, "10.201.1.2/24", o.Evidence.Lease.Address)
	require.Equal(t, w.snd.mac(t, "veth-snd").String(), o.Evidence.Lease.MAC)
	require.Equal(t, "10.201.1.1", o.Evidence.Lease.DefaultRoute)
	require.False(t, o.Evidence.Lease.Dynamic, "a static test address is permanent")

	none := probeIn(t, w.snd, ProbeSpec{ID: "lease", Kind: KindDHCPLease, Via: netip.MustParsePrefix("10.88.0.0/24"), DeadlineMS: 100})
	require.Equal(t, Silent, none.Outcome, none.Reason)

	// The routed world gives the sender a global address and a default
	// route: reached. A bare namespace has neither: silent.
	v6 := probeIn(t, w.snd, ProbeSpec{ID: "v6", Kind: KindIPv6State, DeadlineMS: 100})
	require.Equal(t, Reached, v6.Outcome, v6.Reason)
	require.Contains(t, v6.Evidence.IPv6.GlobalAddresses, "2001:db8:1::2/64 on veth-snd")
	require.NotEmpty(t, v6.Evidence.IPv6.DefaultRoutes)
	bare := newNS(t, runID(), "bare")
	v6 = probeIn(t, bare, ProbeSpec{ID: "v6", Kind: KindIPv6State, DeadlineMS: 100})
	require.Equal(t, Silent, v6.Outcome, v6.Reason)
}

func TestPrivilegedNDPRouterSolicitation(t *testing.T) {
	w := newRoutedWorld(t)
	// Nobody advertises: silent, as an isolated box must see.
	o := probeIn(t, w.snd, ProbeSpec{ID: "rs", Kind: KindNDPRS, Via: w.sndNet, DeadlineMS: 500})
	require.Equal(t, Silent, o.Outcome, o.Reason)
	require.Equal(t, udpSends, o.Evidence.Sent)

	// A router that answers solicitations: reached, naming it.
	stop := startRAResponder(t, w.rtr, w.sndNet, netip.MustParsePrefix("2001:db8:1::/64"))
	defer stop()
	o = probeIn(t, w.snd, ProbeSpec{ID: "rs", Kind: KindNDPRS, Via: w.sndNet, DeadlineMS: probeDeadlineMS})
	require.Equal(t, Reached, o.Outcome, o.Reason)
	require.True(t, strings.HasPrefix(o.Evidence.IPv6.Router, "fe80::"), o.Evidence.IPv6.Router)
	require.Equal(t, []string{"2001:db8:1::/64"}, o.Evidence.IPv6.Prefixes)
}

func TestPrivilegedDNS(t *testing.T) {
	w := newRoutedWorld(t)
	startDNSServer(t, w.tgt, netip.AddrPortFrom(w.tgtIP, 53))
	dnsProbe := func(name, qtype string, port int) ProbeSpec {
		return ProbeSpec{ID: "dns", Kind: KindDNS, Target: w.tgtIP, Port: port, Name: name, QType: qtype, DeadlineMS: probeDeadlineMS}
	}
	tests := []struct {
		name  string
		rule  rule
		spec  ProbeSpec
		want  Outcome
		rcode string
		check func(t *testing.T, o Observation)
	}{
		{"public name resolves", ruleAccept, dnsProbe("canary.box.test", "A", 0), Reached, "NOERROR", func(t *testing.T, o Observation) {
			require.True(t, o.Evidence.DNS.Resolved)
			require.Len(t, o.Evidence.DNS.Answers, 1)
			require.Contains(t, o.Evidence.DNS.Answers[0], "203.0.113.7")
		}},
		{"reverse lookup", ruleAccept, dnsProbe("203.0.113.7", "PTR", 0), Reached, "NOERROR", func(t *testing.T, o Observation) {
			require.Equal(t, "7.113.0.203.in-addr.arpa.", o.Evidence.DNS.Name)
			require.Contains(t, o.Evidence.DNS.Answers[0], "canary.box.test.")
		}},
		{"unknown name is NXDOMAIN", ruleAccept, dnsProbe("peer-a.incus", "A", 0), Refused, "NXDOMAIN", func(t *testing.T, o Observation) {
			require.False(t, o.Evidence.DNS.Resolved)
			require.Contains(t, o.Reason, "did not resolve")
		}},
		{"no such record is NODATA", ruleAccept, dnsProbe("canary.box.test", "AAAA", 0), Refused, "NOERROR", func(t *testing.T, o Observation) {
			require.Contains(t, o.Reason, "NODATA")
		}},
		{"a refusing resolver", ruleAccept, dnsProbe("refuse.box.test", "A", 0), Refused, "REFUSED", nil},
		{"no server on the port", ruleAccept, dnsProbe("canary.box.test", "A", 5353), Refused, "", func(t *testing.T, o Observation) {
			require.NotNil(t, o.Evidence.ICMP, "the resolver's host said port-unreachable")
			require.True(t, o.Evidence.ICMP.OffenderIsTarget)
		}},
		{"resolver unreachable", ruleDrop, dnsProbe("canary.box.test", "A", 0), Silent, "", nil},
		{"resolver rejected by a router", ruleReject, dnsProbe("canary.box.test", "A", 0), Rejected, "", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w.setRule(t, w.tgtIP, tt.rule)
			o := probeIn(t, w.snd, tt.spec)
			t.Logf("%s %s dns=%+v", o.Outcome, o.Reason, o.Evidence.DNS)
			require.Equal(t, tt.want, o.Outcome, o.Reason)
			require.Equal(t, tt.rcode, o.Evidence.DNS.Rcode)
			if tt.check != nil {
				tt.check(t, o)
			}
		})
	}
}

// TestPrivilegedAgent runs two agents as processes, one in the target
// namespace (listeners and a witness) and one in the sender (probes that
// wait for the target to be armed), and reads both reports.
func TestPrivilegedAgent(t *testing.T) {
	w := newRoutedWorld(t)
	n1, n2, n3 := NewNonce(), NewNonce(), NewNonce()
	target := fmt.Sprintf(`{"version":1,"deadline_ms":3000,
	  "listeners":[{"id":"greet","kind":"tcp_greeter","name":"tgt","port":%d,"via":"%s"},
	               {"id":"echo","kind":"udp_echo","name":"tgt","port":%d}],
	  "witnesses":[{"id":"w","via":"%s","window_ms":2800,"nonces":["%s","%s","%s"]}]}`,
		greetPort, w.tgtNet, echoPort, w.tgtNet, n1, n2, n3)
	sender := fmt.Sprintf(`{"version":1,"deadline_ms":2500,"probes":[
	  {"id":"tcp","kind":"tcp","target":"%s","port":%d,"nonce":"%s","deadline_ms":1000,"delay_ms":500},
	  {"id":"udp","kind":"udp","target":"%s","port":%d,"nonce":"%s","deadline_ms":1000,"delay_ms":500},
	  {"id":"icmp6","kind":"icmp","target":"%s","nonce":"%s","deadline_ms":1000,"delay_ms":500},
	  {"id":"closed","kind":"tcp","target":"%s","port":%d,"deadline_ms":1000,"delay_ms":500},
	  {"id":"lease","kind":"dhcp_lease","via":"%s","deadline_ms":100}]}`,
		w.tgtIP, greetPort, n1, w.tgtIP, echoPort, n2, w.tgtIP6, n3, w.tgtIP, closedPort, w.sndNet)
	waitTarget := startAgentIn(t, w.tgt, target)
	waitSender := startAgentIn(t, w.snd, sender)
	srep, swall, sraw := waitSender()
	trep, twall, traw := waitTarget()
	t.Logf("sender report (%s): %s", swall, sraw)
	t.Logf("target report (%s): %s", twall, traw)

	want := map[string]Outcome{"tcp": Reached, "udp": Reached, "icmp6": Reached, "closed": Refused, "lease": Reached}
	require.Len(t, srep.Observations, len(want))
	for _, o := range srep.Observations {
		require.Equal(t, want[o.ID], o.Outcome, "%s: %s", o.ID, o.Reason)
		require.False(t, o.StartedAt.IsZero())
	}
	require.Len(t, trep.Observations, 3)
	for _, o := range trep.Observations {
		require.Equal(t, Reached, o.Outcome, "%s: %s", o.ID, o.Reason)
	}
	wit := trep.Observations[2]
	require.Equal(t, KindWitness, wit.Kind)
	require.GreaterOrEqual(t, wit.Evidence.Witness.Count, 3)
	// The witness was armed before the first probe left.
	require.True(t, wit.Evidence.Witness.ArmedAt.Before(srep.Observations[0].StartedAt))
	require.Less(t, swall.Milliseconds(), int64(2500+500), "the agent returns within its deadline (plus process start)")
	require.Less(t, twall.Milliseconds(), int64(3000+500))
}

// TestPrivilegedAgentLinkLocal: the agent in b (IPv6 on, no link-local
// address, as a container in docs/world.md, "These machines") adds its own fe80:: address for the
// plan, pings ff02::1 across the bridge, and removes the address after.
func TestPrivilegedAgentLinkLocal(t *testing.T) {
	w := newBridgeWorld(t)
	plan := fmt.Sprintf(`{"version":1,"deadline_ms":1500,"link_local":{"via":"%s"},
	  "probes":[{"id":"mc","kind":"icmp","target":"ff02::1","via":"%s","deadline_ms":1000}]}`, w.subnet, w.subnet)
	rep, _, raw := startAgentIn(t, w.b, plan)()
	t.Logf("report: %s", raw)
	require.NotNil(t, rep.LinkLocal)
	require.True(t, rep.LinkLocal.Added, "%+v", rep.LinkLocal)
	require.True(t, rep.LinkLocal.Removed, "%+v", rep.LinkLocal)
	require.Empty(t, rep.LinkLocal.Error)
	o := rep.Observations[0]
	require.Equal(t, Reached, o.Outcome, o.Reason)
	require.Len(t, o.Evidence.Responders, 1)
	require.True(t, netip.MustParseAddr(o.Evidence.Responders[0]).IsLinkLocalUnicast())
	require.NoError(t, w.b.Run(func() error {
		ifi, _, err := InterfaceForSubnet(w.subnet)
		if err != nil {
			return err
		}
		for _, a := range interfaceAddrs(ifi) {
			if a.Addr().IsLinkLocalUnicast() {
				return fmt.Errorf("link-local %s left on %s", a, ifi.Name)
			}
		}
		return nil
	}))
}
