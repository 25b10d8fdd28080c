package guard

import (
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"

	"github.com/box-isolation/box/internal/nstest"
	"github.com/box-isolation/box/internal/testenv/tier"
)

// The privileged tier's world for the guard: throwaway namespaces
// boxgd-<run>-<role> (internal/nstest), deleted in cleanup. "host" has the
// bridge boxnet (10.88.0.1/24) with one box on it, an uplink to "inet"
// (the default route; inet holds the public address 203.0.113.10) and a
// link to "lan" (192.168.20.0/24, which also holds the public address
// 192.0.2.7, routed there and not by the default route). Nothing in them
// has a route off the machine; every nft command runs inside "host".

type guardWorld struct {
	host, box, inet, lan *nstest.NS
}

func newGuardWorld(t *testing.T) *guardWorld {
	t.Helper()
	run := nstest.RunID()
	w := &guardWorld{}
	for role, n := range map[string]**nstest.NS{"host": &w.host, "box": &w.box, "inet": &w.inet, "lan": &w.lan} {
		*n = nstest.New(t, "boxgd-"+run+"-"+role)
	}
	require.NoError(t, w.host.Sysctl("net.ipv4.ip_forward", "1"))
	w.host.AddBridge(t, "boxnet")
	w.host.AddAddr(t, "boxnet", "10.88.0.1/24")
	w.host.LinkUp(t, "boxnet")
	nstest.Veth(t, w.host, "vbox", w.box, "eth0")
	w.host.SetMaster(t, "vbox", "boxnet")
	w.host.LinkUp(t, "vbox")
	w.box.AddAddr(t, "eth0", "10.88.0.2/24")
	w.box.LinkUp(t, "eth0")
	link(t, w.host, "up", "198.51.100.2/24", w.inet, "eth0", "198.51.100.1/24")
	w.inet.AddAddr(t, "lo", "203.0.113.10/32")
	link(t, w.host, "lan", "192.168.20.1/24", w.lan, "eth0", "192.168.20.2/24")
	w.lan.AddAddr(t, "lo", "192.0.2.7/32")
	w.host.WaitOperUp(t, "vbox", "up", "lan")
	w.box.WaitOperUp(t, "eth0")
	route(t, w.box, "0.0.0.0/0", "10.88.0.1")
	route(t, w.host, "0.0.0.0/0", "198.51.100.1")
	route(t, w.host, "192.0.2.7/32", "192.168.20.2")
	route(t, w.inet, "10.88.0.0/24", "198.51.100.2")
	route(t, w.lan, "10.88.0.0/24", "192.168.20.1")
	return w
}

// link joins a and b by a veth pair, each end addressed and up.
func link(tb testing.TB, a *nstest.NS, aName, aCIDR string, b *nstest.NS, bName, bCIDR string) {
	tb.Helper()
	nstest.Veth(tb, a, aName, b, bName)
	a.AddAddr(tb, aName, aCIDR)
	a.LinkUp(tb, aName)
	b.AddAddr(tb, bName, bCIDR)
	b.LinkUp(tb, bName)
}

func route(tb testing.TB, n *nstest.NS, dst, via string) {
	tb.Helper()
	_, d, err := net.ParseCIDR(dst)
	require.NoError(tb, err)
	require.NoError(tb, n.Netlink(tb).RouteAdd(&netlink.Route{Dst: d, Gw: net.ParseIP(via)}), "%s: route %s via %s", n.Name, dst, via)
}

// target is a UDP listener in a namespace.
type target struct {
	name string
	ns   *nstest.NS
	addr netip.AddrPort
	conn net.PacketConn
}

func listen(t *testing.T, name string, ns *nstest.NS, addr string) *target {
	t.Helper()
	tg := &target{name: name, ns: ns, addr: netip.MustParseAddrPort(addr)}
	require.NoError(t, ns.Run(func() error {
		var err error
		tg.conn, err = net.ListenPacket("udp4", addr)
		return err
	}))
	t.Cleanup(func() { tg.conn.Close() })
	return tg
}

// reached sends one datagram from the box to the target and says whether
// it arrived within half a second.
func (w *guardWorld) reached(t *testing.T, tg *target) bool {
	t.Helper()
	_, ok := sendFrom(t, w.box, tg)
	return ok
}

// sendFrom sends one datagram from namespace from to the target and
// returns the source it arrived from, if it arrived within half a second.
func sendFrom(t *testing.T, from *nstest.NS, tg *target) (netip.Addr, bool) {
	t.Helper()
	payload := fmt.Sprintf("probe %s %d", tg.name, time.Now().UnixNano())
	require.NoError(t, from.Run(func() error {
		c, err := net.Dial("udp4", tg.addr.String())
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Write([]byte(payload))
		return err
	}))
	buf := make([]byte, 256)
	deadline := time.Now().Add(500 * time.Millisecond)
	for {
		require.NoError(t, tg.conn.SetReadDeadline(deadline))
		n, src, err := tg.conn.ReadFrom(buf)
		if err != nil {
			return netip.Addr{}, false
		}
		if string(buf[:n]) == payload {
			return src.(*net.UDPAddr).AddrPort().Addr().Unmap(), true
		}
	}
}

// On the bridge's ingress the guard passes DHCP and DNS to the gateway,
// DNS to box's egress resolver, and what the routing table forwards out
// of the default route to a public address, and drops the rest: another
// port of the gateway or of the resolver's address, the host's uplink
// address, a private LAN address, a public address routed to the LAN;
// ARP still resolves. Each drop is shown reachable without the guard
// first (so the guard, not the topology, dropped it), counted under its
// reason, and still dropped after `nft flush ruleset` in the host's
// namespace, which leaves the guard attached.
func TestPrivilegedGuard(t *testing.T) {
	tier.Root(t)
	nft := tier.Tool(t, "nft", "nftables")
	w := newGuardWorld(t)
	w.host.AddAddr(t, "lo", "192.0.0.8/32") // box's egress resolver address
	dns := listen(t, "DNS at the gateway", w.host, "10.88.0.1:53")
	dhcp := listen(t, "DHCP at the gateway", w.host, "10.88.0.1:67")
	resolver := listen(t, "DNS at the egress resolver", w.host, "192.0.0.8:53")
	resolverOther := listen(t, "another port of the egress resolver's address", w.host, "192.0.0.8:9999")
	other := listen(t, "another port of the gateway", w.host, "10.88.0.1:9999")
	uplink := listen(t, "the host's uplink address", w.host, "198.51.100.2:9999")
	lan := listen(t, "a LAN host", w.lan, "192.168.20.2:9999")
	routedLAN := listen(t, "a public address routed to the LAN", w.lan, "192.0.2.7:9999")
	public := listen(t, "a public address by the default route", w.inet, "203.0.113.10:9999")
	// Public, out of the default route's interface, but not by the
	// default route: its gateway itself (the uplink's own subnet), and a
	// prefix another gateway on that subnet routes.
	router := listen(t, "the default route's gateway, on the uplink's own subnet", w.inet, "198.51.100.1:9999")
	w.inet.AddAddr(t, "eth0", "198.51.100.254/24")
	w.inet.AddAddr(t, "lo", "203.0.113.99/32")
	route(t, w.host, "203.0.113.99/32", "198.51.100.254")
	otherGW := listen(t, "a public address routed by another gateway on the uplink", w.inet, "203.0.113.99:9999")
	all := []*target{dns, dhcp, resolver, resolverOther, other, uplink, lan, routedLAN, public, router, otherGW}
	passes := map[*target]bool{dns: true, dhcp: true, resolver: true, public: true}

	for _, tg := range all {
		assert.True(t, w.reached(t, tg), "without the guard, %s is reached (the control)", tg.name)
	}

	p, err := Build(testConfig)
	require.NoError(t, err)
	h := w.host.Netlink(t)
	att, err := Attach(h, "boxnet", p)
	require.NoError(t, err)
	tag, err := p.KernelTag()
	require.NoError(t, err)
	assert.Equal(t, tag, att.Tag, "the kernel's tag is box's own build's")
	elsewhere, err := Build(Config{Subnet: testConfig.Subnet, Gateway: testConfig.Gateway})
	require.NoError(t, err)
	otherTag, err := elsewhere.KernelTag()
	require.NoError(t, err)
	assert.NotEqual(t, tag, otherTag, "a build for other addresses has another tag")
	assert.True(t, att.DirectAction)

	// The box asks for the gateway's MAC again, through the guard.
	out, err := exec.Command("ip", "-n", w.box.Name, "neigh", "flush", "all").CombinedOutput()
	require.NoError(t, err, "%s", out)
	check := func(when string) {
		for _, tg := range all {
			assert.Equal(t, passes[tg], w.reached(t, tg), "%s: %s reached", when, tg.name)
		}
	}
	check("guarded")
	got, err := Counters(att.ID)
	require.NoError(t, err)
	t.Logf("counters: %v", got)
	for _, r := range []Reason{PassDNS, PassDHCP, PassForward, DropHost, DropRange, DropRoute, PassARP} {
		assert.NotZero(t, got[r], "counted under %s", r)
	}
	assert.GreaterOrEqual(t, got[DropRoute], uint64(4), "the uplink address, the LAN-routed public address, the router and the other gateway's prefix")
	assert.GreaterOrEqual(t, got[PassDNS], uint64(2), "the gateway's and the resolver's")
	assert.GreaterOrEqual(t, got[DropRange], uint64(2), "the LAN host and the resolver's other port")

	// The neighbour of the gateway resolved through the guard (ARP).
	neigh, err := w.box.Netlink(t).NeighList(0, netlink.FAMILY_V4)
	require.NoError(t, err)
	resolved := false
	for _, n := range neigh {
		resolved = resolved || (n.IP.Equal(net.ParseIP("10.88.0.1")) && n.HardwareAddr != nil)
	}
	assert.True(t, resolved, "ARP for the gateway answered: %v", neigh)

	// Another tool flushes the ruleset: the guard is not in it.
	out, err = exec.Command("ip", "netns", "exec", w.host.Name, nft, "add table inet other").CombinedOutput()
	require.NoError(t, err, "%s", out)
	out, err = exec.Command("ip", "netns", "exec", w.host.Name, nft, "flush ruleset").CombinedOutput()
	require.NoError(t, err, "%s", out)
	found, err := Find(h, "boxnet")
	require.NoError(t, err)
	require.Len(t, found, 1)
	assert.Equal(t, att.ID, found[0].ID, "the same program, untouched")
	check("after nft flush ruleset")
	again, err := Counters(att.ID)
	require.NoError(t, err)
	assert.Greater(t, again[DropHost], got[DropHost], "the flush changed nothing: the guard dropped them")

	// Attached again: replaced in place, one guard.
	att2, err := Attach(h, "boxnet", p)
	require.NoError(t, err)
	assert.NotEqual(t, att.ID, att2.ID)
	assert.Equal(t, att.Tag, att2.Tag, "the same build, the same tag")
	found, err = Find(h, "boxnet")
	require.NoError(t, err)
	assert.Len(t, found, 1)

	require.NoError(t, Detach(h, "boxnet"))
	found, err = Find(h, "boxnet")
	require.NoError(t, err)
	assert.Empty(t, found)
	for _, tg := range all {
		assert.True(t, w.reached(t, tg), "detached, %s is reached again", tg.name)
	}
	require.NoError(t, Detach(h, "boxnet"), "detaching twice is nothing")
}

// On the uplink's egress the uplinks' guard drops what would leave with a
// box's source: reached un-masqueraded without it (the control), not with
// it (counted), reached again masqueraded once a NAT rule is there (tc's
// egress hook sees the packet after postrouting), and not after `nft
// flush ruleset` takes that rule away. The host's own traffic passes.
func TestPrivilegedUplinkGuard(t *testing.T) {
	tier.Root(t)
	nft := tier.Tool(t, "nft", "nftables")
	w := newGuardWorld(t)
	public := listen(t, "a public address by the default route", w.inet, "203.0.113.10:9999")
	box, uplink := netip.MustParseAddr("10.88.0.2"), netip.MustParseAddr("198.51.100.2")

	src, ok := sendFrom(t, w.box, public)
	require.True(t, ok, "without the guard the box reaches it (the control)")
	assert.Equal(t, box, src, "un-masqueraded: this world has no NAT rule")

	p, err := BuildUplink(netip.MustParsePrefix("10.88.0.0/24"))
	require.NoError(t, err)
	h := w.host.Netlink(t)
	att, err := Attach(h, "up", p)
	require.NoError(t, err)
	assert.Equal(t, Egress, att.Hook)
	assert.Equal(t, UplinkProgramName, att.Name)
	_, ok = sendFrom(t, w.box, public)
	assert.False(t, ok, "a box's source does not leave un-masqueraded")
	src, ok = sendFrom(t, w.host, public)
	assert.True(t, ok, "the host's own traffic passes")
	assert.Equal(t, uplink, src)
	got, err := Counters(att.ID)
	require.NoError(t, err)
	assert.NotZero(t, got[DropUnNATed])
	assert.NotZero(t, got[PassUplink])

	nftIn := func(args ...string) {
		t.Helper()
		out, err := exec.Command("ip", append([]string{"netns", "exec", w.host.Name, nft}, args...)...).CombinedOutput()
		require.NoError(t, err, "nft %v: %s", args, out)
	}
	nftIn("add table ip nat")
	nftIn("add chain ip nat post { type nat hook postrouting priority 100 ; }")
	nftIn("add rule ip nat post oifname up masquerade")
	src, ok = sendFrom(t, w.box, public)
	assert.True(t, ok, "masqueraded, it leaves")
	assert.Equal(t, uplink, src)

	nftIn("flush ruleset")
	_, ok = sendFrom(t, w.box, public)
	assert.False(t, ok, "the NAT rule flushed: it does not leave")
	again, err := Counters(att.ID)
	require.NoError(t, err)
	assert.Greater(t, again[DropUnNATed], got[DropUnNATed])

	require.NoError(t, Detach(h, "up"))
	found, err := Find(h, "up")
	require.NoError(t, err)
	assert.Empty(t, found)
}

// testConfig is the guard for the bridge of these tests.
var testConfig = Config{Subnet: netip.MustParsePrefix("10.88.0.0/24"), Gateway: netip.MustParseAddr("10.88.0.1"), Resolver: netip.MustParseAddr("192.0.0.8")}

// frame is an Ethernet frame from a box (10.88.0.2) carrying UDP to dst:port.
func frame(dst string, port uint16) []byte { return frameFrom("10.88.0.2", dst, port) }

// frameFrom is an Ethernet frame carrying UDP from src to dst:port.
func frameFrom(src, dst string, port uint16) []byte {
	b := make([]byte, 14+20+8+16)
	copy(b[0:6], []byte{0x02, 0, 0, 0, 0, 1})  // the bridge
	copy(b[6:12], []byte{0x02, 0, 0, 0, 0, 2}) // the box
	b[12], b[13] = 0x08, 0x00
	ip := b[14:]
	ip[0] = 0x45
	ip[2], ip[3] = 0, byte(len(b)-14)
	ip[8], ip[9] = 64, 17
	copy(ip[12:16], netip.MustParseAddr(src).AsSlice())
	copy(ip[16:20], netip.MustParseAddr(dst).AsSlice())
	udp := ip[20:]
	udp[0], udp[1] = 0xc3, 0x50
	udp[2], udp[3] = byte(port>>8), byte(port)
	udp[5] = byte(len(udp))
	return b
}

// loadedInRoutedNS is the bridge's program loaded (not attached) and a
// throwaway namespace with a default route to run it in: a test run's
// route lookups see that namespace's table, never the machine's.
func loadedInRoutedNS(tb testing.TB, role string) (*nstest.NS, *ebpf.Program) {
	tb.Helper()
	ns := nstest.New(tb, "boxgd-"+nstest.RunID()+"-"+role)
	require.NoError(tb, ns.Sysctl("net.ipv4.ip_forward", "1"))
	link(tb, ns, "up", "198.51.100.2/24", ns, "peer", "198.51.100.3/24")
	route(tb, ns, "0.0.0.0/0", "198.51.100.1")
	p, err := Build(testConfig)
	require.NoError(tb, err)
	coll, err := ebpf.NewCollection(p.spec)
	require.NoError(tb, err)
	tb.Cleanup(func() { coll.Close() })
	return ns, coll.Programs[ProgramName]
}

// BenchmarkPrivilegedGuard times the bridge's program per packet
// (BPF_PROG_TEST_RUN, in a throwaway namespace whose routing table has a
// default route): a packet dropped early (another port of the gateway),
// DNS to the gateway, a private destination, and one forwarded to a public
// address (two route lookups, the longest path).
func BenchmarkPrivilegedGuard(b *testing.B) {
	tier.Root(b)
	ns, prog := loadedInRoutedNS(b, "bench")
	for _, bc := range []struct {
		name string
		in   []byte
		want uint32
	}{
		{"to the host", frame("10.88.0.1", 9999), tcActShot},
		{"dns", frame("10.88.0.1", 53), tcActOK},
		{"private", frame("192.168.20.2", 9999), tcActShot},
		{"forwarded", frame("203.0.113.10", 9999), tcActOK},
	} {
		b.Run(bc.name, func(b *testing.B) {
			var ret uint32
			var per time.Duration
			require.NoError(b, ns.Run(func() error {
				var err error
				ret, per, err = prog.Benchmark(bc.in, b.N, b.ResetTimer)
				return err
			}))
			require.Equal(b, bc.want, ret, "the verdict")
			b.ReportMetric(float64(per.Nanoseconds()), "ns/packet")
		})
	}
}

// The verdicts a live world cannot easily send, on crafted frames
// (BPF_PROG_TEST_RUN, in a throwaway namespace with a default route): a
// source outside the bridge's subnet, DHCP from 0.0.0.0 (passes) and
// anything else from it (dropped), IPv6, ARP, a frame cut short. (A
// packet larger than the way out's MTU, which bpf_fib_lookup answers with
// FRAG_NEEDED and the program lets the forward path answer, is not
// reproduced here: a test run's frame of 1,658 bytes got SUCCESS, and
// larger ones are refused.)
func TestPrivilegedGuardVerdicts(t *testing.T) {
	tier.Root(t)
	ns, prog := loadedInRoutedNS(t, "verdicts")

	ipv6 := frame("203.0.113.10", 9999)
	ipv6[12], ipv6[13] = 0x86, 0xdd
	arp := make([]byte, 42)
	arp[12], arp[13] = 0x08, 0x06
	for _, tc := range []struct {
		name string
		in   []byte
		want uint32
	}{
		{"a spoofed source", frameFrom("203.0.113.99", "203.0.113.10", 9999), tcActShot},
		{"a source of another private range", frameFrom("192.168.20.2", "10.88.0.1", 53), tcActShot},
		{"DHCP from 0.0.0.0 to the broadcast", frameFrom("0.0.0.0", "255.255.255.255", 67), tcActOK},
		{"DNS from 0.0.0.0", frameFrom("0.0.0.0", "10.88.0.1", 53), tcActShot},
		{"a public address from 0.0.0.0", frameFrom("0.0.0.0", "203.0.113.10", 9999), tcActShot},
		{"the box's own DNS", frame("10.88.0.1", 53), tcActOK},
		{"the box to a public address", frame("203.0.113.10", 9999), tcActOK},
		{"IPv6", ipv6, tcActShot},
		{"ARP", arp, tcActOK},
		{"an IPv4 frame cut short in its ports", frame("203.0.113.10", 9999)[:36], tcActShot},
	} {
		var ret uint32
		require.NoError(t, ns.Run(func() error {
			var err error
			ret, err = prog.Run(&ebpf.RunOptions{Data: tc.in})
			return err
		}), tc.name)
		assert.Equal(t, tc.want, ret, tc.name)
	}
}
