package probes

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// spoofWorld is the bridge world with an address on the bridge itself, as
// an Incus host has on its bridge: br is the host, a the box that forges,
// b the peer whose identity a takes.
type spoofWorld struct {
	*bridgeWorld
	hostIP  netip.Addr
	hostMAC net.HardwareAddr
	nl      *netlink.Handle
	br0     int
}

func newSpoofWorld(t *testing.T) *spoofWorld {
	t.Helper()
	w := &spoofWorld{bridgeWorld: newBridgeWorld(t), hostIP: netip.MustParseAddr("10.202.0.254")}
	w.br.AddAddr(t, "br0", "10.202.0.254/24")
	w.nl = w.br.Netlink(t)
	l := w.br.Link(t, "br0")
	w.br0, w.hostMAC = l.Attrs().Index, l.Attrs().HardwareAddr
	return w
}

// entry is the host's neighbour entry for ip: its MAC and state, "" when
// there is none.
func (w *spoofWorld) entry(t *testing.T, ip netip.Addr) (string, string) {
	t.Helper()
	ns, err := w.nl.NeighList(w.br0, netlink.FAMILY_V4)
	require.NoError(t, err)
	for _, n := range ns {
		if a, ok := netip.AddrFromSlice(n.IP); ok && a.Unmap() == ip {
			return n.HardwareAddr.String(), nudName(n.State)
		}
	}
	return "", ""
}

func nudName(s int) string {
	for _, x := range []struct {
		bit  int
		name string
	}{{netlink.NUD_INCOMPLETE, "INCOMPLETE"}, {netlink.NUD_REACHABLE, "REACHABLE"}, {netlink.NUD_STALE, "STALE"},
		{netlink.NUD_DELAY, "DELAY"}, {netlink.NUD_PROBE, "PROBE"}, {netlink.NUD_FAILED, "FAILED"},
		{netlink.NUD_NOARP, "NOARP"}, {netlink.NUD_PERMANENT, "PERMANENT"}} {
		if s&x.bit != 0 {
			return x.name
		}
	}
	return fmt.Sprintf("state-%#x", s)
}

// forget drops the host's entry for b, whatever it is.
func (w *spoofWorld) forget(t *testing.T) {
	t.Helper()
	err := w.nl.NeighDel(&netlink.Neigh{LinkIndex: w.br0, Family: netlink.FAMILY_V4, IP: w.bIP.AsSlice()})
	if err != nil && !errors.Is(err, unix.ENOENT) {
		t.Fatalf("delete the host's entry for %s: %v", w.bIP, err)
	}
}

// learnPeer makes the host learn b at b's own MAC the way traffic does: it
// forgets b and pings it.
func (w *spoofWorld) learnPeer(t *testing.T) {
	t.Helper()
	w.forget(t)
	o := probeIn(t, w.br, ProbeSpec{ID: "ping", Kind: KindICMP, Target: w.bIP, DeadlineMS: probeDeadlineMS})
	require.Equal(t, Reached, o.Outcome, "the host pings b: %s", o.Reason)
	mac, state := w.entry(t, w.bIP)
	require.Equal(t, w.bMAC.String(), mac, "the host learnt b at b's MAC (%s)", state)
}

// pinPeer gives the host a permanent entry for b at b's MAC, as an
// operator would; it is removed in cleanup.
func (w *spoofWorld) pinPeer(t *testing.T) {
	t.Helper()
	w.forget(t)
	require.NoError(t, w.nl.NeighSet(&netlink.Neigh{LinkIndex: w.br0, Family: netlink.FAMILY_V4, State: netlink.NUD_PERMANENT,
		IP: w.bIP.AsSlice(), HardwareAddr: w.bMAC}))
	t.Cleanup(func() { w.forget(t) })
}

// locktime is the host's ARP locktime on br0: within it of the last
// change, Linux ignores an ARP that would change the entry's MAC.
func (w *spoofWorld) locktime(t *testing.T) time.Duration {
	t.Helper()
	var raw []byte
	require.NoError(t, w.br.Run(func() (err error) {
		raw, err = os.ReadFile("/proc/sys/net/ipv4/neigh/br0/locktime")
		return err
	}))
	// In USER_HZ, hundredths of a second.
	n, err := strconv.Atoi(strings.TrimSpace(string(raw)))
	require.NoError(t, err)
	return time.Duration(n) * 10 * time.Millisecond
}

// spoofRow is one forged ARP and what it does to the host's entry for b.
type spoofRow struct {
	name string
	spec ProbeSpec // op, target, dst_mac, src_mac
	op   string    // the ARP operation on the wire
}

func (w *spoofWorld) spoofRows(forged net.HardwareAddr) []spoofRow {
	other := netip.MustParseAddr("10.202.0.77") // nobody has it
	rows := []spoofRow{
		{"gratuitous", ProbeSpec{Op: ARPOpGratuitous}, "request"},
		{"reply", ProbeSpec{Op: ARPOpReply, Target: w.hostIP, DstMAC: w.hostMAC.String()}, "reply"},
		{"request to the host", ProbeSpec{Op: ARPOpRequest, Target: w.hostIP}, "request"},
		{"request for another address", ProbeSpec{Op: ARPOpRequest, Target: other}, "request"},
	}
	for _, r := range rows[:3] {
		r.name += " from a forged MAC"
		r.spec.SrcMAC = forged.String()
		rows = append(rows, r)
	}
	return rows
}

// spoof runs one arp_spoof probe from a claiming b's address, with a
// witness on the host keyed on the MAC the frames claim to come from.
func (w *spoofWorld) spoof(t *testing.T, r spoofRow) (Observation, Observation, net.HardwareAddr) {
	t.Helper()
	sha := w.aMAC
	if r.spec.SrcMAC != "" {
		sha, _ = net.ParseMAC(r.spec.SrcMAC)
	}
	wit := startWitness(t, w.br, WitnessSpec{ID: "w", Via: w.subnet, WindowMS: 5000, SrcMACs: []string{sha.String()}, Proto: "arp"})
	spec := r.spec
	spec.ID, spec.Kind, spec.Via, spec.ARPSenderIP, spec.DeadlineMS = "spoof", KindARPSpoof, w.subnet, w.bIP, probeDeadlineMS
	o := probeIn(t, w.a, spec)
	// The host's stack takes each frame right after its capture does.
	time.Sleep(50 * time.Millisecond)
	return o, wit.Stop(), sha
}

// TestPrivilegedARPSpoof: a box's forged ARP claiming its peer's address
// really poisons the host's neighbour entry for the peer, which the host
// learnt by talking to the peer more than a locktime before: after it the
// host sends the peer's traffic to the forger's MAC (or to the forged
// MAC). That is what makes arp_spoof an attack a drill check can fail on.
// A witness on the host records the frames with their ARP operation and
// sender. A permanent entry does not move: the check sees "unchanged"
// when nothing changed.
func TestPrivilegedARPSpoof(t *testing.T) {
	w := newSpoofWorld(t)
	lock := w.locktime(t)
	t.Logf("host ARP locktime on br0: %s", lock)
	forged, _ := net.ParseMAC("02:5e:00:00:00:99")
	for _, r := range w.spoofRows(forged) {
		t.Run(r.name, func(t *testing.T) {
			w.learnPeer(t)
			time.Sleep(lock + 200*time.Millisecond)
			o, seen, sha := w.spoof(t, r)
			mac, state := w.entry(t, w.bIP)
			t.Logf("probe: %s %s; witness: %s %s first=%+v; host entry for %s: %s %s",
				o.Outcome, o.Reason, seen.Outcome, seen.Reason, seen.Evidence.Witness.First, w.bIP, mac, state)

			require.Equal(t, Silent, o.Outcome, o.Reason)
			require.Equal(t, spoofSends, o.Evidence.Sent)
			require.Equal(t, w.bIP.String(), o.Evidence.Source, "source is the claimed address")
			require.Equal(t, sha.String(), o.Evidence.MAC)
			require.Equal(t, "veth-a", o.Evidence.Interface)
			require.Contains(t, o.Reason, "claiming "+w.bIP.String()+" at "+sha.String())

			require.Equal(t, Reached, seen.Outcome, seen.Reason)
			require.Equal(t, o.Evidence.Sent, seen.Evidence.Witness.Count, "every forged frame arrived at the host")
			f := seen.Evidence.Witness.First
			require.Equal(t, r.op, f.ARPOp)
			require.Equal(t, sha.String(), f.SrcMAC, "the Ethernet source is the one claimed")
			require.Equal(t, sha.String(), f.ARPSenderMAC, "the ARP sender is the one claimed")
			require.Equal(t, w.bIP.String(), f.SrcIP, "the frame claims b's address")

			require.Equal(t, sha.String(), mac, "the host's entry for b now points at the forger (%s)", state)
		})
	}
	t.Run("a permanent entry holds", func(t *testing.T) {
		w.pinPeer(t)
		o, seen, _ := w.spoof(t, spoofRow{spec: ProbeSpec{Op: ARPOpGratuitous}, op: "request"})
		mac, state := w.entry(t, w.bIP)
		t.Logf("probe: %s %s; witness: %s; host entry: %s %s", o.Outcome, o.Reason, seen.Reason, mac, state)
		require.Equal(t, Silent, o.Outcome, o.Reason)
		require.Equal(t, o.Evidence.Sent, seen.Evidence.Witness.Count, "the frames arrived")
		require.Equal(t, w.bMAC.String(), mac, "a permanent entry ignores ARP")
		require.Equal(t, "PERMANENT", state)
	})
}

// TestPrivilegedARPSpoofLocktime measures what a forged ARP does to an
// entry the host changed less than a locktime ago (it has just learnt the
// peer): Linux keeps the first of several changes within the locktime,
// except that a gratuitous ARP overrides it, and so does a request for
// one of the host's own addresses, whose sender the host learns as it
// answers. A drill's reply (or request for a third address) therefore
// only takes when the victim's entry is older than its locktime.
//
// The host's locktime is raised from its default (1 s) to a minute, so
// the frames go out well within it on any machine: the bound below has
// a minute of slack, where the default gave a loaded machine one second.
func TestPrivilegedARPSpoofLocktime(t *testing.T) {
	w := newSpoofWorld(t)
	require.NoError(t, w.br.Sysctl("net.ipv4.neigh.br0.locktime", "6000")) // USER_HZ: 60 s
	lock := w.locktime(t)
	require.Equal(t, time.Minute, lock)
	takes := map[string]bool{"gratuitous": true, "reply": false, "request to the host": true, "request for another address": false}
	for _, r := range w.spoofRows(nil)[:4] {
		t.Run(r.name, func(t *testing.T) {
			start := time.Now() // no later than the host's last change to the entry
			w.learnPeer(t)
			o, seen, sha := w.spoof(t, r)
			took := time.Since(start)
			mac, state := w.entry(t, w.bIP)
			t.Logf("%s within %s of the host learning b: entry %s %s (forger %s); %s",
				r.name, took.Round(time.Millisecond), mac, state, sha, o.Reason)
			require.Less(t, took, lock, "the frames went out within the host's locktime of it learning b")
			require.Equal(t, Silent, o.Outcome, o.Reason)
			require.Equal(t, o.Evidence.Sent, seen.Evidence.Witness.Count, "the frames arrived")
			if takes[r.name] {
				require.Equal(t, sha.String(), mac, "overrides the locktime")
			} else {
				require.Equal(t, w.bMAC.String(), mac, "ignored within the locktime")
			}
		})
	}
}

// TestPrivilegedForgedUDP: a box's datagram with its peer's address as
// source arrives at the host with that source, the probe's source port and
// nonce, and a UDP checksum that is right for the forged source: the
// host's socket takes it, and the checksum is checked again on a capture
// of it arriving (a veth can tell the receiver to skip the check; a copy
// with a broken checksum says whether this one did). A witness on the
// host matching the nonce finds it. A datagram with no next hop never
// leaves, and the probe says so.
func TestPrivilegedForgedUDP(t *testing.T) {
	w := newSpoofWorld(t)
	const port = 7002
	var conn *net.UDPConn
	require.NoError(t, w.br.Run(func() (err error) {
		conn, err = net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(w.hostIP, port)))
		return err
	}))
	t.Cleanup(func() { conn.Close() })
	var capture *pktSock
	require.NoError(t, w.br.Run(func() (err error) {
		capture, err = openPktSock(unix.SOCK_DGRAM, w.br0, []bpf.Instruction{bpf.RetConstant{Val: 65535}})
		return err
	}))
	t.Cleanup(func() { capture.close() })

	nonce := NewNonce()
	wit := startWitness(t, w.br, WitnessSpec{ID: "w", Via: w.subnet, WindowMS: 5000, Nonces: []string{nonce}})
	o := probeIn(t, w.a, ProbeSpec{ID: "forged", Kind: KindForgedUDP, Target: w.hostIP, Port: port, SrcIP: w.bIP,
		Nonce: nonce, Via: w.subnet, DeadlineMS: probeDeadlineMS})
	seen := wit.Stop()
	t.Logf("probe: %s %s %+v; witness: %s %+v", o.Outcome, o.Reason, o.Evidence, seen.Reason, seen.Evidence.Witness.First)
	require.Equal(t, Silent, o.Outcome, o.Reason)
	require.Equal(t, spoofSends, o.Evidence.Sent)
	require.Equal(t, w.bIP.String(), o.Evidence.Source)
	require.Equal(t, "veth-a", o.Evidence.Interface)
	require.GreaterOrEqual(t, o.Evidence.SrcPort, 32768)
	require.Less(t, o.Evidence.SrcPort, 61000)
	require.Equal(t, fmt.Sprintf("sent 3 datagrams to %s:%d from forged source %s", w.hostIP, port, w.bIP), o.Reason)

	require.Equal(t, Reached, seen.Outcome, "a witness matching the nonce finds it")
	require.Equal(t, o.Evidence.Sent, seen.Evidence.Witness.Count)
	require.Equal(t, w.bIP.String(), seen.Evidence.Witness.First.SrcIP)
	require.Equal(t, w.aMAC.String(), seen.Evidence.Witness.First.SrcMAC, "sent from the forger's own MAC")
	require.Equal(t, port, seen.Evidence.Witness.First.DstPort)

	// The host's socket takes each one, from the forged source.
	from := netip.AddrPortFrom(w.bIP, uint16(o.Evidence.SrcPort))
	buf := make([]byte, 2048)
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(time.Second)))
	for i := range o.Evidence.Sent {
		n, peer, err := conn.ReadFromUDPAddrPort(buf)
		require.NoError(t, err, "datagram %d", i+1)
		require.Equal(t, from, netip.AddrPortFrom(peer.Addr().Unmap(), peer.Port()))
		require.Equal(t, string(probeLine(nonce)), string(buf[:n]))
	}

	// Each arrived with a checksum right for the forged source.
	checked := 0
	require.NoError(t, capture.setReadDeadline(time.Now().Add(100*time.Millisecond)))
	for {
		n, _, err := capture.recv(buf)
		if err != nil {
			break
		}
		p := buf[:n]
		if len(p) < 28 || p[0]>>4 != 4 || p[9] != unix.IPPROTO_UDP || netip.AddrFrom4([4]byte(p[12:16])) != w.bIP ||
			!strings.Contains(string(p), nonce) {
			continue
		}
		require.NotZero(t, binary.BigEndian.Uint16(p[26:28]), "a checksum, not \"none\"")
		require.True(t, verifyUDP(t, p), "the UDP checksum holds for source %s", w.bIP)
		checked++
	}
	require.Equal(t, o.Evidence.Sent, checked, "every datagram was captured arriving")

	// Does the host's stack check checksums on this path? A copy with a
	// broken checksum (sent by hand from a) tells.
	broken := forgedUDP(w.bIP, w.hostIP, o.Evidence.SrcPort, port, probeLine(nonce))
	broken[26] ^= 0x55
	require.NoError(t, w.a.Run(func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_RAW)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		return unix.Sendto(fd, broken, 0, &unix.SockaddrInet4{Addr: w.hostIP.As4()})
	}))
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(300*time.Millisecond)))
	if _, _, err := conn.ReadFromUDPAddrPort(buf); err == nil {
		t.Logf("the host's socket took a datagram with a broken checksum: on this path only the capture's check proves the checksum")
	} else {
		t.Logf("the host's socket dropped a datagram with a broken checksum (%v): taking the probe's proves its checksum too", err)
	}

	// Nobody has 10.202.0.77: no ARP answer, so nothing leaves.
	none := probeIn(t, w.a, ProbeSpec{ID: "nohop", Kind: KindForgedUDP, Target: netip.MustParseAddr("10.202.0.77"), Port: port,
		SrcIP: w.bIP, DeadlineMS: 500})
	t.Logf("no next hop: %s %s", none.Outcome, none.Reason)
	require.Equal(t, Error, none.Outcome, none.Reason)
	require.Contains(t, none.Reason, "seen leaving")
	require.Equal(t, spoofSends, none.Evidence.Sent, "handed to the kernel, never on the wire")
}

// TestPrivilegedSpoofAgent runs both forging probes from a plan, through
// the agent as a process in a, as the drill runs them in a box; witnesses
// on the host see them, and the host's entry for b moves to a's MAC.
func TestPrivilegedSpoofAgent(t *testing.T) {
	w := newSpoofWorld(t)
	w.learnPeer(t)
	time.Sleep(w.locktime(t) + 200*time.Millisecond)
	nonce := NewNonce()
	// Keyed on the claim, not a's MAC: to send the forged datagram, a's
	// kernel asks for the host in a genuine ARP request from a's MAC.
	arpWit := startWitness(t, w.br, WitnessSpec{ID: "arp", Via: w.subnet, WindowMS: 5000, SrcIPs: []netip.Addr{w.bIP}, Proto: "arp"})
	udpWit := startWitness(t, w.br, WitnessSpec{ID: "udp", Via: w.subnet, WindowMS: 5000, Nonces: []string{nonce}})
	plan := fmt.Sprintf(`{"version":1,"deadline_ms":1500,"probes":[
	  {"id":"garp","kind":"arp_spoof","via":"%s","arp_sender_ip":"%s","op":"gratuitous","deadline_ms":1000},
	  {"id":"forged","kind":"forged_udp","via":"%s","target":"%s","port":7004,"src_ip":"%s","nonce":"%s","deadline_ms":1000}]}`,
		w.subnet, w.bIP, w.subnet, w.hostIP, w.bIP, nonce)
	rep, _, raw := startAgentIn(t, w.a, plan)()
	t.Logf("report: %s", raw)
	time.Sleep(50 * time.Millisecond)
	arpSeen, udpSeen := arpWit.Stop(), udpWit.Stop()
	require.Len(t, rep.Observations, 2)
	for _, o := range rep.Observations {
		require.Equal(t, Silent, o.Outcome, "%s: %s", o.ID, o.Reason)
		require.Equal(t, spoofSends, o.Evidence.Sent, o.ID)
		require.Equal(t, w.bIP.String(), o.Evidence.Source, o.ID)
	}
	require.Equal(t, KindARPSpoof, rep.Observations[0].Kind)
	require.Equal(t, w.bIP.String(), rep.Observations[0].Target)
	require.Equal(t, fmt.Sprintf("%s:7004", w.hostIP), rep.Observations[1].Target)
	require.Equal(t, nonce, rep.Observations[1].Nonce)
	require.Equal(t, spoofSends, arpSeen.Evidence.Witness.Count, arpSeen.Reason)
	require.Equal(t, w.aMAC.String(), arpSeen.Evidence.Witness.First.ARPSenderMAC)
	require.Equal(t, spoofSends, udpSeen.Evidence.Witness.Count, udpSeen.Reason)
	mac, state := w.entry(t, w.bIP)
	require.Equal(t, w.aMAC.String(), mac, "the host's entry for b points at a (%s)", state)
}

// TestPrivilegedForgingOurOwnAddress: claiming or forging one of our own
// addresses forges nothing; the probes say so and send nothing.
func TestPrivilegedForgingOurOwnAddress(t *testing.T) {
	w := newBridgeWorld(t)
	wit := startWitness(t, w.b, WitnessSpec{ID: "w", Via: w.subnet, WindowMS: 5000, SrcMACs: []string{w.aMAC.String()}})
	for _, spec := range []ProbeSpec{
		{ID: "a", Kind: KindARPSpoof, Via: w.subnet, ARPSenderIP: w.aIP, Op: ARPOpGratuitous, DeadlineMS: 300},
		{ID: "f", Kind: KindForgedUDP, Target: w.bIP, Port: echoPort, SrcIP: w.aIP, DeadlineMS: 300},
	} {
		o := probeIn(t, w.a, spec)
		require.Equal(t, Error, o.Outcome, o.Reason)
		require.Contains(t, o.Reason, "one of our own addresses: nothing would be forged")
		require.Zero(t, o.Evidence.Sent)
	}
	seen := wit.Stop()
	require.Equal(t, Silent, seen.Outcome, "nothing left a: %+v", seen.Evidence.Witness.First)
}
