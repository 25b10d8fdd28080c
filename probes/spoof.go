package probes

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"time"

	"github.com/mdlayher/arp"
	"github.com/mdlayher/ethernet"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// The forging probes (claim C-SPOOF: a box cannot take another's
// identity) expect no answer: a forgery's answer, if any, goes to the
// address it forged. They report what they sent, and the drill judges
// them by witnesses elsewhere: the victim's neighbour table, a capture on
// the bridge or at the peer.

// spoofSends is how many times a forging probe sends, spoofGap the pause
// between two sends. Nothing answers, so a resend is not a retry: the
// frames are spread so that neither one lost frame nor one landing within
// the victim's ARP locktime of an earlier update (Linux keeps the first
// of several changes within 1 s) decides what the witnesses see.
const (
	spoofSends = probeSends
	spoofGap   = 150 * time.Millisecond
)

// sendSpread calls send spoofSends times, spoofGap apart, or closer when
// ctx's deadline would not fit them all. It stops at the first error, or
// when ctx ends, and returns how many sends succeeded.
func sendSpread(ctx context.Context, send func() error) (int, error) {
	gap := spoofGap
	if d := time.Until(deadlineOf(ctx)) / spoofSends; d < gap {
		gap = d
	}
	sent := 0
	for i := range spoofSends {
		if i > 0 {
			t := time.NewTimer(gap)
			select {
			case <-ctx.Done():
				t.Stop()
				return sent, fmt.Errorf("%w: %w", errCancelled, ctx.Err())
			case <-t.C:
			}
		}
		if err := send(); err != nil {
			return sent, err
		}
		sent++
	}
	return sent, nil
}

// probeARPSpoof forges ARP on the interface holding Via: frames saying
// that Claim, an address that is not ours, is at our MAC, or at SrcMAC,
// which then forges the Ethernet source as well. Op picks the frame:
//
//   - gratuitous: a request from Claim for Claim, target hardware address
//     zero, to broadcast (or DstMAC), as a host announces an address it
//     takes;
//   - reply: an unsolicited reply from Claim to Target at DstMAC;
//   - request: a request from Claim asking for Target, to broadcast (or
//     DstMAC); its target learns the sender as it answers.
//
// The outcome is silent once every frame left (nothing is expected back),
// error when a frame could not be sent.
func probeARPSpoof(ctx context.Context, spec ProbeSpec, obs Observation) Observation {
	ifi, _, err := InterfaceForSubnet(spec.Via)
	if err != nil {
		return fail(obs, fmt.Sprintf("arp_spoof: %v", err))
	}
	obs.Evidence.Interface = ifi.Name
	obs.Evidence.Source = spec.ARPSenderIP.String()
	if localAddrs()[spec.ARPSenderIP] {
		return fail(obs, fmt.Sprintf("arp_spoof: sender address %s is one of our own addresses: nothing would be forged", spec.ARPSenderIP))
	}
	sha := ifi.HardwareAddr
	if spec.SrcMAC != "" {
		sha, _ = net.ParseMAC(spec.SrcMAC) // Validate checked it
	}
	if len(sha) != 6 {
		return fail(obs, fmt.Sprintf("arp_spoof: %s has no Ethernet address", ifi.Name))
	}
	obs.Evidence.MAC = sha.String()
	pkt, dst, err := spoofARP(&spec, sha)
	if err != nil {
		return fail(obs, fmt.Sprintf("arp_spoof: %v", err))
	}
	c, err := openARP(ifi)
	if err != nil {
		return fail(obs, fmt.Sprintf("arp_spoof: %v", err))
	}
	defer c.Close()
	n, err := sendSpread(ctx, func() error { return c.WriteTo(pkt, dst) })
	obs.Evidence.Sent = n
	if err != nil {
		return fail(obs, fmt.Sprintf("arp_spoof: %d of %d frames sent on %s: %v", n, spoofSends, ifi.Name, err))
	}
	what := map[string]string{
		ARPOpGratuitous: "gratuitous ARP announcements",
		ARPOpReply:      "ARP replies",
		ARPOpRequest:    "ARP requests",
	}[spec.Op]
	why := fmt.Sprintf("sent %d forged %s claiming %s at %s to %s on %s", n, what, spec.ARPSenderIP, sha, dst, ifi.Name)
	if spec.Op != ARPOpGratuitous {
		why += fmt.Sprintf(" (ARP target %s)", spec.Target)
	}
	return done(obs, Silent, why)
}

// spoofARP builds an arp_spoof probe's packet from sender hardware address
// sha, and the Ethernet destination it goes to.
func spoofARP(spec *ProbeSpec, sha net.HardwareAddr) (*arp.Packet, net.HardwareAddr, error) {
	dst := ethernet.Broadcast
	if spec.DstMAC != "" {
		dst, _ = net.ParseMAC(spec.DstMAC) // Validate checked it
	}
	zero := make(net.HardwareAddr, 6)
	var p *arp.Packet
	var err error
	switch spec.Op {
	case ARPOpGratuitous:
		p, err = arp.NewPacket(arp.OperationRequest, sha, spec.ARPSenderIP, zero, spec.ARPSenderIP)
	case ARPOpReply:
		p, err = arp.NewPacket(arp.OperationReply, sha, spec.ARPSenderIP, dst, spec.Target)
	case ARPOpRequest:
		p, err = arp.NewPacket(arp.OperationRequest, sha, spec.ARPSenderIP, zero, spec.Target)
	default:
		err = fmt.Errorf("op %q is not one of gratuitous, reply, request", spec.Op)
	}
	return p, dst, err
}

// probeForgedUDP sends the nonce line, as a udp probe sends it, to
// Target:Port in an IPv4 UDP datagram from SrcIP, an address that is not
// ours, and a random ephemeral port. The datagram is written whole, IP
// header included, to a raw socket (IPPROTO_RAW), so the kernel routes it
// and resolves the next hop as for any packet and keeps the forged
// source; the UDP checksum is computed for that source, so a receiver
// takes it. Via, when given, binds the socket to the interface holding it.
//
// A capture of this host's outgoing frames counts the datagrams that
// left:
//
//   - silent: they left (nothing is expected back: an answer goes to the
//     forged source); witnesses at the target say whether they arrived;
//   - error: one could not be sent, or none left before the deadline (our
//     own stack found no next hop, or dropped them: that proves nothing).
func probeForgedUDP(ctx context.Context, spec ProbeSpec, obs Observation) Observation {
	obs.Evidence.Source = spec.SrcIP.String()
	if localAddrs()[spec.SrcIP] {
		return fail(obs, fmt.Sprintf("forged_udp: src_ip %s is one of our own addresses: nothing would be forged", spec.SrcIP))
	}
	ifindex := 0
	var ifname string
	if spec.Via.IsValid() {
		ifi, _, err := InterfaceForSubnet(spec.Via)
		if err != nil {
			return fail(obs, fmt.Sprintf("forged_udp: %v", err))
		}
		ifindex, ifname = ifi.Index, ifi.Name
		obs.Evidence.Interface = ifi.Name
	}
	// The kernel's default ephemeral range, where a real source port is.
	sport := 32768 + rand.IntN(61000-32768)
	obs.Evidence.SrcPort = sport
	pkt := forgedUDP(spec.SrcIP, spec.Target, sport, spec.Port, probeLine(spec.Nonce))

	capture, err := openPktSock(unix.SOCK_DGRAM, ifindex, forgedFilter(spec.SrcIP, spec.Target, sport, spec.Port))
	if err != nil {
		return fail(obs, fmt.Sprintf("forged_udp: capture of our own datagrams: %v", err))
	}
	defer capture.close()
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, unix.IPPROTO_RAW)
	if err != nil {
		return fail(obs, fmt.Sprintf("forged_udp: raw socket (needs CAP_NET_RAW): %v", err))
	}
	defer unix.Close(fd)
	if ifname != "" {
		if err := unix.BindToDevice(fd, ifname); err != nil {
			return fail(obs, fmt.Sprintf("forged_udp: bind to %s: %v", ifname, err))
		}
	}
	to := &unix.SockaddrInet4{Addr: spec.Target.As4()}
	n, err := sendSpread(ctx, func() error { return unix.Sendto(fd, pkt, 0, to) })
	obs.Evidence.Sent = n
	if err != nil {
		if e, ok := errnoOf(err); ok {
			obs.Evidence.Errno = errnoName(e)
		}
		return fail(obs, fmt.Sprintf("forged_udp: %d of %d datagrams sent: %v", n, spoofSends, err))
	}

	left, via := countLeaving(ctx, capture, n)
	if obs.Evidence.Interface == "" {
		obs.Evidence.Interface = via
	}
	if left == 0 {
		if errors.Is(ctx.Err(), context.Canceled) {
			return fail(obs, "cancelled before the datagrams were seen leaving: "+ctx.Err().Error())
		}
		return fail(obs, fmt.Sprintf("forged_udp: none of %d datagrams was seen leaving before the deadline: our own stack "+
			"found no next hop (no ARP answer) or dropped them, so nothing left and this proves nothing", n))
	}
	why := fmt.Sprintf("sent %d datagrams to %s from forged source %s", n, netip.AddrPortFrom(spec.Target, uint16(spec.Port)), spec.SrcIP)
	if left < n {
		why += fmt.Sprintf(" (%d seen leaving)", left)
	}
	return done(obs, Silent, why)
}

// countLeaving reads the capture until want datagrams were seen leaving or
// ctx ends, and returns how many left and by which interface the first
// did.
func countLeaving(ctx context.Context, s *pktSock, want int) (int, string) {
	defer wakeOnCancel(ctx, s.setReadDeadline)()
	_ = s.setReadDeadline(deadlineOf(ctx))
	buf := make([]byte, 64)
	left, via := 0, ""
	for left < want {
		_, from, err := s.recv(buf)
		if err != nil {
			break
		}
		if from.Pkttype != unix.PACKET_OUTGOING {
			continue
		}
		left++
		if via == "" {
			if ifi, err := net.InterfaceByIndex(from.Ifindex); err == nil {
				via = ifi.Name
			}
		}
	}
	return left, via
}

// forgedUDP builds an IPv4 packet holding a UDP datagram from src:sport to
// dst:dport. The kernel fills in the IP header's checksum and
// identification as it sends it (IP_HDRINCL); the UDP checksum is ours.
func forgedUDP(src, dst netip.Addr, sport, dport int, payload []byte) []byte {
	const ipLen, udpLen = 20, 8
	p := make([]byte, ipLen+udpLen+len(payload))
	p[0] = 0x45 // version 4, 5 words of header
	binary.BigEndian.PutUint16(p[2:4], uint16(len(p)))
	p[8] = 64 // TTL
	p[9] = unix.IPPROTO_UDP
	s, d := src.As4(), dst.As4()
	copy(p[12:16], s[:])
	copy(p[16:20], d[:])
	u := p[ipLen:]
	binary.BigEndian.PutUint16(u[0:2], uint16(sport))
	binary.BigEndian.PutUint16(u[2:4], uint16(dport))
	binary.BigEndian.PutUint16(u[4:6], uint16(udpLen+len(payload)))
	copy(u[udpLen:], payload)
	binary.BigEndian.PutUint16(u[6:8], udpChecksum(src, dst, u))
	return p
}

// udpChecksum is the checksum of a UDP datagram (its checksum field zero)
// from src to dst over IPv4 (RFC 768): the ones' complement of the ones'
// complement sum of the pseudo-header and the datagram, 0xffff for 0.
func udpChecksum(src, dst netip.Addr, dgram []byte) uint16 {
	s, d := src.As4(), dst.As4()
	sum := onesSum(0, s[:])
	sum = onesSum(sum, d[:])
	sum += unix.IPPROTO_UDP + uint32(len(dgram))
	sum = onesSum(sum, dgram)
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	c := ^uint16(sum)
	if c == 0 {
		return 0xffff // 0 means "no checksum"
	}
	return c
}

// onesSum adds b, as big-endian 16-bit words (an odd last byte padded with
// zero), to sum.
func onesSum(sum uint32, b []byte) uint32 {
	for len(b) >= 2 {
		sum += uint32(binary.BigEndian.Uint16(b))
		b = b[2:]
	}
	if len(b) == 1 {
		sum += uint32(b[0]) << 8
	}
	return sum
}

// forgedFilter passes, on a SOCK_DGRAM packet socket, the outgoing IPv4
// UDP datagrams from src:sport to dst:dport, truncated to 64 bytes.
func forgedFilter(src, dst netip.Addr, sport, dport int) []bpf.Instruction {
	s, d := src.As4(), dst.As4()
	p := outgoingOnly()
	p = append(p, bpf.LoadExtension{Num: bpf.ExtProto})
	p = append(p, dropUnless(unix.ETH_P_IP)...)
	p = append(p, bpf.LoadAbsolute{Off: 9, Size: 1})
	p = append(p, dropUnless(unix.IPPROTO_UDP)...)
	p = append(p, bpf.LoadAbsolute{Off: 12, Size: 4})
	p = append(p, dropUnless(binary.BigEndian.Uint32(s[:]))...)
	p = append(p, bpf.LoadAbsolute{Off: 16, Size: 4})
	p = append(p, dropUnless(binary.BigEndian.Uint32(d[:]))...)
	p = append(p, bpf.LoadMemShift{Off: 0}, bpf.LoadIndirect{Off: 0, Size: 2})
	p = append(p, dropUnless(uint32(sport))...)
	p = append(p, bpf.LoadIndirect{Off: 2, Size: 2})
	p = append(p, dropUnless(uint32(dport))...)
	return append(p, bpf.RetConstant{Val: 64})
}
