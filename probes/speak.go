package probes

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"strings"
)

// What a tcp probe says once connected (ProbeSpec.Speak). An egress proxy
// between a box and the internet decides by the name in the first thing a
// box sends: a TLS ClientHello's server name, an HTTP request's Host. So
// the probe speaks those, with the nonce where a greeter that echoes its
// first line (up to 512 bytes, to the first newline) echoes it back:
//
//   - http: "GET /<nonce> HTTP/1.1" and a Host header.
//   - tls: a TLS 1.3 ClientHello whose random is the nonce (32 ASCII
//     bytes) and whose server name is ServerName; no byte before the
//     random is a newline.
//
// A refusal by an egress proxy is told apart from the target's own answer
// (policyRefusal): an HTTP response carrying the header X-Box-Egress:
// refused, or a fatal TLS alert before the target said anything. Both are
// "rejected" (something other than the target said the connection will
// not be delivered); the witness at the target says whether anything got
// there.

// egressRefusedHeader is the header box's egress proxy puts on its 403.
const egressRefusedHeader = "x-box-egress: refused"

// spoken is what a tcp probe sends.
func spoken(spec ProbeSpec) []byte {
	switch spec.Speak {
	case SpeakHTTP:
		host := spec.ServerName
		if host == "" {
			host = spec.Target.String()
		}
		return []byte(fmt.Sprintf("GET /%s HTTP/1.1\r\nHost: %s\r\nUser-Agent: box-drill\r\nConnection: close\r\n\r\n", spec.Nonce, host))
	case SpeakTLS:
		return clientHello(spec.ServerName, spec.Nonce)
	}
	return probeLine(spec.Nonce)
}

// clientHello is a TLS 1.3 ClientHello record for sni (none when empty)
// whose 32-byte random is the nonce, padded or cut to 32 bytes. A padding
// extension keeps every length byte before the random from being a
// newline.
func clientHello(sni, nonce string) []byte {
	random := []byte(nonce + strings.Repeat("N", 32))[:32]
	for pad := 0; ; pad++ {
		b := helloRecord(sni, random, pad)
		if !bytes.Contains(b[:11], []byte{'\n'}) {
			return b
		}
	}
}

func helloRecord(sni string, random []byte, pad int) []byte {
	u16 := func(v int) []byte { return binary.BigEndian.AppendUint16(nil, uint16(v)) }
	ext := func(typ int, body []byte) []byte { return append(append(u16(typ), u16(len(body))...), body...) }
	var exts []byte
	if sni != "" {
		name := append([]byte{0}, append(u16(len(sni)), sni...)...)
		exts = append(exts, ext(0x0000, append(u16(len(name)), name...))...)
	}
	exts = append(exts, ext(0x002b, []byte{4, 0x03, 0x04, 0x03, 0x03})...)    // supported_versions: 1.3, 1.2
	exts = append(exts, ext(0x000a, []byte{0, 4, 0x00, 0x1d, 0x00, 0x17})...) // supported_groups: x25519, P-256
	exts = append(exts, ext(0x000d, []byte{0, 6, 4, 3, 8, 4, 4, 1})...)       // signature_algorithms
	share := append([]byte{0x00, 0x1d, 0x00, 0x20}, bytes.Repeat([]byte{0x42}, 32)...)
	exts = append(exts, ext(0x0033, append(u16(len(share)), share...))...) // key_share
	exts = append(exts, ext(0x0015, make([]byte, pad))...)                 // padding
	body := []byte{0x03, 0x03}
	body = append(body, random...)
	body = append(body, 32)
	body = append(body, bytes.Repeat([]byte{0x53}, 32)...) // session id
	body = append(body, 0, 6, 0x13, 0x01, 0x13, 0x02, 0xc0, 0x2f)
	body = append(body, 1, 0) // compression: none
	body = append(body, u16(len(exts))...)
	body = append(body, exts...)
	hs := append([]byte{0x01, byte(len(body) >> 16), byte(len(body) >> 8), byte(len(body))}, body...)
	return append(append([]byte{0x16, 0x03, 0x01}, u16(len(hs))...), hs...)
}

// tlsAlerts names the alerts a refusal may carry.
var tlsAlerts = map[byte]string{40: "handshake_failure", 48: "unknown_ca", 49: "access_denied", 80: "internal_error", 112: "unrecognized_name"}

// policyRefusal says whether what a speaking tcp probe got back is an
// egress proxy's refusal, and why.
func policyRefusal(spec ProbeSpec, got []byte) (Outcome, string, bool) {
	switch spec.Speak {
	case SpeakHTTP:
		head, _, _ := bytes.Cut(got, []byte("\r\n\r\n"))
		if bytes.HasPrefix(got, []byte("HTTP/1.")) && bytes.Contains(bytes.ToLower(head), []byte(egressRefusedHeader)) {
			status, _, _ := bytes.Cut(got, []byte("\r\n"))
			why := "refused by an egress proxy (" + string(status)
			if _, body, ok := bytes.Cut(got, []byte("\r\n\r\n")); ok && len(body) > 0 {
				why += ": " + strings.TrimSpace(printable(body, 200))
			}
			return Rejected, why + ")", true
		}
	case SpeakTLS:
		if len(got) >= 7 && got[0] == 0x15 && got[1] == 0x03 && got[5] == 2 {
			name := tlsAlerts[got[6]]
			if name == "" {
				name = fmt.Sprintf("alert %d", got[6])
			}
			return Rejected, "a fatal TLS alert (" + name + ") before the target said anything: refused by an egress proxy", true
		}
	}
	return "", "", false
}
