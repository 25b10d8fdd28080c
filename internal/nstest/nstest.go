// Package nstest is for privileged tests (root: CAP_NET_ADMIN, and
// CAP_NET_RAW for raw sockets). It builds throwaway named network
// namespaces that are deleted in t.Cleanup whatever happens, runs code
// inside one on a locked OS thread, and wires them together with veth
// pairs, bridges and addresses.
//
// Namespaces are named, conventionally <prefix>-<run>-<role> with a prefix
// per test package (boxpt-, boxnft-) and a RunID per world, so a leak shows
// in `ip netns list` and says which package made it. Nothing here routes a
// namespace to the machine's own network.
package nstest

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/box-isolation/box/internal/nsrun"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// RunID returns a short random hex string that ties one test world's
// namespaces together.
func RunID() string {
	var b [3]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// NS is a throwaway named network namespace.
type NS struct {
	Name   string         // as `ip netns` names it
	Handle netns.NsHandle // open until cleanup; usable as a netns fd
}

// New creates the named namespace with lo up, without moving the test's
// own thread, and deletes it in t.Cleanup.
func New(t testing.TB, name string) *NS {
	t.Helper()
	n := &NS{Name: name}
	err := onThrowawayThread(func() error {
		h, err := netns.NewNamed(name)
		n.Handle = h
		return err
	})
	if err != nil {
		t.Fatalf("create namespace %s: %v", name, err)
	}
	t.Cleanup(func() {
		n.Handle.Close()
		if err := netns.DeleteNamed(n.Name); err != nil {
			t.Errorf("delete namespace %s: %v", n.Name, err)
		}
	})
	n.LinkUp(t, "lo")
	return n
}

// onThrowawayThread runs fn on a fresh locked OS thread that dies with its
// goroutine, so whatever namespace fn leaves it in never leaks elsewhere.
func onThrowawayThread(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		// No UnlockOSThread: the thread exits with the goroutine.
		errc <- fn()
	}()
	return <-errc
}

// Run calls fn on a locked OS thread inside the namespace (internal/nsrun).
// Sockets fn opens, and processes it starts, stay in the namespace
// whichever goroutine uses them later.
func (n *NS) Run(fn func() error) error {
	return nsrun.Do(n.Name, fn)
}

// Netlink returns a netlink handle in the namespace, closed in cleanup.
func (n *NS) Netlink(t testing.TB) *netlink.Handle {
	t.Helper()
	h, err := netlink.NewHandleAt(n.Handle)
	if err != nil {
		t.Fatalf("netlink in %s: %v", n.Name, err)
	}
	t.Cleanup(h.Close)
	return h
}

// Link looks a link up by name.
func (n *NS) Link(t testing.TB, name string) netlink.Link {
	t.Helper()
	l, err := n.Netlink(t).LinkByName(name)
	if err != nil {
		t.Fatalf("%s: link %s: %v", n.Name, name, err)
	}
	return l
}

// LinkUp sets a link administratively up.
func (n *NS) LinkUp(t testing.TB, name string) {
	t.Helper()
	if err := n.Netlink(t).LinkSetUp(n.Link(t, name)); err != nil {
		t.Fatalf("%s: set %s up: %v", n.Name, name, err)
	}
}

// AddAddr adds an address in CIDR form to a link; IPv6 addresses skip DAD
// so they work at once.
func (n *NS) AddAddr(t testing.TB, link, cidr string) {
	t.Helper()
	a, err := netlink.ParseAddr(cidr)
	if err != nil {
		t.Fatal(err)
	}
	if a.IP.To4() == nil {
		a.Flags = unix.IFA_F_NODAD
	}
	if err := n.Netlink(t).AddrAdd(n.Link(t, link), a); err != nil {
		t.Fatalf("%s: add %s to %s: %v", n.Name, cidr, link, err)
	}
}

// Sysctl writes a sysctl (dotted key, as sysctl(8) spells it) inside the
// namespace.
func (n *NS) Sysctl(key, value string) error {
	return n.Run(func() error {
		return os.WriteFile("/proc/sys/"+strings.ReplaceAll(key, ".", "/"), []byte(value), 0o644)
	})
}

// WaitOperUp waits until the kernel has seen carrier on every link. It
// reports carrier through linkwatch, up to a second late; until then a veth
// drops what it is given and IPv6 (addrconf, NDP) stays off on the link,
// while IPv4 addresses work at once.
func (n *NS) WaitOperUp(t testing.TB, links ...string) {
	t.Helper()
	h := n.Netlink(t)
	deadline := time.Now().Add(5 * time.Second)
	for _, name := range links {
		for {
			l, err := h.LinkByName(name)
			if err != nil {
				t.Fatalf("%s: link %s: %v", n.Name, name, err)
			}
			if l.Attrs().OperState == netlink.OperUp {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %s still %s after 5s", n.Name, name, l.Attrs().OperState)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// AddBridge creates a bridge, left down.
func (n *NS) AddBridge(t testing.TB, name string) {
	t.Helper()
	if err := n.Netlink(t).LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: name}}); err != nil {
		t.Fatalf("%s: bridge %s: %v", n.Name, name, err)
	}
}

// SetMaster makes link a port of bridge.
func (n *NS) SetMaster(t testing.TB, link, bridge string) {
	t.Helper()
	if err := n.Netlink(t).LinkSetMasterByIndex(n.Link(t, link), n.Link(t, bridge).Attrs().Index); err != nil {
		t.Fatalf("%s: enslave %s to %s: %v", n.Name, link, bridge, err)
	}
}

// Veth joins aName in a to bName in b with a veth pair; both ends stay
// down, so addresses can be set first.
func Veth(t testing.TB, a *NS, aName string, b *NS, bName string) {
	t.Helper()
	v := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: aName},
		PeerName:      bName,
		PeerNamespace: netlink.NsFd(int(b.Handle)),
	}
	if err := a.Netlink(t).LinkAdd(v); err != nil {
		t.Fatalf("veth %s/%s <-> %s/%s: %v", a.Name, aName, b.Name, bName, err)
	}
}
