package probes

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"net/netip"
	"strings"

	"github.com/box-isolation/box/probes/observation"
	"github.com/miekg/dns"
)

// A UDP probe to a well-known port sends a minimal valid request of that
// port's protocol, because a real server never answers a bare nonce line:
// the probe would read silent although its datagram arrived. The request is
// chosen by destination port unless the probe's payload names one:
//
//	port       request   what is sent                                  what proves the answer is to it
//	53, 5353,  dns       query, type A, RD set, for <nonce>.drill.invalid.  the reply echoes the query id and that question (the nonce)
//	5355       (DNS, mDNS and LLMNR share the wire format)
//	67         dhcp      DHCPINFORM BOOTREQUEST, ciaddr = our address,  a BOOTREPLY with the xid (4 bytes derived from the nonce)
//	                     the nonce in the file field
//	69         tftp      read request (RRQ) for the file <nonce>, octet  nothing: a TFTP server answers an unknown file with an
//	                                                                      ERROR that does not quote it, and from another port
//	123        ntp       NTPv4 client request, 48 bytes                 the reply's origin timestamp equals our transmit timestamp
//	                                                                      (8 bytes derived from the nonce; 48 bytes cannot hold it)
//	137        netbios   NetBIOS node-status query for "*"             the reply's transaction id (2 bytes derived from the nonce)
//	161        snmp      SNMPv2c GetRequest, community "public", for   the reply quotes the second OID, whose sub-identifiers
//	                     sysDescr.0 and 1.3.6.1.4.1.32473.<nonce>       are the nonce's bytes
//	1900       ssdp      unicast M-SEARCH, ST ssdp:all, the nonce in    nothing: a device's answer does not quote the request
//	                     an X-Drill-Nonce header
//	other      nonce     ProbePrefix+nonce+"\n" (the drill's listeners)  the echo quotes the nonce
//	(payload)  quic      a QUIC v1 Initial's long header, 1200 bytes,  the echo quotes the nonce
//	                     the nonce line inside (an egress rule drops
//	                     UDP 443 whatever it holds)
//
// Any reply from the target's address and port is arrival. It is reached
// when it carries the nonce (anywhere, as an echo listener quotes it) or
// the request's proof above, refused otherwise. Two exceptions to "address
// and port": a TFTP server answers from a fresh port (its transfer id), so
// the tftp request accepts a reply from any port of the target's address;
// and DHCP is IPv4 only, so port 67 on an IPv6 target sends the nonce line.
//
// Known limits, documented rather than guessed around: a DHCP server that
// does not answer DHCPINFORM (or answers only to port 68) leaves the probe
// silent; an mDNS responder on 5353 does not answer a name it does not own;
// the NTP, NetBIOS and DHCP requests do not carry the whole nonce, so a
// witness at the target must match them by source and port, not by nonce
// (the DNS, TFTP, SNMP and SSDP requests carry it verbatim).

// UDP request names (evidence.request, and the values a probe's payload may
// force).
const (
	RequestNonce   = "nonce"
	RequestDNS     = "dns"
	RequestDHCP    = "dhcp"
	RequestTFTP    = "tftp"
	RequestNTP     = "ntp"
	RequestNetBIOS = "netbios"
	RequestSNMP    = "snmp"
	RequestSSDP    = "ssdp"
	RequestQUIC    = "quic"
)

// udpRequests lists every request a payload may name, in a stable order.
var udpRequests = []string{RequestNonce, RequestDNS, RequestDHCP, RequestTFTP, RequestNTP, RequestNetBIOS, RequestSNMP, RequestSSDP, RequestQUIC}

// requestForPort is the table above: the request sent to a port when the
// probe does not name one.
func requestForPort(port int) string {
	switch port {
	case 53, 5353, 5355: // DNS, mDNS, LLMNR: one wire format
		return RequestDNS
	case 67:
		return RequestDHCP
	case 69:
		return RequestTFTP
	case 123:
		return RequestNTP
	case 137:
		return RequestNetBIOS
	case 161:
		return RequestSNMP
	case 1900:
		return RequestSSDP
	}
	return RequestNonce
}

// udpRequestFor picks the request for a probe: its payload if it names
// one, else by port, with DHCP falling back to the nonce line for IPv6.
func udpRequestFor(spec *ProbeSpec) string {
	if spec.Payload != "" {
		return spec.Payload
	}
	r := requestForPort(spec.Port)
	if r == RequestDHCP && !spec.Target.Unmap().Is4() {
		return RequestNonce
	}
	return r
}

func checkPayload(p string) error {
	for _, r := range udpRequests {
		if p == r {
			return nil
		}
	}
	return fmt.Errorf("payload %q is not one of %s", observation.Truncate(p, 16), strings.Join(udpRequests, ", "))
}

// udpRequest is one request ready to send.
type udpRequest struct {
	name string
	// build makes the datagram once the socket knows its local address
	// (DHCPINFORM carries it as ciaddr).
	build func(local netip.AddrPort) ([]byte, error)
	// proof reports whether a reply answers this request, and how. A reply
	// holding the nonce anywhere always does (an echo listener).
	proof func(reply []byte) (string, bool)
	// anyPort accepts replies from any port of the target (TFTP).
	anyPort bool
}

// nonceToken derives n bytes from the nonce, for requests with no room for
// the nonce itself: an answer that echoes them read this request.
func nonceToken(nonce string, n int) []byte {
	h := sha256.Sum256([]byte("drill udp token " + nonce))
	return h[:n]
}

// dnsNonceName is the question a DNS request asks: the nonce as the first
// label (two labels if it is longer than a label may be) under
// drill.invalid., a name no resolver can know (RFC 6761).
func dnsNonceName(nonce string) string {
	if len(nonce) > 63 {
		return nonce[:63] + "." + nonce[63:] + ".drill.invalid."
	}
	return nonce + ".drill.invalid."
}

// newUDPRequest builds the named request for nonce, sent to target.
func newUDPRequest(name, nonce string, target netip.AddrPort) (udpRequest, error) {
	echo := func(reply []byte) (string, bool) {
		return "the peer echoed the nonce", bytes.Contains(reply, []byte(nonce))
	}
	r := udpRequest{name: name, proof: echo}
	fixed := func(b []byte) func(netip.AddrPort) ([]byte, error) {
		return func(netip.AddrPort) ([]byte, error) { return b, nil }
	}
	switch name {
	case RequestNonce:
		r.build = fixed(probeLine(nonce))
	case RequestDNS:
		wire, id, q, err := dnsNonceQuery(nonce)
		if err != nil {
			return r, err
		}
		r.build = fixed(wire)
		r.proof = func(b []byte) (string, bool) {
			var in dns.Msg
			if in.Unpack(b) == nil && in.Response && in.Id == id && len(in.Question) == 1 &&
				strings.EqualFold(in.Question[0].Name, q.Name) && in.Question[0].Qtype == q.Qtype {
				return "the DNS reply (" + rcodeName(in.Rcode) + ") answers our query id and question, which holds the nonce", true
			}
			return echo(b)
		}
	case RequestDHCP:
		xid := binary.BigEndian.Uint32(nonceToken(nonce, 4))
		r.build = func(local netip.AddrPort) ([]byte, error) { return dhcpInform(nonce, xid, local.Addr()) }
		r.proof = func(b []byte) (string, bool) {
			if len(b) >= 240 && b[0] == 2 && binary.BigEndian.Uint32(b[4:8]) == xid {
				return "a BOOTREPLY with our xid (derived from the nonce)", true
			}
			return echo(b)
		}
	case RequestTFTP:
		r.build = fixed(tftpRRQ(nonce))
		r.anyPort = true
	case RequestNTP:
		token := nonceToken(nonce, 8)
		r.build = fixed(ntpRequest(token))
		r.proof = func(b []byte) (string, bool) {
			if len(b) >= 48 && b[0]&7 == 4 && bytes.Equal(b[24:32], token) {
				return "an NTP server reply whose origin timestamp is our transmit timestamp (derived from the nonce)", true
			}
			return echo(b)
		}
	case RequestNetBIOS:
		id := nonceToken(nonce, 2)
		r.build = fixed(netbiosStatus(id))
		r.proof = func(b []byte) (string, bool) {
			if len(b) >= 12 && bytes.Equal(b[0:2], id) && b[2]&0x80 != 0 {
				return "a NetBIOS name service response with our transaction id (derived from the nonce)", true
			}
			return echo(b)
		}
	case RequestSNMP:
		wire, err := snmpGet(nonce, binary.BigEndian.Uint32(nonceToken(nonce, 4))&0x7fffffff)
		if err != nil {
			return r, err
		}
		r.build = fixed(wire)
		r.proof = func(b []byte) (string, bool) {
			if bytes.Contains(b, []byte(nonce)) {
				return "the SNMP reply quotes the OID that holds the nonce", true
			}
			return "", false
		}
	case RequestSSDP:
		r.build = fixed(ssdpSearch(target, nonce))
	case RequestQUIC:
		r.build = fixed(quicInitial(nonce))
	default:
		return r, fmt.Errorf("no udp request %q", observation.Truncate(name, 16))
	}
	return r, nil
}

func rcodeName(rc int) string {
	if s := dns.RcodeToString[rc]; s != "" {
		return s
	}
	return fmt.Sprintf("RCODE%d", rc)
}

func dnsNonceQuery(nonce string) ([]byte, uint16, dns.Question, error) {
	q := dns.Question{Name: dnsNonceName(nonce), Qtype: dns.TypeA, Qclass: dns.ClassINET}
	m := new(dns.Msg)
	m.Id = dns.Id()
	m.RecursionDesired = true
	m.Question = []dns.Question{q}
	wire, err := m.Pack()
	if err != nil {
		return nil, 0, q, fmt.Errorf("pack dns query: %w", err)
	}
	return wire, m.Id, q, nil
}

// dhcpInform is a DHCPINFORM (RFC 2131): a client that has an address
// asks for its configuration. Unlike a DISCOVER, whose answer goes to port
// 68 or to broadcast, an INFORM's answer goes to ciaddr, and dnsmasq (the
// Incus bridge's server) sends it to the request's source port. The nonce
// rides in the file field, which servers overwrite in their reply.
func dhcpInform(nonce string, xid uint32, ciaddr netip.Addr) ([]byte, error) {
	if !ciaddr.Unmap().Is4() {
		return nil, fmt.Errorf("dhcp request needs an IPv4 source address, not %s", ciaddr)
	}
	b := make([]byte, 240, 260)
	b[0], b[1], b[2] = 1, 1, 6 // BOOTREQUEST, Ethernet, 6-byte address
	binary.BigEndian.PutUint32(b[4:8], xid)
	ca := ciaddr.Unmap().As4()
	copy(b[12:16], ca[:])
	// chaddr: a locally administered address derived from the nonce; the
	// request is a question, it claims no lease.
	hw := nonceToken(nonce, 6)
	hw[0] = hw[0]&0xfc | 0x02
	copy(b[28:34], hw)
	copy(b[108:236], nonce) // file: 128 bytes, a nonce is at most 64
	copy(b[236:240], []byte{99, 130, 83, 99})
	b = append(b,
		53, 1, 8, // DHCP message type: INFORM
		55, 3, 1, 3, 6, // parameter request list: mask, router, DNS
		255)
	return b, nil
}

// tftpRRQ is a TFTP read request (RFC 1350) for the file named nonce.
func tftpRRQ(nonce string) []byte {
	b := []byte{0, 1}
	b = append(b, nonce...)
	b = append(b, 0)
	b = append(b, "octet"...)
	return append(b, 0)
}

// ntpRequest is an NTPv4 client request (RFC 5905): 48 bytes, LI 0,
// version 4, mode 3, with token as the transmit timestamp, which a server
// copies into its reply's origin timestamp.
func ntpRequest(token []byte) []byte {
	b := make([]byte, 48)
	b[0] = 0<<6 | 4<<3 | 3
	copy(b[40:48], token)
	return b
}

// netbiosStatus is a NetBIOS node-status request (RFC 1002 4.2.17) for the
// wildcard name "*".
func netbiosStatus(id []byte) []byte {
	b := make([]byte, 0, 50)
	b = append(b, id[0], id[1], 0, 0, 0, 1, 0, 0, 0, 0, 0, 0)
	// "*" padded with NULs to 16 bytes, first-level encoded: each half
	// byte + 'A'.
	name := make([]byte, 16)
	name[0] = '*'
	b = append(b, 32)
	for _, c := range name {
		b = append(b, 'A'+c>>4, 'A'+c&0x0f)
	}
	return append(b, 0, 0, 0x21, 0, 1) // NBSTAT, IN
}

// snmpGet is an SNMPv2c GetRequest (RFC 3416) with community "public" for
// sysDescr.0 and for 1.3.6.1.4.1.32473.<nonce bytes> (32473 is the
// enterprise number for documentation, RFC 5612). Every byte of a nonce is
// below 128, so each is one sub-identifier encoded as itself: the nonce
// appears verbatim in the request and in the reply, which quotes every OID
// it was asked for (with noSuchObject for the second).
func snmpGet(nonce string, reqID uint32) ([]byte, error) {
	oid := func(arcs ...int) []byte {
		b := []byte{byte(arcs[0]*40 + arcs[1])}
		for _, a := range arcs[2:] {
			var enc []byte
			enc = append(enc, byte(a&0x7f))
			for a >>= 7; a > 0; a >>= 7 {
				enc = append([]byte{byte(a&0x7f | 0x80)}, enc...)
			}
			b = append(b, enc...)
		}
		return tlv(0x06, b)
	}
	nullv := []byte{0x05, 0x00}
	sysDescr := oid(1, 3, 6, 1, 2, 1, 1, 1, 0)
	arcs := []int{1, 3, 6, 1, 4, 1, 32473}
	for i := 0; i < len(nonce); i++ {
		arcs = append(arcs, int(nonce[i]))
	}
	mark := oid(arcs...)
	vbs := tlv(0x30, append(tlv(0x30, append(sysDescr, nullv...)), tlv(0x30, append(mark, nullv...))...))
	var id [4]byte
	binary.BigEndian.PutUint32(id[:], reqID)
	pdu := tlv(0xa0, concat(tlv(0x02, id[:]), []byte{0x02, 0x01, 0x00}, []byte{0x02, 0x01, 0x00}, vbs))
	msg := tlv(0x30, concat([]byte{0x02, 0x01, 0x01}, tlv(0x04, []byte("public")), pdu))
	if len(msg) > 1400 {
		return nil, fmt.Errorf("snmp request of %d bytes", len(msg))
	}
	return msg, nil
}

// tlv is one BER element with a definite length.
func tlv(tag byte, v []byte) []byte {
	n := len(v)
	var b []byte
	switch {
	case n < 0x80:
		b = []byte{tag, byte(n)}
	case n < 0x100:
		b = []byte{tag, 0x81, byte(n)}
	default:
		b = []byte{tag, 0x82, byte(n >> 8), byte(n)}
	}
	return append(b, v...)
}

func concat(parts ...[]byte) []byte {
	var b []byte
	for _, p := range parts {
		b = append(b, p...)
	}
	return b
}

// ssdpSearch is a unicast M-SEARCH (UPnP Device Architecture 1.1, 1.3.2):
// no MX, HOST the target.
func ssdpSearch(target netip.AddrPort, nonce string) []byte {
	return []byte("M-SEARCH * HTTP/1.1\r\n" +
		"HOST: " + target.String() + "\r\n" +
		"MAN: \"ssdp:discover\"\r\n" +
		"ST: ssdp:all\r\n" +
		"USER-AGENT: Linux/1 UPnP/1.1 box-drill/1\r\n" +
		"X-Drill-Nonce: " + nonce + "\r\n\r\n")
}

// quicInitial is a datagram shaped as a QUIC version 1 Initial (long
// header, the 1200 bytes a client's first flight takes) with the nonce
// line in its payload: not a handshake any server completes, but what a
// firewall that tells QUIC by port or by header sees.
func quicInitial(nonce string) []byte {
	token := nonceToken(nonce, 8)
	b := []byte{0xc3, 0, 0, 0, 1, 8}
	b = append(b, token...)
	b = append(b, 0, 0) // no source connection id, no token
	rest := 1200 - len(b) - 2
	b = append(b, byte(0x40|rest>>8), byte(rest))
	b = append(b, probeLine(nonce)...)
	return append(b, make([]byte, 1200-len(b))...)
}
