package probes

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

func TestParseTCP(t *testing.T) {
	a, b := netip.MustParseAddr("10.201.1.2"), netip.MustParseAddr("10.201.2.2")
	seg := []byte{0x9c, 0x40, 0x1b, 0x58, 0xde, 0xad, 0xbe, 0xef, 0, 0, 0, 0, 0x50, 0x02, 0xff, 0xff, 0, 0, 0, 0}
	s, ok := parseTCP(ipv4Packet(unix.IPPROTO_TCP, a, b, seg))
	require.True(t, ok)
	require.Equal(t, tcpSegment{src: a, dst: b, sport: 40000, dport: 7000, seq: 0xdeadbeef, flags: 0x02}, s)
	a6, b6 := netip.MustParseAddr("2001:db8:1::2"), netip.MustParseAddr("2001:db8:2::2")
	s, ok = parseTCP(ipv6Packet(unix.IPPROTO_TCP, a6, b6, seg))
	require.True(t, ok)
	require.Equal(t, tcpSegment{src: a6, dst: b6, sport: 40000, dport: 7000, seq: 0xdeadbeef, flags: 0x02}, s)

	_, ok = parseTCP(ipv4Packet(unix.IPPROTO_UDP, a, b, seg))
	require.False(t, ok, "not TCP")
	_, ok = parseTCP(ipv4Packet(unix.IPPROTO_TCP, a, b, seg[:10]))
	require.False(t, ok, "truncated")
	frag := ipv4Packet(unix.IPPROTO_TCP, a, b, seg)
	frag[7] = 1
	_, ok = parseTCP(frag)
	require.False(t, ok, "a later fragment has no TCP header")
	_, ok = parseTCP([]byte{0x45})
	require.False(t, ok)

	require.Equal(t, "S", tcpFlagNames(0x02))
	require.Equal(t, "S.", tcpFlagNames(0x12))
	require.Equal(t, "R.", tcpFlagNames(0x14))
	require.Equal(t, "FP.", tcpFlagNames(0x19))
	require.Equal(t, "none", tcpFlagNames(0))
}

func TestPacketFiltersAssemble(t *testing.T) {
	for name, f := range map[string][]bpf.Instruction{
		"syn":      synFilter(40000, 7000),
		"outbound": outboundFilter(),
		"forged":   forgedFilter(netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("10.0.0.1"), 40000, 7001),
	} {
		prog, err := bpf.Assemble(f)
		require.NoError(t, err, name)
		require.Less(t, len(prog), 256, name)
		// Every path ends in a return: the last instruction is one.
		_, ok := f[len(f)-1].(bpf.RetConstant)
		require.True(t, ok, name)
	}
}
