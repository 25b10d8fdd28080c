package probes

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"syscall"
)

// ErrNoInterface is returned (wrapped) by InterfaceForSubnet when no
// interface holds an address in the subnet.
var ErrNoInterface = errors.New("no interface has an address in it")

// InterfaceForSubnet finds the one interface holding an address inside
// prefix and returns it with that address (prefix length included). A box's
// NIC is eth0 in a container and enp5s0 in a VM, so probes never name an
// interface: they name the subnet. Two interfaces in the same subnet is an
// error, not a guess.
func InterfaceForSubnet(prefix netip.Prefix) (*net.Interface, netip.Prefix, error) {
	if !prefix.IsValid() {
		return nil, netip.Prefix{}, errors.New("interface for subnet: no subnet given")
	}
	prefix = prefix.Masked()
	ifs, err := net.Interfaces()
	if err != nil {
		return nil, netip.Prefix{}, fmt.Errorf("interface for subnet %s: %w", prefix, err)
	}
	addrs, err := addrsByIndex()
	if err != nil {
		return nil, netip.Prefix{}, fmt.Errorf("interface for subnet %s: %w", prefix, err)
	}
	var found *net.Interface
	var addr netip.Prefix
	var names []string
	for i := range ifs {
		ifi := &ifs[i]
		for _, p := range addrs[ifi.Index] {
			if !prefix.Contains(p.Addr()) {
				continue
			}
			if found == nil {
				found, addr = ifi, p
			}
			if found.Index != ifi.Index {
				names = append(names, ifi.Name)
			}
			break
		}
	}
	if found == nil {
		return nil, netip.Prefix{}, fmt.Errorf("interface for subnet %s: %w", prefix, ErrNoInterface)
	}
	if len(names) > 0 {
		return nil, netip.Prefix{}, fmt.Errorf("interface for subnet %s: more than one interface has an address in it (%s, %s)",
			prefix, found.Name, strings.Join(names, ", "))
	}
	return found, addr, nil
}

// prefixOf converts a net.Addr from Interface.Addrs to a prefix whose
// address is the interface's own address.
func prefixOf(a net.Addr) (netip.Prefix, bool) {
	ipn, ok := a.(*net.IPNet)
	if !ok {
		return netip.Prefix{}, false
	}
	ip, ok := netip.AddrFromSlice(ipn.IP)
	if !ok {
		return netip.Prefix{}, false
	}
	ones, _ := ipn.Mask.Size()
	return netip.PrefixFrom(ip.Unmap(), ones), true
}

// interfaceAddrs returns every address of one interface.
func interfaceAddrs(ifi *net.Interface) []netip.Prefix {
	addrs, err := ifi.Addrs()
	if err != nil {
		return nil
	}
	var out []netip.Prefix
	for _, a := range addrs {
		if p, ok := prefixOf(a); ok {
			out = append(out, p)
		}
	}
	return out
}

// localAddrs is the set of every address on this host (in the current
// network namespace), used to tell our own stack's errors and our own
// multicast echoes from a peer's.
func localAddrs() map[netip.Addr]bool {
	out := map[netip.Addr]bool{}
	addrs, err := addrsByIndex()
	if err != nil {
		return out
	}
	for _, ps := range addrs {
		for _, p := range ps {
			out[p.Addr()] = true
		}
	}
	return out
}

// addrsByIndex is every interface's addresses, by interface index, from
// one dump of the kernel's addresses: net.Interface.Addrs dumps them all
// on each call, so asking interface by interface costs a dump per
// interface, and a host with a bridge full of boxes has hundreds
// (docs/measurements.md, "A busy host").
func addrsByIndex() (map[int][]netip.Prefix, error) {
	rib, err := syscall.NetlinkRIB(syscall.RTM_GETADDR, syscall.AF_UNSPEC)
	if err != nil {
		return nil, fmt.Errorf("dumping the addresses: %w", os.NewSyscallError("netlinkrib", err))
	}
	msgs, err := syscall.ParseNetlinkMessage(rib)
	if err != nil {
		return nil, fmt.Errorf("dumping the addresses: %w", os.NewSyscallError("parsenetlinkmessage", err))
	}
	out := map[int][]netip.Prefix{}
	for i := range msgs {
		m := &msgs[i]
		if m.Header.Type != syscall.RTM_NEWADDR || len(m.Data) < syscall.SizeofIfAddrmsg {
			continue
		}
		family, bits := m.Data[0], int(m.Data[1])
		index := int(binary.NativeEndian.Uint32(m.Data[4:8]))
		attrs, err := syscall.ParseNetlinkRouteAttr(m)
		if err != nil {
			continue
		}
		// IPv4: the local address (IFA_ADDRESS is the peer's on a
		// point-to-point link); IPv6: IFA_ADDRESS. As the net package.
		var a netip.Addr
		for _, at := range attrs {
			v, ok := netip.AddrFromSlice(at.Value)
			switch {
			case !ok:
			case family == syscall.AF_INET && at.Attr.Type == syscall.IFA_LOCAL:
				a = v
			case at.Attr.Type == syscall.IFA_ADDRESS && !a.IsValid():
				a = v
			}
		}
		if a.IsValid() {
			out[index] = append(out[index], netip.PrefixFrom(a.Unmap(), bits))
		}
	}
	return out, nil
}

// broadcastOf is the directed broadcast address of an IPv4 prefix.
func broadcastOf(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().As4()
	host := 32 - p.Bits()
	v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
	if host >= 32 {
		v = 0xffffffff
	} else {
		v |= (1 << host) - 1
	}
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// source resolves a probe's Via into the interface, our address on it and
// the target with a zone when it needs one. Without Via the kernel picks.
type source struct {
	ifi    *net.Interface
	local  netip.Addr // our address to bind to, or invalid
	target netip.Addr // with zone when link-scoped
	port   int        // the source port to bind (tcp and udp), 0: the kernel's pick
}

func resolveSource(spec *ProbeSpec) (source, error) {
	src := source{target: spec.Target, port: spec.SrcPort}
	if !spec.Via.IsValid() {
		return src, nil
	}
	ifi, p, err := InterfaceForSubnet(spec.Via)
	if err != nil {
		return src, err
	}
	src.ifi = ifi
	if spec.Target.IsValid() && spec.Target.Is4() == p.Addr().Is4() {
		src.local = p.Addr()
	}
	if needsZone(spec.Target) {
		src.target = spec.Target.WithZone(ifi.Name)
		src.local = netip.Addr{}
		for _, a := range interfaceAddrs(ifi) {
			if a.Addr().Is6() && a.Addr().IsLinkLocalUnicast() {
				src.local = a.Addr().WithZone(ifi.Name)
				break
			}
		}
	}
	return src, nil
}
