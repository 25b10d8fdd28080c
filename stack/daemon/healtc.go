package daemon

import (
	"context"
	"fmt"
	"syscall"
	"time"

	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/box-isolation/box/stack/model"
)

// watchTC tells the healer what nftables' events cannot: the guard
// (L-GUARD) lives in tc, so a qdisc or filter another tool deleted, and
// the bridge coming up (at boot Incus creates it after box's units
// start), are heard here, from rtnetlink's tc and link groups in the
// host's namespace. Only the bridge's own link events count: a box's
// port is the port watcher's. It ends with ctx.
func (h *healer) watchTC(ctx context.Context, out chan<- string) {
	for ctx.Err() == nil {
		s, err := nl.SubscribeAt(h.g.Handle, netns.None(), unix.NETLINK_ROUTE, unix.RTNLGRP_TC, unix.RTNLGRP_LINK)
		if err != nil {
			h.logf("heal: subscribing to tc events failed: %v; the guard is checked at each resync until it works", err)
			select {
			case <-ctx.Done():
			case <-time.After(healResync):
			}
			continue
		}
		stop := context.AfterFunc(ctx, s.Close)
		for {
			msgs, _, err := s.Receive()
			if err != nil {
				if ctx.Err() == nil {
					h.logf("heal: tc events: %v; subscribing again", err)
					select {
					case out <- "tc events lost":
					default:
					}
				}
				break
			}
			for _, m := range msgs {
				if what, ok := tcEvent(m, model.Current.Network); ok {
					select {
					case out <- what:
					default: // one waiting is enough: the check reads the kernel
					}
				}
			}
		}
		stop()
		s.Close()
	}
}

// tcEvent says which messages the guard's check must hear: a qdisc or
// filter deleted or added anywhere (the guard's hooks are the bridge and
// the uplinks), and a link message for the bridge itself.
func tcEvent(m syscall.NetlinkMessage, bridge string) (string, bool) {
	switch m.Header.Type {
	case unix.RTM_DELQDISC, unix.RTM_DELTFILTER:
		return "a tc qdisc or filter deleted", true
	case unix.RTM_NEWQDISC, unix.RTM_NEWTFILTER:
		return "a tc qdisc or filter added", true
	case unix.RTM_NEWLINK:
		if len(m.Data) < unix.SizeofIfInfomsg {
			return "", false
		}
		attrs, err := nl.ParseRouteAttr(m.Data[unix.SizeofIfInfomsg:])
		if err != nil {
			return "", false
		}
		for _, a := range attrs {
			if a.Attr.Type == unix.IFLA_IFNAME && string(trimNul(a.Value)) == bridge {
				return fmt.Sprintf("link %s changed", bridge), true
			}
		}
	}
	return "", false
}

func trimNul(b []byte) []byte {
	for len(b) > 0 && b[len(b)-1] == 0 {
		b = b[:len(b)-1]
	}
	return b
}
