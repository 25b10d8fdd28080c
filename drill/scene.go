package drill

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/box-isolation/box/drill/topo"
	"github.com/box-isolation/box/internal/hostscan"
	"github.com/box-isolation/box/internal/nsrun"
	"github.com/box-isolation/box/probes"
	"github.com/box-isolation/box/stack"
	"github.com/box-isolation/box/stack/model"
)

// routed reports whether a sender reaches the box subnet only by routing
// (a workload behind a box's NAT): nothing it sends at layer 2 (ARP,
// broadcast, multicast, IPv6 link-local) leaves its own bridge.
func routed(e BoxEnd) bool { return e.Via.IsValid() }

// HostAddr and Target are the topology's.
type (
	HostAddr = topo.HostAddr
	Target   = topo.Target
)

// Scene is everything the scenario needs to know about the run: the
// topology it was given, the stack as Verify found it, the probe boxes, and
// what the drill read in the host's namespace once the stack was up.
type Scene struct {
	topo.Topology

	Subnet  netip.Prefix
	Gateway netip.Addr
	// GatewayMAC is the bridge's own MAC, where a box's frames to the
	// host go.
	GatewayMAC net.HardwareAddr
	A, B, C    BoxEnd
	// T is the granted user's box (C-TIER), W the allowlisted one
	// (C-ALLOW), N the nesting one (C-NESTED), L the load box (C-KERNEL);
	// zero when their claim is not run.
	T, W, N, L BoxEnd
	DNSDomain  string // the bridge's DNS domain, for sibling name forms

	// HostAddrs are the host's own addresses, the gateway first.
	HostAddrs []HostAddr
	// Listeners are the sockets listening in the host's namespace once the
	// stack is up (read from the kernel): what a box would really aim at.
	Listeners []hostscan.Listener
	// Forwards are the host's DNAT and redirect rules (read from its
	// nftables ruleset): the ports they forward are targets too.
	Forwards []hostscan.Forward
	// questions are the names C-NAMES asks besides the siblings'
	// (nameQuestions).
	questions []topo.Name
	// Members are, on a cluster, its members the drill can enter (the
	// local one, where box-a runs, among them); empty off a cluster.
	Members []MemberScene
	// HostTCP and HostUDP are the ports of the drill's listeners on the
	// host's addresses (9100 and 9101 when zero); on a real host they are
	// picked per run, so a service of the host's own is never in the way.
	HostTCP, HostUDP int
	// DHCPFirst and DHCPSize are the bridge's dynamic DHCP pool (its first
	// range, as its dnsmasq was started with), what C-SPOOF's made-up
	// clients ask for; DHCPPrefix makes their hardware addresses and
	// client identifiers the run's own.
	DHCPFirst  netip.Addr
	DHCPSize   int
	DHCPPrefix [3]byte
}

// box is the probe box at a place, if the scene has one there.
func (t Scene) box(p Place) (BoxEnd, bool) {
	for _, e := range []BoxEnd{t.A, t.B, t.C, t.T, t.W, t.N} {
		if e.Place == p && e.IP.IsValid() {
			return e, true
		}
	}
	for _, m := range t.Members {
		if m.Box.Place == p && m.Box.IP.IsValid() {
			return m.Box, true
		}
	}
	return BoxEnd{}, false
}

// A sceneInput is something the drill reads off the host for the scene,
// besides the topology it was given. What the run could not read of one
// is noted for the claims that need it (Claim.inputs), under their IDs:
// the engine says what it missed, the claim what that costs it.
type sceneInput string

const (
	inputBridgeMAC sceneInput = "bridge MAC" // where a box's frames to the host go
	inputForwards  sceneInput = "forwards"   // the ports the host forwards, and its other rules
	inputNames     sceneInput = "names"      // the names a box asks its resolver
	inputDHCPPool  sceneInput = "DHCP pool"  // the bridge's dynamic DHCP range
)

// inputNotes are the report's notes that the drill missed something of an
// input (what): one for each claim of the catalogue that needs the input,
// under its ID and with what the claim loses.
func inputNotes(in sceneInput, what string) []string {
	var out []string
	for _, c := range Catalogue {
		loses, ok := c.inputs[in]
		if !ok {
			continue
		}
		n := string(c.ID) + ": " + what
		if loses != "" {
			n += ": " + loses
		}
		out = append(out, n)
	}
	return out
}

// buildScene joins the topology with the stack, the boxes and what the
// host's namespace holds now that the stack is up.
func (r *run) buildScene(ctx context.Context) (Scene, error) {
	v, h := r.v, r.cfg.Host
	s := Scene{Topology: r.cfg.Topology, Subnet: v.Subnet, Gateway: v.Gateway,
		A: *r.ends[PlaceA], B: *r.ends[PlaceB], C: *r.ends[PlaceC], DNSDomain: "incus"}
	s.takeBoxes(r.ends, v.Fleet, h.Incus.ProjectName())
	notes := func(ns ...string) { r.rep.Notes = append(r.rep.Notes, ns...) }
	if mac, err := bridgeMAC(h.NetNS); err != nil {
		notes(inputNotes(inputBridgeMAC, "the bridge's MAC was not read ("+err.Error()+")")...)
	} else {
		s.GatewayMAC = mac
	}
	if n, _, err := h.Incus.Networks().Get(ctx, model.Current.Network); err == nil && n.Config["dns.domain"] != "" {
		s.DNSDomain = n.Config["dns.domain"]
	}
	missed, err := s.readHost(h.NetNS)
	notes(missed...)
	if err != nil {
		return s, err
	}
	for _, m := range r.members {
		if m.Local {
			m.HostAddrs, m.Listeners, m.Forwards = s.HostAddrs, s.Listeners, s.Forwards
		} else if err := m.read(v.Subnet, v.Gateway); err != nil {
			return s, err
		}
		if e, ok := r.ends[memberBoxPlace(m.Name)]; ok {
			m.Box = *e
		}
		s.Members = append(s.Members, m)
	}
	// Boxes are not LAN targets.
	s.LANHosts = slices.DeleteFunc(slices.Clone(s.LANHosts), func(t topo.Target) bool { return v.Subnet.Contains(t.Addr) })
	notes(s.Notes...)
	notes(s.askNames()...)
	if err := s.readDHCPPool(h); err != nil {
		notes(inputNotes(inputDHCPPool, "the bridge's DHCP pool was not read ("+err.Error()+")")...)
	}
	if _, err := rand.Read(s.DHCPPrefix[:]); err != nil {
		return s, err
	}
	// A locally administered unicast prefix: no vendor's, no group's.
	s.DHCPPrefix[0] = s.DHCPPrefix[0]&0xfc | 0x02
	if s.Source == topo.SourceHost {
		// Listener ports picked per run from the dynamic range, so a
		// service the host runs on a fixed port is never in the way.
		var rnd [2]byte
		if _, err := rand.Read(rnd[:]); err != nil {
			return s, err
		}
		s.HostTCP = 49152 + int(binary.BigEndian.Uint16(rnd[:]))%16000
		s.HostUDP = s.HostTCP + 1
	}
	return s, nil
}

// takeBoxes puts the probe boxes minted for claims of their own (box-t,
// box-w, box-n, box-l) in the scene, and gives box-a, box-b and the clone
// the ports the census met them on.
func (s *Scene) takeBoxes(ends map[Place]*BoxEnd, fleet *model.Census, project string) {
	for p, e := range map[Place]*BoxEnd{PlaceT: &s.T, PlaceW: &s.W, PlaceN: &s.N, PlaceL: &s.L} {
		if end, ok := ends[p]; ok {
			*e = *end
		}
	}
	if fleet == nil {
		return
	}
	for _, e := range []*BoxEnd{&s.A, &s.B, &s.C} {
		if sib, ok := fleet.Sibling(project, e.Instance); ok {
			e.Port = sib.Port
		}
	}
}

// bridgeMAC reads the bridge's own MAC in namespace ns.
func bridgeMAC(ns string) (net.HardwareAddr, error) {
	var mac net.HardwareAddr
	err := withNetNS(ns, func(fd int) error {
		h, err := netlink.NewHandleAt(netns.NsHandle(fd))
		if fd == 0 {
			h, err = netlink.NewHandle()
		}
		if err != nil {
			return err
		}
		defer h.Close()
		br, err := h.LinkByName(model.Current.Network)
		if err == nil {
			mac = br.Attrs().HardwareAddr
		}
		return err
	})
	return mac, err
}

// readHost reads the host's addresses, the sockets listening in its
// namespace (ns) and the ports it forwards, with notes on the forwarding
// rules it could not read.
func (s *Scene) readHost(ns string) ([]string, error) {
	addrs, _, err := topo.ReadInterfaces(ns)
	if err != nil {
		return nil, err
	}
	s.HostAddrs = topo.HostAddrs(addrs, s.Subnet, s.Gateway)
	var fw hostscan.Forwarding
	var fwErr error
	if err := nsrun.Do(ns, func() error {
		var err error
		s.Listeners, err = hostscan.Listeners()
		fw, fwErr = hostscan.Forwards()
		return err
	}); err != nil {
		return nil, err
	}
	var notes []string
	if fwErr != nil {
		notes = append(notes, inputNotes(inputForwards, "the host's forwarding rules were not read ("+fwErr.Error()+"): the ports they forward are not targets")...)
	}
	s.Forwards = fw.Forwards
	if len(fw.LegacyTables) > 0 {
		notes = append(notes, inputNotes(inputForwards, "legacy iptables tables exist in the host's namespace ("+strings.Join(fw.LegacyTables, ", ")+"); their rules were not read, so the ports they forward are not targets")...)
	}
	for _, f := range fw.Forwards {
		if f.PortUnknown || (f.AllPorts() && (f.Proto == "tcp" || f.Proto == "udp")) {
			notes = append(notes, inputNotes(inputForwards, "the ports of "+f.String()+" could not be listed, so they are not targets")...)
		}
	}
	return notes, nil
}

// askNames picks the names a box asks its resolver besides its siblings'
// (nameQuestions), with notes on those left out.
func (s *Scene) askNames() []string {
	hosts, missed := readHosts(s.HostsFile)
	var notes []string
	if missed != "" {
		notes = inputNotes(inputNames, missed)
	}
	var dropped int
	s.questions, dropped = nameQuestions(*s, hosts)
	if dropped > 0 {
		notes = append(notes, inputNotes(inputNames, fmt.Sprintf("%d more names were not asked (at most %d a run)", dropped, maxNames))...)
	}
	return notes
}

// readDHCPPool reads the bridge's dynamic DHCP pool: its first range.
func (s *Scene) readDHCPPool(h *stack.Host) error {
	pool, err := h.Addresses().DHCPLeases()
	if err != nil {
		return err
	}
	if len(pool.Ranges) > 0 {
		lo, _, _ := strings.Cut(pool.Ranges[0], "-")
		s.DHCPFirst, _ = netip.ParseAddr(lo)
		s.DHCPSize = min(pool.Size, probes.MaxDHCPFlood)
	}
	return nil
}
