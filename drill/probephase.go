package drill

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/box-isolation/box/drill/topo"
	"github.com/box-isolation/box/internal/hostscan"
	"github.com/box-isolation/box/internal/nsrun"
	"github.com/box-isolation/box/probes"
	"github.com/box-isolation/box/stack/model"
	"github.com/box-isolation/box/stack/nft"
)

// runProbes builds the scene and the scenario, and runs every place's
// plan at once.
func (r *run) runProbes(ctx context.Context) error {
	scene, err := r.buildScene(ctx)
	if err != nil {
		return fmt.Errorf("targets: %w", err)
	}
	r.scene = scene
	r.sc = BuildScenario(scene, r.cfg.Claims)
	rep := r.rep
	for _, p := range r.sc.Plans {
		rep.Summary.Probes += len(p.Probes)
	}
	r.cfg.logf("probes: %d probes from %d places, %s deadline each, all at once", rep.Summary.Probes, len(r.sc.Plans), probeDeadline)
	table := nft.CounterPrefix + rep.RunID
	chains, err := r.countingChains()
	if err != nil {
		return err
	}
	for _, ch := range chains {
		err := withNetNS(ch.ns, func(fd int) error { return nft.InstallCounters(fd, table, ch.keys) })
		if err != nil {
			return fmt.Errorf("the witness after %s's filter: %w", ch.whose, err)
		}
		r.later(func(context.Context) error {
			return withNetNS(ch.ns, func(fd int) error {
				_, err := nft.DeleteCounters(fd, table)
				return err
			})
		})
	}
	var stops []func()
	for _, c := range r.cfg.Claims {
		if c.watch != nil && r.skipped[c.ID] == "" {
			stops = append(stops, c.watch(r))
		}
	}
	t0 := time.Now()
	plans, guestAPI := splitGuestAPI(r.sc.Plans)
	var late time.Duration
	r.obs, r.agentErr, late = runPlans(ctx, r.cfg, r.boxClient, r.names, plans)
	rep.Summary.AgentsLateMS = late.Milliseconds()
	// The guest API probes, one box at a time, after the rest: incusd 6.0
	// crashes on a guest API request while another box's connection opens
	// or closes (lxc/incus#3618), and boxes' plans start some tens of
	// milliseconds apart, so a stagger inside the plans was not enough
	// (a clean-clone make test lost the world's incusd so).
	for _, place := range slices.Sorted(maps.Keys(guestAPI)) {
		obs, errs, _ := runPlans(ctx, r.cfg, r.boxClient, r.names, map[Place]*probes.Plan{place: guestAPI[place]})
		r.obs.merge(obs)
		for p, e := range errs {
			r.agentErr[p] = strings.TrimPrefix(r.agentErr[p]+"; ", "; ") + e
		}
	}
	for _, stop := range stops {
		stop()
	}
	rep.Summary.ProbePhaseMS = time.Since(t0).Milliseconds()
	for _, c := range r.cfg.Claims {
		if c.after != nil && r.skipped[c.ID] == "" {
			c.after(ctx, r)
		}
	}
	if rep.Summary.Probes > 0 {
		rep.Summary.MSPerProbe = float64(rep.Summary.ProbePhaseMS) / float64(rep.Summary.Probes)
	}
	for _, place := range slices.Sorted(maps.Keys(r.agentErr)) {
		rep.Problems = append(rep.Problems, "agent at "+string(place)+": "+r.agentErr[place])
	}
	rep.Problems = append(rep.Problems, failedControls(r.sc, r.obs)...)
	for _, ch := range chains {
		r.obs[ch.place] = r.readCounters(ch.ns, table, ch.keys, ch.control)
	}
	return nil
}

// countingChain is one namespace's counting chain: the local host's
// (PlaceFilter), or another cluster member's.
type countingChain struct {
	place     Place
	ns, whose string
	keys      []nft.CountKey
	control   nft.CountKey
}

// countingChains are the chains the scenario counts in, each in its
// member's namespace.
func (r *run) countingChains() ([]countingChain, error) {
	var out []countingChain
	if len(r.sc.Counters) > 0 {
		out = append(out, countingChain{PlaceFilter, r.cfg.Host.NetNS, "the host", r.sc.Counters, r.sc.CountControl})
	}
	for _, place := range slices.Sorted(maps.Keys(r.sc.MemberCounters)) {
		m := memberOfPlace(place)
		mh, ok := r.cfg.Host.ForMember(m)
		if !ok {
			return nil, fmt.Errorf("the witness after member %s's filter: its namespace is not known here", m)
		}
		out = append(out, countingChain{place, mh.NetNS, "member " + m, r.sc.MemberCounters[place], r.sc.CountControls[place]})
	}
	return out, nil
}

// readCounters turns the counting chain's counts into observations; a
// chain that cannot be read leaves them missing (inconclusive).
func (r *run) readCounters(ns, table string, keys []nft.CountKey, control nft.CountKey) map[string]probes.Observation {
	var got map[string]uint64
	err := withNetNS(ns, func(fd int) error {
		var err error
		got, err = nft.ReadCounters(fd, table)
		return err
	})
	if err != nil {
		r.rep.Problems = append(r.rep.Problems, "the witness after the host's filter: "+err.Error())
		return nil
	}
	m := map[string]probes.Observation{}
	for _, k := range keys {
		id := k.String()
		if k == control {
			id = countControlID
		}
		o := probes.Observation{ID: id, Kind: "counter", Target: k.String(), Outcome: probes.Silent, Reason: "no packet counted after the filter"}
		if n := got[k.String()]; n > 0 {
			o.Outcome, o.Reason = probes.Reached, fmt.Sprintf("%d packet(s) %s counted after the host's filter", n, k)
		}
		m[id] = o
	}
	return m
}

// takenBy says whether the host already uses an address: its own, or one
// it routes by a host route.
func takenBy(addrs []topo.IfaceAddr, routes []topo.Route) func(netip.Addr) bool {
	return func(a netip.Addr) bool {
		return slices.ContainsFunc(addrs, func(i topo.IfaceAddr) bool { return i.Prefix.Addr() == a }) ||
			slices.ContainsFunc(routes, func(r topo.Route) bool { return r.Dst.IsSingleIP() && r.Dst.Addr() == a })
	}
}

// withNetNS runs fn with an fd of the named namespace (0: this one).
func withNetNS(name string, fn func(fd int) error) error {
	if name == "" {
		return fn(0)
	}
	ns, err := netns.GetFromName(name)
	if err != nil {
		return fmt.Errorf("opening namespace %s: %w", name, err)
	}
	defer ns.Close()
	return fn(int(ns))
}

// buildScene joins the topology with the stack, the boxes and what the
// host's namespace holds now that the stack is up.
func (r *run) buildScene(ctx context.Context) (Scene, error) {
	v := r.v
	s := Scene{Topology: r.cfg.Topology, Subnet: v.Subnet, Gateway: v.Gateway,
		A: *r.ends[PlaceA], B: *r.ends[PlaceB], C: *r.ends[PlaceC], DNSDomain: "incus"}
	for p, e := range map[Place]*BoxEnd{PlaceT: &s.T, PlaceW: &s.W, PlaceN: &s.N, PlaceL: &s.L} {
		if end, ok := r.ends[p]; ok {
			*e = *end
		}
	}
	s.Door = r.door
	if v.Fleet != nil {
		for _, e := range []*BoxEnd{&s.A, &s.B, &s.C} {
			if sib, ok := v.Fleet.Sibling(r.cfg.Host.Incus.ProjectName(), e.Instance); ok {
				e.Port = sib.Port
			}
		}
	}
	if err := withNetNS(r.cfg.Host.NetNS, func(fd int) error {
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
			s.GatewayMAC = br.Attrs().HardwareAddr
		}
		return err
	}); err != nil {
		r.rep.Notes = append(r.rep.Notes, string(SpoofID)+": the bridge's MAC was not read ("+err.Error()+"): box-a's lies are not sent")
	}
	if n, _, err := r.cfg.Host.Incus.Network(ctx, model.Current.Network); err == nil && n.Config["dns.domain"] != "" {
		s.DNSDomain = n.Config["dns.domain"]
	}
	addrs, _, err := topo.ReadInterfaces(r.cfg.Host.NetNS)
	if err != nil {
		return s, err
	}
	s.HostAddrs = topo.HostAddrs(addrs, v.Subnet, v.Gateway)
	var fw hostscan.Forwarding
	var fwErr error
	if err := nsrun.Do(r.cfg.Host.NetNS, func() error {
		var err error
		s.Listeners, err = hostscan.Listeners()
		fw, fwErr = hostscan.Forwards()
		return err
	}); err != nil {
		return s, err
	}
	if fwErr != nil {
		r.rep.Notes = append(r.rep.Notes, string(HostID)+": the host's forwarding rules were not read ("+fwErr.Error()+"): the ports they forward are not targets")
	}
	s.Forwards = fw.Forwards
	if len(fw.LegacyTables) > 0 {
		r.rep.Notes = append(r.rep.Notes, string(HostID)+": legacy iptables tables exist in the host's namespace ("+strings.Join(fw.LegacyTables, ", ")+"); their rules were not read, so the ports they forward are not targets")
	}
	for _, f := range fw.Forwards {
		if f.PortUnknown || (f.AllPorts() && (f.Proto == "tcp" || f.Proto == "udp")) {
			r.rep.Notes = append(r.rep.Notes, string(HostID)+": the ports of "+f.String()+" could not be listed, so they are not targets")
		}
	}
	for _, m := range r.members {
		if m.Local {
			m.HostAddrs, m.Listeners, m.Forwards = s.HostAddrs, s.Listeners, s.Forwards
		} else if err := r.readMember(&m, v.Subnet, v.Gateway); err != nil {
			return s, err
		}
		if e, ok := r.ends[memberBoxPlace(m.Name)]; ok {
			m.Box = *e
		}
		s.Members = append(s.Members, m)
	}
	// Boxes are not LAN targets.
	s.LANHosts = slices.DeleteFunc(slices.Clone(s.LANHosts), func(t topo.Target) bool { return v.Subnet.Contains(t.Addr) })
	r.rep.Notes = append(r.rep.Notes, s.Notes...)
	hosts, note := readHosts(s.HostsFile)
	if note != "" {
		r.rep.Notes = append(r.rep.Notes, note)
	}
	var dropped int
	s.questions, dropped = nameQuestions(s, hosts)
	if dropped > 0 {
		r.rep.Notes = append(r.rep.Notes, fmt.Sprintf("%s: %d more names were not asked (at most %d a run)", NamesID, dropped, maxNames))
	}
	if pool, err := r.cfg.Host.DHCPLeases(); err != nil {
		r.rep.Notes = append(r.rep.Notes, string(SpoofID)+": the bridge's DHCP pool was not read ("+err.Error()+"): the DHCP lies are not sent")
	} else if len(pool.Ranges) > 0 {
		lo, _, _ := strings.Cut(pool.Ranges[0], "-")
		s.DHCPFirst, _ = netip.ParseAddr(lo)
		s.DHCPSize = min(pool.Size, probes.MaxDHCPFlood)
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

// failedControls names the positive controls that did not work: plan
// probes that serve no action (the host's control frames and its probes of
// its own listeners). The verdicts they leave inconclusive say so too; this
// puts the cause where an operator looks first.
func failedControls(sc *Scenario, obs observations) []string {
	actions := map[string]bool{}
	for _, a := range sc.Actions {
		actions[a.ID] = true
	}
	var out []string
	for _, place := range slices.Sorted(maps.Keys(sc.Plans)) {
		for _, p := range sc.Plans[place].Probes {
			// A reference's answer is compared with a box's, whatever it is
			// (the upstream's NXDOMAIN, the host's echo to a LAN target that
			// need only be seen leaving): its failure is no failed control.
			if actions[p.ID] || sc.References[p.ID] {
				continue
			}
			if o, ok := obs.get(place, p.ID); !ok || o.Outcome != probes.Reached {
				out = append(out, fmt.Sprintf("positive control %s at %s failed (%s): the verdicts resting on it are inconclusive", p.ID, place, reportOf(o, ok)))
			}
		}
	}
	return out
}
