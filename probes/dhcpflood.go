package probes

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"time"

	"github.com/mdlayher/packet"
	"golang.org/x/sys/unix"
)

// MaxDHCPFlood bounds a dhcp_flood probe: a /24's every address, with
// room to spare.
const MaxDHCPFlood = 1024

// floodBatch and floodPause pace a flood: a server answers one message
// at a time, and what a burst puts beyond its socket's buffer is dropped
// there, showing less than the server would give (measured: 16 per 2 ms
// took 112 of dnsmasq's 253 addresses, 4 per 2 ms all it had left on an
// idle machine and 190 beside a whole drill's probes; docs/measurements.md,
// "DHCP").
const (
	floodBatch = 2
	floodPause = 2 * time.Millisecond
)

// probeDHCPFlood asks, from the interface holding Via with our own MAC,
// for count leases, each for a made-up client (claim C-SPOOF: a box must
// not take the pool): a DISCOVER with rapid commit (RFC 4039), which a
// server that does it answers with a lease at once, and an INIT-REBOOT
// REQUEST for an address of its own (target, target+1, ...), which a
// server without rapid commit may grant. A made-up client is, with
// hw_prefix, a hardware address of the prefix and a 3-byte index; with
// client_id, our own hardware address and the client identifier
// client_id+index (a server that keys leases on it leases each).
//
//   - silent: every message left; what the server did with them is read
//     at the server (its lease file), never here;
//   - error: a message could not be sent.
func probeDHCPFlood(ctx context.Context, spec ProbeSpec, obs Observation) Observation {
	ifi, _, err := InterfaceForSubnet(spec.Via)
	if err != nil {
		return fail(obs, fmt.Sprintf("dhcp_flood: %v", err))
	}
	obs.Evidence.Interface = ifi.Name
	obs.Evidence.MAC = ifi.HardwareAddr.String()
	frames, err := dhcpFloodFrames(&spec, ifi.HardwareAddr, rand.Uint32())
	if err != nil {
		return fail(obs, fmt.Sprintf("dhcp_flood: %v", err))
	}
	c, err := packet.Listen(ifi, packet.Datagram, unix.ETH_P_IP, nil)
	if err != nil {
		return fail(obs, fmt.Sprintf("dhcp_flood: packet socket on %s (needs CAP_NET_RAW): %v", ifi.Name, err))
	}
	defer c.Close()
	for i, f := range frames {
		if i > 0 && i%floodBatch == 0 {
			t := time.NewTimer(floodPause)
			select {
			case <-ctx.Done():
				t.Stop()
				return fail(obs, fmt.Sprintf("dhcp_flood: cut short after %d of %d messages: %v", obs.Evidence.Sent, len(frames), ctx.Err()))
			case <-t.C:
			}
		}
		if _, err := c.WriteTo(f.packet, &packet.Addr{HardwareAddr: f.dst}); err != nil {
			return fail(obs, fmt.Sprintf("dhcp_flood: %d of %d messages sent on %s: %v", obs.Evidence.Sent, len(frames), ifi.Name, err))
		}
		obs.Evidence.Sent++
	}
	obs.Evidence.Request = fmt.Sprintf("%s ... %s", frames[0].what, frames[len(frames)-1].what)
	return done(obs, Silent, fmt.Sprintf("sent %d messages for %d made-up clients from %s on %s", len(frames), spec.Count, ifi.HardwareAddr, ifi.Name))
}

// dhcpFloodFrames builds a flood's messages, two for each made-up client:
// its DISCOVER, then its REQUEST.
func dhcpFloodFrames(spec *ProbeSpec, own net.HardwareAddr, xid uint32) ([]dhcpFrame, error) {
	var prefix []byte
	var err error
	if spec.HWPrefix != "" {
		prefix, err = parseHexBytes(spec.HWPrefix)
	} else {
		prefix, err = parseHexBytes(spec.ClientID)
	}
	if err != nil {
		return nil, err
	}
	out := make([]dhcpFrame, 0, 2*spec.Count)
	next := spec.Target
	for i := range spec.Count {
		idx := []byte{byte(i >> 16), byte(i >> 8), byte(i)}
		one := ProbeSpec{Via: spec.Via, DHCP: DHCPDiscover}
		if spec.HWPrefix != "" {
			one.ClientHW = hexBytes(append(append([]byte{}, prefix...), idx...))
		} else {
			one.ClientID = hexBytes(append(append([]byte{}, prefix...), idx...))
		}
		f, err := dhcpForgeFrame(&one, own, netip.IPv4Unspecified(), xid+uint32(2*i))
		if err != nil {
			return nil, err
		}
		out = append(out, f)
		if next.IsValid() && spec.Via.Contains(next) && next != broadcastOf(spec.Via) {
			one.DHCP, one.Target = DHCPRequest, next
			f, err := dhcpForgeFrame(&one, own, netip.IPv4Unspecified(), xid+uint32(2*i+1))
			if err != nil {
				return nil, err
			}
			out = append(out, f)
			next = next.Next()
		}
	}
	return out, nil
}

// validateDHCPFlood checks what only a dhcp_flood probe has.
func (s *ProbeSpec) validateDHCPFlood() error {
	if s.Count < 1 || s.Count > MaxDHCPFlood {
		return fmt.Errorf("dhcp_flood count %d out of range 1..%d", s.Count, MaxDHCPFlood)
	}
	if (s.HWPrefix == "") == (s.ClientID == "") {
		return errors.New("dhcp_flood needs one of hw_prefix (made-up hardware addresses) or client_id (made-up client identifiers)")
	}
	if s.HWPrefix != "" {
		p, err := parseHexBytes(s.HWPrefix)
		if err != nil {
			return fmt.Errorf("hw_prefix: %w", err)
		}
		if len(p) != 3 {
			return fmt.Errorf("hw_prefix %s: 3 bytes, before a 3-byte index", s.HWPrefix)
		}
		if p[0]&1 != 0 {
			return fmt.Errorf("hw_prefix %s makes group addresses", s.HWPrefix)
		}
	} else if p, _ := parseHexBytes(s.ClientID); len(p) > 13 {
		return fmt.Errorf("client_id %s: at most 13 bytes, before a 3-byte index", s.ClientID)
	}
	if s.Target.IsValid() && !isUnicast4(s.Target) {
		return fmt.Errorf("target %s is not an IPv4 address to ask for", s.Target)
	}
	if s.DHCP != "" || s.ClientHW != "" || s.HType != 0 || s.ServerID.IsValid() || s.DstMAC != "" {
		return errors.New("dhcp_flood takes no dhcp, client_hw, htype, server_id or dst_mac: its messages are discovers and requests from made-up clients")
	}
	return nil
}
