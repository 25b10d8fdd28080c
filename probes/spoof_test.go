package probes

import (
	"context"
	"encoding/binary"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/mdlayher/arp"
	"github.com/mdlayher/ethernet"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

func TestSpoofARPPackets(t *testing.T) {
	sha, _ := net.ParseMAC("02:00:00:00:00:0a")
	peer, _ := net.ParseMAC("02:00:00:00:00:fe")
	claim, target := netip.MustParseAddr("10.202.0.2"), netip.MustParseAddr("10.202.0.254")
	zero := make(net.HardwareAddr, 6)
	tests := []struct {
		name     string
		spec     ProbeSpec
		op       arp.Operation
		tha      net.HardwareAddr
		tpa      netip.Addr
		ethernet net.HardwareAddr
	}{
		{"gratuitous", ProbeSpec{Op: ARPOpGratuitous, ARPSenderIP: claim}, arp.OperationRequest, zero, claim, ethernet.Broadcast},
		{"gratuitous to one host", ProbeSpec{Op: ARPOpGratuitous, ARPSenderIP: claim, DstMAC: peer.String()}, arp.OperationRequest, zero, claim, peer},
		{"reply", ProbeSpec{Op: ARPOpReply, ARPSenderIP: claim, Target: target, DstMAC: peer.String()}, arp.OperationReply, peer, target, peer},
		{"request", ProbeSpec{Op: ARPOpRequest, ARPSenderIP: claim, Target: target}, arp.OperationRequest, zero, target, ethernet.Broadcast},
		{"request to one host", ProbeSpec{Op: ARPOpRequest, ARPSenderIP: claim, Target: target, DstMAC: peer.String()}, arp.OperationRequest, zero, target, peer},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, dst, err := spoofARP(&tt.spec, sha)
			require.NoError(t, err)
			require.Equal(t, tt.ethernet, dst)
			// Read back from the wire format, as a receiver would.
			b, err := p.MarshalBinary()
			require.NoError(t, err)
			var got arp.Packet
			require.NoError(t, got.UnmarshalBinary(b))
			require.Equal(t, tt.op, got.Operation)
			require.Equal(t, sha, got.SenderHardwareAddr)
			require.Equal(t, claim, got.SenderIP)
			require.Equal(t, tt.tha, got.TargetHardwareAddr)
			require.Equal(t, tt.tpa, got.TargetIP)
		})
	}
	_, _, err := spoofARP(&ProbeSpec{Op: "announce", ARPSenderIP: claim}, sha)
	require.Error(t, err)
}

// verifyUDP checks a datagram the way a receiver does: the ones' complement
// sum of the pseudo-header and the datagram, checksum included, is all ones.
func verifyUDP(t *testing.T, pkt []byte) bool {
	t.Helper()
	ihl := int(pkt[0]&0x0f) * 4
	b := append([]byte(nil), pkt[12:20]...)
	b = append(b, 0, unix.IPPROTO_UDP, 0, 0)
	binary.BigEndian.PutUint16(b[10:12], uint16(len(pkt)-ihl))
	b = append(b, pkt[ihl:]...)
	if len(b)%2 == 1 {
		b = append(b, 0)
	}
	var sum uint32
	for i := 0; i < len(b); i += 2 {
		sum += uint32(b[i])<<8 | uint32(b[i+1])
	}
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	return sum == 0xffff
}

func TestForgedUDP(t *testing.T) {
	src, dst := netip.MustParseAddr("10.202.0.2"), netip.MustParseAddr("10.202.0.254")
	payload := probeLine("forged0123456789")
	p := forgedUDP(src, dst, 40000, 7001, payload)
	require.Len(t, p, 20+8+len(payload))
	require.Equal(t, byte(0x45), p[0])
	require.Equal(t, uint16(len(p)), binary.BigEndian.Uint16(p[2:4]))
	require.Equal(t, byte(unix.IPPROTO_UDP), p[9])
	require.Equal(t, src, netip.AddrFrom4([4]byte(p[12:16])), "the forged source is in the header")
	require.Equal(t, dst, netip.AddrFrom4([4]byte(p[16:20])))
	u := p[20:]
	require.Equal(t, uint16(40000), binary.BigEndian.Uint16(u[0:2]))
	require.Equal(t, uint16(7001), binary.BigEndian.Uint16(u[2:4]))
	require.Equal(t, uint16(8+len(payload)), binary.BigEndian.Uint16(u[4:6]))
	require.Equal(t, payload, u[8:])
	// Computed apart (Python, RFC 768) for this very datagram.
	require.Equal(t, uint16(0x9cfb), binary.BigEndian.Uint16(u[6:8]))
	require.True(t, verifyUDP(t, p))
	// The checksum covers the forged source: the same datagram read as
	// coming from the real sender fails.
	unforged := append([]byte(nil), p...)
	copy(unforged[12:16], []byte{10, 202, 0, 1})
	require.False(t, verifyUDP(t, unforged))
	// An odd length is padded for the sum.
	odd := forgedUDP(src, dst, 1, 2, []byte("abc"))
	require.True(t, verifyUDP(t, odd))
}

func TestSendSpread(t *testing.T) {
	var at []time.Time
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	start := time.Now()
	n, err := sendSpread(ctx, func() error { at = append(at, time.Now()); return nil })
	require.NoError(t, err)
	require.Equal(t, spoofSends, n)
	require.Len(t, at, spoofSends)
	require.GreaterOrEqual(t, at[len(at)-1].Sub(start), time.Duration(spoofSends-1)*spoofGap, "spread, not all at once")

	// A short deadline brings the sends closer; all of them still fit.
	ctx, cancel = context.WithTimeout(context.Background(), 90*time.Millisecond)
	defer cancel()
	at = nil
	n, err = sendSpread(ctx, func() error { at = append(at, time.Now()); return nil })
	require.NoError(t, err)
	require.Equal(t, spoofSends, n)
	dl, _ := ctx.Deadline()
	require.True(t, at[len(at)-1].Before(dl))

	// The first error stops it.
	n, err = sendSpread(context.Background(), func() error { return unix.ENOBUFS })
	require.ErrorIs(t, err, unix.ENOBUFS)
	require.Equal(t, 0, n)
}

func TestForgingProbeTargets(t *testing.T) {
	claim := netip.MustParseAddr("10.202.0.2")
	require.Equal(t, "10.202.0.2", targetString(&ProbeSpec{Kind: KindARPSpoof, ARPSenderIP: claim, Op: ARPOpGratuitous}))
	require.Equal(t, "10.202.0.254", targetString(&ProbeSpec{Kind: KindARPSpoof, ARPSenderIP: claim, Op: ARPOpReply, Target: netip.MustParseAddr("10.202.0.254")}))
	require.Equal(t, "10.202.0.254:7001", targetString(&ProbeSpec{Kind: KindForgedUDP, SrcIP: claim, Target: netip.MustParseAddr("10.202.0.254"), Port: 7001}))
	require.True(t, strings.HasPrefix(string(KindForgedUDP), "forged"))
}
