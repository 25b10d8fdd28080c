package nft

import (
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"testing"

	"github.com/google/nftables"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"

	"github.com/box-isolation/box/internal/testenv/tier"
)

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
		changed, err := SetPorts(cfg, now)
		require.NoError(t, err)
		assert.False(t, changed, "second SetPorts is a no-op")

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
	})

	t.Run("delete", func(t *testing.T) {
		removed, err := Delete(cfg)
		require.NoError(t, err)
		assert.Equal(t, []string{"table inet box", "table bridge box"}, removed)
		removed, err = Delete(cfg)
		require.NoError(t, err)
		assert.Empty(t, removed, "second Delete is a no-op")
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

// The counting chain counts what the host firewall let in, and nothing it
// dropped: the drill's witness after the filter.
func TestPrivilegedCounters(t *testing.T) {
	requireRoot(t)
	w := newWorld(t)
	caps, err := Probe(w.cfg)
	require.NoError(t, err)
	w.host.serve(t, "udp", "10.99.0.1:53", "host-dns")
	w.host.serve(t, "tcp", "10.99.0.1:22", "host-ssh")
	_, err = Apply(w.cfg, caps, w.ports(t))
	require.NoError(t, err)

	src, gw := netip.MustParseAddr("10.99.0.2"), netip.MustParseAddr("10.99.0.1")
	dns := CountKey{Src: src, Dst: gw, Proto: "udp", Port: 53}
	ssh := CountKey{Src: src, Dst: gw, Proto: "tcp", Port: 22}
	echo := CountKey{Src: src, Dst: gw, Proto: "icmp"}
	table := CounterPrefix + w.run
	require.NoError(t, InstallCounters(int(w.host.Handle), table, []CountKey{dns, ssh, echo}))
	t.Cleanup(func() { _, _ = DeleteCounters(int(w.host.Handle), table) })

	assert.Equal(t, reached, w.a.dial(t, "udp", "10.99.0.1:53", "host-dns"), "DNS to the gateway passes the filter")
	assert.Equal(t, silent, w.a.dial(t, "tcp", "10.99.0.1:22", "host-ssh"), "ssh on the gateway is dropped")
	assert.Equal(t, silent, w.a.ping(t, "10.99.0.1"), "echo to the gateway is dropped")
	got, err := ReadCounters(int(w.host.Handle), table)
	require.NoError(t, err)
	assert.NotZero(t, got[dns.String()], "counted after the filter: %v", got)
	assert.Zero(t, got[ssh.String()], "dropped before the counting chain: %v", got)
	assert.Zero(t, got[echo.String()], "dropped before the counting chain: %v", got)

	// With the host firewall gone the same ssh attempt is counted.
	_, err = Delete(w.cfg)
	require.NoError(t, err)
	assert.Equal(t, reached, w.a.dial(t, "tcp", "10.99.0.1:22", "host-ssh"))
	got, err = ReadCounters(int(w.host.Handle), table)
	require.NoError(t, err)
	assert.NotZero(t, got[ssh.String()], "counted once nothing drops it: %v", got)

	// A port the host forwards elsewhere (DNAT) is counted by what the box
	// aimed at, on the forward path.
	{
		nft := tier.Tool(t, "nft", "nftables")
		require.NoError(t, w.host.Sysctl("net.ipv4.ip_forward", "1"))
		rt := w.d.Netlink(t)
		require.NoError(t, rt.RouteAdd(&netlink.Route{LinkIndex: w.d.Link(t, "eth0").Attrs().Index,
			Dst: &net.IPNet{IP: net.IPv4(10, 99, 0, 0), Mask: net.CIDRMask(24, 32)}, Gw: net.IPv4(10, 99, 1, 1)}))
		w.d.serve(t, "tcp", "10.99.1.3:22", "forwarded")
		out, err := exec.Command("ip", "netns", "exec", w.host.Name, nft, "add table ip portfwd; add chain ip portfwd prerouting { type nat hook prerouting priority dstnat; }; add rule ip portfwd prerouting ip daddr 10.99.0.1 tcp dport 2222 dnat to 10.99.1.3:22").CombinedOutput()
		require.NoError(t, err, "%s", out)
		fwd := CountKey{Src: src, Dst: gw, Proto: "tcp", Port: 2222}
		require.NoError(t, InstallCounters(int(w.host.Handle), table+"f", []CountKey{fwd}))
		assert.Equal(t, reached, w.a.dial(t, "tcp", "10.99.0.1:2222", "forwarded"), "the forward works")
		got, err = ReadCounters(int(w.host.Handle), table+"f")
		require.NoError(t, err)
		assert.NotZero(t, got[fwd.String()], "counted on the forward path by its original destination: %v", got)
	}

	removed, err := DeleteCounters(int(w.host.Handle), "")
	require.NoError(t, err)
	assert.Subset(t, removed, []string{"table inet " + table})
	require.Error(t, InstallCounters(int(w.host.Handle), "box", nil), "only drill_ tables")
}
