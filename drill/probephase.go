package drill

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/vishvananda/netns"

	"github.com/box-isolation/box/drill/topo"
	"github.com/box-isolation/box/probes"
	"github.com/box-isolation/box/stack/guard"
	"github.com/box-isolation/box/stack/hostns"
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
	guardBefore := guardCounts(r.cfg.Host.NetNS)
	t0 := time.Now()
	plans := r.sc.Plans
	var apart []map[Place]*probes.Plan
	for _, c := range r.cfg.Claims {
		if c.apart != nil {
			var a map[Place]*probes.Plan
			plans, a = c.apart(plans)
			apart = append(apart, a)
		}
	}
	var late time.Duration
	r.obs, r.agentErr, late, rep.Summary.Agents = runPlans(ctx, r.cfg, r.boxClient, r.names, plans)
	rep.Summary.AgentsLateMS = late.Milliseconds()
	// What a claim needs run apart, one box at a time, after the rest.
	for _, a := range apart {
		for _, place := range slices.Sorted(maps.Keys(a)) {
			obs, errs, _, _ := runPlans(ctx, r.cfg, r.boxClient, r.names, map[Place]*probes.Plan{place: a[place]})
			r.obs.merge(obs)
			for p, e := range errs {
				r.agentErr[p] = strings.TrimPrefix(r.agentErr[p]+"; ", "; ") + e
			}
		}
	}
	for _, stop := range stops {
		stop()
	}
	rep.Summary.ProbePhaseMS = time.Since(t0).Milliseconds()
	rep.Stack.GuardCounted = countedSince(guardBefore, guardCounts(r.cfg.Host.NetNS))
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
	for _, a := range rep.Summary.Agents {
		if a.SlackMS < 0 {
			rep.Problems = append(rep.Problems, fmt.Sprintf("agent at %s armed %d ms after the agreed start (arming took %d ms of the %s lead): it started that late, and what its controls and witnesses missed for it is inconclusive, never passed", a.Place, -a.SlackMS, a.ArmingMS, agentLead))
		}
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

// guardCounts reads the guard's counters in the host's namespace (nil
// where it is not attached or they cannot be read: the report then has
// none).
func guardCounts(netns string) map[string]map[string]uint64 {
	g, err := hostns.Open(netns)
	if err != nil {
		return nil
	}
	defer g.Close()
	hooks, err := guard.Hooks(g)
	if err != nil {
		return nil
	}
	out := map[string]map[string]uint64{}
	for name, h := range hooks {
		out[name] = h.Counters
	}
	return out
}

// countedSince is what each counter gained from before to after (a hook
// attached since counts from zero; one gone since counts nothing; a
// counter that gained nothing is left out).
func countedSince(before, after map[string]map[string]uint64) map[string]map[string]uint64 {
	if len(after) == 0 {
		return nil
	}
	out := map[string]map[string]uint64{}
	for hook, reasons := range after {
		out[hook] = map[string]uint64{}
		for reason, n := range reasons {
			if was := before[hook][reason]; n > was {
				out[hook][reason] = n - was
			}
		}
	}
	return out
}
