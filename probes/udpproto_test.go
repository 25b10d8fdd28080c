package probes

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"strings"
	"testing"

	"github.com/miekg/dns"
	"github.com/stretchr/testify/require"
)

func TestUDPRequestTable(t *testing.T) {
	for port, want := range map[int]string{53: "dns", 5353: "dns", 67: "dhcp", 69: "tftp", 123: "ntp",
		137: "netbios", 161: "snmp", 1900: "ssdp", 7001: "nonce", 9101: "nonce", 1: "nonce", 68: "nonce"} {
		require.Equal(t, want, requestForPort(port), "port %d", port)
	}
	v4, v6 := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("2001:db8::1")
	require.Equal(t, "dhcp", udpRequestFor(&ProbeSpec{Target: v4, Port: 67}))
	require.Equal(t, "nonce", udpRequestFor(&ProbeSpec{Target: v6, Port: 67}), "DHCP is IPv4 only")
	require.Equal(t, "nonce", udpRequestFor(&ProbeSpec{Target: v4, Port: 53, Payload: "nonce"}))
	require.Equal(t, "ntp", udpRequestFor(&ProbeSpec{Target: v4, Port: 9999, Payload: "ntp"}))
	for _, r := range udpRequests {
		require.NoError(t, checkPayload(r))
	}
	require.Error(t, checkPayload("http"))
}

// ber walks one BER element and returns its tag, value and the rest; it
// fails the test on a malformed length.
func ber(t *testing.T, b []byte) (byte, []byte, []byte) {
	t.Helper()
	require.GreaterOrEqual(t, len(b), 2)
	tag, n, off := b[0], int(b[1]), 2
	switch {
	case n == 0x81:
		n, off = int(b[2]), 3
	case n == 0x82:
		n, off = int(binary.BigEndian.Uint16(b[2:4])), 4
	case n > 0x7f:
		t.Fatalf("unexpected length form %#x", n)
	}
	require.GreaterOrEqual(t, len(b), off+n, "element longer than its container")
	return tag, b[off : off+n], b[off+n:]
}

func TestUDPRequestsAreValid(t *testing.T) {
	nonce := "0123456789abcdef0123456789abcdef"
	target := netip.MustParseAddrPort("10.0.0.1:53")
	local := netip.MustParseAddrPort("10.0.0.2:40000")
	build := func(name string) (udpRequest, []byte) {
		r, err := newUDPRequest(name, nonce, target)
		require.NoError(t, err)
		b, err := r.build(local)
		require.NoError(t, err)
		return r, b
	}

	t.Run("dns", func(t *testing.T) {
		r, b := build(RequestDNS)
		var m dns.Msg
		require.NoError(t, m.Unpack(b))
		require.False(t, m.Response)
		require.True(t, m.RecursionDesired)
		require.Len(t, m.Question, 1)
		require.Equal(t, nonce+".drill.invalid.", m.Question[0].Name)
		require.Equal(t, dns.TypeA, m.Question[0].Qtype)
		require.True(t, bytes.Contains(b, []byte(nonce)), "a witness finds the nonce in the query")
		reply := new(dns.Msg).SetRcode(&m, dns.RcodeNameError)
		wire, err := reply.Pack()
		require.NoError(t, err)
		why, ok := r.proof(wire)
		require.True(t, ok)
		require.Contains(t, why, "NXDOMAIN")
		reply.Id++
		wire, _ = reply.Pack()
		why, ok = r.proof(wire)
		require.True(t, ok, "another id, but the nonce is quoted")
		require.Equal(t, "the peer echoed the nonce", why)
		reply.Question[0].Name = "other.drill.invalid."
		wire, _ = reply.Pack()
		_, ok = r.proof(wire)
		require.False(t, ok, "another question is not ours")
		// A nonce longer than a label is split in two.
		long := strings.Repeat("a", 64)
		r2, err := newUDPRequest(RequestDNS, long, target)
		require.NoError(t, err)
		b2, err := r2.build(local)
		require.NoError(t, err)
		require.NoError(t, m.Unpack(b2))
		require.Equal(t, strings.Repeat("a", 63)+".a.drill.invalid.", m.Question[0].Name)
	})

	t.Run("dhcp", func(t *testing.T) {
		r, b := build(RequestDHCP)
		require.Equal(t, byte(1), b[0], "BOOTREQUEST")
		require.Equal(t, []byte{10, 0, 0, 2}, b[12:16], "ciaddr is our address")
		require.Equal(t, []byte{99, 130, 83, 99}, b[236:240], "magic cookie")
		require.Equal(t, []byte{53, 1, 8}, b[240:243], "DHCPINFORM")
		require.Equal(t, byte(255), b[len(b)-1])
		require.Equal(t, nonce, string(bytes.TrimRight(b[108:236], "\x00")), "the nonce in the file field")
		require.Equal(t, byte(2), b[28]&3, "a locally administered, unicast chaddr")
		reply := append([]byte(nil), b...)
		reply[0] = 2
		clear(reply[108:236]) // servers overwrite the file field
		why, ok := r.proof(reply)
		require.True(t, ok)
		require.Contains(t, why, "xid")
		reply[4]++
		_, ok = r.proof(reply)
		require.False(t, ok)
		_, err := r.build(netip.MustParseAddrPort("[2001:db8::2]:1"))
		require.Error(t, err)
	})

	t.Run("tftp", func(t *testing.T) {
		r, b := build(RequestTFTP)
		require.Equal(t, append(append([]byte{0, 1}, nonce...), "\x00octet\x00"...), b)
		require.True(t, r.anyPort, "a TFTP server answers from a fresh port")
		_, ok := r.proof([]byte{0, 5, 0, 1, 'F', 0})
		require.False(t, ok, "an ERROR does not quote the file")
	})

	t.Run("ntp", func(t *testing.T) {
		r, b := build(RequestNTP)
		require.Len(t, b, 48)
		require.Equal(t, byte(0x23), b[0], "LI 0, version 4, mode 3 (client)")
		reply := make([]byte, 48)
		reply[0] = 0x24 // mode 4, server
		copy(reply[24:32], b[40:48])
		_, ok := r.proof(reply)
		require.True(t, ok)
		reply[0] = 0x23
		_, ok = r.proof(reply)
		require.False(t, ok, "a client packet is not an answer")
	})

	t.Run("netbios", func(t *testing.T) {
		r, b := build(RequestNetBIOS)
		require.Len(t, b, 50)
		require.Equal(t, []byte{0, 0, 0, 1, 0, 0, 0, 0, 0, 0}, b[2:12], "a query, one question")
		require.Equal(t, byte(32), b[12])
		require.Equal(t, "CK"+strings.Repeat("AA", 15), string(b[13:45]), `"*" first-level encoded`)
		require.Equal(t, []byte{0, 0, 0x21, 0, 1}, b[45:50], "NBSTAT, IN")
		reply := append([]byte(nil), b...)
		reply[2] |= 0x84
		_, ok := r.proof(reply)
		require.True(t, ok)
	})

	t.Run("snmp", func(t *testing.T) {
		r, b := build(RequestSNMP)
		tag, msg, rest := ber(t, b)
		require.Equal(t, byte(0x30), tag)
		require.Empty(t, rest)
		tag, v, msg := ber(t, msg)
		require.Equal(t, []byte{0x02}, []byte{tag})
		require.Equal(t, []byte{1}, v, "version 2c")
		tag, v, msg = ber(t, msg)
		require.Equal(t, byte(0x04), tag)
		require.Equal(t, "public", string(v))
		tag, pdu, msg := ber(t, msg)
		require.Equal(t, byte(0xa0), tag, "GetRequest")
		require.Empty(t, msg)
		for range 3 { // request-id, error-status, error-index
			tag, _, pdu = ber(t, pdu)
			require.Equal(t, byte(0x02), tag)
		}
		tag, vbs, pdu := ber(t, pdu)
		require.Equal(t, byte(0x30), tag)
		require.Empty(t, pdu)
		var oids [][]byte
		for len(vbs) > 0 {
			var vb []byte
			tag, vb, vbs = ber(t, vbs)
			require.Equal(t, byte(0x30), tag)
			tag, oid, vb := ber(t, vb)
			require.Equal(t, byte(0x06), tag)
			oids = append(oids, oid)
			tag, _, vb = ber(t, vb)
			require.Equal(t, byte(0x05), tag)
			require.Empty(t, vb)
		}
		require.Len(t, oids, 2)
		require.Equal(t, []byte{0x2b, 6, 1, 2, 1, 1, 1, 0}, oids[0], "sysDescr.0")
		require.Equal(t, append([]byte{0x2b, 6, 1, 4, 1, 0x81, 0xfd, 0x59}, nonce...), oids[1], "1.3.6.1.4.1.32473.<nonce>")
		_, ok := r.proof(b)
		require.True(t, ok, "a reply quoting the OID proves it")
		_, ok = r.proof([]byte("no"))
		require.False(t, ok)
	})

	t.Run("ssdp", func(t *testing.T) {
		_, b := build(RequestSSDP)
		s := string(b)
		require.True(t, strings.HasPrefix(s, "M-SEARCH * HTTP/1.1\r\n"))
		require.Contains(t, s, "\r\nHOST: 10.0.0.1:53\r\n")
		require.Contains(t, s, "\r\nMAN: \"ssdp:discover\"\r\n")
		require.Contains(t, s, "\r\nX-Drill-Nonce: "+nonce+"\r\n")
		require.True(t, strings.HasSuffix(s, "\r\n\r\n"))
	})

	t.Run("nonce", func(t *testing.T) {
		r, b := build(RequestNonce)
		require.Equal(t, probeLine(nonce), b)
		_, ok := r.proof([]byte(EchoPrefix + "x " + string(b)))
		require.True(t, ok)
	})

	// An echo listener on a well-known port quotes the request, nonce and
	// all: every request that carries the nonce verbatim is reached by it.
	for _, name := range []string{RequestDNS, RequestTFTP, RequestSNMP, RequestSSDP, RequestDHCP} {
		r, b := build(name)
		_, ok := r.proof(append([]byte(EchoPrefix+"x "), b...))
		require.True(t, ok, "%s echoed", name)
	}
}
