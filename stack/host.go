package stack

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/box-isolation/box/internal/nsrun"
	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/model"
	"github.com/box-isolation/box/stack/nft"
)

// Host is where the stack lives: an incusd and the network namespace its
// bridges are in.
type Host struct {
	Incus *incus.Client
	// NetNS names the network namespace incusd runs in (as `ip netns`
	// knows it); empty means this process's own, as on a real host.
	NetNS string
	// Options are the operator's choices (BOX_SUBNET, BOX_DNS, BOX_POOL).
	Options model.Options
	// BootUnitDir is where the systemd unit that re-applies the firewall at
	// boot is written; empty disables it (the hermetic world has no
	// systemd, and its host namespace does not survive a reboot anyway).
	BootUnitDir string
	// Exe is the box binary the boot unit runs.
	Exe string
	// FirewallFile is where setup-host saves what the boot unit loads the
	// firewall from before Incus starts (DefaultFirewallFile on a real
	// host; empty saves nothing, as in the hermetic world).
	FirewallFile string
	// IncusDir is incusd's INCUS_DIR on a real host (/var/lib/incus by
	// default): the boot unit removes stale dnsmasq pid files there before
	// Incus starts (removeStaleDnsmasqPIDs). Empty touches nothing.
	IncusDir string
	// IncusUserSocket is incus-user's socket (BOX_INCUS_USER_SOCKET); empty
	// is unix.socket.user beside incusd's.
	IncusUserSocket string
	// Tier: box acts for a granted user, through incus-user's socket, on
	// their project only; the kernel's layers are left to the watcher.
	Tier bool
	// TierGroup is the group incus-user serves (BOX_TIER_GROUP);
	// DefaultTierGroup when empty.
	TierGroup string
	// IncusConfigDir is the incus CLI's config directory
	// (incus.ConfigDir): its remotes name the image servers a
	// REMOTE:ALIAS image is pulled from. Empty leaves the CLI's built-in
	// remotes (images, the public image server; local).
	IncusConfigDir string
	// Progress, when set, hears what a long operation is doing (one box
	// of many removed); box shows it on a terminal only.
	Progress func(format string, args ...any)
	// MemberNetNS names, on a cluster, the network namespace of other
	// members (member -> namespace) that this machine can enter: the
	// hermetic world's members, all on one machine (BOX_MEMBER_NETNS).
	// Verify reads those members' host layers too.
	MemberNetNS map[string]string
	// Remote names the incus CLI's remote this Host drives over HTTPS
	// (box --remote); empty is this machine's incusd. A remote's kernel is
	// not this machine's: its host layers, ports and pins are its own
	// host's (box setup-host and box-ports.service there), and nothing
	// here reads or writes this machine's nft or links for it.
	Remote string
	// MemberOnly: Ensure converges only this member's host layers, leaving
	// the cluster's Incus objects to `box setup-host` on any member.
	MemberOnly bool
	// SetupLockPath overrides the setup lock's file (SetupLockPath(NetNS)
	// when empty); LockWait how long a second caller waits for it
	// (SetupLockWait when 0).
	SetupLockPath string
	LockWait      time.Duration
	// Notice, when set, hears what the operator should know while they
	// wait (another run holds the setup lock); box prints it on stderr.
	Notice func(string)

	cluster *ClusterInfo // read once (Cluster)
	member  string       // the member this Host acts on ("" standalone or local)
	// kernelless hosts (unit tests against a fake incusd) leave this
	// machine's kernel alone: refreshPorts does nothing.
	kernelless bool
}

// progressf tells Progress, if anyone listens.
func (host *Host) progressf(format string, args ...any) {
	if host.Progress != nil {
		host.Progress(format, args...)
	}
}

// ground opens netlink (and nftables) inside the host's namespace.
type ground struct {
	h    *netlink.Handle
	ns   netns.NsHandle // -1 for the current namespace
	ino  uint64         // the namespace's inode, to match processes
	host *Host
}

func (host *Host) ground() (*ground, error) {
	if host.Remote != "" {
		return nil, &RemoteHostError{Remote: host.Remote}
	}
	g := &ground{ns: -1, host: host}
	path := "/proc/self/ns/net"
	if host.NetNS != "" {
		ns, err := netns.GetFromName(host.NetNS)
		if err != nil {
			return nil, fmt.Errorf("opening network namespace %s: %w", host.NetNS, err)
		}
		g.ns = ns
		path = "/run/netns/" + host.NetNS
		if g.h, err = netlink.NewHandleAt(ns); err != nil {
			ns.Close()
			return nil, fmt.Errorf("netlink in %s: %w", host.NetNS, err)
		}
	} else {
		var err error
		if g.h, err = netlink.NewHandle(); err != nil {
			return nil, fmt.Errorf("netlink: %w", err)
		}
	}
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		g.close()
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	g.ino = st.Ino
	return g, nil
}

func (g *ground) close() {
	if g.h != nil {
		g.h.Close()
	}
	if g.ns >= 0 {
		g.ns.Close()
	}
}

// nftConfig addresses one generation's tables in the host's namespace.
func (g *ground) nftConfig(gen model.Generation) nft.Config {
	return nft.Config{Table: gen.NFTTable, Bridge: gen.Network, NetNS: int(g.ns)}
}

// addressUses lists what already uses addresses in the host's namespace: every
// route, every local address and the default gateways. Links named in skip
// (the stack's own bridge) are left out.
func (g *ground) addressUses(skip string) ([]model.AddressUse, error) {
	links, err := g.linkList()
	if err != nil {
		return nil, fmt.Errorf("listing links: %w", err)
	}
	names := map[int]string{}
	for _, l := range links {
		names[l.Attrs().Index] = l.Attrs().Name
	}
	routes, err := g.h.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: syscall.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE)
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
			if p, ok := prefixOf(r.Dst); ok && p.Bits() > 0 && !p.Addr().IsLoopback() {
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
		addrs, err := g.h.AddrList(l, netlink.FAMILY_V4)
		if err != nil {
			continue
		}
		for _, a := range addrs {
			if p, ok := prefixOf(a.IPNet); ok && !p.Addr().IsLoopback() {
				out = append(out, model.AddressUse{Prefix: p.Masked(), What: fmt.Sprintf("address %s on %s", p, l.Attrs().Name)})
			}
		}
	}
	return out, nil
}

// linkList lists the links, again when the kernel says a link changed
// during the dump (links come and go while boxes start): such a list may
// lack a port.
func (g *ground) linkList() ([]netlink.Link, error) {
	for i := 0; ; i++ {
		links, err := g.h.LinkList()
		if errors.Is(err, netlink.ErrDumpInterrupted) && i < 10 {
			continue
		}
		return links, err
	}
}

func prefixOf(n *net.IPNet) (netip.Prefix, bool) {
	a, ok := netip.AddrFromSlice(n.IP)
	if !ok {
		return netip.Prefix{}, false
	}
	ones, _ := n.Mask.Size()
	a = a.Unmap()
	return netip.PrefixFrom(a, ones), true
}

// Port is one port of a bridge, as the kernel has it.
type Port struct {
	Name     string
	Isolated bool
}

// bridgePorts lists a bridge's ports with their isolated flag.
func (g *ground) bridgePorts(bridge string) ([]Port, error) {
	br, err := g.h.LinkByName(bridge)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil, nil
		}
		return nil, fmt.Errorf("finding bridge %s: %w", bridge, err)
	}
	links, err := g.linkList()
	if err != nil {
		return nil, fmt.Errorf("listing links: %w", err)
	}
	var ports []Port
	for _, l := range links {
		if l.Attrs().MasterIndex != br.Attrs().Index {
			continue
		}
		pi, err := g.h.LinkGetProtinfo(l)
		if err != nil {
			return nil, fmt.Errorf("reading bridge port flags of %s: %w", l.Attrs().Name, err)
		}
		ports = append(ports, Port{Name: l.Attrs().Name, Isolated: pi.Isolated})
	}
	return ports, nil
}

func portNames(ports []Port) []string {
	out := make([]string, len(ports))
	for i, p := range ports {
		out[i] = p.Name
	}
	return out
}

// linkAddrs lists a link's addresses of a family; a missing link has none.
func (g *ground) linkAddrs(name string, family int) ([]netlink.Addr, error) {
	l, err := g.h.LinkByName(name)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil, nil
		}
		return nil, err
	}
	return g.h.AddrList(l, family)
}

// globalV6 lists the IPv6 addresses on a link that are not link-local.
func (g *ground) globalV6(name string) ([]netlink.Addr, error) {
	addrs, err := g.linkAddrs(name, netlink.FAMILY_V6)
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

// gatewayHolders names the links other than the bridge that hold gw.
func (g *ground) gatewayHolders(bridge string, gw netip.Addr) ([]string, error) {
	links, err := g.linkList()
	if err != nil {
		return nil, err
	}
	var out []string
	for _, l := range links {
		if l.Attrs().Name == bridge {
			continue
		}
		addrs, _ := g.h.AddrList(l, netlink.FAMILY_V4)
		for _, a := range addrs {
			if ip, ok := netip.AddrFromSlice(a.IP.To4()); ok && ip == gw {
				out = append(out, l.Attrs().Name)
			}
		}
	}
	return out, nil
}

// dnsmasqFor finds the dnsmasq process serving the bridge in the host's
// namespace: Incus can report a network Created while none runs (after an
// unclean daemon death), so the process is the ground truth.
func (g *ground) dnsmasqFor(bridge string) int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		args := procArgs(pid)
		if len(args) == 0 || !strings.HasSuffix(args[0], "dnsmasq") {
			continue
		}
		serving := false
		for _, a := range args {
			if a == "--interface="+bridge || a == "-i"+bridge {
				serving = true
			}
		}
		if !serving {
			continue
		}
		var st syscall.Stat_t
		if syscall.Stat("/proc/"+e.Name()+"/ns/net", &st) == nil && st.Ino == g.ino {
			return pid
		}
	}
	return 0
}

// procArgs is a process's command line; nil when it cannot be read (the
// process is gone, or is a kernel thread).
func procArgs(pid int) []string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil || len(b) == 0 {
		return nil
	}
	return strings.Split(strings.TrimSuffix(string(b), "\x00"), "\x00")
}

// dnsmasqLeaseFile finds the lease file of the dnsmasq serving the bridge,
// as that process was told it (Incus passes --dhcp-leasefile=PATH). pid is
// 0 when no dnsmasq serves the bridge, path empty when it names none.
func (g *ground) dnsmasqLeaseFile(bridge string) (path string, pid int) {
	pid = g.dnsmasqFor(bridge)
	if pid == 0 {
		return "", 0
	}
	for _, a := range procArgs(pid) {
		if p, ok := strings.CutPrefix(a, "--dhcp-leasefile="); ok {
			path = p
		}
	}
	return path, pid
}

// ipv6Disabled reads the bridge's disable_ipv6 sysctl in the host's
// namespace; ok is false when the bridge has no such entry.
func (g *ground) ipv6Disabled(bridge string) (disabled, ok bool, err error) {
	path := "/proc/sys/net/ipv6/conf/" + bridge + "/disable_ipv6"
	err = nsrun.Do(g.host.NetNS, func() error {
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

// disableIPv6 turns IPv6 off on the bridge's own interface.
func (g *ground) disableIPv6(bridge string) error {
	return nsrun.Do(g.host.NetNS, func() error {
		return os.WriteFile("/proc/sys/net/ipv6/conf/"+bridge+"/disable_ipv6", []byte("1"), 0o644)
	})
}

// isolatePorts turns the isolated flag on for every port of the bridge,
// whatever attached it, and returns the ports and the names it changed.
func (g *ground) isolatePorts(bridge string) ([]Port, []string, error) {
	ports, err := g.bridgePorts(bridge)
	if err != nil {
		return nil, nil, err
	}
	var changed []string
	for i, p := range ports {
		if p.Isolated {
			continue
		}
		l, err := g.h.LinkByName(p.Name)
		if err == nil {
			err = g.h.LinkSetIsolated(l, true)
		}
		if err != nil {
			return nil, nil, fmt.Errorf("isolating bridge port %s: %w", p.Name, err)
		}
		ports[i].Isolated = true
		changed = append(changed, p.Name)
	}
	return ports, changed, nil
}

// forwardBlockers turns another firewall's forward drop policy into
// findings: it drops the boxes' egress, and box does not rewrite rules it
// does not own, so each says what the operator can run.
func (g *ground) forwardBlockers(bridge string) ([]model.Finding, error) {
	bs, err := nft.ForwardBlockers(int(g.ns), model.Current.NFTTable, bridge)
	if err != nil {
		return nil, fmt.Errorf("reading other firewalls' forward chains: %w", err)
	}
	var out []model.Finding
	for _, b := range bs {
		fix := fmt.Sprintf("add accepts for iifname %q and oifname %q ct state established,related to %s %s %s", bridge, bridge, b.Family, b.Table, b.Chain)
		switch b.Owner {
		case "docker":
			fix = fmt.Sprintf("iptables -I DOCKER-USER -i %s -j ACCEPT; iptables -I DOCKER-USER -o %s -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT", bridge, bridge)
		case "ufw":
			fix = fmt.Sprintf("ufw route allow in on %s; ufw route allow out on %s", bridge, bridge)
		}
		out = append(out, model.Finding{Layer: model.LayerNAT, Object: "nft " + b.String(),
			Problem: "drops forwarded traffic, so boxes lose their egress; box does not change rules it does not own", Fix: fix, Advisory: true})
	}
	return out, nil
}

// RemoteHostError: what was asked reads or changes a host's kernel (nft,
// links, the port watcher), and the Host drives a remote Incus, whose
// kernel is another machine's.
type RemoteHostError struct{ Remote string }

func (e *RemoteHostError) Error() string {
	return fmt.Sprintf("this needs the host's kernel, and remote %s's host is another machine: run it there (box on that host, without --remote)", e.Remote)
}
