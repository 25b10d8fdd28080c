package nft

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/mdlayher/arp"
	"github.com/mdlayher/ethernet"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/box-isolation/box/internal/testenv/tier"
)

// pinWorld is a host namespace with bridge boxnet (10.88.0.1) and two
// boxes pinned on it, a (.10) and b (.11), and a bystander bridge "other"
// with box c, which the pin table must never look at. MACs say whose they
// are: 02:..:01 the host, 02:..:0a box a, 02:..:0b box b.
type pinWorld struct {
	host, a, b, c *testNS
	cfg           Config
	caps          Capabilities
	ports         []string
}

var (
	macHost  = mustMAC("02:00:00:00:00:01")
	macA     = mustMAC("02:00:00:00:00:0a")
	macB     = mustMAC("02:00:00:00:00:0b")
	macOther = mustMAC("02:00:00:00:00:ee") // nobody's
	gwAddr   = netip.MustParseAddr("10.88.0.1")
	addrA    = netip.MustParseAddr("10.88.0.10")
	addrB    = netip.MustParseAddr("10.88.0.11")
	addrA2   = netip.MustParseAddr("10.88.0.12") // a's next lease
	anyAddr  = netip.IPv4Unspecified()
	bcast    = netip.MustParseAddr("255.255.255.255")
)

func mustMAC(s string) net.HardwareAddr {
	m, err := net.ParseMAC(s)
	if err != nil {
		panic(err)
	}
	return m
}

func newPinWorld(t *testing.T) *pinWorld {
	t.Helper()
	run := runID()
	w := &pinWorld{host: newNS(t, run, "host")}
	w.cfg = Config{Gateway: gwAddr, NetNS: int(w.host.Handle)}
	for _, k := range []string{"iptables", "ip6tables", "arptables"} {
		_ = w.host.Sysctl("net.bridge.bridge-nf-call-"+k, "0") // as newWorld: only the bridge table acts
	}
	w.host.bridge(t, "boxnet", "10.88.0.1/24")
	require.NoError(t, w.host.Netlink(t).LinkSetHardwareAddr(w.host.Link(t, "boxnet"), macHost))
	// The host takes any ARP at once (no lock time after an update): as
	// easy to poison as a host can be, so no control passes by timing.
	require.NoError(t, w.host.Sysctl("net.ipv4.neigh.boxnet.locktime", "0"))
	w.host.bridge(t, "other", "10.88.1.1/24")
	w.a, w.b, w.c = newNS(t, run, "a"), newNS(t, run, "b"), newNS(t, run, "c")
	for _, bx := range []struct {
		ns   *testNS
		br   string
		port string
		cidr string
		mac  net.HardwareAddr
	}{{w.a, "boxnet", "vA", "10.88.0.10/24", macA}, {w.b, "boxnet", "vB", "10.88.0.11/24", macB}, {w.c, "other", "oC", "10.88.1.2/24", nil}} {
		w.host.plug(t, bx.br, bx.port, bx.ns, bx.cidr)
		if bx.mac != nil {
			require.NoError(t, bx.ns.Netlink(t).LinkSetHardwareAddr(bx.ns.Link(t, "eth0"), bx.mac))
		}
	}
	var err error
	w.caps, err = Probe(w.cfg)
	require.NoError(t, err)
	w.ports, err = bridgePorts(w.cfg.NetNS, "boxnet")
	require.NoError(t, err)
	return w
}

func pinsOf(aAddrs ...netip.Addr) []Pin {
	return []Pin{{Port: "vA", MAC: macA, Addrs: aAddrs}, {Port: "vB", MAC: macB, Addrs: []netip.Addr{addrB}}}
}

// withoutPins runs fn with the pin table deleted (the control: the same
// frames do get through without it) and puts it back.
func (w *pinWorld) withoutPins(t *testing.T, pins []Pin, fn func()) {
	t.Helper()
	removed, err := DeletePins(w.cfg)
	require.NoError(t, err)
	require.True(t, removed, "the pin table was there")
	fn()
	_, err = ApplyPins(w.cfg, w.caps, w.ports, pins)
	require.NoError(t, err)
	f, err := VerifyPins(w.cfg, w.caps, w.ports, pins)
	require.NoError(t, err)
	require.Empty(t, f)
}

// sendFrames writes whole Ethernet frames out of n's eth0, as anything
// root in a box can.
func (n *testNS) sendFrames(t *testing.T, frames ...[]byte) {
	t.Helper()
	if err := n.rawSender(t)(frames...); err != nil {
		t.Fatalf("%s: send frames: %v", n.Name, err)
	}
}

// rawSender opens a packet socket on n's eth0 (closed in cleanup) and
// returns a function that sends frames out of it from any goroutine.
func (n *testNS) rawSender(t *testing.T) func(frames ...[]byte) error {
	t.Helper()
	idx := n.Link(t, "eth0").Attrs().Index
	var fd int
	err := n.Run(func() (err error) {
		fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
		return err
	})
	require.NoError(t, err, "packet socket in %s", n.Name)
	t.Cleanup(func() { unix.Close(fd) })
	return func(frames ...[]byte) error {
		for _, f := range frames {
			if err := unix.Sendto(fd, f, 0, &unix.SockaddrLinklayer{Ifindex: idx}); err != nil {
				return err
			}
		}
		return nil
	}
}

// arpAnswered sends frame out of n's eth0 and reports whether an ARP reply
// that want accepts comes back within probeWait: the host's answer to a
// probe, proof that the probe reached it.
func (n *testNS) arpAnswered(t *testing.T, frame []byte, want func(*arp.Packet) bool) bool {
	t.Helper()
	idx := n.Link(t, "eth0").Attrs().Index
	var got bool
	err := n.Run(func() error {
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(htons(unix.ETH_P_ARP)))
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ARP), Ifindex: idx}); err != nil {
			return err
		}
		tv := unix.NsecToTimeval((50 * time.Millisecond).Nanoseconds())
		if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
			return err
		}
		if err := unix.Sendto(fd, frame, 0, &unix.SockaddrLinklayer{Ifindex: idx}); err != nil {
			return err
		}
		buf := make([]byte, 1600)
		for deadline := time.Now().Add(probeWait); time.Now().Before(deadline); {
			k, _, err := unix.Recvfrom(fd, buf, 0)
			if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
				continue
			}
			if err != nil {
				return err
			}
			var p arp.Packet
			if k >= 14+28 && p.UnmarshalBinary(buf[14:k]) == nil && p.Operation == arp.OperationReply && want(&p) {
				got = true
				return nil
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("%s: ARP exchange: %v", n.Name, err)
	}
	return got
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// neighMAC is n's neighbour entry for ip on link, nil if it has none.
func (n *testNS) neighMAC(t *testing.T, link string, ip netip.Addr) net.HardwareAddr {
	t.Helper()
	ns, err := n.Netlink(t).NeighList(n.Link(t, link).Attrs().Index, netlink.FAMILY_V4)
	require.NoError(t, err)
	for _, e := range ns {
		if a, ok := netip.AddrFromSlice(e.IP.To4()); ok && a == ip && e.State&(netlink.NUD_INCOMPLETE|netlink.NUD_FAILED) == 0 {
			return e.HardwareAddr
		}
	}
	return nil
}

// learnB makes the host hold a fresh neighbour entry for b, the way it
// gets one: by talking to b. Linux only lets ARP change an entry it
// already has.
func (w *pinWorld) learnB(t *testing.T) {
	t.Helper()
	idx := w.host.Link(t, "boxnet").Attrs().Index
	_ = w.host.Netlink(t).NeighDel(&netlink.Neigh{LinkIndex: idx, Family: netlink.FAMILY_V4, IP: net.IP(addrB.AsSlice())})
	require.Equal(t, reached, w.host.ping(t, addrB.String()), "host -> b")
	require.Equal(t, macB, w.host.neighMAC(t, "boxnet", addrB), "the host knows b by b's MAC")
	// A non-gratuitous reply changes the entry only once its lock time
	// (0 here) has passed since the update: a clock tick.
	time.Sleep(30 * time.Millisecond)
}

// eventually polls cond for up to a second.
func eventually(cond func() bool) bool {
	for deadline := time.Now().Add(time.Second); ; time.Sleep(20 * time.Millisecond) {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
	}
}

// sink is a UDP listener in the host namespace that records every
// datagram: the witness that a packet reached the host's stack.
type sink struct {
	mu  sync.Mutex
	got []datagram
}

type datagram struct {
	from netip.AddrPort
	data string
}

func (n *testNS) sink(t *testing.T, addr string) *sink {
	t.Helper()
	s := &sink{}
	err := n.Run(func() error {
		pc, err := net.ListenPacket("udp4", addr)
		if err != nil {
			return err
		}
		t.Cleanup(func() { pc.Close() })
		go func() {
			buf := make([]byte, 1600)
			for {
				k, from, err := pc.ReadFrom(buf)
				if err != nil {
					return
				}
				s.mu.Lock()
				s.got = append(s.got, datagram{from.(*net.UDPAddr).AddrPort(), string(buf[:k])})
				s.mu.Unlock()
			}
		}()
		return nil
	})
	require.NoError(t, err, "listen %s in %s", addr, n.Name)
	return s
}

// from returns the sources of the datagrams that carried nonce.
func (s *sink) from(nonce string) []netip.AddrPort {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []netip.AddrPort
	for _, d := range s.got {
		if strings.Contains(d.data, nonce) {
			out = append(out, d.from)
		}
	}
	return out
}

// arrivals waits until the control nonce has arrived (the witness is
// alive) and then for the rest of probeWait, and returns where each nonce
// came from.
func (s *sink) arrivals(t *testing.T, control string, nonces ...string) map[string][]netip.AddrPort {
	t.Helper()
	start := time.Now()
	require.True(t, eventually(func() bool { return len(s.from(control)) > 0 }), "the control datagram %q never arrived: the witness proves nothing", control)
	time.Sleep(time.Until(start.Add(probeWait)))
	out := map[string][]netip.AddrPort{}
	for _, n := range append(nonces, control) {
		out[n] = s.from(n)
	}
	return out
}

// frame builds an Ethernet frame (padded to the minimum length).
func frame(src, dst net.HardwareAddr, et ethernet.EtherType, payload []byte) []byte {
	b, err := (&ethernet.Frame{Source: src, Destination: dst, EtherType: et, Payload: payload}).MarshalBinary()
	if err != nil {
		panic(err)
	}
	return b
}

// tagged puts an 802.1Q tag with VLAN id 0 (priority only) into f: the
// receiving host treats the frame as untagged.
func tagged(f []byte) []byte {
	return slices.Concat(f[:12], []byte{0x81, 0x00, 0x00, 0x00}, f[12:])
}

// arpFrame is an ARP packet in a frame from src to dst.
func arpFrame(src, dst net.HardwareAddr, op arp.Operation, sha net.HardwareAddr, sip netip.Addr, tha net.HardwareAddr, tip netip.Addr) []byte {
	p, err := arp.NewPacket(op, sha, sip, tha, tip)
	if err != nil {
		panic(err)
	}
	b, _ := p.MarshalBinary()
	return frame(src, dst, ethernet.EtherTypeARP, b)
}

// udpFrame is an IPv4 UDP datagram in a frame, with any source a box
// cares to write.
func udpFrame(src, dst net.HardwareAddr, sip, dip netip.Addr, sport, dport uint16, payload string) []byte {
	udp := binary.BigEndian.AppendUint16(nil, sport)
	udp = binary.BigEndian.AppendUint16(udp, dport)
	udp = binary.BigEndian.AppendUint16(udp, uint16(8+len(payload)))
	udp = append(udp, 0, 0) // no checksum: allowed over IPv4
	udp = append(udp, payload...)
	ip := make([]byte, 20)
	ip[0], ip[8], ip[9] = 0x45, 64, unix.IPPROTO_UDP
	binary.BigEndian.PutUint16(ip[2:], uint16(20+len(udp)))
	s4, d4 := sip.As4(), dip.As4()
	copy(ip[12:], s4[:])
	copy(ip[16:], d4[:])
	var sum uint32
	for i := 0; i < 20; i += 2 {
		sum += uint32(binary.BigEndian.Uint16(ip[i:]))
	}
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	binary.BigEndian.PutUint16(ip[10:], ^uint16(sum))
	return frame(src, dst, ethernet.EtherTypeIPv4, append(ip, udp...))
}

func TestPrivilegedPins(t *testing.T) {
	requireRoot(t)
	w := newPinWorld(t)
	cfg, caps, ports := w.cfg, w.caps, w.ports
	pins := pinsOf(addrA)
	t.Logf("mode %s; ports %v", caps.Mode(), ports)
	require.Equal(t, []string{"vA", "vB"}, ports)
	sink := w.host.sink(t, "0.0.0.0:7000")
	dhcp := w.host.sink(t, "0.0.0.0:67")

	present, err := PinsPresent(cfg)
	require.NoError(t, err)
	require.False(t, present)
	changes, err := ApplyPins(cfg, caps, ports, pins)
	require.NoError(t, err)
	assert.Equal(t, []string{"created table bridge box_pin"}, changes)
	present, err = PinsPresent(cfg)
	require.NoError(t, err)
	require.True(t, present)
	f, err := VerifyPins(cfg, caps, ports, pins)
	require.NoError(t, err)
	require.Empty(t, f, "VerifyPins after ApplyPins")
	again, err := ApplyPins(cfg, caps, ports, pins)
	require.NoError(t, err)
	assert.Empty(t, again, "a second ApplyPins changes nothing")

	t.Run("held pins", func(t *testing.T) {
		other := netip.MustParseAddr("10.88.0.99")
		for _, tc := range []struct {
			name string
			pins []Pin
			want bool
		}{
			{"both as applied", pins, true},
			{"b alone", pins[1:], true},
			{"a at another address", pinsOf(other)[:1], false},
			{"a with an address more", pinsOf(addrA, other)[:1], false},
			{"a with none", pinsOf()[:1], false},
			{"a with b's MAC", []Pin{{Port: "vA", MAC: macB, Addrs: []netip.Addr{addrA}}}, false},
			{"a port with no pin", []Pin{{Port: "vC", MAC: macA, Addrs: []netip.Addr{addrA}}}, false},
		} {
			held, err := PinsHeld(cfg, tc.pins)
			require.NoError(t, err, tc.name)
			assert.Equal(t, tc.want, held, tc.name)
		}
		addrs, err := PinnedAddrs(cfg)
		require.NoError(t, err)
		assert.ElementsMatch(t, []netip.Addr{addrA, addrB}, addrs, "the addresses bound")
		w.withoutPins(t, pins, func() {
			held, err := PinsHeld(cfg, pins)
			require.NoError(t, err)
			assert.False(t, held, "no pin table holds nothing")
			addrs, err := PinnedAddrs(cfg)
			require.NoError(t, err)
			assert.Empty(t, addrs, "no pin table binds nothing")
		})
	})

	t.Run("matches nft's own reading", func(t *testing.T) {
		nft := tier.Tool(t, "nft", "nftables")
		out, err := exec.Command("ip", "netns", "exec", w.host.Name, nft, "list", "table", "bridge", "box_pin").CombinedOutput()
		require.NoError(t, err, "%s", out)
		r, err := DesiredPins(cfg, caps, ports, pins)
		require.NoError(t, err)
		r.Tables[0].Sets = slices.Clone(r.Tables[0].Sets)
		for i := range r.Tables[0].Sets {
			r.Tables[0].Sets[i].Elements = nil // nft wraps them its own way; VerifyPins compared them
		}
		assert.Equal(t, r.String(), dropElements(string(out)))
	})

	t.Run("own traffic passes", func(t *testing.T) {
		// a has not talked to the host yet: the ping needs a's ARP for
		// the gateway (sender a's address and MAC) and its answer.
		assert.Equal(t, reached, w.a.ping(t, gwAddr.String()), "a -> gateway from its own address")
		assert.Equal(t, reached, w.b.ping(t, gwAddr.String()), "b -> gateway")
		own := "own-" + runID()
		discover := "discover-" + runID()
		w.a.sendFrames(t, udpFrame(macA, macHost, addrA, gwAddr, 40000, 7000, own),
			udpFrame(macA, ethernet.Broadcast, anyAddr, bcast, 68, 67, dhcpMsg(dhcpDiscover, 1, macA, anyAddr, discover)))
		assert.Equal(t, []netip.AddrPort{netip.AddrPortFrom(addrA, 40000)}, sink.arrivals(t, own)[own], "a's datagram from its own address")
		assert.Equal(t, []netip.AddrPort{netip.AddrPortFrom(anyAddr, 68)}, dhcp.arrivals(t, discover)[discover], "a DHCP discover from 0.0.0.0")
		// An ARP probe (RFC 5227) for the gateway's address: the host
		// answers it, which proves it arrived.
		probe := arpFrame(macA, ethernet.Broadcast, arp.OperationRequest, macA, anyAddr, make(net.HardwareAddr, 6), gwAddr)
		assert.True(t, w.a.arpAnswered(t, probe, func(p *arp.Packet) bool {
			return p.SenderIP == gwAddr && bytes.Equal(p.TargetHardwareAddr, macA)
		}), "the host answers a's ARP probe")
		assert.Equal(t, reached, w.c.ping(t, "10.88.1.1"), "c on bridge other is never looked at")
	})

	t.Run("forged ARP does not poison the host", func(t *testing.T) {
		for _, tc := range []struct {
			name  string
			frame []byte
		}{
			{"gratuitous ARP request claiming b's address", arpFrame(macA, ethernet.Broadcast, arp.OperationRequest, macA, addrB, ethernet.Broadcast, addrB)},
			// A gratuitous reply names the sender as target too (Linux
			// takes it as gratuitous only then).
			{"gratuitous ARP reply claiming b's address", arpFrame(macA, ethernet.Broadcast, arp.OperationReply, macA, addrB, macA, addrB)},
			{"ARP reply to the host claiming b's address", arpFrame(macA, macHost, arp.OperationReply, macA, addrB, macHost, gwAddr)},
			{"the same gratuitous ARP in an 802.1Q priority tag", tagged(arpFrame(macA, ethernet.Broadcast, arp.OperationRequest, macA, addrB, ethernet.Broadcast, addrB))},
		} {
			t.Run(tc.name, func(t *testing.T) {
				w.learnB(t)
				w.a.sendFrames(t, tc.frame)
				time.Sleep(300 * time.Millisecond)
				assert.Equal(t, macB, w.host.neighMAC(t, "boxnet", addrB), "pinned: the host still has b's MAC for b")
				w.withoutPins(t, pins, func() {
					w.learnB(t)
					w.a.sendFrames(t, tc.frame)
					assert.True(t, eventually(func() bool { return bytes.Equal(w.host.neighMAC(t, "boxnet", addrB), macA) }),
						"control, no pin table: the host takes a's MAC for b (has %v)", w.host.neighMAC(t, "boxnet", addrB))
				})
			})
		}
		w.learnB(t)

		// A probe whose sender hardware address is not the sending port's:
		// the host answers it (to that address, flooded) only without pins.
		probe := arpFrame(macA, ethernet.Broadcast, arp.OperationRequest, macOther, anyAddr, make(net.HardwareAddr, 6), gwAddr)
		answered := func(p *arp.Packet) bool { return p.SenderIP == gwAddr && bytes.Equal(p.TargetHardwareAddr, macOther) }
		assert.False(t, w.a.arpAnswered(t, probe, answered), "pinned: an ARP probe with another sender MAC is dropped")
		w.withoutPins(t, pins, func() {
			assert.True(t, w.a.arpAnswered(t, probe, answered), "control, no pin table: the host answers it")
		})
	})

	t.Run("forged IPv4 source does not reach the host", func(t *testing.T) {
		send := func() (forged, forgedTagged, control string) {
			forged, forgedTagged, control = "forged-"+runID(), "tagged-"+runID(), "control-"+runID()
			w.a.sendFrames(t,
				udpFrame(macA, macHost, addrB, gwAddr, 40001, 7000, forged),
				tagged(udpFrame(macA, macHost, addrB, gwAddr, 40001, 7000, forgedTagged)),
				udpFrame(macA, macHost, addrA, gwAddr, 40002, 7000, control))
			return
		}
		forged, forgedTagged, control := send()
		got := sink.arrivals(t, control, forged, forgedTagged)
		assert.Empty(t, got[forged], "pinned: a's datagram with b's source address")
		assert.Empty(t, got[forgedTagged], "pinned: the same in an 802.1Q priority tag")
		w.withoutPins(t, pins, func() {
			forged, forgedTagged, control := send()
			got := sink.arrivals(t, control, forged, forgedTagged)
			fromB := []netip.AddrPort{netip.AddrPortFrom(addrB, 40001)}
			assert.Equal(t, fromB, got[forged], "control, no pin table: it arrives as from b")
			assert.Equal(t, fromB, got[forgedTagged], "control, no pin table: the tagged one arrives too")
		})
	})

	t.Run("DHCP names the port's own MAC, whole", func(t *testing.T) {
		// Each message is sent by a from its own MAC (and, unicast, its own
		// address), so only the DHCP rules can stop it; the host's DHCP
		// port is the witness. A control of a's own arrives with each.
		long := slices.Concat(macA, []byte{0xb0, 0xc5, 1, 2, 3, 4, 5, 6, 7, 8})
		for _, tc := range []struct {
			name string
			send func(nonce string) [][]byte
		}{
			{"a RELEASE naming b", func(n string) [][]byte {
				return [][]byte{udpFrame(macA, macHost, addrA, gwAddr, 68, 67, dhcpMsg(dhcpRelease, 1, macB, addrB, n, dhcpOpt(54, gwAddr.AsSlice())))}
			}},
			{"a DECLINE naming b", func(n string) [][]byte {
				return [][]byte{udpFrame(macA, ethernet.Broadcast, addrA, bcast, 68, 67, dhcpMsg(dhcpDecline, 1, macB, anyAddr, n,
					dhcpOpt(50, addrB.AsSlice()), dhcpOpt(54, gwAddr.AsSlice())))}
			}},
			{"a DISCOVER for a made-up hardware address", func(n string) [][]byte {
				return [][]byte{udpFrame(macA, ethernet.Broadcast, anyAddr, bcast, 68, 67, dhcpMsg(dhcpDiscover, 1, macOther, anyAddr, n, dhcpOpt(80, nil)))}
			}},
			{"a DISCOVER for a's MAC as IEEE 802 (htype 6)", func(n string) [][]byte {
				return [][]byte{udpFrame(macA, ethernet.Broadcast, anyAddr, bcast, 68, 67, dhcpMsg(dhcpDiscover, 6, macA, anyAddr, n))}
			}},
			{"a DISCOVER for a's MAC and 10 bytes more (hlen 16)", func(n string) [][]byte {
				return [][]byte{udpFrame(macA, ethernet.Broadcast, anyAddr, bcast, 68, 67, dhcpMsg(dhcpDiscover, 1, long, anyAddr, n))}
			}},
			{"a DISCOVER for a made-up address in two fragments", func(n string) [][]byte {
				return fragmented(udpFrame(macA, ethernet.Broadcast, anyAddr, bcast, 68, 67, dhcpMsg(dhcpDiscover, 1, macOther, anyAddr, n)), 8)
			}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				send := func() (forged, control string) {
					forged, control = "forged-"+runID(), "control-"+runID()
					w.a.sendFrames(t, tc.send(forged)...)
					w.a.sendFrames(t, udpFrame(macA, ethernet.Broadcast, anyAddr, bcast, 68, 67, dhcpMsg(dhcpDiscover, 1, macA, anyAddr, control)))
					return
				}
				forged, control := send()
				assert.Empty(t, dhcp.arrivals(t, control, forged)[forged], "pinned: dropped")
				w.withoutPins(t, pins, func() {
					forged, control := send()
					assert.NotEmpty(t, dhcp.arrivals(t, control, forged)[forged], "control, no pin table: it reaches the host's DHCP port")
				})
			})
		}
	})

	t.Run("a port with no pin yet may only ask for an address", func(t *testing.T) {
		// b's port is in the scope with no pin, as a box's is from its
		// link event until Incus names its box: it may send a whole
		// DISCOVER or REQUEST from 0.0.0.0 and nothing else. a, pinned,
		// still may not ask for another MAC.
		_, err := SetPins(cfg, ports, pins[:1])
		require.NoError(t, err)
		t.Cleanup(func() {
			_, err := SetPins(cfg, ports, pins)
			require.NoError(t, err)
		})
		for _, tc := range []struct {
			name   string
			from   *testNS
			frames func(n string) [][]byte
			passes bool
		}{
			{"b's DISCOVER", w.b, func(n string) [][]byte {
				return [][]byte{udpFrame(macB, ethernet.Broadcast, anyAddr, bcast, 68, 67, dhcpMsg(dhcpDiscover, 1, macB, anyAddr, n))}
			}, true},
			{"b's REQUEST", w.b, func(n string) [][]byte {
				return [][]byte{udpFrame(macB, ethernet.Broadcast, anyAddr, bcast, 68, 67, dhcpMsg(dhcpRequest, 1, macB, anyAddr, n, dhcpOpt(50, addrB.AsSlice())))}
			}, true},
			{"b's DECLINE naming a", w.b, func(n string) [][]byte {
				return [][]byte{udpFrame(macB, ethernet.Broadcast, anyAddr, bcast, 68, 67, dhcpMsg(dhcpDecline, 1, macA, anyAddr, n, dhcpOpt(50, addrA.AsSlice())))}
			}, false},
			{"b's RELEASE naming a, from 0.0.0.0", w.b, func(n string) [][]byte {
				return [][]byte{udpFrame(macB, ethernet.Broadcast, anyAddr, bcast, 68, 67, dhcpMsg(dhcpRelease, 1, macA, anyAddr, n))}
			}, false},
			{"b's DISCOVER from an address", w.b, func(n string) [][]byte {
				return [][]byte{udpFrame(macB, ethernet.Broadcast, addrB, bcast, 68, 67, dhcpMsg(dhcpDiscover, 1, macB, anyAddr, n))}
			}, false},
			{"b's DISCOVER as IEEE 802 (htype 6)", w.b, func(n string) [][]byte {
				return [][]byte{udpFrame(macB, ethernet.Broadcast, anyAddr, bcast, 68, 67, dhcpMsg(dhcpDiscover, 6, macB, anyAddr, n))}
			}, false},
			{"b's DISCOVER in two fragments", w.b, func(n string) [][]byte {
				return fragmented(udpFrame(macB, ethernet.Broadcast, anyAddr, bcast, 68, 67, dhcpMsg(dhcpDiscover, 1, macB, anyAddr, n)), 8)
			}, false},
			{"a datagram from b to the host", w.b, func(n string) [][]byte {
				return [][]byte{udpFrame(macB, macHost, addrB, gwAddr, 40001, 67, n)}
			}, false},
			{"a's DISCOVER for b's MAC (a is pinned)", w.a, func(n string) [][]byte {
				return [][]byte{udpFrame(macA, ethernet.Broadcast, anyAddr, bcast, 68, 67, dhcpMsg(dhcpDiscover, 1, macB, anyAddr, n))}
			}, false},
		} {
			t.Run(tc.name, func(t *testing.T) {
				n := "unpinned-" + runID()
				tc.from.sendFrames(t, tc.frames(n)...)
				control := "control-" + runID()
				w.a.sendFrames(t, udpFrame(macA, ethernet.Broadcast, anyAddr, bcast, 68, 67, dhcpMsg(dhcpDiscover, 1, macA, anyAddr, control)))
				got := dhcp.arrivals(t, control, n)[n]
				if tc.passes {
					assert.NotEmpty(t, got, "it reaches the host's DHCP port")
				} else {
					assert.Empty(t, got, "dropped")
				}
			})
		}
		assert.Equal(t, silent, w.b.ping(t, gwAddr.String()), "b, unpinned, pings nothing")
	})

	t.Run("a box that changes its MAC is cut off", func(t *testing.T) {
		setMAC := func(m net.HardwareAddr) {
			require.NoError(t, w.a.Netlink(t).LinkSetHardwareAddr(w.a.Link(t, "eth0"), m))
		}
		setMAC(macOther)
		t.Cleanup(func() { setMAC(macA) })
		assert.Equal(t, silent, w.a.ping(t, gwAddr.String()), "pinned: a with a new MAC")
		w.withoutPins(t, pins, func() {
			assert.Equal(t, reached, w.a.ping(t, gwAddr.String()), "control, no pin table: the new MAC works")
		})
		setMAC(macA)
		assert.Equal(t, reached, w.a.ping(t, gwAddr.String()), "a with its own MAC again")
	})

	t.Run("lease change without a window", func(t *testing.T) {
		// a's lease moves from .10 to .12. While SetPins runs, a sends a
		// datagram from .10, .12 and b's .11 every millisecond, and the
		// host's nftables events are watched.
		mc, err := nftables.New(nftables.WithNetNSFd(cfg.NetNS))
		require.NoError(t, err)
		mon := nftables.NewMonitor(nftables.WithMonitorEventBuffer(64))
		events, err := mc.AddGenerationalMonitor(mon)
		require.NoError(t, err)
		t.Cleanup(func() { _ = mon.Close() })

		tag := runID()
		send := w.a.rawSender(t)
		stop := make(chan struct{})
		type result struct {
			rounds int
			err    error
		}
		sent := make(chan result)
		go func() {
			i := 0
			for ; ; i++ {
				select {
				case <-stop:
					sent <- result{i, nil}
					return
				default:
				}
				var fs [][]byte
				for _, src := range []netip.Addr{addrA, addrA2, addrB} {
					fs = append(fs, udpFrame(macA, macHost, src, gwAddr, 40003, 7000, fmt.Sprintf("%s-%s-%d", tag, src, i)))
				}
				if err := send(fs...); err != nil {
					sent <- result{i, err}
					return
				}
				time.Sleep(time.Millisecond)
			}
		}()
		time.Sleep(200 * time.Millisecond)
		newPins := pinsOf(addrA2)
		changed, err := SetPins(cfg, ports, newPins)
		require.NoError(t, err)
		assert.True(t, changed)
		pins = newPins
		time.Sleep(200 * time.Millisecond)
		close(stop)
		res := <-sent
		require.NoError(t, res.err, "sending from a")
		rounds := res.rounds
		time.Sleep(100 * time.Millisecond)

		// One transaction, element changes only: the kernel went from the
		// old pins to the new ones in one step.
		var gens []*nftables.MonitorEvents
		for len(events) > 0 {
			gens = append(gens, <-events)
		}
		require.Len(t, gens, 1, "SetPins commits one generation")
		require.NotEmpty(t, gens[0].Changes)
		for _, e := range gens[0].Changes {
			assert.Contains(t, []nftables.MonitorEventType{nftables.MonitorEventTypeNewSetElem, nftables.MonitorEventTypeDelSetElem}, e.Type,
				"only set elements change (event %d)", e.Type)
		}

		count := map[netip.Addr]int{}
		sink.mu.Lock()
		for _, d := range sink.got {
			for _, src := range []netip.Addr{addrA, addrA2, addrB} {
				if bytes.HasPrefix([]byte(d.data), []byte(fmt.Sprintf("%s-%s-", tag, src))) {
					count[src]++
				}
			}
		}
		sink.mu.Unlock()
		t.Logf("%d rounds sent; arrived from .10: %d, .12: %d, .11: %d", rounds, count[addrA], count[addrA2], count[addrB])
		assert.Zero(t, count[addrB], "b's address never passed from a, not even during the change")
		assert.Positive(t, count[addrA], "the old lease worked until the change")
		assert.Positive(t, count[addrA2], "the new lease works after it")
		// Each round sends from both leases; at most the round the switch
		// fell into has both arrive.
		assert.LessOrEqual(t, count[addrA]+count[addrA2], rounds+1, "one of .10 and .12 at a time")

		old, cur, control := "old-"+runID(), "new-"+runID(), "ctl-"+runID()
		w.a.sendFrames(t, udpFrame(macA, macHost, addrA, gwAddr, 40004, 7000, old), udpFrame(macA, macHost, addrA2, gwAddr, 40004, 7000, control))
		assert.Empty(t, sink.arrivals(t, control, old, cur)[old], "the old lease no longer passes")

		// a moves to its new address, as its DHCP client would.
		old4, err := netlink.ParseAddr("10.88.0.10/24")
		require.NoError(t, err)
		require.NoError(t, w.a.Netlink(t).AddrDel(w.a.Link(t, "eth0"), old4))
		w.a.AddAddr(t, "eth0", "10.88.0.12/24")
		assert.Equal(t, reached, w.a.ping(t, gwAddr.String()), "a -> gateway from its new address")

		f, err := VerifyPins(cfg, caps, ports, newPins)
		require.NoError(t, err)
		assert.Empty(t, f)
		f, err = VerifyPins(cfg, caps, ports, pinsOf(addrA))
		require.NoError(t, err)
		assert.Equal(t, []Finding{{Object: "table bridge box_pin set bind", Problem: "pin for vA stale: want 10.88.0.10, has 10.88.0.12"}}, f,
			"against the old leases the table is stale")
		changed, err = SetPins(cfg, ports, newPins)
		require.NoError(t, err)
		assert.False(t, changed, "a second SetPins is a no-op")
	})

	t.Run("drift is found and repaired", func(t *testing.T) {
		// A hand-added element lets a claim b's address.
		c, err := nftables.New(nftables.WithNetNSFd(cfg.NetNS))
		require.NoError(t, err)
		tbl := &nftables.Table{Family: nftables.TableFamilyBridge, Name: "box_pin"}
		bind := Set{Name: "bind", Type: "ifname . ipv4_addr"}
		require.NoError(t, c.SetAddElements(nftSet(tbl, bind, 0), elements(bind.Type, []string{"vA . 10.88.0.11"})))
		require.NoError(t, c.Flush())
		f, err := VerifyPins(cfg, caps, ports, pins)
		require.NoError(t, err)
		assert.Equal(t, []Finding{{Object: "table bridge box_pin set bind", Problem: "pin for vA stale: want 10.88.0.12, has 10.88.0.11, 10.88.0.12"}}, f)
		changes, err := ApplyPins(cfg, caps, ports, pins)
		require.NoError(t, err)
		assert.Equal(t, []string{"updated set bind in table bridge box_pin: removed vA . 10.88.0.11"}, changes)

		// A rule taken out: the MAC check.
		rules, err := c.GetRules(tbl, &nftables.Chain{Name: "prerouting", Table: tbl})
		require.NoError(t, err)
		require.NoError(t, c.DelRule(rules[1]))
		require.NoError(t, c.Flush())
		f, err = VerifyPins(cfg, caps, ports, pins)
		require.NoError(t, err)
		require.Len(t, f, 1)
		assert.Equal(t, "table bridge box_pin chain prerouting", f[0].Object)
		assert.Contains(t, f[0].Problem, "rule 2 missing: want `iifname @boxnet_ports iifname . ether saddr != @hw drop`")
		changes, err = ApplyPins(cfg, caps, ports, pins)
		require.NoError(t, err)
		assert.Equal(t, []string{"replaced the rules of chain bridge box_pin prerouting (1 rule missing)"}, changes)
		f, err = VerifyPins(cfg, caps, ports, pins)
		require.NoError(t, err)
		assert.Empty(t, f)
	})

	t.Run("a port without a pin is cut off", func(t *testing.T) {
		onlyA := pinsOf(addrA2)[:1]
		_, err := SetPins(cfg, ports, onlyA)
		require.NoError(t, err)
		assert.Equal(t, silent, w.b.ping(t, gwAddr.String()), "b, in the port set with no pin")
		_, err = SetPins(cfg, ports, pins)
		require.NoError(t, err)
		assert.Equal(t, reached, w.b.ping(t, gwAddr.String()), "b pinned again")
	})

	t.Run("delete", func(t *testing.T) {
		removed, err := DeletePins(cfg)
		require.NoError(t, err)
		assert.True(t, removed)
		removed, err = DeletePins(cfg)
		require.NoError(t, err)
		assert.False(t, removed, "a second DeletePins is a no-op")
		_, err = SetPins(cfg, ports, pins)
		assert.ErrorIs(t, err, ErrNotApplied)
		inet, bridge, err := Present(cfg)
		require.NoError(t, err)
		assert.False(t, inet || bridge, "the pin table is not the bridge drop")
	})
}

// TestPrivilegedPinsAtomic asks for bridge-meta mode whatever the kernel
// supports: where it lacks it, the batch fails whole and no table is left.
func TestPrivilegedPinsAtomic(t *testing.T) {
	requireRoot(t)
	host := newNS(t, runID(), "pinatomic")
	cfg := Config{NetNS: int(host.Handle)}
	caps, err := Probe(cfg)
	require.NoError(t, err)
	pins := pinsOf(addrA)
	changes, err := ApplyPins(cfg, Capabilities{BridgeMeta: true}, nil, pins)
	if caps.BridgeMeta {
		require.NoError(t, err)
		assert.Equal(t, []string{"created table bridge box_pin"}, changes)
		return
	}
	require.Error(t, err, "the kernel lacks bridge meta, so the batch must fail")
	t.Logf("ApplyPins in bridge-meta mode on this kernel: %v", err)
	present, err := PinsPresent(cfg)
	require.NoError(t, err)
	assert.False(t, present, "a failed batch leaves nothing")

	// In port-set mode SetPins keeps the table's own port set current.
	_, err = ApplyPins(cfg, caps, []string{"vA"}, pins)
	require.NoError(t, err)
	_, err = SetPins(cfg, []string{"vA", "vB"}, pins)
	require.NoError(t, err)
	f, err := VerifyPins(cfg, caps, []string{"vA", "vB"}, pins)
	require.NoError(t, err)
	assert.Empty(t, f, "SetPins kept the port set current")
}

// DHCP message types (RFC 2132 option 53).
const (
	dhcpDiscover = 1
	dhcpRequest  = 3
	dhcpDecline  = 4
	dhcpRelease  = 7
)

// dhcpMsg is a DHCP message from a client of hardware type htype: the
// BOOTP header naming chaddr (hlen its length) and ciaddr, nonce in its
// server name field (where no server looks, and a witness finds it), the
// magic cookie, the message type and opts.
func dhcpMsg(typ byte, htype byte, chaddr []byte, ciaddr netip.Addr, nonce string, opts ...[]byte) string {
	m := make([]byte, 236)
	m[0], m[1], m[2] = 1, htype, byte(len(chaddr))
	binary.BigEndian.PutUint32(m[4:], 0x0b0c5000)
	c := ciaddr.As4()
	copy(m[12:], c[:])
	copy(m[28:44], chaddr)
	copy(m[44:108], nonce)
	m = append(m, 99, 130, 83, 99, 53, 1, typ)
	for _, o := range opts {
		m = append(m, o...)
	}
	return string(append(m, 255))
}

// dhcpOpt is one DHCP option.
func dhcpOpt(code byte, val []byte) []byte { return append([]byte{code, byte(len(val))}, val...) }

// fragmented splits an IPv4 frame into two fragments, the first carrying
// the first n bytes (a multiple of 8) of its payload.
func fragmented(f []byte, n int) [][]byte {
	ip := f[14:]
	ihl := int(ip[0]&0x0f) * 4
	total := int(binary.BigEndian.Uint16(ip[2:]))
	payload := ip[ihl:total]
	var out [][]byte
	for i, part := range [][]byte{payload[:n], payload[n:]} {
		h := slices.Clone(ip[:ihl])
		binary.BigEndian.PutUint16(h[2:], uint16(ihl+len(part)))
		frag := uint16(0x2000) // more fragments
		if i == 1 {
			frag = uint16(n / 8)
		}
		binary.BigEndian.PutUint16(h[6:], frag)
		h[10], h[11] = 0, 0
		var sum uint32
		for k := 0; k < ihl; k += 2 {
			sum += uint32(binary.BigEndian.Uint16(h[k:]))
		}
		for sum > 0xffff {
			sum = sum>>16 + sum&0xffff
		}
		binary.BigEndian.PutUint16(h[10:], ^uint16(sum))
		out = append(out, frame(net.HardwareAddr(f[6:12]), net.HardwareAddr(f[0:6]), ethernet.EtherTypeIPv4, append(h, part...)))
	}
	return out
}
