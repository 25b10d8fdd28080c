package daemon

import (
	"context"
	"fmt"
	"io"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/nftables"

	"github.com/box-isolation/box/stack"
	"github.com/box-isolation/box/stack/guard"
	"github.com/box-isolation/box/stack/hostns"
	"github.com/box-isolation/box/stack/model"
	"github.com/box-isolation/box/stack/nft"
)

// The healer. Another tool's `flush ruleset` (Debian's nftables.service,
// ufw, firewalld, Docker) removes box's tables and Incus's, and nothing puts
// them back until a box command runs. The healer runs beside the port
// watcher: it listens to nftables' own netlink events in the host's
// namespace and, when a table box needs changes or goes, puts box's back at
// once from what the kernel and its memory hold (no Incus call), then has
// Incus rewrite inet incus (ReapplyIncusFirewall) and converges the rest
// (fresh pins, the egress table) as Ensure's firewall step does.
// docs/heal.md has the measurements.

// How the healer paces itself.
const (
	// healDebounce coalesces a burst (a flush is one transaction, another
	// firewall's restart a few within milliseconds); the first event after
	// a quiet period is never delayed.
	healDebounce = 10 * time.Millisecond
	// healResync checks whatever was heard: a lost event (the monitor's
	// socket overflowed) is caught here at the latest.
	healResync = 30 * time.Second
	// healRetry is how soon a failed heal is tried again.
	healRetry = time.Second
	// healRemember is how often the healer looks whether to read again
	// from Incus what it puts back without asking (the fleet's addresses
	// for the pins): when the bridge's ports changed since its last
	// reading (a box minted since is pinned at once after a flush), or
	// healResync after it.
	healRemember = 5 * time.Second
)

// Run is the daemon, what `box guard-and-serve` (its unit) runs:
// WatchPorts with the healer beside it. WatchPorts alone is for a watcher
// that must leave the tables as they are, such as the drill's while its
// mutations hold a layer out on purpose. takeOver is how long it waits for
// a daemon already serving the namespace to stop (the unit's old name
// during an upgrade) before it refuses.
func Run(ctx context.Context, host *stack.Host, log io.Writer, takeOver time.Duration) error {
	o := defaultWatchOptions()
	o.heal = true
	o.takeOver = takeOver
	return watchPorts(ctx, host, log, o)
}

type healer struct {
	host *stack.Host
	g    *hostns.NS // the event loop's; the Incus worker has its own
	logf func(string, ...any)

	caps   nft.Capabilities
	probed bool

	// mu guards fleet and desired: what Incus last said (the pins'
	// addresses, the network's config), read by the Incus worker and used,
	// as remembered, on the critical path.
	mu      sync.Mutex
	fleet   *stack.Fleet
	desired *model.Desired

	pending []string // what was heard since the last check
	since   time.Time
	quiet   string // the last "nothing to heal" reason, said once

	// incus wakes the Incus worker: asking Incus takes the better part of
	// a second, and the event loop must never wait behind it.
	incus chan incusJob
	// incusStuck is set when Incus's rewrite left a chain out (worker only).
	incusStuck bool
	// guardUnsupported is set once the kernel refused the guard (said once).
	guardUnsupported bool
}

// incusJob is what the event loop hands the Incus worker after a check.
type incusJob struct {
	gw       netip.Addr
	causes   []string
	since    time.Time
	boxFixed bool // the check put some of box's tables back
}

// healLoop runs the healer until ctx ends. Failures are logged and
// retried; it never ends the watcher.
func healLoop(ctx context.Context, host *stack.Host, logf func(string, ...any), st *status) {
	g, err := host.OpenNS()
	if err != nil {
		st.set(serviceHealer, false, err.Error())
		logf("heal: not healing: %v", err)
		return
	}
	defer g.Close()
	h := &healer{host: host, g: g, logf: logf, incus: make(chan incusJob, 1)}
	st.set(serviceHealer, true, "")
	done := make(chan struct{})
	go func() {
		defer close(done)
		h.incusWorker(ctx)
	}()
	h.run(ctx)
	<-done
}

func (h *healer) run(ctx context.Context) {
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	armed := false
	arm := func(d time.Duration) {
		if !armed {
			timer.Reset(d)
			armed = true
		}
	}
	resync := time.NewTicker(healResync)
	defer resync.Stop()
	resubscribe := time.NewTimer(0)
	defer resubscribe.Stop()

	tc := make(chan string, 1)
	go h.watchTC(ctx, tc)
	var lastCheck time.Time
	failed := 0 // checks failed in a row
	var mon *nftables.Monitor
	var events chan *nftables.MonitorEvents
	defer func() {
		if mon != nil {
			_ = mon.Close()
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return
		case <-resubscribe.C:
			m, ch, err := h.subscribe()
			if err != nil {
				h.logf("heal: subscribing to nftables events failed: %v; trying again in %s", err, healRetry)
				resubscribe.Reset(healRetry)
				continue
			}
			mon, events = m, ch
			h.hear("watcher started")
			arm(0)
		case evs, ok := <-events:
			if !ok || (evs.GeneratedBy != nil && evs.GeneratedBy.Type == nftables.MonitorEventTypeOOB) {
				why := "closed"
				if ok && evs.GeneratedBy.Error != nil {
					why = evs.GeneratedBy.Error.Error()
				}
				h.logf("heal: the nftables event subscription ended (%s); subscribing again and checking", why)
				_ = mon.Close()
				mon, events = nil, nil
				resubscribe.Reset(100 * time.Millisecond)
				continue
			}
			if what, ok := classifyNft(evs, ownThread, h.watched); ok {
				h.hear(what)
				// The first event after a quiet period is answered at once;
				// a burst waits out the rest of the window.
				arm(max(0, healDebounce-time.Since(lastCheck)))
			}
		case what := <-tc:
			h.hear(what)
			arm(max(0, healDebounce-time.Since(lastCheck)))
		case <-resync.C:
			h.hear("resync")
			arm(0)
		case <-timer.C:
			armed = false
			lastCheck = time.Now()
			err := h.check(ctx)
			switch {
			case err == nil || ctx.Err() != nil:
				failed = 0
			case failed == 0:
				// Often a read that met another tool's change half way
				// (a table listed, then gone): tried again at once.
				failed++
				h.hear("retry")
				arm(healDebounce)
			default:
				failed++
				h.logf("heal: %v; trying again in %s", err, healRetry)
				h.hear("retry")
				arm(healRetry)
			}
		}
	}
}

func (h *healer) hear(what string) {
	if len(h.pending) == 0 {
		h.since = time.Now()
	}
	if !slices.Contains(h.pending, what) {
		h.pending = append(h.pending, what)
	}
}

// subscribe joins nftables' multicast group in the host's namespace. The
// monitor must take every message type: the library only hands out a
// transaction's changes with its closing NEWGEN message (who made it).
func (h *healer) subscribe() (*nftables.Monitor, chan *nftables.MonitorEvents, error) {
	var opts []nftables.ConnOption
	if fd := h.g.NFTConfig(model.Current).NetNS; fd > 0 {
		opts = append(opts, nftables.WithNetNSFd(fd))
	}
	c, err := nftables.New(opts...)
	if err != nil {
		return nil, nil, err
	}
	m := nftables.NewMonitor(nftables.WithMonitorEventBuffer(64))
	ch, err := c.AddGenerationalMonitor(m)
	if err != nil {
		return nil, nil, err
	}
	return m, ch, nil
}

// watched says whether a table is one the healer keeps: box's (the host
// firewall, the bridge drop, the pins, the egress sets) and Incus's.
func (h *healer) watched(fam nftables.TableFamily, name string) bool {
	cfg := h.g.NFTConfig(model.Current)
	switch fam {
	case nftables.TableFamilyINet:
		return name == cfg.Table || name == cfg.EgressTable() || name == cfg.RouteTable() || name == nft.IncusTable
	case nftables.TableFamilyBridge:
		return name == cfg.Table || name == cfg.PinTable()
	}
	return false
}

// classifyNft says what one nftables transaction did to the watched tables,
// and who did it, or false when it touched none of them or was the
// healer's own. Set elements are left out: box's own refreshes change them
// all the time, and the resync catches another tool's.
func classifyNft(evs *nftables.MonitorEvents, mine func(uint32) bool, watched func(nftables.TableFamily, string) bool) (string, bool) {
	who := "an unknown process"
	if evs.GeneratedBy != nil {
		if gm, ok := evs.GeneratedBy.Data.(*nftables.GenMsg); ok && gm != nil {
			if mine(gm.ProcPID) {
				return "", false
			}
			who = fmt.Sprintf("%s (pid %d)", gm.ProcComm, gm.ProcPID)
		}
	}
	var what []string
	add := func(s string) {
		if !slices.Contains(what, s) {
			what = append(what, s)
		}
	}
	for _, ev := range evs.Changes {
		var t *nftables.Table
		var obj string
		switch d := ev.Data.(type) {
		case *nftables.Table:
			t, obj = d, "table"
		case *nftables.Chain:
			t, obj = d.Table, "chain "+d.Name
		case *nftables.Rule:
			t, obj = d.Table, "rules"
			if d.Chain != nil {
				obj = "rules of chain " + d.Chain.Name
			}
		case *nftables.Set:
			t, obj = d.Table, "set "+d.Name
		}
		if t == nil || !watched(t.Family, t.Name) {
			continue
		}
		verb := "changed"
		switch ev.Type {
		case nftables.MonitorEventTypeDelTable, nftables.MonitorEventTypeDelChain, nftables.MonitorEventTypeDelSet:
			verb = "deleted"
		case nftables.MonitorEventTypeNewTable, nftables.MonitorEventTypeNewChain, nftables.MonitorEventTypeNewSet:
			verb = "added"
		}
		if obj == "table" {
			add(fmt.Sprintf("table %s %s %s", familyWord(t.Family), t.Name, verb))
		} else {
			add(fmt.Sprintf("%s %s: %s %s", familyWord(t.Family), t.Name, obj, verb))
		}
	}
	if len(what) == 0 {
		return "", false
	}
	const most = 6
	if len(what) > most {
		what = append(what[:most], fmt.Sprintf("and %d more", len(what)-most))
	}
	return strings.Join(what, ", ") + " by " + who, true
}

// ownThread says whether a transaction's author is a thread of this
// process: the kernel names the writing task's thread id, not its
// process's, and a Go program writes from any of its threads.
func ownThread(tid uint32) bool {
	_, err := os.Stat(fmt.Sprintf("/proc/self/task/%d", tid))
	return err == nil
}

func familyWord(f nftables.TableFamily) string {
	switch f {
	case nftables.TableFamilyINet:
		return "inet"
	case nftables.TableFamilyBridge:
		return "bridge"
	case nftables.TableFamilyIPv4:
		return "ip"
	case nftables.TableFamilyIPv6:
		return "ip6"
	}
	return fmt.Sprintf("family-%d", f)
}

// gateway reads the bridge's own IPv4 address from the kernel: the host
// firewall's only address a box may reach, known without Incus.
func (h *healer) gateway() (netip.Addr, bool, error) { return gatewayOf(h.g) }

func gatewayOf(g *hostns.NS) (netip.Addr, bool, error) {
	p, ok, err := g.IPv4Prefix(model.Current.Network)
	return p.Addr(), ok, err
}

// check looks at the kernel and puts box's tables back (the critical
// path: no Incus call), then hands Incus's table and the rest to the
// Incus worker.
func (h *healer) check(ctx context.Context) error {
	causes, since := h.pending, h.since
	h.pending = nil
	idle := func(why string) error {
		if why != h.quiet {
			h.logf("heal: not healing: %s", why)
			h.quiet = why
		}
		return nil
	}
	if pid := hostns.TearingDown(h.g.Inode); pid != 0 {
		return idle(fmt.Sprintf("box teardown-host (pid %d) is removing the stack", pid))
	}
	if holder, held := h.host.Lock.Held(h.host.NetNS); held {
		// setup-host or doctor --fix is converging the stack: what it
		// removes on the way (a rollback) is not for the healer to put back.
		return idle("the setup lock is held by " + holder)
	}
	gw, ok, err := h.gateway()
	if err != nil {
		return err
	}
	if !ok {
		return idle(fmt.Sprintf("no bridge %s with an IPv4 address here: the stack is not set up (box setup-host sets it up)", model.Current.Network))
	}
	h.quiet = ""
	cfg := h.g.NFTConfig(model.Current)
	cfg.Gateway = gw
	if !h.probed {
		if h.caps, err = nft.Probe(cfg); err != nil {
			return fmt.Errorf("probing nftables: %w", err)
		}
		h.probed = true
	}
	h.mu.Lock()
	f := h.fleet
	h.mu.Unlock()

	// The ports are listed under the lock: a list read before waiting for
	// it (behind a box command's refresh) would put a port that left since
	// back in the set, or drop one that joined.
	unlock, err := hostns.LockPorts(ctx)
	if err != nil {
		return err
	}
	ports, err := h.g.BridgePorts(model.Current.Network)
	if err != nil {
		unlock()
		return err
	}
	names := hostns.PortNames(ports)
	applied, err := nft.Apply(cfg, h.caps, names)
	// The pins' contents are the port watcher's to keep (the remembered
	// fleet may be a box behind): put back only a pin table that is gone.
	var pinsThere bool
	if err == nil && f != nil {
		pinsThere, err = nft.PinsPresent(cfg)
	}
	if err == nil && f != nil && !pinsThere {
		plan := f.PlanPins(names)
		var pinned []string
		pinned, err = nft.ApplyPins(cfg, h.caps, plan.Scope, plan.Pins)
		applied = append(applied, pinned...)
	}
	if err == nil {
		// L-ROUTE from the kernel's routes alone.
		var rt nft.Route
		if rt, err = h.g.RouteView(model.Current.Network); err == nil {
			var routed []string
			routed, err = rt.Apply(cfg)
			applied = append(applied, routed...)
		}
	}
	if err == nil {
		// L-GUARD: in tc, which a flush leaves alone, but another tool may
		// delete the qdisc, and the bridge may be new (at boot).
		var guarded []model.Change
		var notes []string
		guarded, notes, err = guard.EnsureNoted(h.g)
		for _, c := range guarded {
			applied = append(applied, c.Object+" "+c.Action+": "+c.Detail)
		}
		if len(notes) > 0 && !h.guardUnsupported {
			h.logf("heal: %s", strings.Join(notes, "; "))
		}
		h.guardUnsupported = len(notes) > 0
	}
	unlock()
	if err != nil {
		return fmt.Errorf("putting box's tables back: %w", err)
	}
	if len(applied) > 0 {
		msg := fmt.Sprintf("heal: after %s: put back %s", strings.Join(causes, "; "), strings.Join(applied, "; "))
		if !since.IsZero() {
			msg += fmt.Sprintf(" (%s after the first event)", time.Since(since).Round(time.Millisecond))
		}
		h.logf("%s", msg)
	}
	job := incusJob{gw: gw, causes: causes, since: since, boxFixed: len(applied) > 0}
	select {
	case h.incus <- job:
	default:
		// The worker has a job waiting: fold this one into it.
		select {
		case old := <-h.incus:
			job.boxFixed = job.boxFixed || old.boxFixed
			job.causes = append(old.causes, job.causes...)
			if !old.since.IsZero() {
				job.since = old.since
			}
		default:
		}
		select {
		case h.incus <- job:
		default:
		}
	}
	return nil
}

// incusWorker answers the event loop's checks with what needs Incus: it
// has Incus rewrite inet incus when a chain the stack needs is missing,
// converges the rest as Ensure's firewall step does (fresh pins, the
// egress table) after any heal, and keeps the memory the critical path
// uses fresh (every healRemember).
func (h *healer) incusWorker(ctx context.Context) {
	g, err := h.host.OpenNS()
	if err != nil {
		h.logf("heal: not asking Incus: %v", err)
		return
	}
	defer g.Close()
	memory := time.NewTicker(healRemember)
	defer memory.Stop()
	remembered, rememberedAt := "", time.Time{} // the ports when the memory was read, and when
	for {
		select {
		case <-ctx.Done():
			return
		case <-memory.C:
			// Beside a full bridge a reading of the fleet takes incusd a
			// few hundred milliseconds: read again when the bridge's ports
			// changed (a box started or went), else every healResync.
			ports := bridgePortNames(g)
			if ports == remembered && time.Since(rememberedAt) < healResync {
				continue
			}
			if gw, ok, err := gatewayOf(g); err == nil && ok {
				if err := h.remember(ctx, gw); err != nil && ctx.Err() == nil {
					h.logf("heal: reading what to put back from Incus: %v", err)
				} else if err == nil {
					remembered, rememberedAt = ports, time.Now()
				}
			}
		case job := <-h.incus:
			if err := h.incusStep(ctx, g, job); err != nil && ctx.Err() == nil {
				h.logf("heal: %v", err)
			}
		}
	}
}

func (h *healer) incusStep(ctx context.Context, g *hostns.NS, job incusJob) error {
	h.mu.Lock()
	d := h.desired
	h.mu.Unlock()
	// Incus's rules not in nftables (its xtables driver): only box's are
	// healed here.
	useNft, _, err := stack.IncusUsesNft(ctx, h.host.Incus)
	if err != nil {
		return err
	}
	if d == nil {
		if err := h.remember(ctx, job.gw); err != nil {
			return fmt.Errorf("reading what to put back from Incus: %w", err)
		}
		h.mu.Lock()
		d = h.desired
		h.mu.Unlock()
	}
	cfg := g.NFTConfig(model.Current)
	chains, present, err := nft.IncusChains(cfg)
	if err != nil {
		return err
	}
	// What Incus writes follows boxnet's live config: with the ACL detached
	// or NAT off (an admin, a drill mutation) no rewrite brings those
	// chains, and asking again at every resync would only restart dnsmasq.
	// That drift is Verify's to name.
	live := *d
	if n, _, nerr := h.host.Incus.Networks().Get(ctx, model.Current.Network); nerr == nil {
		live.Network.Config = n.Config
	}
	var did []string
	missing := stack.IncusChainFindings(live, chains, present)
	switch {
	case !useNft || len(missing) == 0:
		h.incusStuck = false
	case h.incusStuck && !slices.Contains(job.causes, "resync"):
		// Incus writes through nft processes of its own, so its rewrite
		// cannot be told from another tool's by who: a rewrite that left
		// a chain out is asked for again at the resync only.
	default:
		detail, err := stack.ReapplyIncusFirewall(ctx, h.host.Incus)
		if err != nil {
			return err
		}
		did = append(did, detail)
		msg := "heal: " + detail
		if !job.since.IsZero() {
			msg += fmt.Sprintf(" (%s after the first event)", time.Since(job.since).Round(time.Millisecond))
		}
		h.logf("%s", msg)
		chains, present, err := nft.IncusChains(cfg)
		if err != nil {
			return err
		}
		if still := stack.IncusChainFindings(*d, chains, present); len(still) > 0 {
			h.incusStuck = true
			h.logf("heal: Incus set %s up again, but %s is still missing; asking again at the next resync (%s): read incusd's log", model.Current.Network, still[0].Object, healResync)
		}
	}
	if len(did) == 0 && !job.boxFixed {
		return nil
	}
	rest, err := h.host.ApplyFirewall(ctx, g, job.gw)
	var more []string
	for _, c := range rest.Changes {
		more = append(more, c.String())
	}
	if len(more) > 0 {
		h.logf("heal: then, fresh from Incus: %s", strings.Join(more, "; "))
	}
	if err != nil {
		return fmt.Errorf("converging the firewall after the heal: %w", err)
	}
	return h.remember(ctx, job.gw)
}

// remember reads from Incus what the critical path needs: the fleet (for
// the pins) and the network's desired config (for Incus's chains).
func (h *healer) remember(ctx context.Context, gw netip.Addr) error {
	f, err := h.host.ReadFleet(ctx)
	if err != nil {
		return fmt.Errorf("reading the fleet: %w", err)
	}
	n, _, err := h.host.Incus.Networks().Get(ctx, model.Current.Network)
	if err != nil {
		return err
	}
	p, err := netip.ParsePrefix(n.Config["ipv4.address"])
	if err != nil {
		return fmt.Errorf("network %s has ipv4.address=%q", model.Current.Network, n.Config["ipv4.address"])
	}
	opts, err := h.host.Options.With(n.Config)
	if err != nil {
		return err
	}
	d := model.BuildDesired(p.Masked(), opts)
	h.mu.Lock()
	h.fleet, h.desired = &f, &d
	h.mu.Unlock()
	return nil
}

// bridgePortNames names the bridge's ports, sorted, as one string ("" when
// they cannot be read: never equal to a reading that worked).
func bridgePortNames(g *hostns.NS) string {
	ports, err := g.BridgePorts(model.Current.Network)
	if err != nil {
		return ""
	}
	names := hostns.PortNames(ports)
	slices.Sort(names)
	return "ports: " + strings.Join(names, " ")
}
