package probes

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"strings"

	"github.com/mdlayher/packet"
	"golang.org/x/sys/unix"

	"github.com/box-isolation/box/internal/dhcpmsg"
	"github.com/box-isolation/box/probes/observation"
)

// The DHCP messages a dhcp_forge probe sends (its "dhcp").
const (
	// DHCPRelease gives up the lease of client_hw at target (ciaddr), to
	// server_id.
	DHCPRelease = "release"
	// DHCPDecline refuses target (requested address) for client_hw, to
	// server_id: dnsmasq then disables a configured address for 10
	// minutes.
	DHCPDecline = "decline"
	// DHCPDiscover asks for a lease for client_hw, with rapid commit (RFC
	// 4039: a server that does it leases at once).
	DHCPDiscover = "discover"
	// DHCPRequest asks for target for client_hw, as a client rebooting
	// with an address asks (INIT-REBOOT: no server identifier).
	DHCPRequest = "request"
)

// probeDHCPForge sends, from the interface holding Via, with our own MAC
// and (for a release or decline) our own address, one DHCP message naming
// a client that need not be us (claim C-SPOOF): client_hw (our MAC when
// empty) of hardware type htype, with client_id when given. The server
// keys a lease on those payload fields, not on the frame; the host's pin
// table must drop a message naming anyone but the sending port's own MAC
// as an Ethernet address. Like the other forging probes it sends three
// times and expects no answer (an answer goes to the client it named):
//
//   - silent: every message left; what the server did with them is read
//     at the server (its lease file), never here;
//   - error: a message could not be built or sent.
func probeDHCPForge(ctx context.Context, spec ProbeSpec, obs Observation) Observation {
	ifi, p, err := InterfaceForSubnet(spec.Via)
	if err != nil {
		return fail(obs, fmt.Sprintf("dhcp_forge: %v", err))
	}
	obs.Evidence.Interface = ifi.Name
	obs.Evidence.MAC = ifi.HardwareAddr.String()
	f, err := dhcpForgeFrame(&spec, ifi.HardwareAddr, p.Addr(), rand.Uint32())
	if err != nil {
		return fail(obs, fmt.Sprintf("dhcp_forge: %v", err))
	}
	obs.Evidence.Source = f.src.String()
	obs.Evidence.Request = f.what
	c, err := packet.Listen(ifi, packet.Datagram, unix.ETH_P_IP, nil)
	if err != nil {
		return fail(obs, fmt.Sprintf("dhcp_forge: packet socket on %s (needs CAP_NET_RAW): %v", ifi.Name, err))
	}
	defer c.Close()
	n, err := sendSpread(ctx, func() error {
		_, err := c.WriteTo(f.packet, &packet.Addr{HardwareAddr: f.dst})
		return err
	})
	obs.Evidence.Sent = n
	if err != nil {
		return fail(obs, fmt.Sprintf("dhcp_forge: %d of %d messages sent on %s: %v", n, spoofSends, ifi.Name, err))
	}
	return done(obs, Silent, fmt.Sprintf("sent %d x %s from %s (%s) on %s", n, f.what, f.src, ifi.HardwareAddr, ifi.Name))
}

// dhcpFrame is one DHCP message ready to leave: its IPv4 packet, the
// Ethernet destination, its IPv4 source and what it says.
type dhcpFrame struct {
	packet []byte
	dst    net.HardwareAddr
	src    netip.Addr
	what   string
}

// dhcpForgeFrame builds a dhcp_forge probe's message from an interface
// with hardware address own and address addr.
func dhcpForgeFrame(spec *ProbeSpec, own net.HardwareAddr, addr netip.Addr, xid uint32) (dhcpFrame, error) {
	chaddr := []byte(own)
	if spec.ClientHW != "" {
		chaddr, _ = parseHexBytes(spec.ClientHW) // Validate checked it
	}
	m := dhcpmsg.Message{HType: byte(spec.HType), CHAddr: chaddr, Xid: xid}
	if spec.ClientID != "" {
		id, _ := parseHexBytes(spec.ClientID)
		m.Options = append(m.Options, dhcpmsg.Option{Code: dhcpmsg.OptClientID, Data: id})
	}
	// A client without a lease sends from 0.0.0.0 to everyone; a release
	// goes to its server from the client's address, and a decline, which
	// RFC 2131 has broadcast, from ours too: the pins let only our own
	// address, or none, through.
	src, dst, eth := netip.IPv4Unspecified(), limitedBroadcast4, net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
	switch spec.DHCP {
	case DHCPRelease:
		m.Type, m.CIAddr = dhcpmsg.Release, spec.Target
		m.Options = append(m.Options, dhcpmsg.Addr(dhcpmsg.OptServerID, spec.ServerID))
		src, dst = addr, spec.ServerID
	case DHCPDecline:
		m.Type = dhcpmsg.Decline
		m.Options = append(m.Options, dhcpmsg.Addr(dhcpmsg.OptRequestedIP, spec.Target), dhcpmsg.Addr(dhcpmsg.OptServerID, spec.ServerID))
		src = addr
	case DHCPDiscover:
		m.Type, m.Broadcast = dhcpmsg.Discover, true
		m.Options = append(m.Options, dhcpmsg.Option{Code: dhcpmsg.OptRapidCommit})
	case DHCPRequest:
		m.Type, m.Broadcast = dhcpmsg.Request, true
		m.Options = append(m.Options, dhcpmsg.Addr(dhcpmsg.OptRequestedIP, spec.Target))
	default:
		return dhcpFrame{}, fmt.Errorf("dhcp %q is not one of release, decline, discover, request", spec.DHCP)
	}
	if spec.DstMAC != "" {
		eth, _ = net.ParseMAC(spec.DstMAC)
	}
	payload, err := m.Marshal()
	if err != nil {
		return dhcpFrame{}, err
	}
	what := describeDHCP(m)
	return dhcpFrame{packet: udpPacket4(src, dst, 68, 67, payload), dst: eth, src: src, what: what}, nil
}

// limitedBroadcast4 is where a DHCP client without an address sends.
var limitedBroadcast4 = netip.AddrFrom4([4]byte{255, 255, 255, 255})

// describeDHCP says what a message names, for the evidence.
func describeDHCP(m dhcpmsg.Message) string {
	var b strings.Builder
	b.WriteString(dhcpmsg.TypeName(m.Type))
	ht := m.HType
	if ht == 0 {
		ht = dhcpmsg.HTypeEthernet
	}
	fmt.Fprintf(&b, " for client %s (htype %d, hlen %d)", hexBytes(m.CHAddr), ht, len(m.CHAddr))
	if m.CIAddr.IsValid() {
		fmt.Fprintf(&b, " ciaddr %s", m.CIAddr)
	}
	for _, o := range m.Options {
		switch o.Code {
		case dhcpmsg.OptRequestedIP:
			fmt.Fprintf(&b, " requested %s", netip.AddrFrom4([4]byte(o.Data)))
		case dhcpmsg.OptServerID:
			fmt.Fprintf(&b, " server %s", netip.AddrFrom4([4]byte(o.Data)))
		case dhcpmsg.OptClientID:
			fmt.Fprintf(&b, " client-id %s", hexBytes(o.Data))
		case dhcpmsg.OptRapidCommit:
			b.WriteString(" rapid-commit")
		}
	}
	return b.String()
}

// udpPacket4 is a whole IPv4 packet holding a UDP datagram, both
// checksums set: written to a packet socket, nothing fills them in.
func udpPacket4(src, dst netip.Addr, sport, dport int, payload []byte) []byte {
	p := forgedUDP(src, dst, sport, dport, payload)
	binary.BigEndian.PutUint16(p[10:12], ^uint16(foldSum(onesSum(0, p[:20]))))
	return p
}

// foldSum folds a ones' complement sum into 16 bits.
func foldSum(sum uint32) uint32 {
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	return sum
}

// parseHexBytes reads colon-separated hex bytes ("0a:b0:c5"), 1 to 16 of
// them: a hardware address of any length, or a client identifier.
func parseHexBytes(s string) ([]byte, error) {
	parts := strings.Split(s, ":")
	if len(parts) == 0 || len(parts) > 16 {
		return nil, fmt.Errorf("%q: 1 to 16 colon-separated hex bytes", observation.Truncate(s, 32))
	}
	out := make([]byte, len(parts))
	for i, p := range parts {
		b, err := hex.DecodeString(p)
		if err != nil || len(b) != 1 {
			return nil, fmt.Errorf("%q: %q is not a hex byte", observation.Truncate(s, 64), observation.Truncate(p, 8))
		}
		out[i] = b[0]
	}
	return out, nil
}

// hexBytes writes bytes as parseHexBytes reads them.
func hexBytes(b []byte) string {
	parts := make([]string, len(b))
	for i, c := range b {
		parts[i] = fmt.Sprintf("%02x", c)
	}
	return strings.Join(parts, ":")
}

// validateDHCP checks what only the DHCP forging probes have.
func (s *ProbeSpec) validateDHCP() error {
	if !s.Via.IsValid() || !s.Via.Addr().Is4() {
		return fmt.Errorf("%s needs via, an IPv4 subnet (its interface sends the messages)", s.Kind)
	}
	if s.Port != 0 || s.Nonce != "" {
		return fmt.Errorf("%s takes no port and carries no nonce", s.Kind)
	}
	if s.HType < 0 || s.HType > 255 {
		return fmt.Errorf("htype %d out of range 0..255", s.HType)
	}
	for name, v := range map[string]string{"client_hw": s.ClientHW, "client_id": s.ClientID} {
		if v == "" {
			continue
		}
		if _, err := parseHexBytes(v); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
	}
	if s.DstMAC != "" {
		if _, err := ethernetMAC(s.DstMAC); err != nil {
			return fmt.Errorf("dst_mac: %w", err)
		}
	}
	if s.Kind == KindDHCPFlood {
		return s.validateDHCPFlood()
	}
	if s.Count != 0 || s.HWPrefix != "" {
		return errors.New("count and hw_prefix are for dhcp_flood probes")
	}
	switch s.DHCP {
	case DHCPRelease, DHCPDecline:
		if !isUnicast4(s.Target) {
			return fmt.Errorf("a dhcp_forge %s needs target, the IPv4 address it gives up", s.DHCP)
		}
		if !isUnicast4(s.ServerID) {
			return fmt.Errorf("a dhcp_forge %s needs server_id, the server's IPv4 address", s.DHCP)
		}
	case DHCPRequest:
		if !isUnicast4(s.Target) {
			return errors.New("a dhcp_forge request needs target, the IPv4 address it asks for")
		}
		fallthrough
	case DHCPDiscover:
		if s.ServerID.IsValid() {
			return fmt.Errorf("a dhcp_forge %s names no server", s.DHCP)
		}
		if s.DHCP == DHCPDiscover && s.Target.IsValid() {
			return errors.New("a dhcp_forge discover takes no target")
		}
	case "":
		return errors.New("dhcp_forge needs dhcp: release, decline, discover or request")
	default:
		return fmt.Errorf("dhcp %q is not one of release, decline, discover, request", observation.Truncate(s.DHCP, 32))
	}
	return nil
}
