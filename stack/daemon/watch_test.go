package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/box-isolation/box/internal/syncbuf"
	"github.com/box-isolation/box/stack"
	"github.com/box-isolation/box/stack/hostns"

	"github.com/google/nftables"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/box-isolation/box/internal/nstest"
	"github.com/box-isolation/box/internal/testenv/tier"
	"github.com/box-isolation/box/stack/nft"
)

// linkUpdate builds a link update as the kernel would send it.
func linkUpdate(typ uint16, family uint8, idx int, name string, master int, isolated *bool) linkEvent {
	a := netlink.LinkAttrs{Index: idx, Name: name, MasterIndex: master}
	if isolated != nil {
		a.Protinfo = &netlink.Protinfo{Isolated: *isolated}
	}
	return linkEvent{at: time.Now(), u: netlink.LinkUpdate{
		IfInfomsg: nl.IfInfomsg{IfInfomsg: unix.IfInfomsg{Family: family, Index: int32(idx)}},
		Header:    unix.NlMsghdr{Type: typ},
		Link:      &netlink.Device{LinkAttrs: a},
	}}
}

func TestWatcherClassifiesLinkEvents(t *testing.T) {
	off, on := false, true
	w := &watcher{bridge: "boxnet", links: map[int]linkInfo{}}
	dump := func(ev linkEvent) linkEvent { ev.u.Header.Flags |= unix.NLM_F_MULTI; return ev }
	for _, step := range []struct {
		name string
		ev   linkEvent
		want string // "" for no trigger, else "port/what"
	}{
		{"the dump only teaches: a port listed before its bridge", dump(linkUpdate(unix.RTM_NEWLINK, unix.AF_UNSPEC, 5, "vold", 3, nil)), ""},
		{"the dump only teaches: the bridge", dump(linkUpdate(unix.RTM_NEWLINK, unix.AF_UNSPEC, 3, "boxnet", 0, nil)), ""},
		{"a known port changing carrier", linkUpdate(unix.RTM_NEWLINK, unix.AF_UNSPEC, 5, "vold", 3, nil), ""},
		{"a link elsewhere", linkUpdate(unix.RTM_NEWLINK, unix.AF_UNSPEC, 9, "docker0", 0, nil), ""},
		{"a port of another bridge", linkUpdate(unix.RTM_NEWLINK, unix.AF_UNSPEC, 10, "vdock", 9, nil), ""},
		{"a veth made, not yet a port", linkUpdate(unix.RTM_NEWLINK, unix.AF_UNSPEC, 7, "vnew", 0, nil), ""},
		{"enslaved", linkUpdate(unix.RTM_NEWLINK, unix.AF_UNSPEC, 7, "vnew", 3, nil), "vnew/joined"},
		{"the bridge's own AF_BRIDGE notice (its master is itself)", linkUpdate(unix.RTM_NEWLINK, unix.AF_BRIDGE, 3, "boxnet", 3, nil), ""},
		{"the port's AF_BRIDGE notice, isolated", linkUpdate(unix.RTM_NEWLINK, unix.AF_BRIDGE, 7, "vnew", 3, &on), ""},
		{"isolated turned off", linkUpdate(unix.RTM_NEWLINK, unix.AF_BRIDGE, 7, "vnew", 3, &off), "vnew/isolated turned off"},
		{"renamed", linkUpdate(unix.RTM_NEWLINK, unix.AF_UNSPEC, 7, "vren", 3, nil), "vren/renamed from vnew"},
		{"released from the bridge (AF_BRIDGE DELLINK)", linkUpdate(unix.RTM_DELLINK, unix.AF_BRIDGE, 7, "vren", 3, nil), "vren/left"},
		{"its master cleared after that", linkUpdate(unix.RTM_NEWLINK, unix.AF_UNSPEC, 7, "vren", 0, nil), ""},
		{"a port deleted", linkUpdate(unix.RTM_DELLINK, unix.AF_UNSPEC, 5, "vold", 3, nil), "vold/left"},
		{"a deleted non-port", linkUpdate(unix.RTM_DELLINK, unix.AF_UNSPEC, 10, "vdock", 9, nil), ""},
		{"the bridge deleted", linkUpdate(unix.RTM_DELLINK, unix.AF_UNSPEC, 3, "boxnet", 0, nil), "/bridge boxnet went away"},
		{"a port of the old index is no port", linkUpdate(unix.RTM_NEWLINK, unix.AF_UNSPEC, 11, "vstale", 3, nil), ""},
		{"a bridge renamed to boxnet appears", linkUpdate(unix.RTM_NEWLINK, unix.AF_UNSPEC, 12, "boxnet", 0, nil), "/bridge boxnet appeared"},
		{"and its port joins", linkUpdate(unix.RTM_NEWLINK, unix.AF_UNSPEC, 13, "vb", 12, nil), "vb/joined"},
		{"the bridge renamed away", linkUpdate(unix.RTM_NEWLINK, unix.AF_UNSPEC, 12, "oldnet", 0, nil), "/bridge boxnet went away"},
	} {
		tr, ok := w.classify(step.ev)
		got := ""
		if ok {
			got = tr.port + "/" + tr.what
			assert.Equal(t, trigLink, tr.kind, step.name)
			assert.Equal(t, step.ev.at, tr.at, "%s: the trigger keeps the event's arrival", step.name)
		}
		assert.Equal(t, step.want, got, step.name)
	}
}

func TestWatcherReportLines(t *testing.T) {
	t0 := time.Now()
	done := t0.Add(2100 * time.Microsecond)
	link := func(port, what string) trigger { return trigger{kind: trigLink, at: t0, port: port, what: what} }
	lines := reportLines("boxnet", stack.PortsRefresh{Isolated: []string{"vj", "vf"}, Added: []string{"vj", "vr"}, Removed: []string{"vl", "ghost"}},
		[]trigger{link("vl", "left"), link("vj", "joined"), link("vf", "isolated turned off")}, done)
	assert.Equal(t, []string{
		"ghost: not a port of boxnet, removed from the port set 2.1ms after the link event",
		"vf: isolated turned back on 2.1ms after the link event",
		"vj: joined boxnet, isolated and in the port set 2.1ms after the link event",
		"vl: left boxnet, removed from the port set 2.1ms after the link event",
		"vr: joined boxnet, in the port set (it was isolated already) 2.1ms after the link event",
	}, lines)

	lines = reportLines("boxnet", stack.PortsRefresh{Isolated: []string{"va", "vi"}, Added: []string{"va"}, Removed: []string{"vr"},
		IsolatedAt: t0.Add(300 * time.Microsecond), AddedAt: t0.Add(700 * time.Microsecond)},
		[]trigger{link("va", "joined"), link("vi", "isolated turned off"), link("vr", "left")}, done)
	assert.Equal(t, []string{
		"va: joined boxnet, isolated and in the port set 0.7ms after the link event",
		"vi: isolated turned back on 0.3ms after the link event",
		"vr: left boxnet, removed from the port set 2.1ms after the link event",
	}, lines, "each change is timed when it took effect: the addition's commit, the flag, the refresh's end")

	lines = reportLines("boxnet", stack.PortsRefresh{Added: []string{"vnew"}, Removed: []string{"vold"}}, []trigger{link("vnew", "renamed from vold")}, done)
	assert.Equal(t, []string{
		"vnew: joined boxnet, in the port set (it was isolated already) 2.1ms after the link event",
		"vold: renamed to vnew, the old name removed from the port set 2.1ms after the link event",
	}, lines)
	// A port's own event, then its rename, in one refresh (the first
	// answer to each came before it): the rename is why the old name went.
	lines = reportLines("boxnet", stack.PortsRefresh{Removed: []string{"vold"}}, []trigger{link("vold", "isolated turned off"), link("vnew", "renamed from vold")}, done)
	assert.Equal(t, []string{"vold: renamed to vnew, the old name removed from the port set 2.1ms after the link event"}, lines)

	lines = reportLines("boxnet", stack.PortsRefresh{Isolated: []string{"v1"}, Added: []string{"v1"}},
		[]trigger{{kind: trigResync, at: t0}, {kind: trigLease, at: t0}}, done)
	assert.Equal(t, []string{"v1: joined boxnet, isolated and in the port set at the periodic resync"}, lines, "the earliest trigger is the cause of a port no event named")
	lines = reportLines("boxnet", stack.PortsRefresh{Isolated: []string{"v1"}}, []trigger{{kind: trigLease, at: t0}}, done)
	assert.Equal(t, []string{"v1: isolated turned back on 2.1ms after the lease file change"}, lines)
	lines = reportLines("boxnet", stack.PortsRefresh{Isolated: []string{"v1"}, Added: []string{"v1"}}, []trigger{{kind: trigSync, at: t0, what: "watcher started"}}, done)
	assert.Equal(t, []string{"v1: joined boxnet, isolated and in the port set at the full sync (watcher started)"}, lines)
	assert.Empty(t, reportLines("boxnet", stack.PortsRefresh{}, []trigger{link("v", "joined")}, done), "a refresh that changed nothing says nothing")
}

// The privileged tier: a throwaway namespace boxpw-<run>-host (never the
// machine's own, never the world's) with a bridge boxnet and box's nft
// tables in port-set mode.

type watchWorld struct {
	ns   *nstest.NS
	h    *netlink.Handle
	host *stack.Host
	log  *syncbuf.Buffer
}

func newWatchWorld(t testing.TB) *watchWorld {
	t.Helper()
	tier.Root(t)
	w := &watchWorld{ns: nstest.New(t, "boxpw-"+nstest.RunID()+"-host"), log: &syncbuf.Buffer{}}
	w.h = w.ns.Netlink(t)
	w.host = &stack.Host{NetNS: w.ns.Name}
	w.ns.AddBridge(t, "boxnet")
	w.ns.LinkUp(t, "boxnet")
	cfg := nft.Config{NetNS: int(w.ns.Handle), Gateway: netip.MustParseAddr("10.99.0.1")}
	caps := nft.Capabilities{Detail: "port-set mode, as on a kernel without nft bridge meta"}
	require.Equal(t, nft.ModePortSet, nft.Desired(cfg, caps).Mode)
	_, err := nft.Apply(cfg, caps, nil)
	require.NoError(t, err)
	return w
}

// watch runs the watcher until the test ends, once its first refresh (the
// full sync) is done; stop ends it and returns what WatchPorts returned.
func (w *watchWorld) watch(t testing.TB, o watchOptions) (stop func() error) {
	t.Helper()
	first := make(chan struct{})
	var once sync.Once
	inner := o.refreshed
	o.refreshed = func(r stack.PortsRefresh, c []trigger, at time.Time) {
		once.Do(func() { close(first) })
		if inner != nil {
			inner(r, c, at)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	var err error
	go func() { err = watchPorts(ctx, w.host, w.log, o); close(done) }()
	stop = func() error {
		cancel()
		select {
		case <-done:
			return err
		case <-time.After(5 * time.Second):
			return errors.New("the watcher did not stop within 5s of its context ending")
		}
	}
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Error(err)
		}
	})
	select {
	case <-first:
	case <-time.After(5 * time.Second):
		t.Fatalf("the watcher did not refresh within 5s of starting; its log:\n%s", w.log.String())
	}
	return stop
}

func (w *watchWorld) waitLog(t testing.TB, s string) {
	t.Helper()
	require.Eventually(t, func() bool { return strings.Contains(w.log.String(), s) }, 5*time.Second, 5*time.Millisecond,
		"the watcher's log never said %q; it said:\n%s", s, w.log.String())
}

// portSet reads the bridge drop's port set from the kernel.
func (w *watchWorld) portSet(t testing.TB) []string {
	t.Helper()
	c, err := nftables.New(nftables.WithNetNSFd(int(w.ns.Handle)))
	require.NoError(t, err)
	s, err := c.GetSetByName(&nftables.Table{Family: nftables.TableFamilyBridge, Name: "box"}, "boxnet_ports")
	require.NoError(t, err)
	elems, err := c.GetSetElements(s)
	require.NoError(t, err)
	out := []string{}
	for _, e := range elems {
		out = append(out, strings.TrimRight(string(e.Key), "\x00"))
	}
	sort.Strings(out)
	return out
}

// addToSet puts a name in the port set behind the watcher's back: no link
// event says so.
func (w *watchWorld) addToSet(t testing.TB, name string) {
	t.Helper()
	c, err := nftables.New(nftables.WithNetNSFd(int(w.ns.Handle)))
	require.NoError(t, err)
	key := make([]byte, unix.IFNAMSIZ)
	copy(key, name)
	s := &nftables.Set{Table: &nftables.Table{Family: nftables.TableFamilyBridge, Name: "box"}, Name: "boxnet_ports", KeyType: nftables.TypeIFName}
	require.NoError(t, c.SetAddElements(s, []nftables.SetElement{{Key: key}}))
	require.NoError(t, c.Flush())
}

// veth makes a veth pair name/name+"p", both ends in the world's namespace.
func (w *watchWorld) veth(t testing.TB, name string) netlink.Link {
	t.Helper()
	require.NoError(t, w.h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: name + "p"}))
	l, err := w.h.LinkByName(name)
	require.NoError(t, err)
	return l
}

func (w *watchWorld) enslave(t testing.TB, l netlink.Link) {
	t.Helper()
	br, err := w.h.LinkByName("boxnet")
	require.NoError(t, err)
	require.NoError(t, w.h.LinkSetMasterByIndex(l, br.Attrs().Index))
}

func (w *watchWorld) isolated(t testing.TB, name string) bool {
	t.Helper()
	l, err := w.h.LinkByName(name)
	require.NoError(t, err)
	pi, err := w.h.LinkGetProtinfo(l)
	require.NoError(t, err)
	return pi.Isolated
}

// settles waits (a bounded while) until cond holds.
func settles(t *testing.T, what string, cond func() bool) {
	t.Helper()
	require.Eventually(t, cond, 5*time.Second, 2*time.Millisecond, what)
}

func TestPrivilegedWatchPorts(t *testing.T) {
	w := newWatchWorld(t)
	// A port that is there before the watcher, unisolated and outside the
	// set: the full sync at the start takes it in.
	pre := w.veth(t, "vpre")
	w.enslave(t, pre)
	require.False(t, w.isolated(t, "vpre"))
	require.Empty(t, w.portSet(t))

	o := defaultWatchOptions()
	o.resync = time.Hour // nothing but the events under test refreshes
	stop := w.watch(t, o)
	settles(t, "the full sync isolates the existing port and puts it in the set", func() bool {
		return slices.Equal(w.portSet(t), []string{"vpre"}) && w.isolated(t, "vpre")
	})
	w.waitLog(t, "vpre: joined boxnet, isolated and in the port set at the full sync (watcher started)")

	pid, running, err := hostns.DaemonRunning(w.host.NetNS)
	require.NoError(t, err)
	assert.True(t, running, "DaemonRunning while it runs")
	assert.Equal(t, os.Getpid(), pid, "the lock file holds the watcher's PID")
	err = WatchPorts(context.Background(), w.host, io.Discard)
	require.Error(t, err, "a second watcher in the same namespace")
	assert.Contains(t, err.Error(), fmt.Sprintf("box's daemon (pid %d) already serves network namespace %s", os.Getpid(), w.ns.Name))

	// Each step is a kernel change no box command made, so only the
	// watcher can answer it; the set and the flag are read back from the
	// kernel.
	j := w.veth(t, "vjoin")
	w.enslave(t, j)
	settles(t, "an enslaved veth is isolated and in the set", func() bool {
		return slices.Equal(w.portSet(t), []string{"vjoin", "vpre"}) && w.isolated(t, "vjoin")
	})
	w.waitLog(t, "vjoin: joined boxnet, isolated and in the port set ")
	w.waitLog(t, "ms after the link event")

	require.NoError(t, w.h.LinkSetIsolated(j, false))
	settles(t, "isolated turned off by hand is turned back on", func() bool { return w.isolated(t, "vjoin") })
	w.waitLog(t, "vjoin: isolated turned back on ")

	require.NoError(t, w.h.LinkSetName(j, "vrenamed"))
	settles(t, "a renamed port is in the set under its new name only", func() bool {
		return slices.Equal(w.portSet(t), []string{"vpre", "vrenamed"})
	})
	w.waitLog(t, "vjoin: renamed to vrenamed, the old name removed from the port set ")

	require.NoError(t, w.h.LinkSetNoMaster(pre))
	settles(t, "a port released from the bridge leaves the set", func() bool {
		return slices.Equal(w.portSet(t), []string{"vrenamed"})
	})
	ren, err := w.h.LinkByName("vrenamed")
	require.NoError(t, err)
	require.NoError(t, w.h.LinkDel(ren))
	settles(t, "a deleted port leaves the set", func() bool { return len(w.portSet(t)) == 0 })
	w.waitLog(t, "vrenamed: left boxnet, removed from the port set ")

	// A bridge that becomes boxnet with a port already on it (renamed
	// into place): its appearance is the only event.
	w.ns.AddBridge(t, "boxnew")
	other := w.veth(t, "vother")
	newBr, err := w.h.LinkByName("boxnew")
	require.NoError(t, err)
	require.NoError(t, w.h.LinkSetMasterByIndex(other, newBr.Attrs().Index))
	// A port that joins boxnet after it: once the watcher has taken that
	// one in, a sync has run on the links as they were after vother's
	// move, so vother's absence is the watcher's answer, not its delay.
	mark := w.veth(t, "vmark")
	w.enslave(t, mark)
	settles(t, "a port that joins boxnet afterwards is isolated and in the set", func() bool {
		return slices.Contains(w.portSet(t), "vmark") && w.isolated(t, "vmark")
	})
	assert.Equal(t, []string{"vmark"}, w.portSet(t), "a port of another bridge stays out of the set")
	assert.False(t, w.isolated(t, "vother"), "and its flags are not box's")
	require.NoError(t, w.h.LinkDel(mark))
	settles(t, "the marker leaves the set", func() bool { return len(w.portSet(t)) == 0 })
	old, err := w.h.LinkByName("boxnet")
	require.NoError(t, err)
	require.NoError(t, w.h.LinkDel(old))
	require.NoError(t, w.h.LinkSetName(newBr, "boxnet"))
	settles(t, "the port of a bridge that appears as boxnet is isolated and in the set", func() bool {
		return slices.Equal(w.portSet(t), []string{"vother"}) && w.isolated(t, "vother")
	})
	w.waitLog(t, "(bridge boxnet appeared)")

	require.NoError(t, stop(), "WatchPorts returns nil when its context ends")
	_, running, err = hostns.DaemonRunning(w.host.NetNS)
	require.NoError(t, err)
	assert.False(t, running, "the lock is released when the watcher stops")
	t.Logf("watcher log:\n%s", w.log.String())
}

// TestPrivilegedWatchPortsFirstAnswer: a port that joins is isolated and
// in the set before the full refresh its event queues (held back here by
// a long debounce), which then finds nothing left to do for it; the
// first answer reads neither the bridge's ports nor the set, so beside a
// full bridge it costs what it costs beside an empty one.
func TestPrivilegedWatchPortsFirstAnswer(t *testing.T) {
	w := newWatchWorld(t)
	o := defaultWatchOptions()
	o.resync, o.debounce = time.Hour, 3*time.Second
	var mu sync.Mutex
	var refreshes []stack.PortsRefresh
	o.refreshed = func(r stack.PortsRefresh, _ []trigger, _ time.Time) {
		mu.Lock()
		defer mu.Unlock()
		refreshes = append(refreshes, r)
	}
	w.watch(t, o)
	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(refreshes)
	}
	first := count()
	w.enslave(t, w.veth(t, "vfast"))
	require.Eventually(t, func() bool { return slices.Equal(w.portSet(t), []string{"vfast"}) && w.isolated(t, "vfast") },
		time.Second, time.Millisecond, "the port is isolated and in the set at once")
	assert.Equal(t, first, count(), "before any full refresh: the debounce holds it for 3 s")
	w.waitLog(t, "vfast: joined boxnet, isolated and in the port set ")

	settles(t, "the full refresh follows", func() bool { return count() > first })
	mu.Lock()
	last := refreshes[len(refreshes)-1]
	mu.Unlock()
	assert.Empty(t, last.Isolated, "nothing left to isolate")
	assert.Empty(t, last.Added, "nothing left to add")
	assert.Equal(t, 1, strings.Count(w.log.String(), "vfast:"), "the port is logged once:\n%s", w.log.String())
}

func TestPrivilegedWatchPortsResubscribes(t *testing.T) {
	w := newWatchWorld(t)
	o := defaultWatchOptions()
	o.resync = time.Hour
	o.rcvbuf = 1 // the kernel's minimum: a burst of link events overflows it
	w.watch(t, o)
	var want []string
	for i := range 40 {
		name := fmt.Sprintf("vburst%d", i)
		w.enslave(t, w.veth(t, name))
		want = append(want, name)
	}
	sort.Strings(want)
	w.waitLog(t, "link subscription ended (")
	w.waitLog(t, "subscribing again")
	settles(t, "every port of the burst is isolated and in the set, lost events or not", func() bool {
		if !slices.Equal(w.portSet(t), want) {
			return false
		}
		for _, p := range want {
			if !w.isolated(t, p) {
				return false
			}
		}
		return true
	})
	t.Logf("watcher log:\n%s", w.log.String())
}

// fakeDnsmasq starts a process inside the namespace whose command line is
// what the stack looks for in a dnsmasq serving boxnet (a shell waiting on
// its stdin), and stops it by its PID.
func fakeDnsmasq(t *testing.T, ns *nstest.NS, leases string) (pid int, stop func()) {
	t.Helper()
	cmd := &exec.Cmd{Path: "/bin/sh", Args: []string{"dnsmasq", "-c", "read x", "--interface=boxnet", "--dhcp-leasefile=" + leases}}
	in, err := cmd.StdinPipe()
	require.NoError(t, err)
	require.NoError(t, ns.Run(cmd.Start), "starting a stand-in dnsmasq (needs /bin/sh)")
	var once sync.Once
	stop = func() {
		once.Do(func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			in.Close()
		})
	}
	t.Cleanup(stop)
	return cmd.Process.Pid, stop
}

// leaseFileWatch is the watcher's options for the lease file's tests: no
// periodic resync, dnsmasq looked for every 20 ms, and each refresh's
// causes sent on the channel it returns.
func leaseFileWatch() (watchOptions, chan []trigger) {
	o := defaultWatchOptions()
	o.resync = time.Hour
	o.leaseRecheck = 20 * time.Millisecond
	causes := make(chan []trigger, 100)
	o.refreshed = func(_ stack.PortsRefresh, c []trigger, _ time.Time) {
		select {
		case causes <- c:
		default:
		}
	}
	return o, causes
}

func TestPrivilegedWatchPortsLeaseFile(t *testing.T) {
	w := newWatchWorld(t)
	leases := filepath.Join(t.TempDir(), "dnsmasq.leases")
	require.NoError(t, os.WriteFile(leases, nil, 0o644))
	pid, stopDnsmasq := fakeDnsmasq(t, w.ns, leases)
	g, err := hostns.Open(w.host.NetNS)
	require.NoError(t, err)
	path, found := g.DnsmasqLeaseFile("boxnet")
	g.Close()
	require.Equal(t, pid, found, "the stand-in is found as the dnsmasq serving boxnet in the namespace")
	require.Equal(t, leases, path, "its lease file is read from --dhcp-leasefile=")

	o, causes := leaseFileWatch()
	w.watch(t, o)
	w.waitLog(t, fmt.Sprintf("watching the lease file %s (dnsmasq pid %d)", leases, pid))

	// A stale name in the set, put there with no link event: only a
	// refresh removes it, and nothing but the lease file can cause one.
	ghostGone := func(name, leases string) {
		t.Helper()
		w.addToSet(t, name)
		time.Sleep(100 * time.Millisecond)
		require.Equal(t, []string{name}, w.portSet(t), "negative control: nothing refreshes before the lease file changes")
		for len(causes) > 0 {
			<-causes
		}
		f, err := os.OpenFile(leases, os.O_APPEND|os.O_WRONLY, 0)
		require.NoError(t, err)
		_, err = fmt.Fprintf(f, "1700000000 00:16:3e:00:00:01 10.99.0.7 %s *\n", name)
		require.NoError(t, err)
		require.NoError(t, f.Close())
		settles(t, "a lease file write refreshes the set", func() bool { return len(w.portSet(t)) == 0 })
		select {
		case c := <-causes:
			require.NotEmpty(t, c)
			assert.Equal(t, trigLease, c[0].kind, "the refresh answered the lease file")
		case <-time.After(time.Second):
			t.Fatal("no refresh reported")
		}
		w.waitLog(t, name+": not a port of boxnet, removed from the port set ")
	}
	ghostGone("ghost0", leases)
	w.waitLog(t, "ms after the lease file change")

	// dnsmasq restarts with its lease file elsewhere: found again.
	stopDnsmasq()
	leases2 := filepath.Join(t.TempDir(), "dnsmasq.leases")
	require.NoError(t, os.WriteFile(leases2, nil, 0o644))
	pid2, _ := fakeDnsmasq(t, w.ns, leases2)
	w.waitLog(t, fmt.Sprintf("watching the lease file %s (dnsmasq pid %d)", leases2, pid2))
	for found := false; !found; {
		select {
		case c := <-causes:
			found = slices.ContainsFunc(c, func(t trigger) bool { return t.kind == trigLease && t.what == "dnsmasq found again" })
		case <-time.After(5 * time.Second):
			t.Fatal("finding dnsmasq again did not refresh")
		}
	}
	ghostGone("ghost1", leases2)
	t.Logf("watcher log:\n%s", w.log.String())
}

// BenchmarkPrivilegedWatchPortsJoin times a port's way into the set, from
// the enslave call and from the watcher's hearing of its event, beside a
// bridge with 2 and with 240 other ports (a full bridge of boxes): the
// first answer (joinPort) reads neither the bridge's ports nor the set, so
// it must not grow with them.
func BenchmarkPrivilegedWatchPortsJoin(b *testing.B) {
	for _, others := range []int{2, 240} {
		b.Run(fmt.Sprintf("ports=%d", others), func(b *testing.B) { benchJoin(b, others) })
	}
}

func benchJoin(b *testing.B, others int) {
	w := newWatchWorld(b)
	for i := range others {
		w.enslave(b, w.veth(b, fmt.Sprintf("vo%d", i)))
	}
	type done struct {
		r     stack.PortsRefresh
		cause trigger
	}
	// Where a port went in or out: its first answer, or a full refresh.
	changed := make(chan done, 1024)
	send := func(d done) {
		select {
		case changed <- d:
		default:
		}
	}
	o := defaultWatchOptions()
	o.resync = time.Hour
	o.answered = func(r stack.PortsRefresh, t trigger) { send(done{r, t}) }
	o.refreshed = func(r stack.PortsRefresh, c []trigger, _ time.Time) {
		for _, t := range c {
			send(done{r, t})
		}
		if len(c) == 0 {
			send(done{r: r})
		}
	}
	w.watch(b, o)
	waitFor := func(port string, added bool) done {
		for {
			select {
			case d := <-changed:
				list := d.r.Removed
				if added {
					list = d.r.Added
				}
				if slices.Contains(list, port) && (d.cause.port == port || !added) {
					return d
				}
			case <-time.After(5 * time.Second):
				b.Fatalf("%s never reported in or out of the set", port)
			}
		}
	}
	var fromCall, fromEvent []time.Duration
	b.ResetTimer()
	for i := range b.N {
		b.StopTimer()
		name := fmt.Sprintf("vb%d", i)
		l := w.veth(b, name)
		time.Sleep(3 * o.debounce) // a quiet period, as between box starts
		b.StartTimer()
		t0 := time.Now()
		w.enslave(b, l)
		d := waitFor(name, true)
		b.StopTimer()
		fromCall = append(fromCall, d.r.AddedAt.Sub(t0))
		fromEvent = append(fromEvent, d.r.AddedAt.Sub(d.cause.at))
		require.NoError(b, w.h.LinkDel(l))
		waitFor(name, false)
		b.StartTimer()
	}
	b.StopTimer()
	ms := func(ds []time.Duration, q float64) float64 {
		if len(ds) == 0 {
			return 0
		}
		s := slices.Clone(ds)
		slices.Sort(s)
		return float64(s[int(q*float64(len(s)-1))]) / float64(time.Millisecond)
	}
	b.ReportMetric(ms(fromCall, 0.5), "ms-enslave-to-set-p50")
	b.ReportMetric(ms(fromCall, 0.99), "ms-enslave-to-set-p99")
	b.ReportMetric(ms(fromCall, 1), "ms-enslave-to-set-max")
	b.ReportMetric(ms(fromEvent, 0.5), "ms-event-to-set-p50")
	b.ReportMetric(ms(fromEvent, 1), "ms-event-to-set-max")
}

// TestPrivilegedDaemonTakeOver: a daemon told to take over waits while
// another serves the namespace (as the renamed unit waits for the old one
// during an upgrade), then serves the moment that one stops.
func TestPrivilegedDaemonTakeOver(t *testing.T) {
	w := newWatchWorld(t)
	stopFirst := w.watch(t, defaultWatchOptions())
	second := &syncbuf.Buffer{}
	o := defaultWatchOptions()
	o.takeOver = 10 * time.Second
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- watchPorts(ctx, w.host, second, o) }()
	time.Sleep(500 * time.Millisecond)
	assert.NotContains(t, second.String(), "watching the ports", "it waits while the first serves")
	select {
	case err := <-done:
		t.Fatalf("the second daemon gave up while waiting: %v", err)
	default:
	}
	require.NoError(t, stopFirst())
	stopped := time.Now()
	require.Eventually(t, func() bool { return strings.Contains(second.String(), "watching the ports") }, 5*time.Second, time.Millisecond,
		"the second daemon took over; it said:\n%s", second.String())
	t.Logf("took over %s after the first stopped", time.Since(stopped).Round(time.Millisecond))
	cancel()
	require.NoError(t, <-done)
}

// TestPrivilegedDaemonStatus: the daemon writes what each service does and
// whether it is up, box doctor reads it while the daemon runs, and the file
// goes with the daemon.
func TestPrivilegedDaemonStatus(t *testing.T) {
	w := newWatchWorld(t)
	stop := w.watch(t, defaultWatchOptions())
	var st *hostns.DaemonStatus
	require.Eventually(t, func() bool {
		var err error
		st, err = hostns.ReadDaemonStatus(w.host.NetNS)
		require.NoError(t, err)
		return st != nil && len(st.Services) == 3 && st.Services[0].Up
	}, 5*time.Second, 5*time.Millisecond, "the status names the services, the port watcher up; log:\n%s", w.log.String())
	assert.Equal(t, os.Getpid(), st.PID)
	byName := map[string]hostns.ServiceState{}
	for _, s := range st.Services {
		byName[s.Name] = s
		assert.NotEmpty(t, s.Does, s.Name)
	}
	assert.ElementsMatch(t, []string{servicePorts, serviceRoutes, serviceEgress}, slices.Collect(maps.Keys(byName)), "no healer: WatchPorts runs none")
	// This namespace has no route table: the route watcher says so.
	require.Eventually(t, func() bool {
		st, _ := hostns.ReadDaemonStatus(w.host.NetNS)
		for _, s := range st.Services {
			if s.Name == serviceRoutes {
				return !s.Up && strings.Contains(s.Problem, "is missing")
			}
		}
		return false
	}, 5*time.Second, 5*time.Millisecond, "the route watcher is down while its table is missing")
	require.NoError(t, stop())
	st, err := hostns.ReadDaemonStatus(w.host.NetNS)
	require.NoError(t, err)
	assert.Nil(t, st, "no daemon, no status")
	ino, err := hostns.Inode(w.host.NetNS)
	require.NoError(t, err)
	assert.NoFileExists(t, hostns.DaemonStatusPath(ino))
}

// TestPrivilegedBootFromSavedFile is the boot in a throwaway namespace:
// box's tables load from the saved file with no Incus (the Host has no
// client: a call would panic) and no bridge yet; the watcher is ready
// before the bridge exists; then "Incus" makes the bridge and plugs a
// box's port in, and the port is in the bridge drop's set from its link
// event alone.
func TestPrivilegedBootFromSavedFile(t *testing.T) {
	tier.Root(t)
	ns := nstest.New(t, "boxboot-"+nstest.RunID()+"-host")
	path := filepath.Join(t.TempDir(), "firewall.json")
	h := &stack.Host{NetNS: ns.Name, Boot: stack.BootFiles{FirewallFile: path}, Lock: stack.SetupLock{Path: filepath.Join(t.TempDir(), "setup.lock")}}
	ctx := context.Background()

	_, err := h.EnsureBoot(ctx)
	require.ErrorContains(t, err, "run box setup-host once")

	require.NoError(t, h.BootFiles().SaveFirewall(func(s *stack.SavedFirewall) { s.Gateway = netip.MustParseAddr("10.99.0.1") }))
	rep, err := h.EnsureBoot(ctx)
	require.NoError(t, err)
	t.Logf("boot: %v; %v", rep.Changes, rep.Notes)
	cfg := nft.Config{NetNS: int(ns.Handle), Gateway: netip.MustParseAddr("10.99.0.1")}
	inet, bridge, err := nft.Present(cfg)
	require.NoError(t, err)
	assert.True(t, inet && bridge, "inet box and bridge box loaded before the bridge exists")
	pins, err := nft.PinsPresent(cfg)
	require.NoError(t, err)
	assert.True(t, pins, "the pin table too")
	again, err := h.EnsureBoot(ctx)
	require.NoError(t, err)
	for _, c := range again.Changes {
		assert.NotEqual(t, "nft", c.Object, "a second boot load changes no table: %v", c)
	}

	var ready atomic.Int32
	w := &watchWorld{ns: ns, log: &syncbuf.Buffer{}, h: ns.Netlink(t), host: h}
	o := defaultWatchOptions()
	o.ready = func() { ready.Add(1) }
	w.watch(t, o)
	assert.EqualValues(t, 1, ready.Load(), "ready after the first sync, with no bridge yet")

	ns.AddBridge(t, "boxnet")
	ns.LinkUp(t, "boxnet")
	l := w.veth(t, "vboot")
	start := time.Now()
	w.enslave(t, l)
	require.Eventually(t, func() bool { return slices.Contains(w.portSet(t), "vboot") }, 5*time.Second, time.Millisecond,
		"the port never joined the bridge drop's set; the watcher said:\n%s", w.log.String())
	t.Logf("port in the bridge drop's set %s after it joined the bridge", time.Since(start).Round(100*time.Microsecond))
	assert.True(t, w.isolated(t, "vboot"), "and isolated")
	assert.EqualValues(t, 1, ready.Load(), "ready is said once")
}

// A change of the lease file alone, with every port pinned and every
// lease at the address its own port's pin binds, changes nothing a
// refresh of the pins would: the worker skips it (beside a full bridge
// that refresh reads every instance, and every box's start writes the
// lease file). A lease astray is refreshed for.
func TestPrivilegedWatchPortsSkipsSettledLeases(t *testing.T) {
	w := newWatchWorld(t)
	w.enslave(t, w.veth(t, "vbox"))
	mac := net.HardwareAddr{0x10, 0x66, 0x6a, 0, 0, 1}
	cfg := nft.Config{NetNS: int(w.ns.Handle), Gateway: netip.MustParseAddr("10.99.0.1")}
	_, err := nft.ApplyPins(cfg, nft.Capabilities{}, []string{"vbox"}, []nft.Pin{{Port: "vbox", MAC: mac, Addrs: []netip.Addr{netip.MustParseAddr("10.99.0.5")}}})
	require.NoError(t, err)
	leases := filepath.Join(t.TempDir(), "dnsmasq.leases")
	require.NoError(t, os.WriteFile(leases, nil, 0o644))
	pid, _ := fakeDnsmasq(t, w.ns, leases)

	o, refreshed := leaseFileWatch()
	skipped := make(chan trigger, 10)
	o.pinsSkipped = func(c trigger) { skipped <- c }
	w.watch(t, o)
	w.waitLog(t, fmt.Sprintf("watching the lease file %s (dnsmasq pid %d)", leases, pid))
	lease := func(line string) (written time.Time) {
		t.Helper()
		// Quiet first: a change the watcher's own isolating of the port
		// made is a link event, and a kick with one is never skipped.
		for quiet := false; !quiet; {
			select {
			case <-refreshed:
			case <-time.After(300 * time.Millisecond):
				quiet = true
			}
		}
		written = time.Now()
		f, err := os.OpenFile(leases, os.O_APPEND|os.O_WRONLY, 0)
		require.NoError(t, err)
		_, err = fmt.Fprintln(f, line)
		require.NoError(t, err)
		require.NoError(t, f.Close())
		for heard := false; !heard; {
			select {
			case c := <-refreshed:
				heard = slices.ContainsFunc(c, func(t trigger) bool { return t.kind == trigLease })
			case <-time.After(2 * time.Second):
				t.Fatal("no refresh answered the lease file's change")
			}
		}
		return written
	}

	// skippedSince waits for a skip of a kick heard since written (an
	// earlier write's later events may still be skipped).
	skippedSince := func(written time.Time, what string) {
		t.Helper()
		for deadline := time.After(2 * time.Second); ; {
			select {
			case c := <-skipped:
				if !c.at.Before(written) {
					assert.Equal(t, trigLease, c.kind)
					return
				}
			case <-deadline:
				t.Fatalf("the pins' refresh for %s was not skipped", what)
			}
		}
	}
	skippedSince(lease("1700000000 10:66:6a:00:00:01 10.99.0.5 box *"), "a lease its port's pin binds")

	// A lease of a MAC on no port (a removed box's, left to expire)
	// changes no pin either.
	skippedSince(lease("1700000000 10:66:6a:00:00:02 10.99.0.6 gone *"), "a lease of a MAC on no port")

	// Control: the pinned port's MAC at an address its pin does not bind
	// (a lease astray). (The earlier writes' later events may still be
	// skipped: only a kick heard since this write counts.)
	written := lease("1700000000 10:66:6a:00:00:01 10.99.0.7 box *")
	for deadline := time.After(500 * time.Millisecond); ; {
		select {
		case c := <-skipped:
			require.False(t, c.at.After(written), "the pins' refresh for a lease no pin binds was skipped")
			continue
		case <-deadline:
		}
		break
	}
}
