package nft

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"

	"github.com/box-isolation/box/internal/nstest"
	"github.com/box-isolation/box/internal/testenv/tier"
)

// The privileged tier's world: throwaway network namespaces
// (internal/nstest) named boxnft-<run>-<role>, deleted in t.Cleanup
// whatever happens. Nothing in them has a route out, and every nft change
// happens inside them; the machine's own ruleset is never read or written.

// requireRoot skips unless root; BOX_REQUIRE_TIERS=1 (set by `make test`)
// turns the skip into a failure.
func requireRoot(t *testing.T) {
	t.Helper()
	tier.Root(t)
}

// runID ties one world's namespaces together.
var runID = nstest.RunID

// testNS is a throwaway namespace (internal/nstest) with this package's
// helpers on it.
type testNS struct{ *nstest.NS }

// newNS creates boxnft-<run>-<role> (named so `ip netns list` shows a leak)
// with lo up, and deletes it in cleanup.
func newNS(t *testing.T, run, role string) *testNS {
	t.Helper()
	return &testNS{nstest.New(t, "boxnft-"+run+"-"+role)}
}

func (n *testNS) bridge(t *testing.T, name, cidr string) {
	t.Helper()
	n.AddBridge(t, name)
	if cidr != "" {
		n.AddAddr(t, name, cidr)
	}
	n.LinkUp(t, name)
}

// plug adds a veth port named port on bridge br of host n whose other end
// is eth0 in box, addressed cidr.
func (n *testNS) plug(t *testing.T, br, port string, box *testNS, cidr string) {
	t.Helper()
	nstest.Veth(t, n.NS, port, box.NS, "eth0")
	n.SetMaster(t, port, br)
	n.LinkUp(t, port)
	box.AddAddr(t, "eth0", cidr)
	box.LinkUp(t, "eth0")
	// Until carrier is seen the veth drops what it is given, which would
	// read as a blocked probe.
	n.WaitOperUp(t, port)
	box.WaitOperUp(t, "eth0")
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
	err := n.Run(func() error {
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
		t.Fatalf("%s: ping %s: %v", n.Name, dst, err)
	}
	return out
}

// serve opens a TCP and a UDP listener in n at addr; both greet with
// "greeting:" so a client can prove the intended host answered.
func (n *testNS) serve(t *testing.T, network, addr, greeting string) {
	t.Helper()
	err := n.Run(func() error {
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
		t.Fatalf("%s: listen %s %s: %v", n.Name, network, addr, err)
	}
}

// dial connects from n to a listener made by serve and reads its greeting.
func (n *testNS) dial(t *testing.T, network, addr, greeting string) outcome {
	t.Helper()
	var out outcome
	err := n.Run(func() error {
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
		t.Fatalf("%s: %s %s: %v", n.Name, network, addr, err)
	}
	return out
}

// bridgePorts lists the interfaces enslaved to bridge in the namespace nsFd
// (0 or -1: the current one), sorted: the ports Apply and SetPorts want. (The stack reads
// them itself; this is the tests' own reading.)
func bridgePorts(nsFd int, bridge string) ([]string, error) {
	var h *netlink.Handle
	var err error
	if nsFd > 0 {
		h, err = netlink.NewHandleAt(netns.NsHandle(nsFd))
	} else {
		h, err = netlink.NewHandle()
	}
	if err != nil {
		return nil, fmt.Errorf("opening rtnetlink: %w", err)
	}
	defer h.Close()
	br, err := h.LinkByName(bridge)
	if err != nil {
		return nil, fmt.Errorf("finding bridge %s: %w", bridge, err)
	}
	links, err := h.LinkList()
	if err != nil {
		return nil, fmt.Errorf("listing links: %w", err)
	}
	var ports []string
	for _, l := range links {
		if l.Attrs().MasterIndex == br.Attrs().Index {
			ports = append(ports, l.Attrs().Name)
		}
	}
	slices.Sort(ports)
	return ports, nil
}
