package stack

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/box-isolation/box/stack/hostns"
	"github.com/box-isolation/box/stack/model"
	"github.com/box-isolation/box/stack/nft"
)

// L-ROUTE: a box's forwarded traffic leaves the host only by the
// interfaces of its default routes (stack/nft/route.go has the table).
// The set of those interfaces follows the kernel: Ensure writes it, the
// port watcher keeps it current from route events (watchRoutes), Verify
// compares it with the routes of the moment. docs/egress.md says what
// that means with several default routes, a VPN, roaming and a cluster.

// ensureRoute converges the route table to the host's default routes.
func ensureRoute(g *hostns.NS) ([]model.Change, error) {
	rt, err := g.RouteView(model.Current.Network)
	if err != nil {
		return nil, fmt.Errorf("reading the routes for %s: %w", model.LayerRoute, err)
	}
	applied, err := nft.ApplyRoute(g.NFTConfig(model.Current), rt)
	if err != nil {
		return nil, fmt.Errorf("applying the route table: %w", err)
	}
	var out []model.Change
	for _, a := range applied {
		out = append(out, model.Change{Object: "nft", Action: "updated", Detail: a})
	}
	return out, nil
}

// verifyRoute compares the route table with the default routes of the
// moment; notes say what a box may leave by.
func verifyRoute(g *hostns.NS) (findings []model.Finding, notes []string, err error) {
	rt, err := g.RouteView(model.Current.Network)
	if err != nil {
		return nil, nil, fmt.Errorf("reading the routes for %s: %w", model.LayerRoute, err)
	}
	up := rt.Uplinks
	rf, err := nft.VerifyRoute(g.NFTConfig(model.Current), rt)
	if err != nil {
		return nil, nil, fmt.Errorf("reading the route table: %w", err)
	}
	for _, f := range rf {
		// A routed prefix's drop that is missing or stale is advisory: the
		// out-interface check and the ACL stand in front of it, and routes
		// come and go between converges where no watcher runs (the
		// drill's own LAN stand-in adds host routes by its veth for the
		// run). The uplink set and the table's shape are not.
		advisory := strings.Contains(f.Problem, "ip daddr ")
		findings = append(findings, model.Finding{Layer: model.LayerRoute, Object: "nft " + f.Object, Problem: f.Problem, Fix: fixEnsure, Advisory: advisory})
	}
	if len(up) == 0 {
		notes = append(notes, "the host has no default route: boxes reach nothing outside the host until it has one ("+string(model.LayerRoute)+")")
	}
	return findings, notes, nil
}

// How watchRoutes paces itself: the same debounce and safety net as the
// port watcher's.
const (
	routeDebounce = watchDebounce
	routeResync   = watchResync
)

// watchRoutes keeps the route table's uplink set equal to the default
// routes' interfaces, and its drops equal to the routed prefixes, until
// ctx ends: routeDebounce after the last of a
// burst of route, link and address events (a default route added or
// removed, a link that went down taking its routes), and every
// routeResync whatever was heard. It only updates the set of a table that is there: making the
// table is Ensure's (`box setup-host`, `box doctor --fix`), and a table
// someone removed is Verify's to report. Between a new default route and
// the update, a box's new connections by it are dropped: the set errs
// closed.
func watchRoutes(ctx context.Context, host *Host, logf func(string, ...any)) {
	g, err := host.ground()
	if err != nil {
		logf("%s: watching routes: %v", model.LayerRoute, err)
		return
	}
	defer g.Close()
	ncfg := g.NFTConfig(model.Current)
	// Route events, and link and address events: IPv4 routes a link
	// takes down with it, or an address takes with it, go without a route
	// event of their own (measured: TestPrivilegedRouteUplinks).
	var sub *routeSubscription
	defer func() {
		if sub != nil {
			sub.stop()
		}
	}()
	subscribe := func() error {
		s, err := subscribeRoutes(g)
		if err != nil {
			return err
		}
		sub = s
		return nil
	}
	missing := false
	syncSet := func(why string) {
		rt, err := g.RouteView(model.Current.Network)
		if err == nil {
			var present bool
			if present, err = nft.RoutePresent(ncfg); err == nil && !present {
				err = nft.ErrNotApplied
			}
		}
		if err == nil {
			var changed []string
			if changed, err = nft.ApplyRoute(ncfg, rt); err == nil {
				missing = false
				if len(changed) > 0 {
					logf("%s: %s (%s)", model.LayerRoute, strings.Join(changed, "; "), why)
				}
				return
			}
		}
		if errors.Is(err, nft.ErrNotApplied) {
			if !missing {
				logf("%s: table inet %s is missing: boxes may leave by any route until `box doctor --fix` makes it", model.LayerRoute, ncfg.RouteTable())
			}
			missing = true
			return
		}
		logf("%s: keeping the uplink set: %v", model.LayerRoute, err)
	}

	resync := time.NewTicker(routeResync)
	defer resync.Stop()
	debounce := time.NewTimer(time.Hour)
	debounce.Stop()
	retry := time.NewTimer(0)
	defer retry.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-retry.C:
			if err := subscribe(); err != nil {
				logf("%s: subscribing to route events failed: %v; trying again in %s", model.LayerRoute, err, watchRetry)
				retry.Reset(watchRetry)
				continue
			}
			syncSet("route subscription started")
		case <-sub.endedC():
			// Events were lost: subscribe again, and read afresh.
			sub.stop()
			sub = nil
			retry.Reset(watchRetry)
		case <-sub.events():
			debounce.Reset(routeDebounce)
		case <-debounce.C:
			syncSet("route event")
		case <-resync.C:
			syncSet("resync")
		}
	}
}

// routeSubscription is what watchRoutes hears: the kernel's route, link
// and address events in the host's namespace, as wake-ups (one pending at
// most: each sync reads the kernel afresh). ended closes when any of the
// three subscriptions ends.
type routeSubscription struct {
	wake              chan struct{}
	ended             chan struct{}
	done              chan struct{}
	stopOnce, endOnce sync.Once
	wg                sync.WaitGroup
}

func subscribeRoutes(g *hostns.NS) (*routeSubscription, error) {
	s := &routeSubscription{wake: make(chan struct{}, 1), ended: make(chan struct{}), done: make(chan struct{})}
	var nsh *netns.NsHandle
	if g.Handle >= 0 {
		ns := g.Handle
		nsh = &ns
	}
	routes, links, addrs := make(chan netlink.RouteUpdate, 256), make(chan netlink.LinkUpdate, 256), make(chan netlink.AddrUpdate, 256)
	ignore := func(error) {} // a lost message is made up for by the next sync
	const rcvbuf = 1 << 20
	err := netlink.RouteSubscribeWithOptions(routes, s.done, netlink.RouteSubscribeOptions{Namespace: nsh, ReceiveBufferSize: rcvbuf, ErrorCallback: ignore})
	if err == nil {
		err = netlink.LinkSubscribeWithOptions(links, s.done, netlink.LinkSubscribeOptions{Namespace: nsh, ReceiveBufferSize: rcvbuf, ErrorCallback: ignore})
	}
	if err == nil {
		err = netlink.AddrSubscribeWithOptions(addrs, s.done, netlink.AddrSubscribeOptions{Namespace: nsh, ReceiveBufferSize: rcvbuf, ErrorCallback: ignore})
	}
	if err != nil {
		close(s.done) // the sockets already opened are closed on done
		return nil, err
	}
	s.wg.Add(3)
	go drainInto(s, routes)
	go drainInto(s, links)
	go drainInto(s, addrs)
	return s, nil
}

// drainInto turns one subscription's events into wake-ups until it ends.
func drainInto[T any](s *routeSubscription, ch <-chan T) {
	defer s.wg.Done()
	for range ch {
		select {
		case s.wake <- struct{}{}:
		default: // one is pending already
		}
	}
	s.endOnce.Do(func() { close(s.ended) })
}

// events and ended are nil (never ready) for no subscription.
func (s *routeSubscription) events() <-chan struct{} {
	if s == nil {
		return nil
	}
	return s.wake
}

func (s *routeSubscription) endedC() <-chan struct{} {
	if s == nil {
		return nil
	}
	return s.ended
}

// stop closes the sockets and waits for their readers.
func (s *routeSubscription) stop() {
	s.stopOnce.Do(func() { close(s.done) })
	s.wg.Wait()
}
