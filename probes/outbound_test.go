package probes

import (
	"encoding/binary"
	"net"
	"net/netip"
	"testing"

	"github.com/mdlayher/ethernet"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

func outWitness(spec WitnessSpec) *Witness {
	w := newWitness(spec)
	w.taps = []*outTap{}
	w.name = "eth0"
	close(w.finished) // no readers: frames are handed to recordOut
	return w
}

func TestOutboundWitnessRecords(t *testing.T) {
	mac, _ := net.ParseMAC("02:00:00:00:00:0a")
	gw, _ := net.ParseMAC("02:00:00:00:00:01")
	host := netip.MustParseAddr("192.0.2.10")
	private, public := netip.MustParseAddr("10.1.2.3"), netip.MustParseAddr("198.51.100.7")
	nonce := "0123456789abcdef"
	eth := &unix.SockaddrLinklayer{Pkttype: unix.PACKET_OUTGOING, Hatype: unix.ARPHRD_ETHER}
	udp := func(dst netip.Addr, payload []byte) []byte {
		return frame(mac, gw, ethernet.EtherTypeIPv4, ipv4Packet(unix.IPPROTO_UDP, host, dst, ports(40001, 7001, append([]byte{0, 0, 0, 0}, payload...)...)))
	}
	syn := func(sport uint16, seq uint32) []byte {
		tcp := ports(sport, 7000, make([]byte, 16)...)
		binary.BigEndian.PutUint32(tcp[4:8], seq)
		tcp[12], tcp[13] = 0x50, 0x02
		return frame(mac, gw, ethernet.EtherTypeIPv4, ipv4Packet(unix.IPPROTO_TCP, host, private, tcp))
	}
	spec := WitnessSpec{ID: "out", Ifaces: []string{"eth0"}, DstPrefixes: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")},
		Nonces: []string{nonce}, Control: "c0ffee0123456789"}
	w := outWitness(spec)
	w.control = []byte(ControlPrefix + spec.Control)

	w.recordOut(udp(private, probeLine(nonce)), eth, "eth0")
	w.recordOut(syn(40000, 0xdeadbeef), eth, "eth0")
	w.recordOut(udp(public, probeLine(nonce)), eth, "eth0") // not toward the prefixes
	w.recordOut(udp(private, probeLine(nonce)), &unix.SockaddrLinklayer{Pkttype: unix.PACKET_HOST, Hatype: unix.ARPHRD_ETHER}, "eth0")
	w.recordOut(ControlFrame(gw, mac, spec.Control), eth, "eth0")
	// A link with no Ethernet header (WireGuard, tun): the kernel says the
	// protocol.
	bare := ipv4Packet(unix.IPPROTO_UDP, host, private, ports(40002, 53, 0, 0, 0, 0))
	w.recordOut(bare, &unix.SockaddrLinklayer{Pkttype: unix.PACKET_OUTGOING, Hatype: unix.ARPHRD_NONE, Protocol: htons(unix.ETH_P_IP)}, "wg0")

	obs := w.Stop()
	ev := obs.Evidence.Witness
	require.Equal(t, Reached, obs.Outcome, obs.Reason)
	require.Contains(t, obs.Reason, "left eth0")
	require.Equal(t, 1, ev.Count, "only the packet with the nonce matches")
	require.Equal(t, 3, ev.Recorded)
	require.Equal(t, 5, ev.Captured, "every outgoing frame read; the incoming one is never counted")
	require.Equal(t, 1, ev.Controls)
	require.Equal(t, "nonce "+nonce, ev.First.MatchedBy)
	require.Len(t, ev.Records, 3)
	r := ev.Records[0]
	require.Equal(t, PacketRecord{At: r.At, Iface: "eth0", SrcIP: host.String(), DstIP: private.String(), Proto: "udp",
		SrcPort: 40001, DstPort: 7001, Nonce: nonce, Matched: true}, r)
	r = ev.Records[1]
	require.Equal(t, PacketRecord{At: r.At, Iface: "eth0", SrcIP: host.String(), DstIP: private.String(), Proto: "tcp",
		SrcPort: 40000, DstPort: 7000, TCPFlags: "S", Seq: 0xdeadbeef}, r)
	r = ev.Records[2]
	require.Equal(t, "wg0", r.Iface)
	require.Equal(t, 53, r.DstPort)

	// With no keys, every recorded packet matches; narrowing applies.
	w = outWitness(WitnessSpec{ID: "out", Ifaces: []string{"eth0"}, DstPrefixes: spec.DstPrefixes, Proto: "tcp"})
	w.recordOut(udp(private, nil), eth, "eth0")
	w.recordOut(syn(40000, 1), eth, "eth0")
	obs = w.Stop()
	require.Equal(t, Reached, obs.Outcome)
	require.Equal(t, 1, obs.Evidence.Witness.Count)
	require.Equal(t, "dst_prefixes 10.1.2.3", obs.Evidence.Witness.First.MatchedBy)

	w = outWitness(WitnessSpec{ID: "out", Ifaces: []string{"eth0"}, DstPrefixes: spec.DstPrefixes, Nonces: []string{nonce}})
	w.recordOut(udp(public, probeLine(nonce)), eth, "eth0")
	obs = w.Stop()
	require.Equal(t, Silent, obs.Outcome, "a packet toward a public address is never recorded")
	require.Contains(t, obs.Reason, "no matching frame left eth0")
	require.Zero(t, obs.Evidence.Witness.Recorded)
}

// TestOutboundWitnessKeepsWhatMatters: the record list is bounded, and once
// it is full a SYN or a packet with a nonce displaces a plain packet.
func TestOutboundWitnessKeepsWhatMatters(t *testing.T) {
	w := outWitness(WitnessSpec{ID: "out", Ifaces: []string{"eth0"}, DstPrefixes: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")},
		Nonces: []string{"0123456789abcdef"}})
	for i := range MaxWitnessRecords + 10 {
		w.keep(PacketRecord{Proto: "udp", SrcPort: i})
	}
	w.keep(PacketRecord{Proto: "tcp", TCPFlags: "S", SrcPort: 1})
	w.keep(PacketRecord{Proto: "udp", Nonce: "0123456789abcdef", SrcPort: 2})
	w.keep(PacketRecord{Proto: "tcp", TCPFlags: "S.", SrcPort: 3})
	require.Len(t, w.records, MaxWitnessRecords)
	require.Equal(t, 2, w.records[0].SrcPort, "the two oldest plain records made room")
	require.Equal(t, "S", w.records[MaxWitnessRecords-2].TCPFlags)
	require.Equal(t, "0123456789abcdef", w.records[MaxWitnessRecords-1].Nonce)
	for range 2 * MaxWitnessRecords {
		w.keep(PacketRecord{Proto: "tcp", TCPFlags: "S"})
	}
	require.Len(t, w.records, MaxWitnessRecords)
}
