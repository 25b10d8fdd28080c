package drill

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	"github.com/vishvananda/netlink"

	"github.com/box-isolation/box/drill/topo"
	"github.com/box-isolation/box/internal/nsrun"
	"github.com/box-isolation/box/stack/model"
)

// lanSim stands in for the LAN in host mode (C-INBOUND): a packet the host
// itself sends takes the output path, not the forward path where the ACL's
// ingress rules sit, and one sent on the real LAN would leave the machine.
// So the drill makes a throwaway namespace joined to the host's namespace
// by a veth and sends from there, with a source address in each private
// range, to a box through the host's forward path. Nothing leaves the
// machine: the namespace has no other interface. The host routes each
// source (a /32) back through the veth, so a reply comes back there and
// strict reverse-path filtering accepts the packets; no sysctl changes.
// Removing the namespace removes the veth, and with it those routes.
type lanSim struct {
	ns       string // the throwaway namespace
	hostVeth string // its peer, in the host's namespace
	sources  []netip.Addr
}

// lanSimPrefix starts the name of every namespace a lanSim makes, so an
// aborted run's is found.
const lanSimPrefix = "drl-"

// lanSimSamples are the sources a lanSim sends from in a private range
// none of the host's LAN prefixes covers: addresses at the top of each
// range, where a LAN host is least likely.
var lanSimSamples = []netip.Addr{
	netip.MustParseAddr("10.255.255.77"),
	netip.MustParseAddr("172.31.255.77"),
	netip.MustParseAddr("192.168.255.77"),
	netip.MustParseAddr("100.127.255.77"),
}

// lanSimOffset is how far below a LAN prefix's broadcast address its
// source sits: high in the prefix, where a LAN host is least likely.
const lanSimOffset = 10

// maxLANSimSources bounds the sources (each costs two probes).
const maxLANSimSources = 8

// lanSimSources picks what a lanSim sends from: one address in each of the
// host's real LAN prefixes (every prefix it routes by an interface its
// default routes do not leave by, private or not: RoutedOffUplinks; the
// uplink's own segment is the way the internet comes in), near its top,
// so that an ingress rule opened for the host's own LAN is probed; then
// a sample in each private range none of them covers. An address the
// host uses, routes by a host route or has a neighbour entry for is never
// taken; nor is one in the box subnet, or in a prefix too small to hold a
// free address.
func lanSimSources(routes []topo.Route, boxSubnet netip.Prefix, taken func(netip.Addr) bool) []netip.Addr {
	var out []netip.Addr
	ok := func(a netip.Addr) bool {
		return a.IsValid() && a.Is4() && !taken(a) && !boxSubnet.Contains(a) && !slices.Contains(out, a) && len(out) < maxLANSimSources
	}
	for _, p := range topo.RoutedOffUplinks(routes) {
		if !p.Addr().Is4() || p.Bits() > 28 || p.Overlaps(boxSubnet) {
			continue
		}
		a := lastAddr(p)
		for range lanSimOffset {
			a = a.Prev()
		}
		if ok(a) {
			out = append(out, a)
		}
	}
	for _, a := range lanSimSamples {
		if slices.ContainsFunc(out, func(s netip.Addr) bool { return samePrivateRange(s, a) }) {
			continue
		}
		if ok(a) {
			out = append(out, a)
		}
	}
	return out
}

// lastAddr is the last address of an IPv4 prefix (its broadcast address).
func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().As4()
	v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
	v |= 1<<(32-p.Bits()) - 1
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// samePrivateRange reports whether a and b are in one private range.
func samePrivateRange(a, b netip.Addr) bool {
	return slices.ContainsFunc(model.PrivateRanges, func(r netip.Prefix) bool { return r.Contains(a) && r.Contains(b) })
}

// newLANSim builds the namespace for a run, toward box (the probed box's
// address) in the host's namespace hostNS ("" for the drill's own). A
// source the host already uses or routes by a host route is left out.
func newLANSim(hostNS, runID string, box netip.Addr, sources []netip.Addr) (_ *lanSim, err error) {
	l := &lanSim{ns: lanSimPrefix + runID, hostVeth: "drl" + runID}
	defer func() {
		if err != nil {
			if rerr := l.remove(); rerr != nil {
				err = fmt.Errorf("%w; and removing it: %v", err, rerr)
			}
		}
	}()
	l.sources = sources
	if len(l.sources) == 0 {
		return nil, fmt.Errorf("every source address it would use is taken on this host")
	}
	host := ipIn(hostNS)
	if err := nsrun.Create(l.ns); err != nil {
		return nil, err
	}
	steps := [][]string{
		append(host, "link", "add", l.hostVeth, "type", "veth", "peer", "name", "eth0", "netns", l.ns),
		append(host, "link", "set", l.hostVeth, "up"),
		{"ip", "-n", l.ns, "link", "set", "lo", "up"},
		{"ip", "-n", l.ns, "link", "set", "eth0", "up"},
	}
	for _, a := range l.sources {
		steps = append(steps,
			[]string{"ip", "-n", l.ns, "addr", "add", a.String() + "/32", "dev", "eth0"},
			append(host, "route", "add", a.String()+"/32", "dev", l.hostVeth))
	}
	for _, s := range steps {
		if out, err := exec.Command(s[0], s[1:]...).CombinedOutput(); err != nil {
			return nil, fmt.Errorf("%s: %w: %s", strings.Join(s, " "), err, strings.TrimSpace(string(out)))
		}
	}
	// The box is reached through the host: its address on the veth, with
	// the host's end of it as the next hop.
	var mac net.HardwareAddr
	if err := nsrun.Do(hostNS, func() error {
		link, err := netlink.LinkByName(l.hostVeth)
		if err == nil {
			mac = link.Attrs().HardwareAddr
		}
		return err
	}); err != nil {
		return nil, err
	}
	for _, s := range [][]string{
		{"ip", "-n", l.ns, "route", "add", box.String() + "/32", "dev", "eth0"},
		{"ip", "-n", l.ns, "neigh", "replace", box.String(), "lladdr", mac.String(), "dev", "eth0", "nud", "permanent"},
	} {
		if out, err := exec.Command(s[0], s[1:]...).CombinedOutput(); err != nil {
			return nil, fmt.Errorf("%s: %w: %s", strings.Join(s, " "), err, strings.TrimSpace(string(out)))
		}
	}
	return l, nil
}

// ipIn is the start of an ip command acting in namespace ns.
func ipIn(ns string) []string {
	if ns == "" {
		return []string{"ip"}
	}
	return []string{"ip", "-n", ns}
}

// remove deletes the namespace (and with it the veth and the host's routes
// through it); a namespace already gone is no error.
func (l *lanSim) remove() error {
	return removeLANSim(l.ns)
}

func removeLANSim(ns string) error { return nsrun.Delete(ns) }

// cleanLANSims is C-INBOUND's clean: an aborted run's LAN stand-in.
func cleanLANSims(_ context.Context, cfg *Config) error {
	removed, err := removeLANSims()
	if len(removed) > 0 {
		cfg.logf("preflight: removed an earlier run's %s", strings.Join(removed, ", "))
	}
	if err != nil {
		return fmt.Errorf("removing an earlier run's LAN stand-in: %w", err)
	}
	return nil
}

// removeLANSims removes what aborted runs left: every namespace whose name
// starts with lanSimPrefix.
func removeLANSims() ([]string, error) {
	m, _ := filepath.Glob(filepath.Join(nsrun.Dir, lanSimPrefix+"*"))
	var removed []string
	for _, p := range m {
		if err := removeLANSim(filepath.Base(p)); err != nil {
			return removed, err
		}
		removed = append(removed, "namespace "+filepath.Base(p))
	}
	return removed, nil
}
