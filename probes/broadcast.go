package probes

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/netip"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// probeBroadcast sends the nonce line to the subnet's broadcast address (or
// Target, when given: a broadcast address or a multicast group) out of the
// interface holding Via, and listens for echoes. To a well-known port (or
// with Payload) it sends that protocol's request instead, as udp probes do
// (udpproto.go): an mDNS or LLMNR query, an SSDP M-SEARCH, each carrying
// the nonce, as a distribution's own multicast would go out.
//
//   - any echo with the nonce from an address that is not ours: reached,
//     naming every responder;
//   - nothing: silent.
//
// Broadcasts draw no ICMP errors, so refused and rejected never come from
// here.
func probeBroadcast(ctx context.Context, spec ProbeSpec, obs Observation) Observation {
	ifi, p, err := InterfaceForSubnet(spec.Via)
	if err != nil {
		return fail(obs, fmt.Sprintf("broadcast probe %s: %v", obs.Target, err))
	}
	obs.Evidence.Interface = ifi.Name
	obs.Evidence.Source = p.Addr().String()
	bcast := spec.Target
	if !bcast.IsValid() {
		bcast = broadcastOf(p)
	}
	lc := net.ListenConfig{
		Control: func(_, _ string, c syscall.RawConn) error {
			var serr error
			err := c.Control(func(fd uintptr) {
				if serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_BROADCAST, 1); serr != nil {
					return
				}
				// The broadcast must leave through the box's own interface,
				// whatever the routing table says.
				serr = unix.SetsockoptString(int(fd), unix.SOL_SOCKET, unix.SO_BINDTODEVICE, ifi.Name)
			})
			if err != nil {
				return err
			}
			return serr
		},
	}
	pc, err := lc.ListenPacket(ctx, "udp4", netip.AddrPortFrom(netip.IPv4Unspecified(), 0).String())
	if err != nil {
		return fail(obs, fmt.Sprintf("broadcast probe %s: %v", obs.Target, err))
	}
	defer pc.Close()
	dst := net.UDPAddrFromAddrPort(netip.AddrPortFrom(bcast, uint16(spec.Port)))
	name := udpRequestFor(&spec)
	if name == RequestDHCP {
		name = RequestNonce // a DHCP server's port gets the nonce line on a wire, not a DHCPINFORM
	}
	obs.Evidence.Request = name
	req, err := newUDPRequest(name, spec.Nonce, dst.AddrPort())
	if err != nil {
		return fail(obs, fmt.Sprintf("broadcast probe %s: %s request: %v", obs.Target, name, err))
	}
	payload, err := req.build(pc.LocalAddr().(*net.UDPAddr).AddrPort())
	if err != nil {
		return fail(obs, fmt.Sprintf("broadcast probe %s: %s request: %v", obs.Target, name, err))
	}
	local := localAddrs()
	var answers echoes
	buf := make([]byte, 2048)
	resend := newResender(ctx)
	_, err = resend.run(pc.SetReadDeadline, func(int) (bool, error) {
		if _, err := pc.WriteTo(payload, dst); err != nil {
			return false, fmt.Errorf("broadcast probe %s: send: %v", obs.Target, err)
		}
		return true, nil
	}, func(wake time.Time) (bool, error) {
		_ = pc.SetReadDeadline(wake)
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			if isTimeout(err) {
				return false, nil
			}
			return false, fmt.Errorf("broadcast probe %s: read: %v", obs.Target, err)
		}
		a := addrOf(net.ParseIP(peerIP(from)))
		if local[a] || !bytes.Contains(buf[:n], []byte(spec.Nonce)) {
			return false, nil
		}
		answers.add(resend, a, buf[:n])
		return false, nil
	})
	if err != nil {
		return fail(obs, err.Error())
	}
	obs.Evidence.Sent = resend.sent
	if len(answers.from) == 0 {
		return done(obs, Silent, fmt.Sprintf("no echo to %d broadcasts before the deadline", resend.sent))
	}
	answers.fill(&obs)
	return done(obs, Reached, fmt.Sprintf("%d host(s) echoed the broadcast nonce", len(answers.from)))
}
