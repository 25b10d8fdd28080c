// Package dhcpmsg encodes and decodes DHCP messages (RFC 2131, RFC 2132)
// as a client sends them: the BOOTP header and its options. The probes
// forge them from inside a box; the stack releases leases from the host.
// It builds messages only: sockets and frames are its callers'.
package dhcpmsg

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
)

// Message types (option 53).
const (
	Discover byte = 1
	Offer    byte = 2
	Request  byte = 3
	Decline  byte = 4
	Ack      byte = 5
	Nak      byte = 6
	Release  byte = 7
)

// Options a client sends.
const (
	OptRequestedIP byte = 50
	OptMessageType byte = 53
	OptServerID    byte = 54
	OptClientID    byte = 61
	OptRapidCommit byte = 80 // RFC 4039: a DISCOVER that takes its lease at once
	optPad         byte = 0
	optEnd         byte = 255
)

// Hardware types (htype).
const (
	HTypeEthernet byte = 1
	HTypeIEEE802  byte = 6
)

// headerLen is the fixed BOOTP header: op to file, before the cookie.
const headerLen = 236

// chaddrMax is the size of the chaddr field.
const chaddrMax = 16

var cookie = [4]byte{99, 130, 83, 99}

// Option is one DHCP option.
type Option struct {
	Code byte
	Data []byte
}

// Message is a DHCP message from a client (op BOOTREQUEST).
type Message struct {
	Type  byte // option 53
	HType byte // 0 means Ethernet
	// CHAddr is the client hardware address; hlen is its length (at most
	// 16).
	CHAddr []byte
	Xid    uint32
	// Broadcast asks the server to answer by broadcast.
	Broadcast bool
	CIAddr    netip.Addr
	// SName is the server host name field, which no server reads: a
	// place for a marker a capture can find.
	SName   string
	Options []Option // after option 53, in order
}

// Marshal encodes m as a client sends it.
func (m Message) Marshal() ([]byte, error) {
	if len(m.CHAddr) == 0 || len(m.CHAddr) > chaddrMax {
		return nil, fmt.Errorf("chaddr of %d bytes: a client's is 1 to %d", len(m.CHAddr), chaddrMax)
	}
	if len(m.SName) > 64 {
		return nil, errors.New("sname longer than 64 bytes")
	}
	b := make([]byte, headerLen, headerLen+64)
	b[0] = 1 // BOOTREQUEST
	b[1] = m.HType
	if b[1] == 0 {
		b[1] = HTypeEthernet
	}
	b[2] = byte(len(m.CHAddr))
	binary.BigEndian.PutUint32(b[4:8], m.Xid)
	if m.Broadcast {
		binary.BigEndian.PutUint16(b[10:12], 0x8000)
	}
	if m.CIAddr.IsValid() {
		if !m.CIAddr.Is4() {
			return nil, fmt.Errorf("ciaddr %s is not IPv4", m.CIAddr)
		}
		a := m.CIAddr.As4()
		copy(b[12:16], a[:])
	}
	copy(b[28:28+chaddrMax], m.CHAddr)
	copy(b[44:108], m.SName)
	b = append(b, cookie[:]...)
	b = append(b, OptMessageType, 1, m.Type)
	for _, o := range m.Options {
		if len(o.Data) > 255 || o.Code == optPad || o.Code == optEnd || o.Code == OptMessageType {
			return nil, fmt.Errorf("option %d of %d bytes cannot be sent so", o.Code, len(o.Data))
		}
		b = append(b, o.Code, byte(len(o.Data)))
		b = append(b, o.Data...)
	}
	return append(b, optEnd), nil
}

// Addr is an option carrying one IPv4 address (requested IP, server id).
func Addr(code byte, a netip.Addr) Option {
	a4 := a.As4()
	return Option{Code: code, Data: a4[:]}
}

// Parse decodes a client's message (what Marshal makes).
func Parse(b []byte) (Message, error) {
	var m Message
	if len(b) < headerLen+len(cookie) || [4]byte(b[headerLen:headerLen+4]) != cookie {
		return m, errors.New("not a DHCP message (too short, or no magic cookie)")
	}
	if b[0] != 1 {
		return m, fmt.Errorf("op %d is not a client's", b[0])
	}
	hlen := int(b[2])
	if hlen == 0 || hlen > chaddrMax {
		return m, fmt.Errorf("hlen %d", hlen)
	}
	m.HType = b[1]
	m.CHAddr = append([]byte(nil), b[28:28+hlen]...)
	m.Xid = binary.BigEndian.Uint32(b[4:8])
	m.Broadcast = binary.BigEndian.Uint16(b[10:12])&0x8000 != 0
	if ci := netip.AddrFrom4([4]byte(b[12:16])); !ci.IsUnspecified() {
		m.CIAddr = ci
	}
	sname := b[44:108]
	for i, c := range sname {
		if c == 0 {
			sname = sname[:i]
			break
		}
	}
	m.SName = string(sname)
	opts := b[headerLen+4:]
	for len(opts) > 0 {
		code := opts[0]
		if code == optEnd {
			break
		}
		if code == optPad {
			opts = opts[1:]
			continue
		}
		if len(opts) < 2 || len(opts) < 2+int(opts[1]) {
			return m, fmt.Errorf("option %d runs past the message", code)
		}
		data := opts[2 : 2+int(opts[1])]
		if code == OptMessageType && len(data) == 1 {
			m.Type = data[0]
		} else {
			m.Options = append(m.Options, Option{Code: code, Data: append([]byte(nil), data...)})
		}
		opts = opts[2+int(opts[1]):]
	}
	if m.Type == 0 {
		return m, errors.New("no message type (option 53)")
	}
	return m, nil
}

// Option finds an option by its code.
func (m Message) Option(code byte) ([]byte, bool) {
	for _, o := range m.Options {
		if o.Code == code {
			return o.Data, true
		}
	}
	return nil, false
}

// TypeName names a message type as RFC 2131 does.
func TypeName(t byte) string {
	if n, ok := map[byte]string{Discover: "DHCPDISCOVER", Offer: "DHCPOFFER", Request: "DHCPREQUEST", Decline: "DHCPDECLINE",
		Ack: "DHCPACK", Nak: "DHCPNAK", Release: "DHCPRELEASE"}[t]; ok {
		return n
	}
	return fmt.Sprintf("DHCP type %d", t)
}
