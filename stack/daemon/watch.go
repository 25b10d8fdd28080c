package daemon

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/box-isolation/box/internal/sdnotify"
	"github.com/box-isolation/box/stack"
	"github.com/box-isolation/box/stack/bootunits"
	"github.com/box-isolation/box/stack/egress"
	"github.com/box-isolation/box/stack/hostns"
	"github.com/box-isolation/box/stack/model"
	"github.com/box-isolation/box/stack/nft"
)

// The port watcher. Where the kernel has no nft bridge meta, the bridge drop
// matches a set of the bridge's port names, and a port Incus plugs in on its
// own (a box that restarts itself, a NIC replugged) is outside that set, and
// not isolated, until something refreshes it. WatchPorts closes that window:
// it refreshes on the kernel's link events, on changes to dnsmasq's lease
// file and on a periodic resync, and each time it calls RefreshPorts, the
// same refresh box commands run.

// How the watcher paces itself (watchOptions' defaults).
const (
	// watchDebounce coalesces a burst of events (one veth joining sends
	// several); the first event after a quiet period is never delayed.
	watchDebounce = 5 * time.Millisecond
	// watchResync is the safety net: a full refresh whatever was heard.
	watchResync = 30 * time.Second
	// watchLeaseRecheck is how often a lost (or not yet found) dnsmasq is
	// looked for again.
	watchLeaseRecheck = 2 * time.Second
	// watchRetry is how soon a failed refresh is tried again.
	watchRetry = time.Second
)

// watchOptions are WatchPorts' knobs; tests and the benchmark change them.
type watchOptions struct {
	debounce, resync, leaseRecheck, retry time.Duration
	// rcvbuf is the link subscription's socket buffer: a burst larger
	// than it kills the subscription (ENOBUFS), and the watcher
	// subscribes again and resyncs.
	rcvbuf int
	// heal runs the healer beside the watcher (Run).
	heal bool
	// refreshed, when set, is called after every successful refresh with
	// what it changed, the triggers it answered and when it finished.
	refreshed func(r stack.PortsRefresh, causes []trigger, done time.Time)
	// answered, when set, is called after a port's first answer (joinPort)
	// with what it changed and the event it answered.
	answered func(r stack.PortsRefresh, t trigger)
	// pinsSkipped, when set, is called when the pins' refresh for a cause
	// was skipped (leaseOnlySettled).
	pinsSkipped func(cause trigger)
	// ready, when set, is called once, after the first refresh (done or
	// failed) that followed the link subscription: from then on every new
	// port is taken in from its link event. The daemon's unit is
	// Type=notify, and Incus starts after it (notifyReady).
	ready func()
	// takeOver is how long to wait for a daemon already serving the
	// namespace to stop (0: refuse at once).
	takeOver time.Duration
}

func defaultWatchOptions() watchOptions {
	return watchOptions{debounce: watchDebounce, resync: watchResync, leaseRecheck: watchLeaseRecheck, retry: watchRetry, rcvbuf: 1 << 20}
}

// notifyReady tells systemd the watcher is ready (a unit of Type=notify),
// and logs it; outside such a unit it does nothing.
func notifyReady(logf func(string, ...any)) func() {
	return func() {
		switch there, err := sdnotify.Ready(); {
		case err != nil:
			logf("%v", err)
		case there:
			logf("ready: told systemd (Incus, ordered after %s, may start)", bootunits.DaemonUnitName)
		}
	}
}

// WatchPorts keeps the stack's bridge ports isolated and the bridge drop's
// port set exact until ctx ends, when it returns nil. It refreshes (the
// refresh box commands run after changing a box) when a link joins or
// leaves the bridge, when the bridge appears, when a port's flags change
// (someone turned isolated off), when the lease file of the dnsmasq serving
// the bridge changes, and every 30 s whatever it heard. It logs one line per
// port a refresh changed, with the delay from the event's arrival.
//
// One daemon runs per network namespace: a second one is refused while the
// first holds its lock (hostns.LockDaemon).
func WatchPorts(ctx context.Context, host *stack.Host, log io.Writer) error {
	return watchPorts(ctx, host, log, defaultWatchOptions())
}

func watchPorts(ctx context.Context, host *stack.Host, log io.Writer, o watchOptions) error {
	g, err := host.OpenNS()
	if err != nil {
		return fmt.Errorf("watching ports: %w", err)
	}
	defer g.Close()
	release, err := hostns.LockDaemon(g.Inode, hostns.Label(host.NetNS), o.takeOver)
	if err != nil {
		return err
	}
	defer release()
	services := []string{servicePorts, serviceRoutes, serviceEgress}
	if o.heal {
		services = slices.Insert(services, 1, serviceHealer)
	}
	w := &watcher{
		host: host, g: g, o: o, log: log, bridge: model.Current.Network,
		links: map[int]linkInfo{}, timer: time.NewTimer(time.Hour), pins: make(chan trigger, 1),
	}
	w.timer.Stop()
	if w.o.ready == nil {
		w.o.ready = notifyReady(w.logf)
	}
	w.status = newStatus(g.Inode, os.Getpid(), services, w.logf)
	defer os.Remove(hostns.DaemonStatusPath(g.Inode))
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(5)
	go func() {
		defer wg.Done()
		w.pinWorker(ctx)
	}()
	asked := make(chan struct{}, 1)
	go func() {
		defer wg.Done()
		w.listenRefresh(ctx, asked)
	}()
	// The healer puts the tables back after another tool's flush (heal.go).
	go func() {
		defer wg.Done()
		if o.heal {
			healLoop(ctx, host, w.logf, w.status)
		}
	}()
	// L-ROUTE's uplink set follows the route events (routes.go).
	go func() {
		defer wg.Done()
		watchRoutes(ctx, host, w.logf, w.status)
	}()
	// The allowlisted boxes' resolver and proxy live here too.
	go func() {
		defer wg.Done()
		egress.Run(ctx, host.NetNS, w.logf, func(up bool, why string) { w.status.set(serviceEgress, up, why) })
	}()
	defer wg.Wait()
	defer cancel()
	return w.run(ctx, asked)
}

// triggerKind is what made the watcher refresh; the log names it.
type triggerKind int

const (
	trigSync   triggerKind = iota // the link subscription (re)started
	trigLink                      // a kernel link event about the bridge or a port
	trigLease                     // the dnsmasq lease file changed (or dnsmasq came back)
	trigResync                    // the periodic resync
	trigAsked                     // a box command asked (the refresh socket)
)

func (k triggerKind) String() string {
	return [...]string{"full sync", "link event", "lease file change", "periodic resync", "box command's request"}[k]
}

// trigger is one reason to refresh.
type trigger struct {
	kind triggerKind
	at   time.Time // when the event reached the watcher
	port string    // the port a link event was about, if any
	what string    // e.g. "joined", "left", "isolated turned off", "bridge boxnet appeared"
	// isolated says the event showed the port isolated already.
	isolated bool
}

// when says how long after its trigger a change took effect.
func (t trigger) when(done time.Time) string {
	switch t.kind {
	case trigLink, trigLease:
		s := fmt.Sprintf("%.1fms after the %s", float64(done.Sub(t.at))/float64(time.Millisecond), t.kind)
		if t.port == "" && t.what != "" {
			s += " (" + t.what + ")"
		}
		return s
	}
	s := "at the " + t.kind.String()
	if t.what != "" {
		s += " (" + t.what + ")"
	}
	return s
}

// linkInfo is what the watcher remembers of a link.
type linkInfo struct {
	name   string
	master int
}

// linkEvent is a link update stamped with its arrival.
type linkEvent struct {
	u  netlink.LinkUpdate
	at time.Time
}

type watcher struct {
	host   *stack.Host
	g      *hostns.NS
	o      watchOptions
	log    io.Writer // written through logf: the run loop and the pin worker
	logMu  sync.Mutex
	bridge string

	links   map[int]linkInfo // every link in the namespace, by index
	brIndex int              // the bridge's index; 0 while there is none

	pending     []trigger // triggers since the last successful refresh
	lastRefresh time.Time
	timer       *time.Timer // the debounced (or retried) refresh
	armed       bool
	refreshErr  string // the last refresh failure, said once
	// pins wakes the pin worker (RefreshPins asks Incus, which takes tens
	// of milliseconds: a new port must never wait for that).
	pins chan trigger
	// waiters are the refresh socket's questions (refresh.go).
	waiters refreshWaiters

	lease    *leaseWatch
	leaseErr string // the last failure to watch it, said once

	status *status // what box doctor reads of the services
}

func (w *watcher) logf(format string, args ...any) {
	w.logMu.Lock()
	defer w.logMu.Unlock()
	fmt.Fprintf(w.log, format+"\n", args...)
}

func (w *watcher) run(ctx context.Context, asked <-chan struct{}) error {
	w.logf("watching the ports of bridge %s in %s (pid %d, lock %s)", w.bridge, hostns.Label(w.host.NetNS), os.Getpid(), hostns.DaemonLockPath(w.g.Inode))
	lease, err := newLeaseWatch()
	if err != nil {
		return fmt.Errorf("watching ports: %w", err)
	}
	w.lease = lease
	defer lease.close()
	w.findLease(ctx, false)

	resync := time.NewTicker(w.o.resync)
	defer resync.Stop()
	recheck := time.NewTicker(w.o.leaseRecheck)
	defer recheck.Stop()
	resubscribe := time.NewTimer(0)
	defer resubscribe.Stop()
	backoff := 100 * time.Millisecond

	var sub *linkSubscription
	defer func() {
		if sub != nil {
			sub.stop()
		}
	}()
	for {
		var events <-chan linkEvent
		if sub != nil {
			events = sub.events
		}
		select {
		case <-ctx.Done():
			w.logf("stopped")
			return nil

		case <-resubscribe.C:
			s, err := subscribeLinks(w.g, w.o.rcvbuf)
			if err != nil {
				w.logf("subscribing to link events failed: %v; trying again in %s", err, backoff)
				resubscribe.Reset(backoff)
				backoff = min(2*backoff, 5*time.Second)
				continue
			}
			sub, backoff = s, 100*time.Millisecond
			// The subscription's dump teaches the links afresh.
			w.links, w.brIndex = map[int]linkInfo{}, 0
			what := "watcher started"
			if !w.lastRefresh.IsZero() {
				what = "link subscription restarted"
			}
			w.add(ctx, trigger{kind: trigSync, at: time.Now(), what: what})

		case ev, ok := <-events:
			if !ok {
				// The subscription died (its socket overflowed, or an
				// error): events were lost, so resubscribe and resync.
				w.logf("link subscription ended (%v); subscribing again", sub.lastErr())
				sub.stop()
				sub = nil
				resubscribe.Reset(100 * time.Millisecond)
				continue
			}
			if t, ok := w.classify(ev); ok {
				w.joinPort(ctx, t)
				w.add(ctx, t)
			}

		case ev := <-lease.events:
			if lease.matches(ev) {
				w.add(ctx, trigger{kind: trigLease, at: ev.at})
			}

		case <-recheck.C:
			if !lease.alive() {
				w.findLease(ctx, true)
			}

		case <-resync.C:
			w.findLease(ctx, true)
			w.add(ctx, trigger{kind: trigResync, at: time.Now()})

		case <-asked:
			w.add(ctx, trigger{kind: trigAsked, at: time.Now()})

		case <-w.timer.C:
			w.armed = false
			w.refresh(ctx)
		}
	}
}

// add queues a trigger and refreshes at once after a quiet period, or at
// the end of the debounce window inside a burst.
func (w *watcher) add(ctx context.Context, t trigger) {
	w.pending = append(w.pending, t)
	if w.armed {
		return
	}
	if wait := w.o.debounce - time.Since(w.lastRefresh); wait > 0 {
		w.timer.Reset(wait)
		w.armed = true
		return
	}
	w.refresh(ctx)
}

func (w *watcher) refresh(ctx context.Context) {
	r, err := w.host.SyncPorts(ctx)
	done := time.Now()
	w.lastRefresh = done
	w.report(r, done)
	if w.o.ready != nil {
		// Said after a failure too: Incus waiting on a watcher that cannot
		// sync would keep every box down; the failure is logged below.
		w.o.ready()
		w.o.ready = nil
	}
	if err != nil {
		if ctx.Err() != nil {
			return
		}
		// Keep the triggers: the retry's delays still count from them.
		if len(w.pending) == 0 {
			w.pending = append(w.pending, trigger{kind: trigSync, at: done, what: "retry"})
		}
		// A lasting failure is said once, not at every retry.
		w.status.set(servicePorts, false, "refreshing the ports failed: "+err.Error())
		if msg := err.Error(); msg != w.refreshErr {
			w.logf("refreshing the ports after a %s failed: %v; trying again every %s", w.pending[0].kind, err, w.o.retry)
			w.refreshErr = msg
		}
		w.timer.Reset(w.o.retry)
		w.armed = true
		return
	}
	w.status.set(servicePorts, true, "")
	if w.refreshErr != "" {
		w.logf("refreshing the ports works again")
		w.refreshErr = ""
	}
	if w.o.refreshed != nil {
		w.o.refreshed(r, slices.Clone(w.pending), done)
	}
	// The pins' cause is a lease file change only when nothing else was
	// heard: the worker may skip a refresh for one (leaseOnlySettled).
	cause := trigger{kind: trigSync, at: done}
	if len(w.pending) > 0 {
		cause = w.pending[0]
	}
	if i := slices.IndexFunc(w.pending, func(t trigger) bool { return t.kind != trigLease }); i >= 0 {
		cause = w.pending[i]
	}
	w.pending = w.pending[:0]
	select { // the worker refreshes the pins once for any number of kicks
	case w.pins <- cause:
	default:
		if cause.kind != trigLease {
			// The kick waiting may be a lease file change's, which the
			// worker may skip: this one takes its place.
			select {
			case <-w.pins:
			default:
			}
			select {
			case w.pins <- cause:
			default:
			}
		}
	}
}

// leaseOnlySettled says the worker may skip the pins' refresh for cause:
// a change of dnsmasq's lease file alone, nobody waiting on the refresh
// socket, and the kernel's pins already holding every port and every
// lease (stack.Addresses.LeasesPinned). Each box's start writes the lease
// file after its port came up, so beside a full bridge every mint cost
// the watcher two whole refreshes, the second reading every instance for
// nothing.
func (w *watcher) leaseOnlySettled(cause trigger, waiting int) bool {
	return cause.kind == trigLease && waiting == 0 && w.host.Addresses().LeasesPinned()
}

// A port no instance claims yet, or a box still starting that has no
// fixed address, is looked at again every unresolvedRecheck, at most
// unresolvedTries times in a row.
const (
	unresolvedRecheck = 100 * time.Millisecond
	unresolvedTries   = 50
)

// pinWorker refreshes the pins after every port refresh, apart from the
// run loop. A port is on the bridge a moment before Incus records whose it
// is: it looks again soon, so that port's pin does not wait for the next
// trigger; a port nobody ever claims (the census names it) is looked at a
// few times, then left to the periodic resync.
func (w *watcher) pinWorker(ctx context.Context) {
	failed := ""
	for {
		var cause trigger
		select {
		case <-ctx.Done():
			return
		case cause = <-w.pins:
		}
		for try := 0; ; try++ {
			var r stack.PortsRefresh
			waiting := w.waiters.take()
			if try == 0 && w.leaseOnlySettled(cause, len(waiting)) {
				if w.o.pinsSkipped != nil {
					w.o.pinsSkipped(cause)
				}
				break
			}
			err := w.host.RefreshPins(ctx, &r)
			answer(waiting, err)
			switch {
			case ctx.Err() != nil:
				return
			case err != nil && err.Error() != failed:
				failed = err.Error()
				w.logf("refreshing the pins after a %s failed: %v; trying again at the next trigger", cause.kind, err)
			case err == nil && failed != "":
				failed = ""
				w.logf("refreshing the pins works again")
			}
			if r.Pinned {
				w.logf("pins: the ports' MACs and addresses re-read and the pin table updated %s", cause.when(time.Now()))
			}
			if err != nil || len(r.Unresolved)+len(r.Addressless) == 0 || try >= unresolvedTries {
				break
			}
			cause = trigger{kind: trigSync, at: time.Now(), what: "ports not yet claimed by an instance: " + strings.Join(r.Unresolved, ", ")}
			if len(r.Addressless) > 0 {
				cause.what = "boxes Incus was starting, to be given a fixed address: " + strings.Join(r.Addressless, ", ")
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(unresolvedRecheck):
			}
		}
	}
}

// report logs one line per port the refresh changed, naming its trigger.
func (w *watcher) report(r stack.PortsRefresh, done time.Time) {
	for _, l := range reportLines(w.bridge, r, w.pending, done) {
		w.logf("%s", l)
	}
}

func reportLines(bridge string, r stack.PortsRefresh, causes []trigger, done time.Time) []string {
	isolated, added, removed := map[string]bool{}, map[string]bool{}, map[string]bool{}
	var names []string
	for _, s := range []struct {
		in  []string
		set map[string]bool
	}{{r.Isolated, isolated}, {r.Added, added}, {r.Removed, removed}} {
		for _, n := range s.in {
			s.set[n] = true
			names = append(names, n)
		}
	}
	slices.Sort(names)
	names = slices.Compact(names)
	var out []string
	for _, port := range names {
		cause := trigger{kind: trigSync}
		if len(causes) > 0 {
			cause = causes[0]
		}
		// The port's first own event, unless it was renamed away since.
		renamed := ""
		for _, t := range causes {
			if t.what == "renamed from "+port {
				cause, renamed = t, t.port
				break
			}
			if t.port == port && cause.port != port {
				cause = t
			}
		}
		ownEvent := cause.port == port
		// When the change took effect: the flag set, the set's addition
		// committed, or (a removal) the refresh's end.
		at := done
		switch {
		case added[port] && !r.AddedAt.IsZero():
			at = r.AddedAt
		case isolated[port] && !removed[port] && !r.IsolatedAt.IsZero():
			at = r.IsolatedAt
		}
		var what string
		switch {
		case removed[port] && ownEvent && cause.what == "left":
			what = "left " + bridge + ", removed from the port set"
		case removed[port] && renamed != "":
			what = "renamed to " + renamed + ", the old name removed from the port set"
		case removed[port]:
			what = "not a port of " + bridge + ", removed from the port set"
		case added[port] && isolated[port]:
			what = "joined " + bridge + ", isolated and in the port set"
		case added[port]:
			what = "joined " + bridge + ", in the port set (it was isolated already)"
		case ownEvent && cause.what == "joined":
			what = "joined " + bridge + ", isolated"
		default:
			what = "isolated turned back on"
		}
		out = append(out, port+": "+what+" "+cause.when(at))
	}
	return out
}

// classify updates what the watcher knows of the links from one update
// and says whether it is a reason to refresh. The dump that starts a
// subscription only teaches; the full sync that comes with it refreshes.
func (w *watcher) classify(ev linkEvent) (trigger, bool) {
	u := ev.u
	a := u.Link.Attrs()
	idx := a.Index
	del := u.Header.Type == unix.RTM_DELLINK
	// An AF_BRIDGE RTM_DELLINK says a port left its bridge; the link stays.
	gone := del && u.Family != unix.AF_BRIDGE
	prev, had := w.links[idx]
	wasPort := had && w.isPort(idx, prev)

	t := trigger{kind: trigLink, at: ev.at}
	switch {
	case idx == w.brIndex && (gone || a.Name != w.bridge):
		w.brIndex = 0
		t.what = "bridge " + w.bridge + " went away"
	case !del && a.Name == w.bridge && idx != w.brIndex:
		w.brIndex = idx
		t.what = "bridge " + w.bridge + " appeared"
	}
	switch {
	case gone:
		delete(w.links, idx)
	case del:
		w.links[idx] = linkInfo{name: a.Name}
	default:
		w.links[idx] = linkInfo{name: a.Name, master: a.MasterIndex}
	}
	cur, has := w.links[idx]
	isPort := has && w.isPort(idx, cur)

	if u.Header.Flags&unix.NLM_F_MULTI != 0 {
		return t, false
	}
	switch {
	case t.what != "":
	case !wasPort && isPort:
		t.port, t.what = cur.name, "joined"
		t.isolated = a.Protinfo != nil && a.Protinfo.Isolated
	case wasPort && !isPort:
		t.port, t.what = prev.name, "left"
	case isPort && prev.name != cur.name:
		t.port, t.what = cur.name, "renamed from "+prev.name
	case isPort && a.Protinfo != nil && !a.Protinfo.Isolated:
		t.port, t.what = cur.name, "isolated turned off"
	default:
		return t, false
	}
	return t, true
}

// joinPort is the first answer to a port that joined the bridge or was
// renamed: that port alone isolated and put in the port set at once, with
// no dump of the bridge's ports or of the set, so beside a full bridge a
// new box's port waits no longer than beside an empty one. The full
// refresh follows as for any event and sees to the rest (a port that
// left, a set that is not there, isolation turned off: the kernel's event
// for a port that joined says it is not isolated yet, and often arrives
// after this answer isolated it); a failure here is left to it.
func (w *watcher) joinPort(ctx context.Context, t trigger) {
	if t.what != "joined" && !strings.HasPrefix(t.what, "renamed from ") {
		return
	}
	unlock, err := hostns.LockFile(ctx, hostns.PortsLock, "the port set")
	if err != nil {
		return
	}
	defer unlock()
	if ok, err := w.g.IsolatePort(w.bridge, t.port); err != nil || !ok {
		return
	}
	// A renamed port was a port, isolated by then.
	r := stack.PortsRefresh{IsolatedAt: time.Now()}
	if t.what == "joined" && !t.isolated {
		r.Isolated = []string{t.port}
	}
	if err := nft.AddPorts(w.g.NFTConfig(model.Current), []string{t.port}); err != nil {
		return
	}
	r.Added, r.AddedAt = []string{t.port}, time.Now()
	for _, l := range reportLines(w.bridge, r, []trigger{t}, r.AddedAt) {
		w.logf("%s", l)
	}
	if w.o.answered != nil {
		w.o.answered(r, t)
	}
}

func (w *watcher) isPort(idx int, l linkInfo) bool {
	return w.brIndex != 0 && idx != w.brIndex && l.master == w.brIndex
}

// findLease (re)finds the lease file from the dnsmasq serving the bridge
// and watches it; once dnsmasq is back (or changed files) that is a reason
// to refresh too.
func (w *watcher) findLease(ctx context.Context, trig bool) {
	path, pid := w.g.DnsmasqLeaseFile(w.bridge)
	changed, err := w.lease.watch(path, pid)
	if err != nil {
		// Said once, not at every recheck.
		if msg := err.Error(); msg != w.leaseErr {
			w.logf("watching the lease file %s (dnsmasq pid %d) failed: %v; looking again every %s", path, pid, err, w.o.leaseRecheck)
			w.leaseErr = msg
		}
		return
	}
	w.leaseErr = ""
	switch {
	case !changed:
	case pid == 0:
		w.logf("no dnsmasq serves %s in %s: its lease file is not watched (looking again every %s)", w.bridge, hostns.Label(w.host.NetNS), w.o.leaseRecheck)
	case path == "":
		w.logf("dnsmasq pid %d serves %s without --dhcp-leasefile: no lease file to watch", pid, w.bridge)
	default:
		w.logf("watching the lease file %s (dnsmasq pid %d)", path, pid)
		if trig {
			w.add(ctx, trigger{kind: trigLease, at: time.Now(), what: "dnsmasq found again"})
		}
	}
}

// linkSubscription is one netlink link-event subscription.
type linkSubscription struct {
	events chan linkEvent
	done   chan struct{}
	once   sync.Once
	mu     sync.Mutex
	err    error
}

// subscribeLinks subscribes to link events in the host's namespace,
// dumping the existing links first; each event is stamped on arrival.
func subscribeLinks(g *hostns.NS, rcvbuf int) (*linkSubscription, error) {
	s := &linkSubscription{events: make(chan linkEvent, 1024), done: make(chan struct{})}
	raw := make(chan netlink.LinkUpdate, 1024)
	opts := netlink.LinkSubscribeOptions{
		ListExisting:      true,
		ReceiveBufferSize: rcvbuf,
		// The error that ends a subscription is said when its channel
		// closes; the others (an interrupted dump, a message that did not
		// parse) cost at most one link's news, which the refresh (it reads
		// the kernel afresh) and the periodic resync make up for.
		ErrorCallback: func(err error) {
			s.mu.Lock()
			s.err = err
			s.mu.Unlock()
		},
	}
	if g.Handle >= 0 {
		ns := g.Handle
		opts.Namespace = &ns
	}
	if err := netlink.LinkSubscribeWithOptions(raw, s.done, opts); err != nil {
		close(s.done) // the socket, if one was opened, is closed on done
		return nil, err
	}
	go func() {
		defer close(s.events)
		for u := range raw {
			s.events <- linkEvent{u: u, at: time.Now()}
		}
	}()
	return s, nil
}

func (s *linkSubscription) lastErr() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err == nil {
		return errors.New("closed")
	}
	return s.err
}

// stop closes the subscription's socket and drains its events, so no
// goroutine is left blocked sending; it is also what cleans up after a
// subscription that died on its own.
func (s *linkSubscription) stop() {
	s.once.Do(func() { close(s.done) })
	for range s.events {
	}
}

// leaseWatch watches the lease file's directory with inotify: dnsmasq
// rewrites the file in place, other writers replace it.
type leaseWatch struct {
	f      *os.File
	fd     int
	events chan leaseEvent
	stopc  chan struct{}

	wd         int // -1 when nothing is watched
	path, name string
	pid        int
}

type leaseEvent struct {
	wd       int
	name     string
	overflow bool
	at       time.Time
}

const leaseMask = unix.IN_MODIFY | unix.IN_CLOSE_WRITE | unix.IN_MOVED_TO | unix.IN_CREATE | unix.IN_DELETE

func newLeaseWatch() (*leaseWatch, error) {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("inotify: %w", err)
	}
	lw := &leaseWatch{f: os.NewFile(uintptr(fd), "inotify"), fd: fd, wd: -1,
		events: make(chan leaseEvent, 64), stopc: make(chan struct{})}
	go lw.read()
	return lw, nil
}

func (lw *leaseWatch) read() {
	buf := make([]byte, 64*(unix.SizeofInotifyEvent+unix.NAME_MAX+1))
	for {
		n, err := lw.f.Read(buf)
		if err != nil {
			return // closed
		}
		at := time.Now()
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			wd := int32(binary.NativeEndian.Uint32(buf[off:]))
			mask := binary.NativeEndian.Uint32(buf[off+4:])
			l := int(binary.NativeEndian.Uint32(buf[off+12:]))
			start := off + unix.SizeofInotifyEvent
			name := strings.TrimRight(string(buf[start:min(start+l, n)]), "\x00")
			off = start + l
			select {
			case lw.events <- leaseEvent{wd: int(wd), name: name, overflow: mask&unix.IN_Q_OVERFLOW != 0, at: at}:
			case <-lw.stopc:
				return
			}
		}
	}
}

// watch points the watch at path's directory; changed says whether the
// file or the dnsmasq process is another than before.
func (lw *leaseWatch) watch(path string, pid int) (changed bool, err error) {
	changed = path != lw.path || pid != lw.pid
	lw.pid = pid
	if path == lw.path {
		return changed, nil
	}
	if lw.wd >= 0 {
		_, _ = unix.InotifyRmWatch(lw.fd, uint32(lw.wd))
		lw.wd, lw.path, lw.name = -1, "", ""
	}
	if path == "" {
		return changed, nil
	}
	wd, err := unix.InotifyAddWatch(lw.fd, filepath.Dir(path), leaseMask)
	if err != nil {
		lw.pid = 0 // looked for again at the next recheck
		return false, fmt.Errorf("inotify on %s: %w", filepath.Dir(path), err)
	}
	lw.wd, lw.path, lw.name = wd, path, filepath.Base(path)
	return changed, nil
}

// matches says whether an event is about the lease file (an overflowed
// queue may have been).
func (lw *leaseWatch) matches(ev leaseEvent) bool {
	return lw.wd >= 0 && (ev.overflow || (ev.wd == lw.wd && ev.name == lw.name))
}

// alive says whether the dnsmasq the lease file came from still runs.
func (lw *leaseWatch) alive() bool {
	if lw.pid == 0 {
		return false
	}
	_, err := os.Stat("/proc/" + strconv.Itoa(lw.pid))
	return err == nil
}

func (lw *leaseWatch) close() {
	close(lw.stopc)
	lw.f.Close()
}
