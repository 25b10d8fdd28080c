package stack

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/box-isolation/box/internal/nsrun"
	"github.com/box-isolation/box/stack/dnsmasq"
	"github.com/box-isolation/box/stack/hostns"
	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/model"
	"github.com/box-isolation/box/stack/nft"
)

// L-DHCP: every box has a fixed address stored by box (its NIC's
// ipv4.address, which Incus writes to dnsmasq as a dhcp-host), and the
// bridge's dnsmasq answers those only. A box can then neither take an
// address (a burst of DISCOVERs with made-up hardware addresses empties a
// dynamic pool for the lease time, across dnsmasq restarts) nor lose its
// own: dnsmasq hands a configured address to its owner whatever its lease
// file says, and the pins follow the stored address, not the lease file.
// The pin table drops a DHCP message naming anyone but its port's own MAC
// (nft.DesiredPins), which is what stops a release or decline naming a
// sibling: dnsmasq takes those from anyone, known or not.

// dnsmasqJoin appends settings lines to a bridge's raw.dnsmasq, ending
// the last line of raw first if it has no newline: a value set by hand
// through a shell's command substitution ($(printf ...)) has none, and a
// line glued to it makes dnsmasq refuse to start.
func dnsmasqJoin(raw, lines string) string {
	if raw != "" && !strings.HasSuffix(raw, "\n") {
		raw += "\n"
	}
	return raw + lines
}

// withoutDHCPLines is raw.dnsmasq without the L-DHCP lines, and whether
// it held every one of them.
func withoutDHCPLines(raw string) (string, bool) {
	var b strings.Builder
	seen := 0
	for _, l := range strings.SplitAfter(raw, "\n") {
		if slices.Contains(model.DHCPLines, strings.TrimSpace(l)) {
			seen++
			continue
		}
		b.WriteString(l)
	}
	return b.String(), seen == len(model.DHCPLines)
}

// rawDnsmasqFindings compares a bridge's raw.dnsmasq with the desired
// value: its L-DHCP lines are L-DHCP's, the rest L-DNS's.
func rawDnsmasqFindings(obj, got, want string) []model.Finding {
	if got == want {
		return nil
	}
	// A value set through a shell's $(...) lost its last newline: harmless
	// (dnsmasq reads the line, and box ends it before it appends).
	got = dnsmasqJoin(got, "")
	if got == want {
		return []model.Finding{{Layer: model.LayerDNS, Object: obj, Advisory: true, Fix: model.FixEnsure,
			Problem: "raw.dnsmasq's last line has no newline (set by hand through $(...)?): box ends it before it appends a line"}}
	}
	var out []model.Finding
	gotRest, gotDHCP := withoutDHCPLines(got)
	wantRest, _ := withoutDHCPLines(want)
	if !gotDHCP {
		out = append(out, model.Finding{Layer: model.LayerDHCP, Object: obj, Fix: model.FixEnsure,
			Problem: fmt.Sprintf("raw.dnsmasq lacks %s: the bridge's DHCP answers clients box did not give an address, or keys leases on client IDs", strings.Join(model.DHCPLines, " and "))})
	}
	if gotRest != wantRest {
		out = append(out, model.Finding{Layer: model.LayerDNS, Object: obj, Fix: model.FixEnsure,
			Problem: fmt.Sprintf("raw.dnsmasq is %q, want %q", got, want)})
	}
	if len(out) == 0 {
		// Only where the lines sit differs.
		out = append(out, model.Finding{Layer: model.LayerDHCP, Object: obj, Fix: model.FixEnsure,
			Problem: fmt.Sprintf("raw.dnsmasq is %q, want %q", got, want)})
	}
	return out
}

// inProject is host acting on the instances of an Incus project.
func (host *Host) inProject(project string) *Host {
	if model.ProjectOf(project) == "default" {
		return host
	}
	cp := *host
	cp.Incus = host.Incus.Project(project)
	return &cp
}

// EnsureFixed gives an instance whose NIC on the bridge has no fixed
// address one, and returns the address it has: the address it leases now
// when nobody else holds or asks for it (a box converted keeps its
// address, and its connections), else a free one of its member's slice.
func (addrs *Addresses) EnsureFixed(ctx context.Context, inst *incus.Instance, member string) (netip.Addr, error) {
	host := addrs.host
	if a := model.FixedAddressOf(inst); a.IsValid() {
		return a, nil
	}
	h := host.inProject(inst.Project)
	if a, ok, err := h.Addresses().keepLeased(ctx, inst); err != nil || ok {
		return a, err
	}
	return h.Addresses().FixAddress(ctx, inst.Name, member)
}

// keepLeased makes the address an instance leases now its fixed address,
// when it leases one and nobody else holds or asks for it.
func (addrs *Addresses) keepLeased(ctx context.Context, inst *incus.Instance) (netip.Addr, bool, error) {
	host := addrs.host
	nics := model.BridgeNICs(model.Current.Network, inst)
	if len(nics) == 0 {
		return netip.Addr{}, false, nil
	}
	mac, err := net.ParseMAC(nics[0].Mac)
	if err != nil {
		return netip.Addr{}, false, nil
	}
	unlock, err := hostns.LockFile(ctx, hostns.AddressLock, "the address slices")
	if err != nil {
		return netip.Addr{}, false, err
	}
	defer unlock()
	f, err := host.readClusterFleet(ctx)
	if err != nil {
		return netip.Addr{}, false, err
	}
	var leased netip.Addr
	others := Fleet{insts: slices.DeleteFunc(slices.Clone(f.insts), func(i incus.Instance) bool {
		return i.Name == inst.Name && model.ProjectOf(i.Project) == model.ProjectOf(inst.Project)
	})}
	for _, l := range f.leases {
		m, err := net.ParseMAC(l.Hwaddr)
		a, aerr := netip.ParseAddr(l.Address)
		switch {
		case err != nil || aerr != nil || l.Type == "gateway":
		case m.String() == mac.String() && a.Is4():
			leased = a
		default:
			others.leases = append(others.leases, l)
		}
	}
	if !leased.IsValid() || usedAddresses(others)[leased] {
		return netip.Addr{}, false, nil
	}
	if err := addrs.setFixedAddress(ctx, inst.Name, leased); err != nil {
		if isAddressConflict(err) {
			return netip.Addr{}, false, nil
		}
		return netip.Addr{}, false, fmt.Errorf("giving %s its leased address %s as its fixed one: %w", inst.Name, leased, err)
	}
	return leased, true, nil
}

// needsAddress says whether an instance is a box whose NIC on the bridge
// has no fixed address.
func needsAddress(inst *incus.Instance) bool {
	if _, ok := model.IsBox(inst); !ok {
		return false
	}
	dev, _ := model.BridgeNICOf(inst)
	return dev != "" && !model.FixedAddressOf(inst).IsValid()
}

// fixAllAddresses gives every box on the bridge, in every project and on
// every member, a fixed address (ensureFixed): before the bridge's DHCP
// answers known clients only, or a box minted before box stored its
// address would lose its lease at its next renewal.
func (addrs *Addresses) fixAllAddresses(ctx context.Context, ci ClusterInfo) ([]model.Change, error) {
	host := addrs.host
	insts, err := host.Incus.Instances().All(ctx)
	if err != nil {
		return nil, fmt.Errorf("listing the instances to give fixed addresses: %w", err)
	}
	var changes []model.Change
	for i := range insts {
		inst := &insts[i]
		if !needsAddress(inst) {
			continue
		}
		member := ""
		if ci.Clustered() {
			member = inst.Location
		}
		a, err := addrs.EnsureFixed(ctx, inst, member)
		if err != nil {
			return changes, fmt.Errorf("box %s: %w", inst.Name, err)
		}
		changes = append(changes, model.Change{Object: "box " + qualified(inst), Action: "updated", Detail: "fixed address " + a.String()})
	}
	return changes, nil
}

// qualified names an instance with its project when that is not default.
func qualified(inst *incus.Instance) string {
	if p := model.ProjectOf(inst.Project); p != "default" {
		return p + "/" + inst.Name
	}
	return inst.Name
}

// fixMissingAddresses gives every box of f with a port on the bridge and
// no fixed address one (ensureFixed), and says whether it gave any: a
// granted user's box, whose user could pick none, as its port comes up
// (the port watcher's refresh); a box started by hand, or minted before
// box stored addresses, at the next refresh. A box whose start Incus is
// still running takes no change yet: it is named in busy, to be looked at
// again soon.
func (addrs *Addresses) fixMissingAddresses(ctx context.Context, f Fleet) (fixed bool, busy []string, err error) {
	host := addrs.host
	for i := range f.insts {
		inst := &f.insts[i]
		if !needsAddress(inst) || !slices.ContainsFunc(model.BridgeNICs(model.Current.Network, inst), func(n model.BridgeNIC) bool { return n.Port != "" }) {
			continue
		}
		if _, err := addrs.EnsureFixed(ctx, inst, host.here()); isBusy(err) {
			busy = append(busy, qualified(inst))
			continue
		} else if err != nil {
			return fixed, busy, fmt.Errorf("giving box %s a fixed address: %w", qualified(inst), err)
		}
		fixed = true
	}
	return fixed, busy, nil
}

// isBusy is Incus refusing a change to an instance while another
// operation on it runs (its start: the port is up a moment before).
func isBusy(err error) bool { return err != nil && strings.Contains(err.Error(), "is busy running") }

// strayLeases are the addresses member's dnsmasq (this host's, member
// "" or its own; another's whose namespace MemberNetNS names) holds in its
// lease file: Incus lists only its instances' leases, and a lease for a
// client that is no instance (made up by a box before the stack stopped
// it) still keeps dnsmasq from handing its address to a box. Best
// effort: nothing when the file cannot be read.
func (addrs *Addresses) strayLeases(member string) map[netip.Addr]bool {
	host := addrs.host
	h := host
	if member != "" && member != host.here() {
		mh, ok := host.ForMember(member)
		if !ok {
			return nil
		}
		h = mh
	}
	pool, err := h.Addresses().DHCPLeases()
	if err != nil {
		return nil
	}
	out := map[netip.Addr]bool{}
	for _, l := range pool.Leases {
		out[l.Address] = true
	}
	return out
}

// dhcpFindings names every NIC on the bridge with no fixed address: a
// box's lacks what L-DHCP rests on; another instance's is advisory (it is
// not box's, and the bridge's DHCP simply does not answer it).
func dhcpFindings(insts []incus.Instance) []model.Finding {
	var out []model.Finding
	for i := range insts {
		inst := &insts[i]
		dev, _ := model.BridgeNICOf(inst)
		if dev == "" || model.FixedAddressOf(inst).IsValid() {
			continue
		}
		if _, ok := model.IsBox(inst); ok {
			out = append(out, model.Finding{Layer: model.LayerDHCP, Object: "box " + qualified(inst), Fix: model.FixEnsure,
				Problem: fmt.Sprintf("its NIC %s has no fixed address: the bridge's DHCP answers only the addresses box stored, so it gets no lease (and is not pinned to one)", dev)})
			continue
		}
		how := "override"
		if _, local := inst.Devices[dev]; local {
			how = "set"
		}
		out = append(out, model.Finding{Layer: model.LayerDHCP, Object: "instance " + qualified(inst), Advisory: true,
			Problem: fmt.Sprintf("its NIC %s on %s has no fixed address, so the bridge's DHCP does not answer it", dev, model.Current.Network),
			Fix:     fmt.Sprintf("give it one (incus config device %s %s %s ipv4.address=ADDR), or mint it with box", how, inst.Name, dev)})
	}
	return out
}

// DHCPLease is one IPv4 lease in dnsmasq's lease file.
type DHCPLease = dnsmasq.Lease

// DHCPPool is what the bridge's dnsmasq hands out and holds, read from
// its command line and its lease file (ground truth: Incus lists only
// its instances' leases).
type DHCPPool struct {
	LeaseFile string `json:"lease_file"`
	// Ranges are its dynamic ranges (--dhcp-range), Size how many
	// addresses they hold, Leased how many of them a lease holds.
	Ranges []string    `json:"ranges"`
	Size   int         `json:"size"`
	Leased int         `json:"leased"`
	Leases []DHCPLease `json:"leases"`
	// Strays are the leases whose hardware address is no instance NIC's
	// on the bridge.
	Strays []DHCPLease `json:"strays,omitempty"`
	// LeaseFileGone: the dnsmasq serving the bridge writes its leases to a
	// file deleted from disk (the lease file replaced while it ran: it
	// reads the file only at its start, and a SIGHUP does not re-read
	// it). What the file on disk says is then not what dnsmasq holds.
	LeaseFileGone bool `json:"lease_file_gone,omitempty"`
	// PID is the dnsmasq's.
	PID int `json:"pid,omitempty"`
	// Astray are boxes' leases for an address other than the box's fixed
	// one.
	Astray []AstrayLease `json:"astray,omitempty"`
}

// AstrayLease is a box's lease for an address that is not its fixed one:
// its pins drop everything it sends from there.
type AstrayLease struct {
	Box   string     `json:"box"`
	Fixed netip.Addr `json:"fixed"`
	Lease DHCPLease  `json:"lease"`
}

func (p DHCPPool) String() string {
	s := fmt.Sprintf("DHCP pool %s: %d of %d addresses leased", strings.Join(p.Ranges, ", "), p.Leased, p.Size)
	if n := len(p.Strays); n > 0 {
		s += fmt.Sprintf("; %d lease(s) belong to no box", n)
	}
	return s
}

// DHCPLeases reads the lease file and ranges of the dnsmasq serving the
// bridge in the host's namespace. An error says it could not: no dnsmasq
// serves the bridge, or its lease file is unreadable.
func (addrs *Addresses) DHCPLeases() (DHCPPool, error) {
	host := addrs.host
	g, err := host.OpenNS()
	if err != nil {
		return DHCPPool{}, err
	}
	defer g.Close()
	return dhcpPool(g, model.Current.Network)
}

// LeasesPinned reports, from the kernel alone, whether a refresh for a
// change of dnsmasq's leases would change nothing: every port is pinned,
// and a lease of a port's MAC is at the address its pin binds (its box's
// fixed address, in its egress sets already). One of a MAC on no port (a
// gone box's) changes no pin; at worst an egress set stays stricter until
// the next resync.
func (addrs *Addresses) LeasesPinned() bool {
	g := addrs.ownNS()
	if g == nil {
		return false
	}
	defer g.Close()
	ports, err := g.BridgePorts(model.Current.Network)
	if err != nil {
		return false
	}
	live, err := nft.LivePins(g.NFTConfig(model.Current))
	if err != nil || len(live) != len(ports) {
		return false
	}
	bound, onPort := map[netip.Addr]string{}, map[string]bool{} // address -> its port's MAC; the ports' MACs
	for _, p := range ports {
		pin, ok := live[p.Name]
		if !ok {
			return false
		}
		onPort[pin.MAC.String()] = true
		for _, a := range pin.Addrs {
			bound[a] = pin.MAC.String()
		}
	}
	pool, err := dhcpPool(g, model.Current.Network)
	if err != nil || pool.LeaseFileGone {
		return false
	}
	for _, l := range pool.Leases {
		if mac, err := net.ParseMAC(l.Hwaddr); err != nil || (onPort[mac.String()] && bound[l.Address] != mac.String()) {
			return false
		}
	}
	return true
}

// dhcpPool reads the pool of the dnsmasq serving bridge.
func dhcpPool(g *hostns.NS, bridge string) (DHCPPool, error) {
	var p DHCPPool
	pid := g.DnsmasqFor(bridge)
	if pid == 0 {
		return p, fmt.Errorf("no dnsmasq serves %s", bridge)
	}
	args := hostns.ProcArgs(pid)
	var ranges []string
	for i, a := range args {
		switch {
		case strings.HasPrefix(a, "--dhcp-leasefile="):
			p.LeaseFile = strings.TrimPrefix(a, "--dhcp-leasefile=")
		case a == "--dhcp-range" && i+1 < len(args):
			ranges = append(ranges, args[i+1])
		case strings.HasPrefix(a, "--dhcp-range="):
			ranges = append(ranges, strings.TrimPrefix(a, "--dhcp-range="))
		}
	}
	if p.LeaseFile == "" {
		return p, fmt.Errorf("the dnsmasq serving %s (pid %d) names no lease file", bridge, pid)
	}
	p.PID, p.LeaseFileGone = pid, hostns.HoldsDeleted(pid, p.LeaseFile)
	var spans [][2]netip.Addr
	for _, r := range ranges {
		lo, hi, ok := dnsmasq.ParseRange(r)
		if !ok {
			continue // an IPv6 range, or a mode this reader does not know
		}
		spans = append(spans, [2]netip.Addr{lo, hi})
		p.Ranges = append(p.Ranges, lo.String()+"-"+hi.String())
		p.Size += dnsmasq.RangeSize(lo, hi)
	}
	f, err := os.Open(p.LeaseFile)
	if errors.Is(err, fs.ErrNotExist) {
		return p, nil // no lease yet
	}
	if err != nil {
		return p, fmt.Errorf("reading dnsmasq's lease file: %w", err)
	}
	defer f.Close()
	if p.Leases, err = dnsmasq.ParseLeases(f); err != nil {
		return p, fmt.Errorf("reading %s: %w", p.LeaseFile, err)
	}
	for _, l := range p.Leases {
		if slices.ContainsFunc(spans, func(s [2]netip.Addr) bool { return l.Address.Compare(s[0]) >= 0 && l.Address.Compare(s[1]) <= 0 }) {
			p.Leased++
		}
	}
	return p, nil
}

// poolOf reads the bridge's pool and names the leases that belong to no
// instance NIC on the bridge (insts: every instance there, any project).
func poolOf(g *hostns.NS, insts []incus.Instance) (DHCPPool, error) {
	p, err := dhcpPool(g, model.Current.Network)
	if err != nil {
		return p, err
	}
	macs := map[string]bool{}
	for i := range insts {
		for _, n := range model.BridgeNICs(model.Current.Network, &insts[i]) {
			if m, err := net.ParseMAC(n.Mac); err == nil {
				macs[m.String()] = true
			}
		}
	}
	for _, l := range p.Leases {
		if !macs[l.Hwaddr] {
			p.Strays = append(p.Strays, l)
		}
	}
	for i := range insts {
		fixed := model.FixedAddressOf(&insts[i])
		if _, ok := model.IsBox(&insts[i]); !ok || !fixed.IsValid() {
			continue
		}
		for _, n := range model.BridgeNICs(model.Current.Network, &insts[i]) {
			m, err := net.ParseMAC(n.Mac)
			if err != nil {
				continue
			}
			for _, l := range p.Leases {
				if l.Hwaddr == m.String() && l.Address != fixed {
					p.Astray = append(p.Astray, AstrayLease{Box: qualified(&insts[i]), Fixed: fixed, Lease: l})
				}
			}
		}
	}
	return p, nil
}

// poolFindings say what the pool shows: leases that belong to no instance
// (advisory: a fixed address is never handed to another client, a new box
// is given an address no lease holds, and a stray lease goes at its
// expiry; one appears legitimately when an instance is removed while its
// lease runs), and a dynamic pool with no address left (a box's own
// DISCOVERs never draw from it, but what took it is worth knowing).
func poolFindings(p DHCPPool) []model.Finding {
	var out []model.Finding
	if p.LeaseFileGone {
		out = append(out, model.Finding{Layer: model.LayerDHCP, Object: fmt.Sprintf("dnsmasq (pid %d)", p.PID),
			Problem: fmt.Sprintf("it writes its leases to a file deleted from disk (%s was replaced while it ran; it reads the file only at its start): the leases on disk are not the ones it holds, and box picks new boxes' addresses from them", p.LeaseFile),
			Fix:     "box doctor --fix (has Incus restart it; nothing of box's replaces the lease file)"})
	}
	for _, a := range p.Astray {
		out = append(out, model.Finding{Layer: model.LayerDHCP, Object: "box " + a.Box,
			Problem: fmt.Sprintf("it holds a lease for %s, not its fixed address %s: its pins drop what it sends from there", a.Lease.Address, a.Fixed),
			Fix:     "box doctor --fix (releases the lease: the box takes its fixed address at its next renewal, or at its next start)"})
	}
	if n := len(p.Strays); n > 0 {
		var names []string
		for i, l := range p.Strays {
			if i == 8 {
				names = append(names, fmt.Sprintf("and %d more", n-i))
				break
			}
			names = append(names, l.Hwaddr+" at "+l.Address.String())
		}
		out = append(out, model.Finding{Layer: model.LayerDHCP, Object: "dnsmasq leases", Advisory: true,
			Problem: fmt.Sprintf("%d lease(s) belong to no instance on %s: %s", n, model.Current.Network, strings.Join(names, ", ")),
			Fix:     fmt.Sprintf("they go when they expire (%s); a burst of them is a box asking for addresses that are not its own: box doctor's pin findings say whether a layer let it", p.LeaseFile)})
	}
	if p.Size > 0 && p.Leased >= p.Size {
		out = append(out, model.Finding{Layer: model.LayerDHCP, Object: "dnsmasq leases", Advisory: true,
			Problem: fmt.Sprintf("the dynamic pool %s is full (%d of %d leased)", strings.Join(p.Ranges, ", "), p.Leased, p.Size),
			Fix:     "the leases that belong to no instance go when they expire"})
	}
	return out
}

// ReleaseLeases gives up leases in the bridge's dnsmasq as Incus does
// when it removes a NIC: a DHCPRELEASE from the host's namespace to the
// bridge's address, naming each lease's client as dnsmasq keys it
// (hardware type and address, client identifier). It is for leases a
// test or a drill's probes made for clients that do not exist, which
// would hold the pool for the lease time, across dnsmasq restarts. It
// sends again, a few times, until the lease file has none of them, and
// returns those it still has.
func (addrs *Addresses) ReleaseLeases(ctx context.Context, leases []DHCPLease) ([]DHCPLease, error) {
	host := addrs.host
	n, _, err := host.Incus.Networks().Get(ctx, model.Current.Network)
	if err != nil {
		return leases, err
	}
	gw, err := netip.ParsePrefix(n.Config["ipv4.address"])
	if err != nil {
		return leases, fmt.Errorf("network %s has ipv4.address=%q", model.Current.Network, n.Config["ipv4.address"])
	}
	left := leases
	for try := 0; try < 5 && len(left) > 0; try++ {
		if err := nsrun.Do(host.NetNS, func() error { return dnsmasq.SendReleases(gw.Addr(), left) }); err != nil {
			return left, fmt.Errorf("releasing leases: %w", err)
		}
		select {
		case <-ctx.Done():
			return left, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
		pool, err := addrs.DHCPLeases()
		if err != nil {
			return left, err
		}
		left = slices.DeleteFunc(slices.Clone(left), func(l DHCPLease) bool {
			return !slices.ContainsFunc(pool.Leases, func(p DHCPLease) bool { return p.Hwaddr == l.Hwaddr && p.Address == l.Address })
		})
	}
	return left, nil
}
