package nft

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
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
// (0 or -1: the current one), sorted: the ports Apply and SyncPorts want. (The stack reads
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

// world is a host namespace with two bridges: boxnet with boxes a and b,
// and a bystander bridge "other" with c and d that box's tables must never
// disturb.
type world struct {
	host, a, b, c, d *testNS
	cfg              Config
	run              string
}

func newWorld(t *testing.T) *world {
	t.Helper()
	run := runID()
	w := &world{run: run, host: newNS(t, run, "host")}
	w.cfg = Config{Gateway: netip.MustParseAddr("10.99.0.1"), NetNS: int(w.host.Handle)}
	// br_netfilter is built in and on in every new namespace on these
	// machines (docs/world.md, "These machines"): bridged IPv4 would then also traverse the inet
	// hooks. Turn it off inside the host namespace so what stops box-to-box
	// traffic here is the bridge table and nothing else.
	for _, k := range []string{"iptables", "ip6tables", "arptables"} {
		if err := w.host.Sysctl("net.bridge.bridge-nf-call-"+k, "0"); err != nil {
			t.Logf("br_netfilter sysctl %s not set (%v): bridged frames skip the inet hooks anyway", k, err)
		}
	}
	w.host.bridge(t, "boxnet", "10.99.0.1/24")
	w.host.bridge(t, "other", "10.99.1.1/24")
	w.a, w.b = newNS(t, run, "a"), newNS(t, run, "b")
	w.c, w.d = newNS(t, run, "c"), newNS(t, run, "d")
	w.host.plug(t, "boxnet", "vA", w.a, "10.99.0.2/24")
	w.host.plug(t, "boxnet", "vB", w.b, "10.99.0.3/24")
	w.host.plug(t, "other", "oC", w.c, "10.99.1.2/24")
	w.host.plug(t, "other", "oD", w.d, "10.99.1.3/24")
	return w
}

func (w *world) ports(t *testing.T) []string {
	t.Helper()
	p, err := bridgePorts(w.cfg.NetNS, "boxnet")
	require.NoError(t, err)
	return p
}

// verifyClean asserts Verify finds nothing.
func verifyClean(t *testing.T, cfg Config, caps Capabilities, ports []string) {
	t.Helper()
	f, err := Verify(cfg, caps, ports)
	require.NoError(t, err)
	assert.Empty(t, f, "Verify after Apply")
}

// bystanders asserts the other bridge's pair still talk, both ways.
func (w *world) bystanders(t *testing.T) {
	t.Helper()
	assert.Equal(t, reached, w.c.ping(t, "10.99.1.3"), "c -> d on bridge other")
	assert.Equal(t, reached, w.d.ping(t, "10.99.1.2"), "d -> c on bridge other")
}

func TestPrivilegedTables(t *testing.T) {
	requireRoot(t)
	w := newWorld(t)
	cfg := w.cfg

	caps, err := Probe(cfg)
	require.NoError(t, err)
	t.Logf("probe: BridgeMeta=%v (%s); mode %s", caps.BridgeMeta, caps.Detail, caps.Mode())
	inet, bridge, err := Present(cfg)
	require.NoError(t, err)
	require.False(t, inet || bridge, "the probe leaves no table behind")

	// Positive controls: every path works before the tables exist, so a
	// blocked probe later is the tables' doing.
	w.host.serve(t, "tcp", "10.99.0.1:22", "host-boxnet")
	w.host.serve(t, "udp", "10.99.0.1:53", "host-dns")
	w.host.serve(t, "tcp", "10.99.1.1:22", "host-other")
	// A resolver on another host address: DNS is the box's only at the
	// gateway (box a reaches that address through the gateway).
	w.host.serve(t, "udp", "10.99.1.1:53", "host-dns-other")
	rt := w.a.Netlink(t)
	require.NoError(t, rt.RouteAdd(&netlink.Route{LinkIndex: w.a.Link(t, "eth0").Attrs().Index,
		Dst: &net.IPNet{IP: net.IPv4(10, 99, 1, 0), Mask: net.CIDRMask(24, 32)}, Gw: net.IPv4(10, 99, 0, 1)}))
	require.Equal(t, reached, w.a.dial(t, "udp", "10.99.1.1:53", "host-dns-other"), "a -> another host address udp 53 before Apply")
	require.Equal(t, reached, w.a.ping(t, "10.99.0.3"), "a -> b before Apply")
	require.Equal(t, reached, w.a.dial(t, "tcp", "10.99.0.1:22", "host-boxnet"), "a -> host tcp 22 before Apply")
	require.Equal(t, reached, w.a.dial(t, "udp", "10.99.0.1:53", "host-dns"), "a -> host udp 53 before Apply")
	w.bystanders(t)

	ports := w.ports(t)
	require.Equal(t, []string{"vA", "vB"}, ports)
	changes, err := Apply(cfg, caps, ports)
	require.NoError(t, err)
	t.Logf("Apply: %q", changes)
	assert.Equal(t, []string{"created table inet box", "created table bridge box"}, changes)
	inet, bridge, err = Present(cfg)
	require.NoError(t, err)
	assert.True(t, inet && bridge, "both tables present")

	t.Run("isolation", func(t *testing.T) {
		assert.Equal(t, silent, w.a.ping(t, "10.99.0.3"), "a -> b on boxnet")
		assert.Equal(t, silent, w.b.ping(t, "10.99.0.2"), "b -> a on boxnet")
		assert.Equal(t, silent, w.a.dial(t, "tcp", "10.99.0.1:22", "host-boxnet"), "a -> host tcp 22 is dropped")
		assert.Equal(t, silent, w.a.ping(t, "10.99.0.1"), "a -> host icmp is dropped")
		assert.Equal(t, reached, w.a.dial(t, "udp", "10.99.0.1:53", "host-dns"), "a -> host udp 53 (DNS) passes")
		assert.Equal(t, silent, w.a.dial(t, "udp", "10.99.1.1:53", "host-dns-other"), "a -> udp 53 on a host address other than the gateway is dropped")
		// Scope: the host firewall matches only traffic from boxnet, the
		// bridge drop only boxnet's ports.
		assert.Equal(t, reached, w.c.dial(t, "tcp", "10.99.1.1:22", "host-other"), "c -> host tcp 22 via bridge other")
		w.bystanders(t)
	})

	t.Run("idempotent", func(t *testing.T) {
		again, err := Apply(cfg, caps, ports)
		require.NoError(t, err)
		assert.Empty(t, again, "second Apply changes nothing")
		verifyClean(t, cfg, caps, ports)
	})

	t.Run("matches nft's own reading", func(t *testing.T) {
		// nft decodes the kernel's tables independently of this package; its
		// listing must equal String(), apart from how nft wraps a set's
		// elements (compared by Verify already).
		nft := tier.Tool(t, "nft", "nftables")
		out, err := exec.Command("ip", "netns", "exec", w.host.Name, nft, "list", "ruleset").CombinedOutput()
		require.NoError(t, err, "%s", out)
		want := Desired(cfg, caps).String()
		assert.Equal(t, want, dropElements(string(out)))
	})

	t.Run("drift: bridge table deleted", func(t *testing.T) {
		c, err := nftables.New(nftables.WithNetNSFd(cfg.NetNS))
		require.NoError(t, err)
		c.DelTable(&nftables.Table{Family: nftables.TableFamilyBridge, Name: "box"})
		require.NoError(t, c.Flush())
		assert.Equal(t, reached, w.a.ping(t, "10.99.0.3"), "without the bridge table a reaches b")

		f, err := Verify(cfg, caps, ports)
		require.NoError(t, err)
		assert.Equal(t, []Finding{{Object: "table bridge box", Problem: "missing"}}, f)
		changes, err := Apply(cfg, caps, ports)
		require.NoError(t, err)
		assert.Equal(t, []string{"created table bridge box"}, changes)
		verifyClean(t, cfg, caps, ports)
		assert.Equal(t, silent, w.a.ping(t, "10.99.0.3"), "repaired")
	})

	t.Run("drift: hole punched in the host firewall", func(t *testing.T) {
		c, err := nftables.New(nftables.WithNetNSFd(cfg.NetNS))
		require.NoError(t, err)
		tbl := &nftables.Table{Family: nftables.TableFamilyINet, Name: "box"}
		c.InsertRule(&nftables.Rule{Table: tbl, Chain: &nftables.Chain{Name: "input", Table: tbl},
			Exprs: rule(accept(), iifname("boxnet")).Exprs})
		require.NoError(t, c.Flush())
		assert.Equal(t, reached, w.a.dial(t, "tcp", "10.99.0.1:22", "host-boxnet"), "the hole works")

		f, err := Verify(cfg, caps, ports)
		require.NoError(t, err)
		require.NotEmpty(t, f)
		assert.Equal(t, "table inet box chain input", f[0].Object)
		assert.Contains(t, f[0].Problem, "unexpected rule 1")
		assert.Len(t, f, 1)
		t.Logf("findings: %v", f)
		changes, err := Apply(cfg, caps, ports)
		require.NoError(t, err)
		assert.Equal(t, []string{"replaced the rules of chain inet box input (1 rule unexpected)"}, changes)
		verifyClean(t, cfg, caps, ports)
		assert.Equal(t, silent, w.a.dial(t, "tcp", "10.99.0.1:22", "host-boxnet"), "hole closed")
	})

	t.Run("drift: chain policy", func(t *testing.T) {
		c, err := nftables.New(nftables.WithNetNSFd(cfg.NetNS))
		require.NoError(t, err)
		tbl := &nftables.Table{Family: nftables.TableFamilyBridge, Name: "box"}
		ch := chainOf(tbl, Desired(cfg, caps).Tables[1].Chains[0])
		ch.Policy = policyOf("drop")
		c.AddChain(ch) // an update of the existing base chain's policy
		require.NoError(t, c.Flush())
		f, err := Verify(cfg, caps, ports)
		require.NoError(t, err)
		assert.Equal(t, []Finding{{Object: "table bridge box chain forward", Problem: "policy is drop, want accept"}}, f)
		changes, err := Apply(cfg, caps, ports)
		require.NoError(t, err)
		assert.Equal(t, []string{"replaced table bridge box (chain forward policy is drop, want accept)"}, changes)
		verifyClean(t, cfg, caps, ports)
		w.bystanders(t)
	})

	t.Run("new port", func(t *testing.T) {
		e := newNS(t, w.run, "e")
		w.host.plug(t, "boxnet", "vE", e, "10.99.0.4/24")
		now := w.ports(t)
		require.Equal(t, []string{"vA", "vB", "vE"}, now)
		if caps.BridgeMeta {
			// The rules name the bridge, not its ports: a new port is
			// isolated at once, with no set to bring up to date.
			verifyClean(t, cfg, caps, now)
			assert.Equal(t, silent, e.ping(t, "10.99.0.2"), "e -> a on a port bridge-meta mode never listed")
			require.NoError(t, w.host.Netlink(t).LinkDel(w.host.Link(t, "vE")))
			return
		}
		f, err := Verify(cfg, caps, now)
		require.NoError(t, err)
		assert.Equal(t, []Finding{{Object: "table bridge box set boxnet_ports", Problem: "port set stale: missing ports vE"}}, f)
		assert.Equal(t, reached, e.ping(t, "10.99.0.2"), "a port missing from the set is not isolated: why a stale set is a finding")

		ch, err := SyncPorts(cfg, now)
		require.NoError(t, err)
		assert.Equal(t, []string{"vE"}, ch.Added, "SyncPorts names what it added")
		assert.Empty(t, ch.Removed)
		assert.False(t, ch.AddedAt.IsZero(), "and when")
		verifyClean(t, cfg, caps, now)
		assert.Equal(t, silent, e.ping(t, "10.99.0.2"), "e -> a once the set is current")
		ch, err = SyncPorts(cfg, now)
		require.NoError(t, err)
		assert.Equal(t, PortsChange{}, ch, "a second SyncPorts is a no-op")

		// The port goes away: the set keeps a stale name until refreshed.
		require.NoError(t, w.host.Netlink(t).LinkDel(w.host.Link(t, "vE")))
		f, err = Verify(cfg, caps, w.ports(t))
		require.NoError(t, err)
		assert.Equal(t, []Finding{{Object: "table bridge box set boxnet_ports", Problem: "port set stale: unexpected ports vE"}}, f)
		ch, err = SyncPorts(cfg, w.ports(t))
		require.NoError(t, err)
		assert.Empty(t, ch.Added)
		assert.Equal(t, []string{"vE"}, ch.Removed, "SyncPorts names what it removed")
		verifyClean(t, cfg, caps, w.ports(t))

		// Both at once (a port renamed): additions and removals are
		// committed in two batches, both land.
		ch, err = SyncPorts(cfg, []string{"vA", "vZ"})
		require.NoError(t, err)
		assert.Equal(t, []string{"vZ"}, ch.Added)
		assert.Equal(t, []string{"vB"}, ch.Removed)
		verifyClean(t, cfg, caps, []string{"vA", "vZ"})
		ch, err = SyncPorts(cfg, w.ports(t))
		require.NoError(t, err)
		assert.Equal(t, []string{"vB"}, ch.Added)
		assert.Equal(t, []string{"vZ"}, ch.Removed)
		verifyClean(t, cfg, caps, w.ports(t))

		// AddPorts (the watcher's first answer) adds without reading the
		// set: a name in it already is no error.
		require.NoError(t, AddPorts(cfg, []string{"vN"}))
		require.NoError(t, AddPorts(cfg, []string{"vA", "vN"}))
		verifyClean(t, cfg, caps, append(w.ports(t), "vN"))
		members, ok, err := PortSetMembers(cfg)
		require.NoError(t, err)
		assert.True(t, ok)
		assert.Equal(t, []string{"vA", "vB", "vN"}, members, "PortSetMembers reads the set as the kernel holds it")
		ch, err = SyncPorts(cfg, w.ports(t))
		require.NoError(t, err)
		assert.Equal(t, []string{"vN"}, ch.Removed)
	})

	t.Run("delete", func(t *testing.T) {
		removed, err := Delete(cfg)
		require.NoError(t, err)
		assert.Equal(t, []string{"table inet box", "table bridge box"}, removed)
		removed, err = Delete(cfg)
		require.NoError(t, err)
		assert.Empty(t, removed, "second Delete is a no-op")
		if !caps.BridgeMeta {
			assert.Error(t, AddPorts(cfg, []string{"vA"}), "no set to add to")
		}
		members, ok, err := PortSetMembers(cfg)
		require.NoError(t, err, "no table is no error")
		assert.False(t, ok)
		assert.Empty(t, members)
		inet, bridge, err := Present(cfg)
		require.NoError(t, err)
		assert.False(t, inet)
		assert.False(t, bridge)
		assert.Equal(t, reached, w.a.ping(t, "10.99.0.3"), "a -> b once the tables are gone")
		w.bystanders(t)
	})
}

// dropElements removes a set's `elements = { ... }` block, which nft
// wraps over several lines, from an nft listing.
func dropElements(s string) string {
	var out []string
	in := false
	for _, l := range strings.SplitAfter(s, "\n") {
		if strings.Contains(l, "elements = {") {
			in = true
		}
		if !in {
			out = append(out, l)
		}
		if in && strings.Contains(l, "}") {
			in = false
		}
	}
	return strings.Join(out, "")
}

// TestPrivilegedApplyIsAtomic asks for bridge-meta mode regardless of what
// the kernel supports. Where the kernel lacks it, the batch must fail as a
// whole: not even the inet table may be left behind.
func TestPrivilegedApplyIsAtomic(t *testing.T) {
	requireRoot(t)
	host := newNS(t, runID(), "atomic")
	cfg := Config{Gateway: testGW, NetNS: int(host.Handle)}
	caps, err := Probe(cfg)
	require.NoError(t, err)
	changes, err := Apply(cfg, Capabilities{BridgeMeta: true}, nil)
	if caps.BridgeMeta {
		require.NoError(t, err)
		assert.Len(t, changes, 2)
		return
	}
	require.Error(t, err, "the kernel lacks bridge meta, so the batch must fail")
	t.Logf("Apply in bridge-meta mode on this kernel: %v", err)
	assert.Empty(t, changes)
	inet, bridge, err := Present(cfg)
	require.NoError(t, err)
	assert.False(t, inet || bridge, "a failed batch leaves nothing")
}

// TestPrivilegedOtherNames runs the legacy generation's names and a port
// list with no bridge in the namespace, and checks the tables of another
// config sharing the namespace are left alone.
func TestPrivilegedOtherNames(t *testing.T) {
	requireRoot(t)
	host := newNS(t, runID(), "names")
	box := Config{Gateway: testGW, NetNS: int(host.Handle)}
	legacy := Config{Table: "claudebox", Bridge: "claudenet", Gateway: testGW, NetNS: int(host.Handle)}
	caps, err := Probe(box)
	require.NoError(t, err)
	_, err = Apply(box, caps, []string{"vethX"})
	require.NoError(t, err)
	_, err = Apply(legacy, caps, []string{"vethY"})
	require.NoError(t, err)
	verifyClean(t, box, caps, []string{"vethX"})
	verifyClean(t, legacy, caps, []string{"vethY"})

	removed, err := Delete(legacy)
	require.NoError(t, err)
	assert.Equal(t, []string{"table inet claudebox", "table bridge claudebox"}, removed)
	verifyClean(t, box, caps, []string{"vethX"})
	changes, err := Apply(box, caps, []string{"vethX"})
	require.NoError(t, err)
	assert.Empty(t, changes, "deleting the other config's tables did not touch these")
	_, err = Delete(box)
	require.NoError(t, err)
}
