package guard

import (
	"errors"
	"fmt"
	"maps"
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
	p, ok, err := g.IPv4Prefix(bridge)
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

// guardedLinks are the links of their own (no master: a box's port
// never carries the guard) that carry a guard, with what is attached
// there; a link gone since the list is left out.
func guardedLinks(g *hostns.NS) (map[string][]Attached, error) {
	links, err := g.Links()
	if err != nil {
		return nil, fmt.Errorf("listing links: %w", err)
	}
	out := map[string][]Attached{}
	for _, l := range links {
		if l.Attrs().MasterIndex != 0 {
			continue
		}
		found, err := Find(g.Netlink, l.Attrs().Name)
		var nf netlink.LinkNotFoundError
		switch {
		case errors.As(err, &nf):
			continue
		case err != nil:
			return nil, err
		case len(found) > 0:
			out[l.Attrs().Name] = found
		}
	}
	return out, nil
}

// staleUplinkGuards are the links besides the bridge and the uplinks
// that carry a guard: where an uplink's program is left from a default
// route that moved.
func staleUplinkGuards(g *hostns.NS, bridge string, uplinks []string) ([]string, error) {
	guarded, err := guardedLinks(g)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, name := range slices.Sorted(maps.Keys(guarded)) {
		if name != bridge && !slices.Contains(uplinks, name) {
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

// Hook is what the kernel has of the guard on one hook.
type Hook struct {
	// Counters are the per-reason counts (reason -> packets; reasons that
	// counted nothing left out).
	Counters map[string]uint64
	// Loaded is when the kernel loaded the program, as time since the
	// host's boot (the boot-time clock, which /proc/PID/stat's start times
	// count in too): box attaches a program within milliseconds of loading
	// it, so this says whether the guard was in place before a process (a
	// box's first) began.
	Loaded time.Duration
}

// Hooks reads the guard on each hook it is attached to ("boxnet ingress"
// -> what the kernel has there), for doctor and the drill's report.
func Hooks(g *hostns.NS) (map[string]Hook, error) {
	out := map[string]Hook{}
	err := attachedHooks(g, func(hook string, a Attached) error {
		c, err := Counters(a.ID)
		if err != nil {
			return err
		}
		h := Hook{Counters: map[string]uint64{}}
		for r, n := range c {
			if n > 0 {
				h.Counters[r.String()] = n
			}
		}
		prog, err := ebpf.NewProgramFromID(ebpf.ProgramID(a.ID))
		if err != nil {
			return fmt.Errorf("opening the guard program %d: %w", a.ID, err)
		}
		defer prog.Close()
		info, err := prog.Info()
		if err != nil {
			return fmt.Errorf("reading the guard program %d: %w", a.ID, err)
		}
		h.Loaded, _ = info.LoadTime()
		out[hook] = h
		return nil
	})
	return out, err
}

// Remove takes the guard off the bridge and every link that carries
// one (teardown; the drill's guard mutation).
func Remove(g *hostns.NS) ([]model.Change, error) {
	guarded, err := guardedLinks(g)
	if err != nil {
		return nil, err
	}
	var changes []model.Change
	var errs []error
	for _, name := range slices.Sorted(maps.Keys(guarded)) {
		if err := Detach(g.Netlink, name); err != nil {
			errs = append(errs, err)
			continue
		}
		for _, a := range guarded[name] {
			changes = append(changes, model.Change{Object: "guard " + name + " " + a.Hook, Action: "removed"})
		}
	}
	return changes, errors.Join(errs...)
}
