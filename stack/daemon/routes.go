package daemon

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"

	"github.com/box-isolation/box/stack"
	"github.com/box-isolation/box/stack/hostns"
	"github.com/box-isolation/box/stack/model"
	"github.com/box-isolation/box/stack/nft"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

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
func watchRoutes(ctx context.Context, host *stack.Host, logf func(string, ...any), st *status) {
	g, err := host.OpenNS()
	if err != nil {
		st.set(serviceRoutes, false, err.Error())
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
			if changed, err = rt.Apply(ncfg); err == nil {
				st.set(serviceRoutes, true, "")
				missing = false
				if len(changed) > 0 {
					logf("%s: %s (%s)", model.LayerRoute, strings.Join(changed, "; "), why)
				}
				return
			}
		}
		if errors.Is(err, nft.ErrNotApplied) {
			st.set(serviceRoutes, false, "table inet "+ncfg.RouteTable()+" is missing (box doctor --fix makes it)")
			if !missing {
				logf("%s: table inet %s is missing: boxes may leave by any route until `box doctor --fix` makes it", model.LayerRoute, ncfg.RouteTable())
			}
			missing = true
			return
		}
		st.set(serviceRoutes, false, "keeping the uplink set: "+err.Error())
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
				st.set(serviceRoutes, false, "subscribing to route events: "+err.Error())
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
