package nft

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"
)

// The privileged tier's world: throwaway network namespaces named
// boxnft-<run>-<role>, deleted in t.Cleanup whatever happens. Nothing in
// them has a route out, and every nft change happens inside them; the
// machine's own ruleset is never read or written.

// requireRoot skips unless root; BOX_REQUIRE_TIERS=1 (set by `make test`,
// see internal/testenv) turns the skip into a failure.
func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	const why = "needs root: run as root (make test)"
	if os.Getenv("BOX_REQUIRE_TIERS") == "1" {
		t.Fatal(why + " (BOX_REQUIRE_TIERS=1 says every tier must run)")
	}
	t.Skip(why)
}

func runID() string {
	var b [3]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

type testNS struct {
	name string
	h    netns.NsHandle
}

// onLockedThread runs fn on a fresh OS thread that is thrown away
// afterwards, so a namespace switch can never leak into another goroutine.
func onLockedThread(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		// No UnlockOSThread: the thread exits with the goroutine.
		errc <- fn()
	}()
	return <-errc
}

// newNS creates a named namespace (named so `ip netns list` shows a leak)
// with lo up, and deletes it in cleanup.
func newNS(t *testing.T, run, role string) *testNS {
	t.Helper()
	n := &testNS{name: "boxnft-" + run + "-" + role}
	err := onLockedThread(func() error {
		h, err := netns.NewNamed(n.name)
		n.h = h
		return err
	})
	if err != nil {
		t.Fatalf("creating namespace %s: %v", n.name, err)
	}
	t.Cleanup(func() {
		n.h.Close()
		if err := netns.DeleteNamed(n.name); err != nil {
			t.Errorf("deleting namespace %s: %v", n.name, err)
		}
	})
	n.up(t, "lo")
	return n
}

func (n *testNS) run(fn func() error) error {
	return onLockedThread(func() error {
		if err := netns.Set(n.h); err != nil {
			return fmt.Errorf("entering %s: %w", n.name, err)
		}
		return fn()
	})
}

func (n *testNS) nl(t *testing.T) *netlink.Handle {
	t.Helper()
	h, err := netlink.NewHandleAt(n.h)
	if err != nil {
		t.Fatalf("netlink in %s: %v", n.name, err)
	}
	t.Cleanup(h.Close)
	return h
}

func (n *testNS) link(t *testing.T, name string) netlink.Link {
	t.Helper()
	l, err := n.nl(t).LinkByName(name)
	if err != nil {
		t.Fatalf("%s: link %s: %v", n.name, name, err)
	}
	return l
}

func (n *testNS) up(t *testing.T, name string) {
	t.Helper()
	if err := n.nl(t).LinkSetUp(n.link(t, name)); err != nil {
		t.Fatalf("%s: set %s up: %v", n.name, name, err)
	}
}

func (n *testNS) addr(t *testing.T, link, cidr string) {
	t.Helper()
	a, err := netlink.ParseAddr(cidr)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.nl(t).AddrAdd(n.link(t, link), a); err != nil {
		t.Fatalf("%s: add %s to %s: %v", n.name, cidr, link, err)
	}
}

func (n *testNS) sysctl(t *testing.T, key, value string) error {
	t.Helper()
	return n.run(func() error {
		return os.WriteFile("/proc/sys/"+strings.ReplaceAll(key, ".", "/"), []byte(value), 0o644)
	})
}

func (n *testNS) bridge(t *testing.T, name, cidr string) {
	t.Helper()
	if err := n.nl(t).LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: name}}); err != nil {
		t.Fatalf("%s: bridge %s: %v", n.name, name, err)
	}
	if cidr != "" {
		n.addr(t, name, cidr)
	}
	n.up(t, name)
}

// plug adds a veth port named port on bridge br of host n whose other end
// is eth0 in box, addressed cidr.
func (n *testNS) plug(t *testing.T, br, port string, box *testNS, cidr string) {
	t.Helper()
	v := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: port, MasterIndex: n.link(t, br).Attrs().Index},
		PeerName:      "eth0",
		PeerNamespace: netlink.NsFd(int(box.h)),
	}
	if err := n.nl(t).LinkAdd(v); err != nil {
		t.Fatalf("veth %s/%s <-> %s/eth0: %v", n.name, port, box.name, err)
	}
	n.up(t, port)
	box.addr(t, "eth0", cidr)
	box.up(t, "eth0")
	// The kernel reports carrier through linkwatch, up to a second late;
	// until then the veth drops what it is given, which would read as a
	// blocked probe.
	n.waitOperUp(t, port)
	box.waitOperUp(t, "eth0")
}

func (n *testNS) waitOperUp(t *testing.T, name string) {
	t.Helper()
	h := n.nl(t)
	deadline := time.Now().Add(3 * time.Second)
	for {
		l, err := h.LinkByName(name)
		if err != nil {
			t.Fatalf("%s: link %s: %v", n.name, name, err)
		}
		if l.Attrs().OperState == netlink.OperUp {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %s not operationally up after 3s", n.name, name)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// outcome of one probe: what an isolation claim cares about.
type outcome string

const (
	reached outcome = "reached" // the intended peer answered and proved it
	silent  outcome = "silent"  // nothing came back before the deadline
)

const probeWait = 800 * time.Millisecond

// ping sends one ICMP echo with a nonce from n to dst and waits for the
// echo reply carrying it back from dst.
func (n *testNS) ping(t *testing.T, dst string) outcome {
	t.Helper()
	var out outcome
	err := n.run(func() error {
		c, err := icmp.ListenPacket("ip4:icmp", "0.0.0.0")
		if err != nil {
			return err
		}
		defer c.Close()
		nonce := []byte("boxnft-" + runID())
		id := int(nonce[len(nonce)-1])<<8 | int(nonce[len(nonce)-2])
		msg := icmp.Message{Type: ipv4.ICMPTypeEcho, Body: &icmp.Echo{ID: id, Seq: 1, Data: nonce}}
		b, err := msg.Marshal(nil)
		if err != nil {
			return err
		}
		if _, err := c.WriteTo(b, &net.IPAddr{IP: net.ParseIP(dst)}); err != nil {
			return err
		}
		if err := c.SetReadDeadline(time.Now().Add(probeWait)); err != nil {
			return err
		}
		buf := make([]byte, 1500)
		for {
			k, peer, err := c.ReadFrom(buf)
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				out = silent
				return nil
			}
			if err != nil {
				return err
			}
			m, err := icmp.ParseMessage(1, buf[:k])
			if err != nil || m.Type != ipv4.ICMPTypeEchoReply || peer.String() != dst {
				continue
			}
			if e, ok := m.Body.(*icmp.Echo); ok && e.ID == id && bytes.Equal(e.Data, nonce) {
				out = reached
				return nil
			}
		}
	})
	if err != nil {
		t.Fatalf("%s: ping %s: %v", n.name, dst, err)
	}
	return out
}

// serve opens a TCP and a UDP listener in n at addr; both greet with
// "greeting:" so a client can prove the intended host answered.
func (n *testNS) serve(t *testing.T, network, addr, greeting string) {
	t.Helper()
	err := n.run(func() error {
		switch network {
		case "tcp":
			l, err := net.Listen("tcp", addr)
			if err != nil {
				return err
			}
			t.Cleanup(func() { l.Close() })
			go func() {
				for {
					c, err := l.Accept()
					if err != nil {
						return
					}
					_, _ = c.Write([]byte(greeting))
					c.Close()
				}
			}()
		case "udp":
			pc, err := net.ListenPacket("udp", addr)
			if err != nil {
				return err
			}
			t.Cleanup(func() { pc.Close() })
			go func() {
				buf := make([]byte, 1500)
				for {
					k, from, err := pc.ReadFrom(buf)
					if err != nil {
						return
					}
					_, _ = pc.WriteTo(append([]byte(greeting+":"), buf[:k]...), from)
				}
			}()
		}
		return nil
	})
	if err != nil {
		t.Fatalf("%s: listen %s %s: %v", n.name, network, addr, err)
	}
}

// dial connects from n to a listener made by serve and reads its greeting.
func (n *testNS) dial(t *testing.T, network, addr, greeting string) outcome {
	t.Helper()
	var out outcome
	err := n.run(func() error {
		c, err := net.DialTimeout(network, addr, probeWait)
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			out = silent
			return nil
		}
		if err != nil {
			return err // refused or unreachable: not what any case expects
		}
		defer c.Close()
		nonce := runID()
		if network == "udp" {
			if _, err := c.Write([]byte(nonce)); err != nil {
				return err
			}
		}
		if err := c.SetReadDeadline(time.Now().Add(probeWait)); err != nil {
			return err
		}
		buf := make([]byte, 256)
		k, err := c.Read(buf)
		if errors.As(err, &ne) && ne.Timeout() {
			out = silent
			return nil
		}
		if err != nil {
			return err
		}
		want := greeting
		if network == "udp" {
			want += ":" + nonce
		}
		if string(buf[:k]) != want {
			return fmt.Errorf("answer %q, want %q", buf[:k], want)
		}
		out = reached
		return nil
	})
	if err != nil {
		t.Fatalf("%s: %s %s: %v", n.name, network, addr, err)
	}
	return out
}
