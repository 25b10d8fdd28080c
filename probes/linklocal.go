package probes

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// EnsureLinkLocal makes sure the interface holding an address in via has
// an IPv6 link-local address, adding addr (or one derived from the MAC by
// EUI-64) when it has none. A container's interface may come up with IPv6
// on but no link-local address (docs/world.md, "These machines"); an attacker simply adds one, so
// the drill does the same before probing IPv6 between boxes.
//
// The returned remove function deletes the address again, only if this
// call added it; it is safe to call when nothing was added.
func EnsureLinkLocal(via netip.Prefix, addr netip.Addr) (LinkLocalState, func() LinkLocalState, error) {
	st := LinkLocalState{}
	noop := func() LinkLocalState { return st }
	ifi, _, err := InterfaceForSubnet(via)
	if err != nil {
		return st, noop, fmt.Errorf("link-local address: %w", err)
	}
	st.Interface = ifi.Name
	// Only a usable address counts: one still in duplicate address
	// detection (tentative, the state a fresh box's own EUI-64 address is
	// in for its first second or two) cannot send or receive yet. Given an
	// explicit address, that exact address must be there.
	for _, a := range usableLinkLocal(ifi) {
		if !addr.IsValid() || a == addr {
			st.Address = a.String()
			return st, noop, nil
		}
	}
	if !addr.IsValid() {
		addr, err = LinkLocalFromMAC(ifi.HardwareAddr)
		if err != nil {
			return st, noop, fmt.Errorf("link-local address on %s: %w", ifi.Name, err)
		}
	}
	link, err := netlink.LinkByIndex(ifi.Index)
	if err != nil {
		return st, noop, fmt.Errorf("link-local address on %s: %w", ifi.Name, err)
	}
	nl := &netlink.Addr{
		IPNet: &net.IPNet{IP: addr.AsSlice(), Mask: net.CIDRMask(64, 128)},
		Scope: unix.RT_SCOPE_LINK,
		// No duplicate address detection: the address must not wait out
		// DAD's second, and a probe box's address is unique by
		// construction (it is still not usable until its local route is
		// in: see below).
		Flags: unix.IFA_F_NODAD,
	}
	if err := netlink.AddrAdd(link, nl); err != nil {
		if errors.Is(err, unix.EACCES) || errors.Is(err, unix.EPERM) {
			return st, noop, fmt.Errorf("link-local address on %s: %w (IPv6 disabled on it, or no CAP_NET_ADMIN)", ifi.Name, err)
		}
		return st, noop, fmt.Errorf("link-local address on %s: %w", ifi.Name, err)
	}
	st.Address = addr.String()
	st.Added = true
	remove := func() LinkLocalState {
		out := st
		if err := netlink.AddrDel(link, nl); err != nil {
			out.Error = fmt.Sprintf("remove %s from %s: %v", addr, ifi.Name, err)
			return out
		}
		out.Removed = true
		return out
	}
	// Listed at once and never tentative, the address still cannot
	// receive: the kernel joins its solicited-node group and installs its
	// local route only when addrconf's DAD work runs (NODAD or not), on a
	// workqueue under RTNL, milliseconds later under load. Until then a
	// neighbour solicitation or advertisement, or an echo, to it is lost.
	if err := waitLocalRoute(ifi.Index, addr, time.Second); err != nil {
		return st, remove, fmt.Errorf("link-local address %s on %s: %w", addr, ifi.Name, err)
	}
	return st, remove, nil
}

// waitLocalRoute polls until the local routing table delivers addr on the
// interface with index ifindex, the last step of the kernel's setup of a
// new address.
func waitLocalRoute(ifindex int, addr netip.Addr, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		rs, err := netlink.RouteListFiltered(netlink.FAMILY_V6,
			&netlink.Route{Table: unix.RT_TABLE_LOCAL, LinkIndex: ifindex}, netlink.RT_FILTER_TABLE|netlink.RT_FILTER_OIF)
		if err != nil {
			return fmt.Errorf("local routes: %w", err)
		}
		for _, r := range rs {
			if r.Type == unix.RTN_LOCAL && r.Dst != nil && r.Dst.IP.Equal(addr.AsSlice()) {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not ready after %v: the kernel has not installed its local route", limit)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// LinkLocalFromMAC derives fe80::/64 + modified EUI-64 from a 48-bit MAC:
// the address the agent adds on a box with that MAC.
func LinkLocalFromMAC(mac net.HardwareAddr) (netip.Addr, error) {
	if len(mac) != 6 {
		return netip.Addr{}, fmt.Errorf("no 48-bit MAC to derive an address from (%q)", mac.String())
	}
	var b [16]byte
	b[0], b[1] = 0xfe, 0x80
	b[8] = mac[0] ^ 0x02
	b[9], b[10] = mac[1], mac[2]
	b[11], b[12] = 0xff, 0xfe
	b[13], b[14], b[15] = mac[3], mac[4], mac[5]
	return netip.AddrFrom16(b), nil
}

// usableLinkLocal lists the interface's link-local addresses that are
// neither tentative nor failed duplicate address detection.
func usableLinkLocal(ifi *net.Interface) []netip.Addr {
	link, err := netlink.LinkByIndex(ifi.Index)
	if err != nil {
		return nil
	}
	addrs, err := netlink.AddrList(link, netlink.FAMILY_V6)
	if err != nil {
		return nil
	}
	var out []netip.Addr
	for _, a := range addrs {
		ip, ok := netip.AddrFromSlice(a.IP)
		if !ok || !ip.IsLinkLocalUnicast() || a.Flags&(unix.IFA_F_TENTATIVE|unix.IFA_F_DADFAILED) != 0 {
			continue
		}
		out = append(out, ip)
	}
	return out
}
