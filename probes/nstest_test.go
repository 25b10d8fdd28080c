package probes

import (
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/box-isolation/box/internal/nstest"
	"github.com/box-isolation/box/internal/testenv/tier"
)

// The privileged tier's test world: throwaway network namespaces
// (internal/nstest) named boxpt-<run>-<role>, joined by veth pairs, deleted
// in t.Cleanup whatever happens. Nothing in them has a route to the
// machine's own network.

const agentEnv = "BOXPROBES_TEST_AGENT"

// TestMain lets the test binary double as the agent, so a privileged test
// can run RunAgent as its own process inside a namespace, exactly as the
// drill runs it inside a box.
func TestMain(m *testing.M) {
	// A kernel or load probe's child is this binary again (child.go).
	if child, err := RunChild(os.Stdin, os.Stdout); child {
		if err != nil {
			fmt.Fprintln(os.Stderr, "child:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	if os.Getenv(agentEnv) == "1" {
		// A nested workload's agent is this binary again, as the agent.
		NestChild = func() *exec.Cmd {
			c := exec.Command("/proc/self/exe")
			c.Env = append(os.Environ(), agentEnv+"=1")
			return c
		}
		if err := RunAgent(context.Background(), os.Stdin, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "agent:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func requireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		tier.Unavailable(t, "needs root (CAP_NET_ADMIN and CAP_NET_RAW) to build throwaway network namespaces: run as root, e.g. sudo go test ./probes/ -run Privileged")
	}
}

// runID ties one world's namespaces together.
var runID = nstest.RunID

// testNS is a throwaway namespace (internal/nstest) with this package's
// helpers on it.
type testNS struct{ *nstest.NS }

// newNS creates boxpt-<run>-<role> with lo up; it is deleted in cleanup.
func newNS(t testing.TB, run, role string) *testNS {
	t.Helper()
	return &testNS{nstest.New(t, "boxpt-"+run+"-"+role)}
}

func (n *testNS) sysctl(t testing.TB, path, value string) {
	t.Helper()
	if err := n.Sysctl(path, value); err != nil {
		t.Fatalf("%s: sysctl %s=%s: %v", n.Name, path, value, err)
	}
}

func (n *testNS) defaultRoute(t testing.TB, gw string) {
	t.Helper()
	h := n.Netlink(t)
	ip := net.ParseIP(gw)
	r := &netlink.Route{Gw: ip}
	if ip.To4() == nil {
		r.Family = netlink.FAMILY_V6
	}
	if err := h.RouteAdd(r); err != nil {
		t.Fatalf("%s: default via %s: %v", n.Name, gw, err)
	}
}

func (n *testNS) mac(t testing.TB, link string) net.HardwareAddr {
	t.Helper()
	return n.Link(t, link).Attrs().HardwareAddr
}

// veth joins a and b; both ends come up later, after addresses are set.
func veth(t testing.TB, a *testNS, aName string, b *testNS, bName string) {
	t.Helper()
	nstest.Veth(t, a.NS, aName, b.NS, bName)
	// IPv6 link-local addresses must be usable at once (no DAD wait).
	a.sysctl(t, "net.ipv6.conf."+aName+".accept_dad", "0")
	b.sysctl(t, "net.ipv6.conf."+bName+".accept_dad", "0")
}

func (n *testNS) nft(t testing.TB) *nftables.Conn {
	t.Helper()
	c, err := nftables.New(nftables.WithNetNSFd(int(n.Handle)))
	if err != nil {
		t.Fatalf("nftables in %s: %v", n.Name, err)
	}
	return c
}

// routedWorld is sender <-veth-> router <-veth-> target, dual stack, with
// an inet filter forward chain in the router for the rule under test. A
// reject there comes from the router's address, never the target's.
type routedWorld struct {
	snd, rtr, tgt          *testNS
	sndNet, tgtNet         netip.Prefix
	sndIP, tgtIP, rtrIP    netip.Addr
	sndIP6, tgtIP6, rtrIP6 netip.Addr
	nftc                   *nftables.Conn
	chain                  *nftables.Chain
}

func newRoutedWorld(t testing.TB) *routedWorld {
	t.Helper()
	requireRoot(t)
	id := runID()
	w := &routedWorld{
		snd: newNS(t, id, "snd"), rtr: newNS(t, id, "rtr"), tgt: newNS(t, id, "tgt"),
		sndNet: netip.MustParsePrefix("10.201.1.0/24"), tgtNet: netip.MustParsePrefix("10.201.2.0/24"),
		sndIP: netip.MustParseAddr("10.201.1.2"), rtrIP: netip.MustParseAddr("10.201.1.1"),
		tgtIP: netip.MustParseAddr("10.201.2.2"), sndIP6: netip.MustParseAddr("2001:db8:1::2"),
		rtrIP6: netip.MustParseAddr("2001:db8:1::1"), tgtIP6: netip.MustParseAddr("2001:db8:2::2"),
	}
	veth(t, w.rtr, "to-snd", w.snd, "veth-snd")
	veth(t, w.rtr, "to-tgt", w.tgt, "veth-tgt")
	w.snd.AddAddr(t, "veth-snd", "10.201.1.2/24")
	w.snd.AddAddr(t, "veth-snd", "2001:db8:1::2/64")
	w.rtr.AddAddr(t, "to-snd", "10.201.1.1/24")
	w.rtr.AddAddr(t, "to-snd", "2001:db8:1::1/64")
	w.rtr.AddAddr(t, "to-tgt", "10.201.2.1/24")
	w.rtr.AddAddr(t, "to-tgt", "2001:db8:2::1/64")
	w.tgt.AddAddr(t, "veth-tgt", "10.201.2.2/24")
	w.tgt.AddAddr(t, "veth-tgt", "2001:db8:2::2/64")
	for _, x := range []struct {
		ns   *testNS
		link string
	}{{w.snd, "veth-snd"}, {w.rtr, "to-snd"}, {w.rtr, "to-tgt"}, {w.tgt, "veth-tgt"}} {
		x.ns.LinkUp(t, x.link)
	}
	w.snd.WaitOperUp(t, "veth-snd")
	w.rtr.WaitOperUp(t, "to-snd", "to-tgt")
	w.tgt.WaitOperUp(t, "veth-tgt")
	w.snd.defaultRoute(t, "10.201.1.1")
	w.snd.defaultRoute(t, "2001:db8:1::1")
	w.tgt.defaultRoute(t, "10.201.2.1")
	w.tgt.defaultRoute(t, "2001:db8:2::1")
	w.rtr.sysctl(t, "net.ipv4.ip_forward", "1")
	w.rtr.sysctl(t, "net.ipv6.conf.all.forwarding", "1")
	// Rate limits would turn a test's third reject into silence.
	for _, n := range []*testNS{w.rtr, w.tgt} {
		n.sysctl(t, "net.ipv4.icmp_ratelimit", "0")
		n.sysctl(t, "net.ipv6.icmp.ratelimit", "0")
	}
	w.nftc = w.rtr.nft(t)
	tbl := w.nftc.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: "boxpt"})
	accept := nftables.ChainPolicyAccept
	w.chain = w.nftc.AddChain(&nftables.Chain{Name: "fwd", Table: tbl, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &accept})
	if err := w.nftc.Flush(); err != nil {
		t.Fatalf("nft table in %s: %v", w.rtr.Name, err)
	}
	return w
}

// rule is what the router does with traffic to one destination.
type rule string

const (
	ruleAccept   rule = "accept"
	ruleDrop     rule = "drop"
	ruleReject   rule = "reject"       // nft "reject": icmpx port-unreachable
	ruleAdmin    rule = "reject-admin" // reject with icmpx admin-prohibited
	ruleTCPReset rule = "reject-tcp-reset"
)

// setRule replaces the router's forward chain with one rule for dst.
func (w *routedWorld) setRule(t testing.TB, dst netip.Addr, r rule) {
	t.Helper()
	w.nftc.FlushChain(w.chain)
	if r != ruleAccept {
		var ex []expr.Any
		if dst.Is4() {
			ex = append(ex,
				&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.NFPROTO_IPV4}},
				&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: dst.AsSlice()})
		} else {
			ex = append(ex,
				&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.NFPROTO_IPV6}},
				&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 24, Len: 16},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: dst.AsSlice()})
		}
		switch r {
		case ruleDrop:
			ex = append(ex, &expr.Verdict{Kind: expr.VerdictDrop})
		case ruleReject:
			ex = append(ex, &expr.Reject{Type: unix.NFT_REJECT_ICMPX_UNREACH, Code: unix.NFT_REJECT_ICMPX_PORT_UNREACH})
		case ruleAdmin:
			ex = append(ex, &expr.Reject{Type: unix.NFT_REJECT_ICMPX_UNREACH, Code: unix.NFT_REJECT_ICMPX_ADMIN_PROHIBITED})
		case ruleTCPReset:
			ex = append(ex,
				&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
				&expr.Reject{Type: unix.NFT_REJECT_TCP_RST})
		}
		w.nftc.AddRule(&nftables.Rule{Table: w.chain.Table, Chain: w.chain, Exprs: ex})
	}
	if err := w.nftc.Flush(); err != nil {
		t.Fatalf("nft rule %s for %s: %v", r, dst, err)
	}
}

// bridgeWorld is two namespaces on a bridge in a third, like two boxes on
// boxnet.
type bridgeWorld struct {
	a, b, br   *testNS
	subnet     netip.Prefix
	aIP, bIP   netip.Addr
	aMAC, bMAC net.HardwareAddr
	nftc       *nftables.Conn
	chain      *nftables.Chain
}

func newBridgeWorld(t testing.TB) *bridgeWorld {
	t.Helper()
	requireRoot(t)
	id := runID()
	w := &bridgeWorld{a: newNS(t, id, "a"), b: newNS(t, id, "b"), br: newNS(t, id, "br"),
		subnet: netip.MustParsePrefix("10.202.0.0/24"),
		aIP:    netip.MustParseAddr("10.202.0.1"), bIP: netip.MustParseAddr("10.202.0.2")}
	w.br.AddBridge(t, "br0")
	// The bridge's own stack takes no part in IPv6: otherwise br0's EUI-64
	// link-local address finishes DAD a second or two after the bridge
	// comes up and br0 itself answers an echo to ff02::1, delivered to it
	// locally, past the port-to-port drop.
	w.br.sysctl(t, "net.ipv6.conf.br0.disable_ipv6", "1")
	veth(t, w.br, "port-a", w.a, "veth-a")
	veth(t, w.br, "port-b", w.b, "veth-b")
	for _, p := range []string{"port-a", "port-b"} {
		w.br.SetMaster(t, p, "br0")
		w.br.LinkUp(t, p)
	}
	w.br.LinkUp(t, "br0")
	w.a.AddAddr(t, "veth-a", "10.202.0.1/24")
	w.b.AddAddr(t, "veth-b", "10.202.0.2/24")
	// b comes up with IPv6 on but no link-local address, like a container
	// in docs/world.md, "These machines"; the link-local test adds one the way the agent does.
	w.b.sysctl(t, "net.ipv6.conf.veth-b.addr_gen_mode", "1")
	w.a.LinkUp(t, "veth-a")
	w.b.LinkUp(t, "veth-b")
	w.a.WaitOperUp(t, "veth-a")
	w.b.WaitOperUp(t, "veth-b")
	w.br.WaitOperUp(t, "port-a", "port-b", "br0")
	// a's EUI-64 link-local address appears with carrier, tentative, and
	// is ready only once addrconf's work has run.
	w.a.waitLinkLocal(t, "veth-a", netip.Addr{})
	w.aMAC, w.bMAC = w.a.mac(t, "veth-a"), w.b.mac(t, "veth-b")

	w.nftc = w.br.nft(t)
	tbl := w.nftc.AddTable(&nftables.Table{Family: nftables.TableFamilyBridge, Name: "boxpt"})
	accept := nftables.ChainPolicyAccept
	w.chain = w.nftc.AddChain(&nftables.Chain{Name: "fwd", Table: tbl, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &accept})
	if err := w.nftc.Flush(); err != nil {
		t.Fatalf("nft bridge table: %v", err)
	}
	return w
}

// waitLinkLocal waits until link has an IPv6 link-local address (want, or
// any one if want is the zero Addr) that the kernel has finished setting
// up, and returns it. Being listed without the tentative flag is not
// enough: the kernel joins the address's solicited-node group and installs
// its local route (without which a unicast to it, a neighbour
// advertisement included, is dropped as not ours) in addrconf's DAD work,
// which runs after the address is added, on a workqueue under RTNL, even
// for a NODAD address or with accept_dad=0; under load that is milliseconds
// later.
func (n *testNS) waitLinkLocal(t testing.TB, link string, want netip.Addr) netip.Addr {
	t.Helper()
	h := n.Netlink(t)
	deadline := time.Now().Add(5 * time.Second)
	for {
		state := "no link-local address"
		l, err := h.LinkByName(link)
		if err != nil {
			t.Fatalf("%s: link %s: %v", n.Name, link, err)
		}
		addrs, err := h.AddrList(l, netlink.FAMILY_V6)
		if err != nil {
			t.Fatalf("%s: addresses on %s: %v", n.Name, link, err)
		}
		for _, a := range addrs {
			ip, ok := netip.AddrFromSlice(a.IP)
			if !ok || !ip.IsLinkLocalUnicast() || (want.IsValid() && ip != want) {
				continue
			}
			switch {
			case a.Flags&(unix.IFA_F_TENTATIVE|unix.IFA_F_DADFAILED) != 0:
				state = fmt.Sprintf("%s tentative or failed DAD (flags %#x)", ip, a.Flags)
			case !n.hasLocalRoute(t, h, l.Attrs().Index, ip):
				state = fmt.Sprintf("%s has no local route yet", ip)
			case !n.inMulticastGroup(t, link, solicitedNode(ip)):
				state = fmt.Sprintf("%s: solicited-node group not joined yet", ip)
			default:
				return ip
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %s: link-local address not ready after 5s: %s", n.Name, link, state)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// hasLocalRoute reports whether the local table routes addr to this host
// through the link with index ifindex.
func (n *testNS) hasLocalRoute(t testing.TB, h *netlink.Handle, ifindex int, addr netip.Addr) bool {
	t.Helper()
	rs, err := h.RouteListFiltered(netlink.FAMILY_V6, &netlink.Route{Table: unix.RT_TABLE_LOCAL, LinkIndex: ifindex},
		netlink.RT_FILTER_TABLE|netlink.RT_FILTER_OIF)
	if err != nil {
		t.Fatalf("%s: local routes: %v", n.Name, err)
	}
	for _, r := range rs {
		if r.Type == unix.RTN_LOCAL && r.Dst != nil && r.Dst.IP.Equal(addr.AsSlice()) {
			return true
		}
	}
	return false
}

// inMulticastGroup reports whether link has joined the IPv6 group, from
// the namespace's /proc/net/igmp6.
func (n *testNS) inMulticastGroup(t testing.TB, link string, group netip.Addr) bool {
	t.Helper()
	var raw []byte
	if err := n.Run(func() (err error) {
		// thread-self: /proc/net follows the process's first thread,
		// which is not in this namespace.
		raw, err = os.ReadFile("/proc/thread-self/net/igmp6")
		return err
	}); err != nil {
		t.Fatalf("%s: igmp6: %v", n.Name, err)
	}
	g := group.As16()
	want := hex.EncodeToString(g[:])
	for _, line := range strings.Split(string(raw), "\n") {
		// index, device, group, users, flags, timer
		if f := strings.Fields(line); len(f) >= 3 && f[1] == link && f[2] == want {
			return true
		}
	}
	return false
}

// solicitedNode is ff02::1:ffXX:XXXX for addr, the group a neighbour
// solicitation for addr goes to.
func solicitedNode(addr netip.Addr) netip.Addr {
	a := addr.As16()
	return netip.AddrFrom16([16]byte{0xff, 0x02, 11: 0x01, 12: 0xff, 13: a[13], 14: a[14], 15: a[15]})
}

// setDrop installs or removes the port-to-port drop. It matches the
// bridge's ports by iifname/oifname, because meta ibrname/obrname is not
// available on these kernels (docs/world.md, "These machines").
func (w *bridgeWorld) setDrop(t testing.TB, on bool) {
	t.Helper()
	w.nftc.FlushChain(w.chain)
	if on {
		for _, pair := range [][2]string{{"port-a", "port-b"}, {"port-b", "port-a"}} {
			w.nftc.AddRule(&nftables.Rule{Table: w.chain.Table, Chain: w.chain, Exprs: []expr.Any{
				&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifname(pair[0])},
				&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifname(pair[1])},
				&expr.Verdict{Kind: expr.VerdictDrop},
			}})
		}
	}
	if err := w.nftc.Flush(); err != nil {
		t.Fatalf("nft bridge drop=%v: %v", on, err)
	}
}

// startWitness arms a witness in ns and stops it in cleanup.
func startWitness(t testing.TB, ns *testNS, spec WitnessSpec) *Witness {
	t.Helper()
	var w *Witness
	if err := ns.Run(func() (err error) { w, err = StartWitness(spec); return err }); err != nil {
		t.Fatalf("witness in %s: %v", ns.Name, err)
	}
	t.Cleanup(func() { w.Stop() })
	return w
}

func startListener(t testing.TB, ns *testNS, spec ListenerSpec) *Listener {
	t.Helper()
	var l *Listener
	if err := ns.Run(func() (err error) { l, err = StartListener(context.Background(), spec); return err }); err != nil {
		t.Fatalf("listener in %s: %v", ns.Name, err)
	}
	t.Cleanup(func() { l.Stop() })
	return l
}

func probeIn(t testing.TB, ns *testNS, spec ProbeSpec) Observation {
	t.Helper()
	var o Observation
	if err := ns.Run(func() error { o = RunProbe(context.Background(), spec); return nil }); err != nil {
		t.Fatal(err)
	}
	return o
}

// startAgentIn starts the test binary as the agent in ns, feeding it
// plan; the returned func waits for its report.
func startAgentIn(t testing.TB, ns *testNS, plan string) func() (*Report, time.Duration, string) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe)
	// The race detector sleeps 1 s at exit by default; that is not the
	// agent's time.
	cmd.Env = append(os.Environ(), agentEnv+"=1", "GORACE=atexit_sleep_ms=0")
	cmd.Stdin = strings.NewReader(plan)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	var start time.Time
	// A child forked from a thread inside the namespace starts there.
	if err := ns.Run(func() error { start = time.Now(); return cmd.Start() }); err != nil {
		t.Fatalf("start agent in %s: %v", ns.Name, err)
	}
	waited := false
	t.Cleanup(func() {
		if !waited {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	return func() (*Report, time.Duration, string) {
		err := cmd.Wait()
		waited = true
		wall := time.Since(start)
		if err != nil {
			t.Fatalf("agent in %s: %v\nstderr: %s\nstdout: %s", ns.Name, err, stderr.String(), stdout.String())
		}
		raw := stdout.String()
		rep, err := DecodeReport(&stdout)
		if err != nil {
			t.Fatalf("agent report: %v\n%s", err, raw)
		}
		return rep, wall, raw
	}
}
