package probes

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"time"

	"github.com/mdlayher/packet"
)

// ControlEtherType is the EtherType of positive-control frames: IEEE
// 802's "local experimental" type, which no protocol stack consumes, so a
// control frame reaches every capture on the wire and nothing else reacts.
const ControlEtherType = 0x88b5

// ControlPrefix starts a control frame's payload; the nonce follows.
const ControlPrefix = "BOXCONTROL "

// ControlInterval is the gap between two control frames: several per
// witness window, so one lost frame never makes a live witness look dead.
const ControlInterval = 250 * time.Millisecond

// probeControl is a positive control for witnesses (docs/claims.md, "Witnesses
// prove they were alive"): it sends Ethernet frames carrying the nonce to
// DstMAC (broadcast when empty) on the interface holding Via, one every
// ControlInterval, and a last one as the deadline comes. Every witness on
// that wire whose spec names the nonce as its control counts them; a
// witness that saw none was not capturing, and its silence proves nothing.
//
// The frames are sent on a packet socket, below IP, so no firewall of the
// sender's own IP stack stops them; a bridge carries a frame its own
// device sends to every port, isolated or not.
//
//   - reached: at least one frame left (the witnesses say whether it arrived);
//   - error: the socket could not be opened or nothing could be sent.
func probeControl(ctx context.Context, spec ProbeSpec, obs Observation) Observation {
	ifi, _, err := InterfaceForSubnet(spec.Via)
	if err != nil {
		return fail(obs, fmt.Sprintf("control: %v", err))
	}
	obs.Evidence.Interface = ifi.Name
	c, err := packet.Listen(ifi, packet.Raw, ControlEtherType, nil)
	if err != nil {
		return fail(obs, fmt.Sprintf("control: packet socket on %s (needs CAP_NET_RAW): %v", ifi.Name, err))
	}
	defer c.Close()
	dst := net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
	if spec.DstMAC != "" {
		dst, _ = net.ParseMAC(spec.DstMAC) // Validate checked it
	}
	frame := ControlFrame(dst, ifi.HardwareAddr, spec.Nonce)
	to := &packet.Addr{HardwareAddr: dst}
	var lastErr error
	for {
		if _, err := c.WriteTo(frame, to); err != nil {
			lastErr = err
		} else {
			obs.Evidence.Sent++
		}
		t := time.NewTimer(ControlInterval)
		select {
		case <-ctx.Done():
			t.Stop()
			// One last frame at the deadline: the later a witness saw its
			// control, the longer it proves it was capturing.
			if _, err := c.WriteTo(frame, to); err == nil {
				obs.Evidence.Sent++
			} else {
				lastErr = err
			}
			if obs.Evidence.Sent == 0 {
				return fail(obs, fmt.Sprintf("control: no frame left %s: %v", ifi.Name, lastErr))
			}
			return done(obs, Reached, fmt.Sprintf("%d control frame(s) sent to %s on %s", obs.Evidence.Sent, dst, ifi.Name))
		case <-t.C:
		}
	}
}

// ControlFrame builds one control frame from src to dst carrying nonce.
func ControlFrame(dst, src net.HardwareAddr, nonce string) []byte {
	f := make([]byte, 14, 14+len(ControlPrefix)+len(nonce))
	copy(f[0:6], dst)
	copy(f[6:12], src)
	binary.BigEndian.PutUint16(f[12:14], ControlEtherType)
	f = append(f, ControlPrefix...)
	return append(f, nonce...)
}
