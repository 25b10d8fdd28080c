package probes

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sort"
	"time"

	"github.com/mdlayher/ndp"
	"github.com/vishvananda/netlink"
	"golang.org/x/net/ipv6"
	"golang.org/x/sys/unix"
)

// probeIPv6State reports the box's IPv6 exposure: global-scope addresses
// (on the interface holding Via, or on every interface but loopback) and
// IPv6 default routes in any table.
//
//   - reached: at least one global address or default route exists (the
//     box has an IPv6 path the IPv4-only rules do not cover);
//   - silent: none;
//   - error: the state could not be read.
func probeIPv6State(_ context.Context, spec ProbeSpec, obs Observation) Observation {
	ev := &IPv6Evidence{}
	obs.Evidence.IPv6 = ev
	var link netlink.Link
	if spec.Via.IsValid() {
		ifi, _, err := InterfaceForSubnet(spec.Via)
		if err != nil {
			return fail(obs, fmt.Sprintf("ipv6 state: %v", err))
		}
		obs.Evidence.Interface = ifi.Name
		if link, err = netlink.LinkByIndex(ifi.Index); err != nil {
			return fail(obs, fmt.Sprintf("ipv6 state: link %s: %v", ifi.Name, err))
		}
	}
	addrs, err := netlink.AddrList(link, netlink.FAMILY_V6)
	if err != nil {
		return fail(obs, fmt.Sprintf("ipv6 state: addresses: %v", err))
	}
	names := map[int]string{}
	if ifs, err := net.Interfaces(); err == nil {
		for _, i := range ifs {
			names[i.Index] = i.Name
		}
	}
	for _, a := range addrs {
		ip := addrOf(a.IP)
		where := ip.String() + "/" + fmt.Sprint(prefixLen(a.IPNet)) + " on " + names[a.LinkIndex]
		switch {
		case ip.IsLoopback():
		case ip.IsLinkLocalUnicast():
			ev.LinkLocal = append(ev.LinkLocal, where)
		case a.Scope == unix.RT_SCOPE_UNIVERSE:
			ev.GlobalAddresses = append(ev.GlobalAddresses, where)
		}
	}
	routes, err := netlink.RouteListFiltered(netlink.FAMILY_V6, &netlink.Route{Table: unix.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return fail(obs, fmt.Sprintf("ipv6 state: routes: %v", err))
	}
	for _, r := range routes {
		if r.Dst != nil && prefixLen(r.Dst) != 0 {
			continue
		}
		if r.Type == unix.RTN_UNREACHABLE || r.Type == unix.RTN_BLACKHOLE || r.Type == unix.RTN_PROHIBIT {
			continue
		}
		desc := "default"
		if r.Gw != nil {
			desc += " via " + r.Gw.String()
		}
		if n := names[r.LinkIndex]; n != "" {
			desc += " dev " + n
		}
		desc += fmt.Sprintf(" table %d", r.Table)
		ev.DefaultRoutes = append(ev.DefaultRoutes, desc)
	}
	sort.Strings(ev.GlobalAddresses)
	sort.Strings(ev.DefaultRoutes)
	if len(ev.GlobalAddresses) == 0 && len(ev.DefaultRoutes) == 0 {
		return done(obs, Silent, "no global IPv6 address and no IPv6 default route")
	}
	return done(obs, Reached, fmt.Sprintf("%d global IPv6 address(es) and %d IPv6 default route(s)", len(ev.GlobalAddresses), len(ev.DefaultRoutes)))
}

func prefixLen(n *net.IPNet) int {
	if n == nil {
		return 0
	}
	ones, _ := n.Mask.Size()
	return ones
}

// probeNDPRS sends router solicitations on the interface holding Via and
// waits for a router advertisement.
//
//   - reached: a router advertised (it is named, with its prefixes);
//   - silent: no advertisement before the deadline (what an isolated box
//     must see).
//
// The solicitation goes from the interface's link-local address when it
// has one, else from :: (RFC 4861 allows it; the router then answers to
// all-nodes, which every IPv6 interface hears).
func probeNDPRS(ctx context.Context, spec ProbeSpec, obs Observation) Observation {
	ifi, _, err := InterfaceForSubnet(spec.Via)
	if err != nil {
		return fail(obs, fmt.Sprintf("ndp rs: %v", err))
	}
	obs.Evidence.Interface = ifi.Name
	c, from, err := ndp.Listen(ifi, ndp.LinkLocal)
	if err != nil {
		c, from, err = ndp.Listen(ifi, ndp.Unspecified)
	}
	if err != nil {
		return fail(obs, fmt.Sprintf("ndp rs on %s (needs IPv6 on the interface and CAP_NET_RAW): %v", ifi.Name, err))
	}
	defer c.Close()
	obs.Evidence.Source = from.String()
	var f ipv6.ICMPFilter
	f.SetAll(true)
	f.Accept(ipv6.ICMPTypeRouterAdvertisement)
	if err := c.SetICMPFilter(&f); err != nil {
		return fail(obs, fmt.Sprintf("ndp rs: icmpv6 filter: %v", err))
	}
	rs := &ndp.RouterSolicitation{}
	if from.IsValid() && !from.IsUnspecified() && len(ifi.HardwareAddr) > 0 {
		// A source link-layer option is forbidden with an unspecified source.
		rs.Options = []ndp.Option{&ndp.LinkLayerAddress{Direction: ndp.Source, Addr: ifi.HardwareAddr}}
	}
	ev := &IPv6Evidence{}
	obs.Evidence.IPv6 = ev
	resend := newResender(ctx)
	answered, err := resend.run(c.SetReadDeadline, func(int) (bool, error) {
		if err := c.WriteTo(rs, nil, netip.MustParseAddr("ff02::2")); err != nil {
			return false, fmt.Errorf("ndp rs on %s: send: %v", ifi.Name, err)
		}
		return true, nil
	}, func(wake time.Time) (bool, error) {
		_ = c.SetReadDeadline(wake)
		msg, _, router, err := c.ReadFrom()
		if err != nil {
			if isTimeout(err) {
				return false, nil
			}
			var ne net.Error
			if errors.As(err, &ne) {
				return false, fmt.Errorf("ndp rs on %s: read: %v", ifi.Name, err)
			}
			return false, nil
		}
		ra, ok := msg.(*ndp.RouterAdvertisement)
		if !ok {
			return false, nil
		}
		ev.Router = router.String()
		for _, o := range ra.Options {
			if p, ok := o.(*ndp.PrefixInformation); ok {
				ev.Prefixes = append(ev.Prefixes, fmt.Sprintf("%s/%d", p.Prefix, p.PrefixLength))
			}
		}
		obs.Evidence.From = router.String()
		return true, nil
	})
	if err != nil {
		return fail(obs, err.Error())
	}
	obs.Evidence.Sent = resend.sent
	if answered {
		return done(obs, Reached, "a router advertisement answered the solicitation")
	}
	return done(obs, Silent, fmt.Sprintf("no router advertisement to %d solicitations before the deadline", resend.sent))
}
