package guard

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"

	"github.com/box-isolation/box/stack/hostns"
	"github.com/box-isolation/box/stack/model"
	"github.com/box-isolation/box/stack/nft"
)

// The layer: box's eBPF programs on the bridge's clsact
// ingress and on the egress of the interfaces the default routes leave
// by. No nft command touches them, so they hold what L-HOSTFW, L-ACL and
// L-ROUTE hold while another tool's `flush ruleset` has those gone and no
// watcher is there to put them back. Ensure attaches them where the
// kernel does not have box's own build (setup-host, doctor --fix, the
// boot unit once the bridge exists, the healer on every check), Verify
// compares what the kernel lists with that build, Teardown takes them
// off. A kernel that will not load them (no BPF, no clsact) gets the
// stack without them and a note that says so.

// guardBuild is box's build of both programs for one bridge address, and
// the tags the kernel gives them.
type guardBuild struct {
	bridge, uplink       *Program
	bridgeTag, uplinkTag string
}

// guardBuilds caches the builds by the bridge's address (loading a
// program to read its tag takes a few milliseconds, and the healer checks
// often).
var guardBuilds sync.Map // netip.Prefix -> guardBuild

// UnsupportedError is a kernel that would not load the guard: the
// stack holds without it, and says so.
type UnsupportedError struct{ Err error }

func (e *UnsupportedError) Error() string {
	return fmt.Sprintf("%s is absent: this kernel would not load box's eBPF program (%v); the nft layers hold alone, and another tool's `nft flush ruleset` opens the host until box's watcher puts them back", model.LayerGuard, e.Err)
}

func (e *UnsupportedError) Unwrap() error { return e.Err }

// buildGuard is box's build for the bridge's address p (the gateway with
// the subnet's length).
func buildGuard(p netip.Prefix) (guardBuild, error) {
	if b, ok := guardBuilds.Load(p); ok {
		return b.(guardBuild), nil
	}
	var b guardBuild
	var err error
	if b.bridge, err = Build(Config{Subnet: p.Masked(), Gateway: p.Addr(), Resolver: nft.EgressDNSAddr}); err != nil {
		return b, err
	}
	if b.uplink, err = BuildUplink(p.Masked()); err != nil {
		return b, err
	}
	if b.bridgeTag, err = b.bridge.KernelTag(); err != nil {
		return b, &UnsupportedError{Err: err}
	}
	if b.uplinkTag, err = b.uplink.KernelTag(); err != nil {
		return b, &UnsupportedError{Err: err}
	}
	guardBuilds.Store(p, b)
	return b, nil
}

// bridgePrefix is the bridge's own IPv4 address with its subnet's length,
// as the kernel has it; false when there is no such bridge or address.
func bridgePrefix(g *hostns.NS, bridge string) (netip.Prefix, bool, error) {
	addrs, err := g.LinkAddrs(bridge, netlink.FAMILY_V4)
	if err != nil {
		return netip.Prefix{}, false, err
	}
	for _, a := range addrs {
		if p, ok := hostns.PrefixOf(a.IPNet); ok && p.Addr().Is4() {
			return p, true, nil
		}
	}
	return netip.Prefix{}, false, nil
}

// guardPlace is one hook the guard belongs on.
type guardPlace struct {
	link, hook, name, tag string
	prog                  *Program
}

// guardPlaces are where box's build belongs: the bridge's ingress and
// each uplink's egress.
func guardPlaces(b guardBuild, bridge string, uplinks []string) []guardPlace {
	out := []guardPlace{{bridge, Ingress, ProgramName, b.bridgeTag, b.bridge}}
	for _, u := range uplinks {
		out = append(out, guardPlace{u, Egress, UplinkProgramName, b.uplinkTag, b.uplink})
	}
	return out
}

// guardProblem says what is wrong with the guard at place, as the kernel
// lists it ("" when box's build is there, and only it).
func guardProblem(found []Attached, pl guardPlace) string {
	var on []Attached
	for _, a := range found {
		if a.Hook == pl.hook {
			on = append(on, a)
		}
	}
	switch {
	case len(on) == 0:
		return "no guard attached"
	case len(on) > 1:
		return fmt.Sprintf("%d guard filters attached, not one", len(on))
	case on[0].Name != pl.name:
		return fmt.Sprintf("program %s attached, not %s", on[0].Name, pl.name)
	case !on[0].DirectAction:
		return "attached without direct action: its verdicts are not final"
	case on[0].Tag != pl.tag:
		return fmt.Sprintf("program id %d with tag %s attached, not box's build for this bridge (tag %s)", on[0].ID, on[0].Tag, pl.tag)
	}
	return ""
}

// Ensure attaches box's build of the guard wherever the kernel does
// not have it (the bridge's ingress, each uplink's egress) and takes the
// uplinks' program off links no default route leaves by any more. No
// bridge, or no address on it yet, is nothing to do. A kernel that will
// not load the programs is a *UnsupportedError.
func Ensure(g *hostns.NS) ([]model.Change, error) {
	bridge := model.Current.Network
	p, ok, err := bridgePrefix(g, bridge)
	if err != nil || !ok {
		return nil, err
	}
	b, err := buildGuard(p)
	if err != nil {
		return nil, err
	}
	rt, err := g.RouteView(bridge)
	if err != nil {
		return nil, fmt.Errorf("reading the routes for %s: %w", model.LayerGuard, err)
	}
	var changes []model.Change
	for _, pl := range guardPlaces(b, bridge, rt.Uplinks) {
		found, err := Find(g.Netlink, pl.link)
		if err != nil {
			return changes, err
		}
		problem := guardProblem(found, pl)
		if problem == "" {
			continue
		}
		a, err := Attach(g.Netlink, pl.link, pl.prog)
		if err != nil {
			return changes, err
		}
		changes = append(changes, model.Change{Object: "guard " + pl.link + " " + pl.hook, Action: "updated",
			Detail: fmt.Sprintf("attached %s (program id %d, tag %s; was: %s)", pl.name, a.ID, a.Tag, problem)})
	}
	stale, err := staleUplinkGuards(g, bridge, rt.Uplinks)
	if err != nil {
		return changes, err
	}
	for _, link := range stale {
		if err := Detach(g.Netlink, link); err != nil {
			return changes, err
		}
		changes = append(changes, model.Change{Object: "guard " + link + " " + Egress, Action: "removed", Detail: "no default route leaves by it any more"})
	}
	return changes, nil
}

// EnsureNoted is Ensure for a converge: a kernel that will not
// load the guard is a warning among the notes, not a failure.
func EnsureNoted(g *hostns.NS) ([]model.Change, []string, error) {
	changes, err := Ensure(g)
	var unsupported *UnsupportedError
	if errors.As(err, &unsupported) {
		return changes, []string{"WARNING: " + unsupported.Error()}, nil
	}
	return changes, nil, err
}

// staleUplinkGuards are the links besides the bridge and the uplinks
// that carry a guard: links of their own (no master), where an uplink's
// program is left from a default route that moved.
func staleUplinkGuards(g *hostns.NS, bridge string, uplinks []string) ([]string, error) {
	links, err := g.Links()
	if err != nil {
		return nil, fmt.Errorf("listing links: %w", err)
	}
	var out []string
	for _, l := range links {
		name := l.Attrs().Name
		if l.Attrs().MasterIndex != 0 || name == bridge || slices.Contains(uplinks, name) {
			continue
		}
		found, err := Find(g.Netlink, name)
		if err != nil {
			var nf netlink.LinkNotFoundError
			if errors.As(err, &nf) {
				continue // gone since the list
			}
			return nil, err
		}
		if len(found) > 0 {
			out = append(out, name)
		}
	}
	return out, nil
}

// Verify compares what the kernel has attached with box's build:
// a finding for each hook without it. A kernel that will not load it is
// no finding (nothing box can converge there) but absent, saying why:
// the nft layers hold alone, and doctor and the drill say so.
func Verify(g *hostns.NS, p netip.Prefix) (findings []model.Finding, absent string, err error) {
	bridge := model.Current.Network
	b, err := buildGuard(p)
	var unsupported *UnsupportedError
	if errors.As(err, &unsupported) {
		return nil, unsupported.Error(), nil
	}
	if err != nil {
		return nil, "", err
	}
	rt, err := g.RouteView(bridge)
	if err != nil {
		return nil, "", fmt.Errorf("reading the routes for %s: %w", model.LayerGuard, err)
	}
	for _, pl := range guardPlaces(b, bridge, rt.Uplinks) {
		found, err := Find(g.Netlink, pl.link)
		if err != nil {
			return nil, "", err
		}
		if problem := guardProblem(found, pl); problem != "" {
			findings = append(findings, model.Finding{Layer: model.LayerGuard, Object: "guard " + pl.link + " " + pl.hook, Problem: problem, Fix: model.FixEnsure})
		}
	}
	return findings, "", nil
}

// attachedHooks calls fn for each guard program attached to the bridge
// or an uplink, with its hook's name ("boxnet ingress").
func attachedHooks(g *hostns.NS, fn func(hook string, a Attached) error) error {
	bridge := model.Current.Network
	rt, err := g.RouteView(bridge)
	if err != nil {
		return err
	}
	for _, link := range append([]string{bridge}, rt.Uplinks...) {
		found, err := Find(g.Netlink, link)
		if err != nil {
			return err
		}
		for _, a := range found {
			if err := fn(link+" "+a.Hook, a); err != nil {
				return err
			}
		}
	}
	return nil
}

// HookCounters are the guard's per-reason counts on each hook it is
// attached to ("boxnet ingress" -> reason -> packets; reasons that counted
// nothing left out), for doctor and the drill's report.
func HookCounters(g *hostns.NS) (map[string]map[string]uint64, error) {
	out := map[string]map[string]uint64{}
	err := attachedHooks(g, func(hook string, a Attached) error {
		c, err := Counters(a.ID)
		if err != nil {
			return err
		}
		m := map[string]uint64{} // the reasons that counted something
		for r, n := range c {
			if n > 0 {
				m[r.String()] = n
			}
		}
		out[hook] = m
		return nil
	})
	return out, err
}

// HookLoadTimes are when the kernel loaded the program attached to each
// hook, as time since the host's boot (the kernel's boot-time clock,
// which /proc/PID/stat's start times count in too): box attaches a
// program within milliseconds of loading it, so this says whether the
// guard was in place before a process (a box's first) began.
func HookLoadTimes(g *hostns.NS) (map[string]time.Duration, error) {
	out := map[string]time.Duration{}
	err := attachedHooks(g, func(hook string, a Attached) error {
		prog, err := ebpf.NewProgramFromID(ebpf.ProgramID(a.ID))
		if err != nil {
			return fmt.Errorf("opening the guard program %d: %w", a.ID, err)
		}
		defer prog.Close()
		info, err := prog.Info()
		if err != nil {
			return fmt.Errorf("reading the guard program %d: %w", a.ID, err)
		}
		if t, ok := info.LoadTime(); ok {
			out[hook] = t
		}
		return nil
	})
	return out, err
}

// Remove takes the guard off the bridge and every link that carries
// one (teardown; the drill's guard mutation).
func Remove(g *hostns.NS) ([]model.Change, error) {
	links, err := g.Links()
	if err != nil {
		return nil, fmt.Errorf("listing links: %w", err)
	}
	var changes []model.Change
	var errs []error
	for _, l := range links {
		name := l.Attrs().Name
		if l.Attrs().MasterIndex != 0 {
			continue
		}
		found, err := Find(g.Netlink, name)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if len(found) == 0 {
			continue
		}
		if err := Detach(g.Netlink, name); err != nil {
			errs = append(errs, err)
			continue
		}
		for _, a := range found {
			changes = append(changes, model.Change{Object: "guard " + name + " " + a.Hook, Action: "removed"})
		}
	}
	return changes, errors.Join(errs...)
}
