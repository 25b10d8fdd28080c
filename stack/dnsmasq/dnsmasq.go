// Package dnsmasq reads what the bridge's dnsmasq keeps and takes (its
// lease file, its --dhcp-range) and sends it the releases of leases no box
// holds: dnsmasq's own formats, apart from Incus's view of its leases.
package dnsmasq

import (
	"bufio"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/box-isolation/box/internal/dhcpmsg"
)

// Lease is one IPv4 lease in dnsmasq's lease file.
type Lease struct {
	Expires time.Time  `json:"expires"`
	Hwaddr  string     `json:"hwaddr"` // as dnsmasq writes it: "06-..." for a hardware type other than Ethernet
	Address netip.Addr `json:"address"`
	// ClientID is the client identifier, "" when it sent none (or
	// dnsmasq ignores them, dhcp-ignore-clid).
	ClientID string `json:"client_id,omitempty"`
}

// ParseRange reads an IPv4 --dhcp-range: "start,end[,mask][,lease]"
// (tag: and set: prefixes skipped).
func ParseRange(r string) (lo, hi netip.Addr, ok bool) {
	var addrs []netip.Addr
	for _, f := range strings.Split(r, ",") {
		if a, err := netip.ParseAddr(f); err == nil && a.Is4() {
			addrs = append(addrs, a)
		}
	}
	if len(addrs) < 2 || addrs[1].Less(addrs[0]) {
		return lo, hi, false
	}
	return addrs[0], addrs[1], true
}

// RangeSize counts the addresses from lo to hi.
func RangeSize(lo, hi netip.Addr) int {
	l, h := lo.As4(), hi.As4()
	return int(uint32(h[0])<<24|uint32(h[1])<<16|uint32(h[2])<<8|uint32(h[3])) -
		int(uint32(l[0])<<24|uint32(l[1])<<16|uint32(l[2])<<8|uint32(l[3])) + 1
}

// ParseLeases reads dnsmasq's lease file: "expiry hwaddr address name
// client-id" per IPv4 lease; IPv6 leases (after a "duid" line) are left
// out.
func ParseLeases(r interface{ Read([]byte) (int, error) }) ([]Lease, error) {
	var out []Lease
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 || f[0] == "duid" {
			continue
		}
		if len(f) < 4 {
			return out, fmt.Errorf("a line of %d fields: %q", len(f), sc.Text())
		}
		a, err := netip.ParseAddr(f[2])
		if err != nil || !a.Is4() {
			continue
		}
		exp, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return out, fmt.Errorf("expiry %q: %w", f[0], err)
		}
		l := Lease{Expires: time.Unix(exp, 0).UTC(), Hwaddr: strings.ToLower(f[1]), Address: a}
		if len(f) > 4 && f[4] != "*" {
			l.ClientID = strings.ToLower(f[4])
		}
		out = append(out, l)
	}
	return out, sc.Err()
}

// SendReleases sends a DHCPRELEASE for each lease to the server at gw,
// paced: dnsmasq's socket drops what a burst puts beyond its buffer.
func SendReleases(gw netip.Addr, leases []Lease) error {
	c, err := net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(gw, 67)))
	if err != nil {
		return err
	}
	defer c.Close()
	for i, l := range leases {
		if i%4 == 3 {
			time.Sleep(2 * time.Millisecond)
		}
		htype, hw, err := leaseClient(l.Hwaddr)
		if err != nil {
			continue // not a client dnsmasq could have
		}
		m := dhcpmsg.Message{Type: dhcpmsg.Release, HType: htype, CHAddr: hw, CIAddr: l.Address,
			Options: []dhcpmsg.Option{dhcpmsg.Addr(dhcpmsg.OptServerID, gw)}}
		if id, err := hexField(l.ClientID); err == nil && len(id) > 0 {
			m.Options = append(m.Options, dhcpmsg.Option{Code: dhcpmsg.OptClientID, Data: id})
		}
		b, err := m.Marshal()
		if err != nil {
			continue
		}
		if _, err := c.Write(b); err != nil {
			return err
		}
	}
	return nil
}

// leaseClient reads a lease file's hardware field: "06-aa:bb:..." for a
// hardware type other than Ethernet, "aa:bb:..." (any length) for
// Ethernet.
func leaseClient(field string) (byte, []byte, error) {
	htype := dhcpmsg.HTypeEthernet
	if t, rest, ok := strings.Cut(field, "-"); ok {
		v, err := strconv.ParseUint(t, 16, 8)
		if err != nil {
			return 0, nil, err
		}
		htype, field = byte(v), rest
	}
	hw, err := hexField(field)
	if err != nil || len(hw) == 0 {
		return 0, nil, fmt.Errorf("hardware address %q", field)
	}
	return htype, hw, nil
}

// hexField reads colon-separated hex bytes.
func hexField(s string) ([]byte, error) {
	if s == "" {
		return nil, nil
	}
	var out []byte
	for _, p := range strings.Split(s, ":") {
		v, err := strconv.ParseUint(p, 16, 8)
		if err != nil {
			return nil, err
		}
		out = append(out, byte(v))
	}
	return out, nil
}
