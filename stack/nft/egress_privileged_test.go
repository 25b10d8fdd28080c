package nft

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/box-isolation/box/internal/nstest"
	"github.com/box-isolation/box/internal/testenv/tier"
)

// egressWorld: boxes a (10.99.0.2) and b (10.99.0.3) on boxnet in a host
// namespace that routes them to an "internet" namespace holding two
// servers, 10.98.0.10 and 10.98.0.20.
type egressWorld struct {
	*world
	inet *testNS
}

func newEgressWorld(t *testing.T) *egressWorld {
	t.Helper()
	w := &egressWorld{world: newWorld(t)}
	w.inet = newNS(t, w.run, "inet")
	// A routed link, no bridge.
	nstest.Veth(t, w.host.NS, "up", w.inet.NS, "eth0")
	w.host.AddAddr(t, "up", "10.98.0.1/24")
	for _, a := range []string{"10.98.0.2/24", "10.98.0.10/24", "10.98.0.20/24"} {
		w.inet.AddAddr(t, "eth0", a)
	}
	w.host.LinkUp(t, "up")
	w.inet.LinkUp(t, "eth0")
	w.host.WaitOperUp(t, "up")
	w.inet.WaitOperUp(t, "eth0")
	require.NoError(t, w.host.Sysctl("net.ipv4.ip_forward", "1"))
	route(t, w.inet, "10.99.0.0/24", "10.98.0.1")
	for _, b := range []*testNS{w.a, w.b} {
		route(t, b, "0.0.0.0/0", "10.99.0.1")
	}
	for _, addr := range []string{"10.98.0.10:80", "10.98.0.20:80", "10.98.0.20:443"} {
		w.inet.serve(t, "tcp", addr, "inet "+addr)
	}
	return w
}

func route(t *testing.T, n *testNS, dst, via string) {
	t.Helper()
	_, d, err := net.ParseCIDR(dst)
	require.NoError(t, err)
	require.NoError(t, n.Netlink(t).RouteAdd(&netlink.Route{Dst: d, Gw: net.ParseIP(via)}), "route %s via %s in %s", dst, via, n.Name)
}

// nftIn runs nft in the host namespace, as dnsmasq would to add elements.
func nftIn(t *testing.T, ns string, args ...string) string {
	t.Helper()
	nft := tier.Tool(t, "nft", "nftables")
	out, err := exec.Command("ip", append([]string{"netns", "exec", ns, nft}, args...)...).CombinedOutput()
	require.NoError(t, err, "nft %v: %s", args, out)
	return string(out)
}

// udpAsk sends one datagram from n to addr and reports the reply, or ""
// when none came.
func (n *testNS) udpAsk(t *testing.T, addr string) string {
	t.Helper()
	var got string
	err := n.Run(func() error {
		c, err := net.Dial("udp4", addr)
		if err != nil {
			return err
		}
		defer c.Close()
		if _, err := c.Write([]byte("ask")); err != nil {
			return err
		}
		_ = c.SetReadDeadline(time.Now().Add(probeWait))
		buf := make([]byte, 256)
		k, err := c.Read(buf)
		if err == nil {
			got = string(buf[:k])
		}
		return nil
	})
	require.NoError(t, err)
	return got
}

// transparent listens in n on addr with IP_TRANSPARENT, as box's proxy
// does, and answers every connection with where it was going and whence
// it came ("to DST from SRC").
func (n *testNS) transparent(t *testing.T, addr string) {
	t.Helper()
	err := n.Run(func() error {
		lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
			var serr error
			err := c.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_TRANSPARENT, 1) })
			return errors.Join(err, serr)
		}}
		l, err := lc.Listen(context.Background(), "tcp4", addr)
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
				fmt.Fprintf(c, "to %s from %s", c.LocalAddr(), c.RemoteAddr())
				c.Close()
			}
		}()
		return nil
	})
	require.NoError(t, err)
}

// read connects from n to addr and reads what the other side says first;
// "" when the connection did not open.
func (n *testNS) read(t *testing.T, addr string) string {
	t.Helper()
	var got string
	err := n.Run(func() error {
		c, err := net.DialTimeout("tcp4", addr, probeWait)
		if err != nil {
			return nil
		}
		defer c.Close()
		_ = c.SetReadDeadline(time.Now().Add(probeWait))
		b, _ := io.ReadAll(c)
		got = string(b)
		return nil
	})
	require.NoError(t, err)
	return got
}

// policyRoute adds the route TPROXY's mark needs in n (stack's egressnet.go
// adds it on a host), and returns what removes its rule.
func policyRoute(t *testing.T, n *testNS) func() {
	t.Helper()
	h := n.Netlink(t)
	lo, err := h.LinkByName("lo")
	require.NoError(t, err)
	require.NoError(t, h.RouteAdd(&netlink.Route{LinkIndex: lo.Attrs().Index, Dst: &net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)},
		Table: EgressRouteTable, Type: unix.RTN_LOCAL, Scope: unix.RT_SCOPE_HOST}))
	r := netlink.NewRule()
	r.Family, r.Mark, r.Table, r.Priority = unix.AF_INET, EgressMark, EgressRouteTable, EgressRulePriority
	require.NoError(t, h.RuleAdd(r))
	return func() { require.NoError(t, h.RuleDel(r)) }
}

// TestPrivilegedEgress is the egress table on its own: the forward chain
// by the allow set, QUIC, DNS over TLS and the resolvers dropped whatever
// the set says, the DNS questions sent on to box's resolver, web traffic
// handed to a transparent listener, and closed whenever what takes it
// over is missing (no listener, no policy route).
func TestPrivilegedEgress(t *testing.T) {
	requireRoot(t)
	tier.Tool(t, "nft", "nftables") // nftIn reads the sets' timeouts with it
	w := newEgressWorld(t)
	cfg := w.cfg
	w.inet.AddAddr(t, "eth0", "10.98.0.53/24")
	for _, at := range []string{"10.98.0.10:8080", "10.98.0.20:8080", "10.98.0.10:853", "10.98.0.53:8080"} {
		w.inet.serve(t, "tcp", at, "inet "+at)
	}
	w.inet.serve(t, "udp", "10.98.0.10:443", "quic")
	a := netip.MustParseAddr("10.99.0.2")
	resolvers := []netip.Addr{netip.MustParseAddr("10.98.0.53")}
	p1 := Egress{Policies: []EgressPolicy{{ID: "p1", Boxes: []netip.Addr{a}}}, Resolvers: resolvers}

	// The host firewall too: it must let the handed-over traffic in.
	ports, err := bridgePorts(cfg.NetNS, "boxnet")
	require.NoError(t, err)
	_, err = Apply(cfg, Capabilities{}, ports)
	require.NoError(t, err)

	// Before any policy, both boxes reach both servers.
	assert.Equal(t, reached, w.a.dial(t, "tcp", "10.98.0.10:8080", "inet 10.98.0.10:8080"))

	changes, err := p1.Apply(cfg)
	require.NoError(t, err)
	assert.Equal(t, []string{"created table inet box_egress"}, changes)
	f, err := p1.Verify(cfg)
	require.NoError(t, err)
	assert.Empty(t, f, "the live table, its tproxy rules included, is the desired one")

	// Box a is allowlisted and nothing is allowed yet; b is open.
	assert.Equal(t, silent, w.a.dial(t, "tcp", "10.98.0.10:8080", "inet 10.98.0.10:8080"), "a under p1 with an empty allow set")
	assert.Equal(t, reached, w.b.dial(t, "tcp", "10.98.0.10:8080", "inet 10.98.0.10:8080"), "b is open")

	// The resolver adds an answer (without a timeout of its own).
	allower, err := NewEgressAllower(cfg)
	require.NoError(t, err)
	defer allower.Close()
	require.NoError(t, allower.Allow("p1", []netip.Addr{netip.MustParseAddr("10.98.0.10"), netip.MustParseAddr("10.98.0.53")}))
	assert.Equal(t, reached, w.a.dial(t, "tcp", "10.98.0.10:8080", "inet 10.98.0.10:8080"), "the answered address")
	assert.Equal(t, silent, w.a.dial(t, "tcp", "10.98.0.20:8080", "inet 10.98.0.20:8080"), "not the other one")
	listing := nftIn(t, w.host.Name, "list", "set", "inet", "box_egress", "allow_p1")
	assert.Contains(t, listing, "timeout 1h", "the set's default timeout")
	assert.Contains(t, listing, "expires", "the resolver's element takes the default timeout: %s", listing)

	// Whatever the set says: no QUIC, no DNS over TLS, no resolver.
	assert.Empty(t, w.a.udpAsk(t, "10.98.0.10:443"), "QUIC to an allowed address")
	assert.NotEmpty(t, w.b.udpAsk(t, "10.98.0.10:443"), "the open box's QUIC arrives")
	assert.Equal(t, silent, w.a.dial(t, "tcp", "10.98.0.10:853", "inet 10.98.0.10:853"), "DNS over TLS to an allowed address")
	assert.Equal(t, silent, w.a.dial(t, "tcp", "10.98.0.53:8080", "inet 10.98.0.53:8080"), "a resolver, allowed by an answer")
	assert.Equal(t, reached, w.b.dial(t, "tcp", "10.98.0.53:8080", "inet 10.98.0.53:8080"))

	// DNS to the gateway goes to box's resolver, on the host's loopback.
	w.host.AddAddr(t, "lo", EgressDNSAddr.String()+"/32")
	w.host.serve(t, "udp", EgressDNSAddr.String()+":53", "box's resolver")
	assert.True(t, strings.HasPrefix(w.a.udpAsk(t, "10.99.0.1:53"), "box's resolver:"), "a's question reached box's resolver, from the gateway's address")
	assert.Empty(t, w.b.udpAsk(t, "10.99.0.1:53"), "b's did not (no dnsmasq here: nothing answers)")
	assert.Empty(t, w.a.udpAsk(t, EgressDNSAddr.String()+":53"), "asked directly, the resolver's address is closed")

	// Web traffic: with nothing to take it, dropped, although allowed.
	assert.Empty(t, w.a.read(t, "10.98.0.10:80"), "no proxy: closed, never open")
	assert.Equal(t, "inet 10.98.0.10:80", w.b.read(t, "10.98.0.10:80"))
	w.host.transparent(t, netip.AddrPortFrom(EgressProxyAddr, EgressProxyPort).String())
	assert.Empty(t, w.a.read(t, "10.98.0.10:80"), "a proxy but no policy route: the marked packet is forwarded, and dropped")
	delRule := policyRoute(t, w.host)
	got := w.a.read(t, "10.98.0.10:80")
	assert.True(t, strings.HasPrefix(got, "to 10.98.0.10:80 from 10.99.0.2:"), "handed to the proxy with its own addresses: %q", got)
	assert.Contains(t, w.a.read(t, "10.98.0.20:443"), "to 10.98.0.20:443 from 10.99.0.2", "443 too, to any address: the proxy decides")
	delRule()
	assert.Empty(t, w.a.read(t, "10.98.0.10:80"), "the rule gone: closed again")
	f, err = p1.Verify(cfg)
	require.NoError(t, err)
	assert.Empty(t, f)

	// Box's own converge leaves the resolver's elements alone, also when a
	// new policy's sets and rule are added.
	p12 := p1
	p12.Policies = append(p12.Policies, EgressPolicy{ID: "p2", Boxes: []netip.Addr{netip.MustParseAddr("10.99.0.3")}})
	changes, err = p12.Apply(cfg)
	require.NoError(t, err)
	t.Logf("adding p2: %v", changes)
	for _, c := range changes {
		assert.NotContains(t, c, "replaced table", "a new policy is added in place")
	}
	allowed, err := EgressAllowed(cfg, "p1")
	require.NoError(t, err)
	assert.Contains(t, allowed, netip.MustParseAddr("10.98.0.10"), "p1's answers survive p2's arrival")
	assert.Equal(t, silent, w.b.dial(t, "tcp", "10.98.0.10:8080", "inet 10.98.0.10:8080"), "b under p2 now")
	assert.Equal(t, reached, w.a.dial(t, "tcp", "10.98.0.10:8080", "inet 10.98.0.10:8080"))

	// Moving a box between policies is an element change only.
	moved := Egress{Policies: []EgressPolicy{{ID: "p1", Boxes: []netip.Addr{a, netip.MustParseAddr("10.99.0.3")}}, {ID: "p2"}}, Resolvers: resolvers}
	changes, err = moved.Apply(cfg)
	require.NoError(t, err)
	assert.Len(t, changes, 2, "two boxes sets changed (both boxes were allowlisted already): %v", changes)
	assert.Equal(t, reached, w.b.dial(t, "tcp", "10.98.0.10:8080", "inet 10.98.0.10:8080"), "b under p1 reaches p1's answer")

	// An established connection outlives its address leaving the set (a
	// long download is not cut when the answer times out).
	t.Run("established outlives the allow element", func(t *testing.T) {
		w.inet.serve(t, "tcp", "10.98.0.10:8081", "inet 10.98.0.10:8081")
		err := w.a.Run(func() error {
			c, err := net.DialTimeout("tcp", "10.98.0.10:8081", probeWait)
			if err != nil {
				return err
			}
			defer c.Close()
			nftIn(t, w.host.Name, "delete", "element", "inet", "box_egress", "allow_p1", "{ 10.98.0.10 }")
			_ = c.SetReadDeadline(time.Now().Add(probeWait))
			buf := make([]byte, 64)
			k, err := c.Read(buf)
			if err != nil {
				return err
			}
			assert.True(t, strings.HasPrefix(string(buf[:k]), "inet"), "the greeting came on the established connection")
			return nil
		})
		require.NoError(t, err)
		assert.Equal(t, silent, w.a.dial(t, "tcp", "10.98.0.10:8080", "inet 10.98.0.10:8080"), "but no new one")
	})

	// What a repeated answer does to an element's timeout.
	t.Run("a repeated answer", func(t *testing.T) {
		nftIn(t, w.host.Name, "add", "element", "inet", "box_egress", "allow_p1", "{ 10.98.0.10 timeout 10s }")
		time.Sleep(2 * time.Second)
		require.NoError(t, allower.Allow("p1", []netip.Addr{netip.MustParseAddr("10.98.0.10")}))
		listing := nftIn(t, w.host.Name, "list", "set", "inet", "box_egress", "allow_p1")
		t.Logf("after a second add, 2 s into a 10 s element: %s", strings.TrimSpace(listing))
		// Measured on kernel 6.18: the second add (with no timeout) gives
		// the element the set's default timeout again, so every answer for
		// a name keeps its address allowed another hour.
		assert.Contains(t, listing, "expires 59m", "a repeated answer refreshes the element's timeout to the set's default")
	})

	// No policy left: DeleteEgress removes the table.
	gone, err := DeleteEgress(cfg)
	require.NoError(t, err)
	assert.True(t, gone)
	assert.Equal(t, reached, w.a.dial(t, "tcp", "10.98.0.20:8080", "inet 10.98.0.20:8080"), "open again")
}
