package drill

import (
	"fmt"
	"net/netip"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// neighWatch records, for the whole probe phase, every neighbour entry the
// host's namespace holds on the bridge (IPv4 ARP entries) and every
// address the bridge's forwarding database learns: an initial dump, then
// every change. C-SPOOF reads it: did the host ever hold box-b's address at
// another MAC, did the bridge ever learn box-b's MAC on another port?
type neighWatch struct {
	bridge  int
	names   map[int]string
	start   time.Time
	done    chan struct{}
	wg      sync.WaitGroup
	mu      sync.Mutex
	events  []neighEvent
	err     error
	stopped bool
}

// neighEvent is one entry as the kernel reported it.
type neighEvent struct {
	At      time.Duration // since the watch started
	FDB     bool          // a forwarding-database entry, not an ARP one
	IP      netip.Addr    // ARP entries only
	MAC     string
	Port    string // FDB entries: the bridge port it was learned on
	State   string
	Deleted bool
}

func (e neighEvent) String() string {
	what := e.IP.String() + " at " + e.MAC
	if e.FDB {
		what = e.MAC + " on port " + e.Port
	}
	if e.Deleted {
		what += " deleted"
	}
	return fmt.Sprintf("%s (%s, +%dms)", what, e.State, e.At.Milliseconds())
}

// watchNeighbours starts recording in namespace ns (empty: this one) for
// bridge's entries.
func watchNeighbours(ns, bridge string) (*neighWatch, error) {
	h := netns.None()
	if ns != "" {
		var err error
		if h, err = netns.GetFromName(ns); err != nil {
			return nil, fmt.Errorf("opening namespace %s: %w", ns, err)
		}
	}
	nh, err := netlink.NewHandleAt(h)
	if err != nil {
		h.Close()
		return nil, fmt.Errorf("netlink in %s: %w", ns, err)
	}
	defer nh.Close()
	br, err := nh.LinkByName(bridge)
	if err != nil {
		h.Close()
		return nil, fmt.Errorf("finding bridge %s: %w", bridge, err)
	}
	w := &neighWatch{bridge: br.Attrs().Index, names: map[int]string{}, start: time.Now(), done: make(chan struct{})}
	if links, err := nh.LinkList(); err == nil {
		for _, l := range links {
			w.names[l.Attrs().Index] = l.Attrs().Name
		}
	}
	ch := make(chan netlink.NeighUpdate, 256)
	opts := netlink.NeighSubscribeOptions{ListExisting: true, ErrorCallback: func(err error) {
		w.mu.Lock()
		if !w.stopped { // closing the socket at stop is no error
			w.err = err
		}
		w.mu.Unlock()
	}}
	if ns != "" {
		opts.Namespace = &h
	}
	if err := netlink.NeighSubscribeWithOptions(ch, w.done, opts); err != nil {
		h.Close()
		return nil, fmt.Errorf("watching neighbours in %s: %w", ns, err)
	}
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		defer h.Close()
		for u := range ch {
			w.record(u)
		}
	}()
	return w, nil
}

func (w *neighWatch) record(u netlink.NeighUpdate) {
	n := u.Neigh
	e := neighEvent{At: time.Since(w.start), MAC: n.HardwareAddr.String(), State: neighState(n.State), Deleted: u.Type == unix.RTM_DELNEIGH}
	switch {
	case n.Family == unix.AF_BRIDGE && n.MasterIndex == w.bridge:
		if n.Flags&netlink.NTF_SELF != 0 || n.State&netlink.NUD_PERMANENT != 0 {
			return // the ports' own addresses, not learned ones
		}
		e.FDB, e.Port = true, w.names[n.LinkIndex]
		if e.Port == "" {
			e.Port = fmt.Sprintf("ifindex %d", n.LinkIndex)
		}
	case n.Family == unix.AF_INET && n.LinkIndex == w.bridge:
		a, ok := netip.AddrFromSlice(n.IP.To4())
		if !ok {
			return
		}
		e.IP = a
	default:
		return
	}
	w.mu.Lock()
	w.events = append(w.events, e)
	w.mu.Unlock()
}

// stop ends the watch and returns what it saw, and the error that cut it
// short, if one did.
func (w *neighWatch) stop() ([]neighEvent, error) {
	w.mu.Lock()
	w.stopped = true
	w.mu.Unlock()
	close(w.done)
	w.wg.Wait()
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.events, w.err
}

func neighState(s int) string {
	names := []struct {
		bit  int
		name string
	}{{netlink.NUD_INCOMPLETE, "incomplete"}, {netlink.NUD_REACHABLE, "reachable"}, {netlink.NUD_STALE, "stale"},
		{netlink.NUD_DELAY, "delay"}, {netlink.NUD_PROBE, "probe"}, {netlink.NUD_FAILED, "failed"},
		{netlink.NUD_NOARP, "noarp"}, {netlink.NUD_PERMANENT, "permanent"}}
	for _, n := range names {
		if s&n.bit != 0 {
			return n.name
		}
	}
	return "none"
}
