package probes

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/mdlayher/arp"
	"github.com/mdlayher/ethernet"
	"github.com/mdlayher/packet"
)

// probeARP asks who-has target on the interface holding Via, from our
// address in Via (not whichever IPv4 address the interface lists first).
//
//   - a reply whose sender is the target: reached, with its MAC;
//   - nothing before the deadline: silent.
//
// ARP has no refusal and no reject: those outcomes never come from here.
// ARP carries no nonce either; a witness at the target keys on our MAC or
// address instead.
func probeARP(ctx context.Context, spec ProbeSpec, obs Observation) Observation {
	ifi, p, err := InterfaceForSubnet(spec.Via)
	if err != nil {
		return fail(obs, fmt.Sprintf("arp probe %s: %v", obs.Target, err))
	}
	obs.Evidence.Interface = ifi.Name
	obs.Evidence.Source = p.Addr().String()
	c, err := openARP(ifi)
	if err != nil {
		return fail(obs, fmt.Sprintf("arp probe %s: %v", obs.Target, err))
	}
	defer c.Close()
	req, err := arp.NewPacket(arp.OperationRequest, ifi.HardwareAddr, p.Addr(), ethernet.Broadcast, spec.Target)
	if err != nil {
		return fail(obs, fmt.Sprintf("arp probe %s: %v", obs.Target, err))
	}
	var reply *arp.Packet
	resend := newResender(ctx)
	_, err = resend.run(c.SetReadDeadline, func(int) (bool, error) {
		if err := c.WriteTo(req, ethernet.Broadcast); err != nil {
			return false, fmt.Errorf("arp probe %s: send: %v", obs.Target, err)
		}
		return true, nil
	}, func(wake time.Time) (bool, error) {
		if err := c.SetReadDeadline(wake); err != nil {
			return false, fmt.Errorf("arp probe %s: deadline: %v", obs.Target, err)
		}
		pkt, _, err := c.Read()
		if err != nil {
			var oe *net.OpError
			if isTimeout(err) || !errors.As(err, &oe) {
				// A frame that does not parse as ARP is noise, not a verdict.
				return false, nil
			}
			return false, fmt.Errorf("arp probe %s: read: %v", obs.Target, err)
		}
		if pkt.Operation != arp.OperationReply || pkt.SenderIP != spec.Target {
			return false, nil
		}
		reply = pkt
		return true, nil
	})
	if err != nil {
		return fail(obs, err.Error())
	}
	obs.Evidence.Sent = resend.sent
	if reply == nil {
		return done(obs, Silent, fmt.Sprintf("no ARP reply to %d requests before the deadline", resend.sent))
	}
	obs.Evidence.From = reply.SenderIP.String()
	obs.Evidence.MAC = net.HardwareAddr(reply.SenderHardwareAddr).String()
	return done(obs, Reached, "ARP reply from the target")
}

// openARP opens an ARP client on a packet socket on ifi. A packet written
// with its WriteTo leaves from the packet's sender hardware address, which
// is what lets arp_spoof forge the Ethernet source too.
func openARP(ifi *net.Interface) (*arp.Client, error) {
	pc, err := packet.Listen(ifi, packet.Raw, int(ethernet.EtherTypeARP), nil)
	if err != nil {
		return nil, fmt.Errorf("packet socket (needs CAP_NET_RAW): %w", err)
	}
	c, err := arp.New(ifi, pc)
	if err != nil {
		pc.Close()
		return nil, err
	}
	return c, nil
}
