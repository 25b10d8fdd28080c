package hostns

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"syscall"

	"github.com/box-isolation/box/internal/nsrun"
	"github.com/box-isolation/box/stack/model"
	"github.com/box-isolation/box/stack/nft"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// NS opens netlink (and nftables) inside the host's namespace.
type NS struct {
	Netlink *netlink.Handle
	Handle  netns.NsHandle // -1 for the current namespace
	Inode   uint64         // the namespace's inode, to match processes
	// Name names the namespace as `ip Name` knows it ("" is this
	// process's own).
	Name string
}

// Open opens netlink in the network namespace `ip netns` calls name
// ("" for this process's own). Close it when done.
func Open(name string) (*NS, error) {
	g := &NS{Handle: -1, Name: name}
	path := "/proc/self/ns/net"
	if name != "" {
		ns, err := netns.GetFromName(name)
		if err != nil {
			return nil, fmt.Errorf("opening network namespace %s: %w", name, err)
		}
		g.Handle = ns
		path = "/run/netns/" + name
		if g.Netlink, err = netlink.NewHandleAt(ns); err != nil {
			ns.Close()
			return nil, fmt.Errorf("netlink in %s: %w", name, err)
		}
	} else {
		var err error
		if g.Netlink, err = netlink.NewHandle(); err != nil {
			return nil, fmt.Errorf("netlink: %w", err)
		}
	}
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		g.Close()
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	g.Inode = st.Ino
	return g, nil
}

func (g *NS) Close() {
	if g.Netlink != nil {
		g.Netlink.Close()
	}
	if g.Handle >= 0 {
		g.Handle.Close()
	}
}

// AddressUses lists what already uses addresses in the host's namespace: every
// route, every local address and the default gateways. Links named in skip
// (the stack's own bridge) are left out.
func (g *NS) AddressUses(skip string) ([]model.AddressUse, error) {
	links, err := g.Links()
	if err != nil {
		return nil, fmt.Errorf("listing links: %w", err)
	}
	names := map[int]string{}
	for _, l := range links {
		names[l.Attrs().Index] = l.Attrs().Name
	}
	routes, err := g.Netlink.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: syscall.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return nil, fmt.Errorf("listing routes: %w", err)
	}
	var out []model.AddressUse
	for _, r := range routes {
		dev := names[r.LinkIndex]
		if dev == skip && skip != "" {
			continue
		}
		if r.Dst != nil {
			if p, ok := PrefixOf(r.Dst); ok && p.Bits() > 0 && !p.Addr().IsLoopback() {
				out = append(out, model.AddressUse{Prefix: p, What: fmt.Sprintf("route %s dev %s", p, dev)})
			}
		}
		if r.Gw != nil && (r.Dst == nil || r.Dst.IP.IsUnspecified()) {
			if a, ok := netip.AddrFromSlice(r.Gw.To4()); ok {
				out = append(out, model.AddressUse{Prefix: netip.PrefixFrom(a, 32), What: fmt.Sprintf("default gateway %s dev %s (is this running inside a box?)", a, dev)})
			}
		}
	}
	for _, l := range links {
		if l.Attrs().Name == skip && skip != "" {
			continue
		}
		addrs, err := g.Netlink.AddrList(l, netlink.FAMILY_V4)
		if err != nil {
			continue
		}
		for _, a := range addrs {
			if p, ok := PrefixOf(a.IPNet); ok && !p.Addr().IsLoopback() {
				out = append(out, model.AddressUse{Prefix: p.Masked(), What: fmt.Sprintf("address %s on %s", p, l.Attrs().Name)})
			}
		}
	}
	return out, nil
}

// Links lists the links, again when the kernel says a link changed
// during the dump (links come and go while boxes start): such a list may
// lack a port.
func (g *NS) Links() ([]netlink.Link, error) {
	for i := 0; ; i++ {
		links, err := g.Netlink.LinkList()
		if errors.Is(err, netlink.ErrDumpInterrupted) && i < 10 {
			continue
		}
		return links, err
	}
}

func PrefixOf(n *net.IPNet) (netip.Prefix, bool) {
	a, ok := netip.AddrFromSlice(n.IP)
	if !ok {
		return netip.Prefix{}, false
	}
	ones, _ := n.Mask.Size()
	a = a.Unmap()
	return netip.PrefixFrom(a, ones), true
}

// LinkAddrs lists a link's addresses of a family; a missing link has none.
func (g *NS) LinkAddrs(name string, family int) ([]netlink.Addr, error) {
	l, err := g.Netlink.LinkByName(name)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil, nil
		}
		return nil, err
	}
	return g.Netlink.AddrList(l, family)
}

// IPv4Prefix is a link's first IPv4 address with its prefix length (the
// bridge's gateway and subnet); false when there is no such link or it
// has no IPv4 address.
func (g *NS) IPv4Prefix(name string) (netip.Prefix, bool, error) {
	addrs, err := g.LinkAddrs(name, netlink.FAMILY_V4)
	if err != nil {
		return netip.Prefix{}, false, fmt.Errorf("reading %s's addresses: %w", name, err)
	}
	for _, a := range addrs {
		if p, ok := PrefixOf(a.IPNet); ok && p.Addr().Is4() {
			return p, true, nil
		}
	}
	return netip.Prefix{}, false, nil
}

// GlobalV6 lists the IPv6 addresses on a link that are not link-local.
func (g *NS) GlobalV6(name string) ([]netlink.Addr, error) {
	addrs, err := g.LinkAddrs(name, netlink.FAMILY_V6)
	if err != nil {
		return nil, err
	}
	var out []netlink.Addr
	for _, a := range addrs {
		if !a.IP.IsLinkLocalUnicast() {
			out = append(out, a)
		}
	}
	return out, nil
}

// GatewayHolders names the links other than the bridge that hold gw.
func (g *NS) GatewayHolders(bridge string, gw netip.Addr) ([]string, error) {
	links, err := g.Links()
	if err != nil {
		return nil, err
	}
	// One dump of the addresses for every link: a dump per link would cost
	// one per box on a full bridge.
	addrs, err := g.Netlink.AddrList(nil, netlink.FAMILY_V4)
	if err != nil {
		return nil, err
	}
	holds := map[int]bool{}
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP.To4()); ok && ip == gw {
			holds[a.LinkIndex] = true
		}
	}
	var out []string
	for _, l := range links {
		if l.Attrs().Name != bridge && holds[l.Attrs().Index] {
			out = append(out, l.Attrs().Name)
		}
	}
	return out, nil
}

// IPv6Disabled reads the bridge's disable_ipv6 sysctl in the host's
// namespace; ok is false when the bridge has no such entry.
func (g *NS) IPv6Disabled(bridge string) (disabled, ok bool, err error) {
	path := "/proc/sys/net/ipv6/conf/" + bridge + "/disable_ipv6"
	err = nsrun.Do(g.Name, func() error {
		b, err := os.ReadFile(path)
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		ok = true
		disabled = strings.TrimSpace(string(b)) == "1"
		return nil
	})
	return disabled, ok, err
}

// DisableIPv6 turns IPv6 off on the bridge's own interface.
func (g *NS) DisableIPv6(bridge string) error {
	return nsrun.Do(g.Name, func() error {
		return os.WriteFile("/proc/sys/net/ipv6/conf/"+bridge+"/disable_ipv6", []byte("1"), 0o644)
	})
}

// NFTConfig addresses one generation's tables in the host's namespace.
func (g *NS) NFTConfig(gen model.Generation) nft.Config {
	return nft.Config{Table: gen.NFTTable, Bridge: gen.Network, NetNS: int(g.Handle)}
}
