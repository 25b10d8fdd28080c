package probes

import (
	"net"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"
)

// startUDPServer serves datagrams on addr in ns with answer, which returns
// the reply (nil for none) and may reply from elsewhere itself.
func startUDPServer(t *testing.T, ns *testNS, addr netip.AddrPort, answer func(pc net.PacketConn, req []byte, from net.Addr) []byte) {
	t.Helper()
	var pc net.PacketConn
	if err := ns.Run(func() (err error) { pc, err = net.ListenPacket("udp", addr.String()); return err }); err != nil {
		t.Fatalf("udp server on %s: %v", addr, err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 2048)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			if reply := answer(pc, append([]byte(nil), buf[:n]...), from); reply != nil {
				_, _ = pc.WriteTo(reply, from)
			}
		}
	}()
	t.Cleanup(func() { pc.Close(); <-done })
}

// ntpStandIn answers only what a real NTP server answers: a 48-byte
// version 3 or 4 client request, with a server reply whose origin
// timestamp is the request's transmit timestamp.
func ntpStandIn(_ net.PacketConn, req []byte, _ net.Addr) []byte {
	if len(req) != 48 || req[0]&7 != 3 || (req[0]>>3)&7 < 3 || (req[0]>>3)&7 > 4 {
		return nil
	}
	r := make([]byte, 48)
	r[0], r[1] = 4<<3|4, 2 // version 4, mode 4 (server); stratum 2
	copy(r[24:32], req[40:48])
	copy(r[32:48], []byte{0xe9, 1, 2, 3, 0, 0, 0, 0, 0xe9, 1, 2, 3, 0, 0, 0, 1})
	return r
}

// tftpStandIn answers a read request as a TFTP server does: an ERROR
// "file not found", sent from a fresh port (its transfer id).
func tftpStandIn(ns *testNS, ip netip.Addr) func(net.PacketConn, []byte, net.Addr) []byte {
	return func(_ net.PacketConn, req []byte, from net.Addr) []byte {
		if len(req) < 4 || req[0] != 0 || req[1] != 1 {
			return nil
		}
		_ = ns.Run(func() error {
			c, err := net.ListenPacket("udp", netip.AddrPortFrom(ip, 0).String())
			if err != nil {
				return err
			}
			defer c.Close()
			_, err = c.WriteTo(append([]byte{0, 5, 0, 1}, "File not found\x00"...), from)
			return err
		})
		return nil
	}
}

// TestPrivilegedUDPProtocolRequests: a UDP probe to a well-known port
// speaks the port's protocol, so a real server answers it: a miekg/dns
// server on 53 and an NTP stand-in on 123 make it arrive (reached, with
// the proof in the reason), a TFTP server's answer from a fresh port is
// arrival too, and a port with nothing behind it is refused by the
// target's port-unreachable, as before.
func TestPrivilegedUDPProtocolRequests(t *testing.T) {
	w := newRoutedWorld(t)
	startDNSServer(t, w.tgt, netip.AddrPortFrom(w.tgtIP, 53))
	startUDPServer(t, w.tgt, netip.AddrPortFrom(w.tgtIP, 123), ntpStandIn)
	startUDPServer(t, w.tgt, netip.AddrPortFrom(w.tgtIP, 69), tftpStandIn(w.tgt, w.tgtIP))
	// A DHCP server on another port, answering DHCPINFORM to the source
	// port as dnsmasq does, with the file field cleared.
	startUDPServer(t, w.tgt, netip.AddrPortFrom(w.tgtIP, 6767), func(_ net.PacketConn, req []byte, _ net.Addr) []byte {
		if len(req) < 243 || req[0] != 1 || req[240] != 53 || req[242] != 8 {
			return nil
		}
		r := append([]byte(nil), req...)
		r[0] = 2
		clear(r[108:236])
		return r
	})
	tests := []struct {
		name    string
		target  netip.Addr
		port    int
		payload string
		rule    rule
		want    Outcome
		request string
		why     string
	}{
		{"dns server on 53", w.tgtIP, 53, "", ruleAccept, Reached, "dns", "DNS reply (NXDOMAIN)"},
		{"ntp server on 123", w.tgtIP, 123, "", ruleAccept, Reached, "ntp", "origin timestamp"},
		{"ntp server ignores the nonce line", w.tgtIP, 123, "nonce", ruleAccept, Silent, "nonce", ""},
		{"ntp request forced on the dns port", w.tgtIP, 53, "ntp", ruleAccept, Refused, "ntp", "does not prove"},
		{"tftp answers from a fresh port", w.tgtIP, 69, "", ruleAccept, Refused, "tftp", "does not prove"},
		{"nothing on 161", w.tgtIP, 161, "", ruleAccept, Refused, "snmp", "port-unreachable"},
		{"nothing on 137 (ipv6)", w.tgtIP6, 137, "", ruleAccept, Refused, "netbios", "port-unreachable"},
		{"nothing on 1900", w.tgtIP, 1900, "", ruleAccept, Refused, "ssdp", "port-unreachable"},
		{"dhcp server answers an inform", w.tgtIP, 6767, "dhcp", ruleAccept, Reached, "dhcp", "BOOTREPLY with our xid"},
		{"dhcp to nothing", w.tgtIP, 67, "", ruleAccept, Refused, "dhcp", "port-unreachable"},
		{"dns server behind a reject", w.tgtIP, 53, "", ruleReject, Rejected, "dns", "port-unreachable from"},
		{"dns server behind a drop", w.tgtIP, 53, "", ruleDrop, Silent, "dns", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w.setRule(t, tt.target, tt.rule)
			nonce := NewNonce()
			wit := startWitness(t, w.tgt, WitnessSpec{ID: "w", Via: w.tgtNet, WindowMS: 10000,
				SrcIPs: []netip.Addr{w.sndIP, w.sndIP6}, Proto: "udp", Port: tt.port})
			o := probeIn(t, w.snd, ProbeSpec{ID: "u", Kind: KindUDP, Target: tt.target, Port: tt.port, Payload: tt.payload,
				Nonce: nonce, DeadlineMS: probeDeadlineMS})
			seen := wit.Stop()
			t.Logf("%s %s request=%s reply=%q icmp=%+v", o.Outcome, o.Reason, o.Evidence.Request, o.Evidence.Reply, o.Evidence.ICMP)
			require.Equal(t, tt.want, o.Outcome, o.Reason)
			require.Equal(t, tt.request, o.Evidence.Request)
			require.Contains(t, o.Reason, tt.why)
			if o.Outcome.Arrived() {
				require.Equal(t, Reached, seen.Outcome, "the witness saw the request arrive")
			} else if tt.rule != ruleAccept {
				require.Equal(t, Silent, seen.Outcome, "nothing arrived")
			}
		})
	}
}
