package stack

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"

	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/model"
	"github.com/box-isolation/box/stack/nft"
)

// Per-port pinning (layer L-PIN, claim C-SPOOF): each port of the bridge
// may send only with the MAC Incus gave its instance's NIC and the fixed
// IPv4 address box stored for that NIC (nft.Pin; the table bridge
// box_pin). Both come from the host's account, never from the box's: the
// MAC from the instance's config (volatile.<nic>.hwaddr, which the box
// cannot change), the address from its NIC's ipv4.address (L-DHCP), not
// from the lease file, which any DHCP message a box gets through to
// dnsmasq can change.

// PinPlan is what the pin table should hold now.
type PinPlan struct {
	// scope are the bridge's ports the table pins; pins what each may be.
	Scope []string
	Pins  []nft.Pin
	// unresolved are ports no instance claims yet (a port is on the bridge
	// a moment before Incus records whose it is, and a stray port is
	// nobody's): they are left out of the scope rather than cut off, and a
	// later refresh pins them; the census names a stray one.
	unresolved []string
	// notes say what could not be pinned and why.
	notes []string
}

// Fleet is every instance and the bridge's leases, read once for what a
// refresh, Verify or Ensure plans from them (the pins, the egress sets).
type Fleet struct {
	insts  []incus.Instance
	leases []incus.NetworkLease
	// bridge is the bridge as read beside them (nil when it was not):
	// the egress plan's policies and records.
	bridge *incus.Network
}

// ReadFleet lists every instance and the bridge's leases: on a cluster,
// those of this host's member (what its pins and egress sets are made of).
func (host *Host) ReadFleet(ctx context.Context) (Fleet, error) {
	f, err := host.readClusterFleet(ctx)
	if err != nil {
		return Fleet{}, err
	}
	return Fleet{insts: onMember(f.insts, host.here()), leases: leasesOn(f.leases, host.here()), bridge: f.bridge}, nil
}

// readClusterFleet is ReadFleet for every member of a cluster. The
// instances, the default project's leases and the bridge are read side
// by side: beside a full bridge each takes incusd tens of milliseconds,
// and a refresh (a new box's pins) waits for all of them.
func (host *Host) readClusterFleet(ctx context.Context) (Fleet, error) {
	if _, err := host.Cluster(ctx); err != nil {
		return Fleet{}, err
	}
	var (
		insts      []incus.Instance
		first      []incus.NetworkLease
		bridge     *incus.Network
		ierr, lerr error
		wg         sync.WaitGroup
	)
	wg.Go(func() { insts, ierr = host.Incus.Instances().All(ctx) })
	wg.Go(func() { first, lerr = host.Incus.Project("default").Networks().Leases(ctx, model.Current.Network) })
	wg.Go(func() {
		// Not readable by everyone (a granted user): the plan reads it
		// again and says so.
		bridge, _, _ = host.Incus.Networks().Get(ctx, model.Current.Network)
	})
	wg.Wait()
	if ierr != nil {
		return Fleet{}, ierr
	}
	if lerr != nil {
		return Fleet{}, fmt.Errorf("project default: %w", lerr)
	}
	leases, err := bridgeLeasesFrom(ctx, host.Incus, insts, first)
	if err != nil {
		return Fleet{}, err
	}
	return Fleet{insts: insts, leases: leases, bridge: bridge}, nil
}

// fleetOf is ReadFleet from a listing of the instances already made.
func (host *Host) fleetOf(ctx context.Context, insts []incus.Instance) (Fleet, error) {
	leases, err := bridgeLeases(ctx, host.Incus, insts)
	if err != nil {
		return Fleet{}, err
	}
	return Fleet{insts: insts, leases: leasesOn(leases, host.here())}, nil
}

// PlanPins says what to pin on ports.
func (f Fleet) PlanPins(ports []string) *PinPlan {
	return pinPlanOf(model.Current.Network, f.insts, ports)
}

// bridgeLeases reads the bridge's leases in every project with an instance
// (Incus lists a network's leases per project, and has no all-projects
// form: a granted user's box's lease is only listed in its project).
func bridgeLeases(ctx context.Context, c *incus.Client, insts []incus.Instance) ([]incus.NetworkLease, error) {
	first, err := c.Project("default").Networks().Leases(ctx, model.Current.Network)
	if err != nil {
		return nil, fmt.Errorf("project default: %w", err)
	}
	return bridgeLeasesFrom(ctx, c, insts, first)
}

// bridgeLeasesFrom is bridgeLeases with the default project's leases
// already read (first).
func bridgeLeasesFrom(ctx context.Context, c *incus.Client, insts []incus.Instance, first []incus.NetworkLease) ([]incus.NetworkLease, error) {
	projects := []string{"default"}
	for i := range insts {
		if p := model.ProjectOf(insts[i].Project); !slices.Contains(projects, p) {
			projects = append(projects, p)
		}
	}
	var out []incus.NetworkLease
	seen := map[string]bool{}
	for _, p := range projects {
		ls := first
		if p != "default" {
			var err error
			if ls, err = c.Project(p).Networks().Leases(ctx, model.Current.Network); err != nil {
				return nil, fmt.Errorf("project %s: %w", p, err)
			}
		}
		for _, l := range ls {
			if k := l.Hwaddr + " " + l.Address; !seen[k] {
				seen[k] = true
				out = append(out, l)
			}
		}
	}
	return out, nil
}

// pinPlanOf pins each of ports to the MAC of the instance NIC it belongs
// to and the fixed address stored for that NIC (none when it has none: it
// may then only ask for one from 0.0.0.0). An address stored for the NICs
// of two ports is pinned to neither, with a note.
func pinPlanOf(bridge string, insts []incus.Instance, ports []string) *PinPlan {
	macOf := map[string]net.HardwareAddr{} // port -> its NIC's MAC
	addrOf := map[string][]netip.Addr{}    // port -> its NIC's fixed address
	for i := range insts {
		for _, n := range model.BridgeNICs(bridge, &insts[i]) {
			if mac, err := net.ParseMAC(n.Mac); err == nil && n.Port != "" {
				macOf[n.Port] = mac
				if a, err := netip.ParseAddr(insts[i].ExpandedDevices[n.Dev]["ipv4.address"]); err == nil && a.Is4() {
					addrOf[n.Port] = []netip.Addr{a}
				}
			}
		}
	}
	p := &PinPlan{}
	owner := map[netip.Addr]string{}
	dup := map[netip.Addr]bool{}
	for _, port := range ports {
		mac, ok := macOf[port]
		if !ok {
			p.unresolved = append(p.unresolved, port)
			continue
		}
		pin := nft.Pin{Port: port, MAC: mac}
		for _, a := range addrOf[port] {
			if other, taken := owner[a]; taken {
				dup[a] = true
				p.notes = append(p.notes, fmt.Sprintf("%s is the fixed address of the NICs of both %s and %s: pinned to neither (box doctor names their instances)", a, other, port))
				continue
			}
			owner[a] = port
			pin.Addrs = append(pin.Addrs, a)
		}
		p.Scope = append(p.Scope, port)
		p.Pins = append(p.Pins, pin)
	}
	for i := range p.Pins {
		p.Pins[i].Addrs = slices.DeleteFunc(p.Pins[i].Addrs, func(a netip.Addr) bool { return dup[a] })
	}
	return p
}

// pinFindings turns the pin table's findings into Verify's.
func pinFindings(nf []nft.Finding, p *PinPlan) []model.Finding {
	var out []model.Finding
	for _, f := range nf {
		layer := model.LayerPin
		if dhcpRule(f.Problem) {
			layer = model.LayerDHCP // the pin table's DHCP drops are L-DHCP's
		}
		out = append(out, model.Finding{Layer: layer, Object: "nft " + f.Object, Problem: f.Problem, Fix: model.FixEnsure})
	}
	for _, n := range p.notes {
		out = append(out, model.Finding{Layer: model.LayerPin, Object: "pins", Problem: n, Fix: "give one of them another address (box incus N -- config device set {} eth0 ipv4.address=ADDR)"})
	}
	if len(p.unresolved) > 0 {
		out = append(out, model.Finding{Layer: model.LayerPin, Object: "pins", Advisory: true,
			Problem: "ports no instance claims are not pinned: " + strings.Join(p.unresolved, ", "), Fix: "box doctor (the census names a stray port)"})
	}
	return out
}

// dhcpRule says a pin table finding is about one of its DHCP drops (a
// rule matching UDP to the DHCP server's port that drops).
func dhcpRule(problem string) bool {
	return strings.Contains(problem, "udp dport 67") && strings.Contains(problem, " drop`")
}
