package stack_test

import (
	"bufio"
	"context"
	"crypto/rand"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/box-isolation/box/stack/stacktest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netns"

	"github.com/box-isolation/box/drill/image"
	"github.com/box-isolation/box/fixtures/world"
	"github.com/box-isolation/box/internal/dhcpmsg"
	"github.com/box-isolation/box/internal/nsrun"
	"github.com/box-isolation/box/probes"
	"github.com/box-isolation/box/stack"
	"github.com/box-isolation/box/stack/boxes"
	"github.com/box-isolation/box/stack/model"
)

// The two attacks of issue 24's "Why" on the bridge's DHCP, made from
// inside a box (root in its network namespace, with the probes a drill
// pushes into one), and what must hold afterwards: the sibling keeps its
// address and traffic, and a new box still gets an address.

// dhcpBox is a probe box with what a test needs of it.
type dhcpBox struct {
	name string
	ip   netip.Addr
	mac  net.HardwareAddr
	ns   netns.NsHandle
	pid  int
}

func mintDHCPBox(t *testing.T, ctx context.Context, h *stack.Host, prefix string) *dhcpBox {
	t.Helper()
	name := stacktest.Name(t, prefix)
	t.Cleanup(func() { _ = boxes.NewManager(h).Remove(context.Background(), name) })
	_, err := boxes.NewManager(h).Mint(ctx, boxes.MintRequest{Name: name, Image: image.DefaultAlias})
	require.NoError(t, err)
	return openDHCPBox(t, ctx, h, name)
}

func openDHCPBox(t *testing.T, ctx context.Context, h *stack.Host, name string) *dhcpBox {
	t.Helper()
	ip, err := h.Addresses().Wait(ctx, name, 30*time.Second)
	require.NoError(t, err, "%s gets an address", name)
	return boxAt(t, ctx, h, name, ip)
}

func boxAt(t *testing.T, ctx context.Context, h *stack.Host, name string, ip netip.Addr) *dhcpBox {
	t.Helper()
	inst, _, err := h.Incus.Instances().Get(ctx, name)
	require.NoError(t, err)
	mac, err := net.ParseMAC(inst.Config["volatile.eth0.hwaddr"])
	require.NoError(t, err)
	st, err := h.Incus.Instances().State(ctx, name)
	require.NoError(t, err)
	ns, err := netns.GetFromPid(int(st.Pid))
	require.NoError(t, err)
	t.Cleanup(func() { ns.Close() })
	return &dhcpBox{name: name, ip: ip, mac: mac, ns: ns, pid: int(st.Pid)}
}

// probe runs one probe inside the box, as its agent would.
func (b *dhcpBox) probe(t *testing.T, spec probes.ProbeSpec) probes.Observation {
	t.Helper()
	var o probes.Observation
	require.NoError(t, inBoxNS(b.ns, func() error { o = probes.RunProbe(context.Background(), spec); return nil }))
	t.Logf("%s: %s %s: %s", b.name, spec.Kind, o.Outcome, o.Reason)
	require.Equal(t, probes.Silent, o.Outcome, "the messages left %s: %s", b.name, o.Reason)
	return o
}

// greet reaches the world's canary from inside the box; "" when it did
// not answer.
func (b *dhcpBox) greet(t *testing.T) string {
	t.Helper()
	var got string
	_ = inBoxNS(b.ns, func() error {
		c, err := net.DialTimeout("tcp", netip.AddrPortFrom(world.Canary, world.CanaryTCPPort).String(), 3*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(3 * time.Second))
		if _, err := fmt.Fprintf(c, "dhcp-%s\n", b.name); err != nil {
			return err
		}
		got, _ = bufio.NewReader(c).ReadString('\n')
		return nil
	})
	return got
}

// renew has the box's DHCP client (busybox udhcpc) renew its lease now,
// as it does half way through the lease, and returns the address the box
// holds once it answered.
func (b *dhcpBox) renew(t *testing.T) netip.Addr {
	t.Helper()
	pid := 0
	ents, err := os.ReadDir("/proc")
	require.NoError(t, err)
	boxNS, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", b.pid))
	require.NoError(t, err)
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", p))
		ns, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", p))
		if strings.TrimSpace(string(comm)) == "udhcpc" && ns == boxNS {
			pid = p
		}
	}
	require.NotZero(t, pid, "%s runs udhcpc", b.name)
	require.NoError(t, syscall.Kill(pid, syscall.SIGUSR1))
	// udhcpc asks at once and applies what it gets (or drops the address
	// on a NAK and asks again): give it a few seconds, then read.
	time.Sleep(3 * time.Second)
	var held netip.Addr
	_ = inBoxNS(b.ns, func() error {
		ifi, err := net.InterfaceByName("eth0")
		if err != nil {
			return err
		}
		addrs, err := ifi.Addrs()
		if err != nil {
			return err
		}
		for _, a := range addrs {
			if p, err := netip.ParsePrefix(a.String()); err == nil && p.Addr().Is4() {
				held = p.Addr()
			}
		}
		return nil
	})
	return held
}

// leaseFile reads the bridge's dnsmasq lease file (IPv4 leases):
// "expiry hwaddr address name client-id".
func leaseFile(t *testing.T, st *world.State) [][]string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(st.IncusDir, "networks", model.Current.Network, "dnsmasq.leases"))
	require.NoError(t, err)
	var out [][]string
	for _, l := range strings.Split(string(raw), "\n") {
		if f := strings.Fields(l); len(f) >= 4 && f[0] != "duid" {
			if a, err := netip.ParseAddr(f[2]); err == nil && a.Is4() {
				out = append(out, f)
			}
		}
	}
	return out
}

// leasedTo is the address the lease file holds for mac (invalid: none).
func leasedTo(t *testing.T, st *world.State, mac net.HardwareAddr) netip.Addr {
	t.Helper()
	for _, l := range leaseFile(t, st) {
		if strings.EqualFold(l[1], mac.String()) {
			return netip.MustParseAddr(l[2])
		}
	}
	return netip.Addr{}
}

// gatewayOf is the bridge's address and MAC.
func gatewayOf(t *testing.T, ctx context.Context, h *stack.Host, st *world.State) (netip.Addr, net.HardwareAddr) {
	t.Helper()
	n, _, err := h.Incus.Networks().Get(ctx, model.Current.Network)
	require.NoError(t, err)
	p := netip.MustParsePrefix(n.Config["ipv4.address"])
	br, err := hostNetlink(t, st).LinkByName(model.Current.Network)
	require.NoError(t, err)
	return p.Addr(), br.Attrs().HardwareAddr
}

// releaseFromHost gives up leases as Incus does when it removes a NIC: a
// DHCPRELEASE from the host to the bridge's dnsmasq naming each, so a
// test that emptied the pool leaves none of its leases behind.
func releaseFromHost(t *testing.T, st *world.State, gw netip.Addr, leases [][]string) {
	t.Helper()
	err := nsrun.Do(st.Names.HostNS, func() error {
		c, err := net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(gw, 67)))
		if err != nil {
			return err
		}
		defer c.Close()
		for i, l := range leases {
			if i%4 == 3 {
				time.Sleep(2 * time.Millisecond) // dnsmasq's socket takes a burst of so many
			}
			hw, err := net.ParseMAC(l[1])
			if err != nil {
				continue
			}
			m, err := dhcpmsg.Message{Type: dhcpmsg.Release, CHAddr: hw, CIAddr: netip.MustParseAddr(l[2]),
				Options: []dhcpmsg.Option{dhcpmsg.Addr(dhcpmsg.OptServerID, gw)}}.Marshal()
			if err != nil {
				return err
			}
			if _, err := c.Write(m); err != nil {
				return err
			}
		}
		return nil
	})
	require.NoError(t, err)
}

// TestSystemDHCPReleaseOfASibling: box-a releases, and declines, box-b's
// lease from its own pinned address and MAC, naming box-b's hardware
// address and IP. Then a box command runs (a third box is minted: the
// pins are refreshed), and box-b renews. box-b keeps its lease, its
// address and its traffic to the canary.
func TestSystemDHCPReleaseOfASibling(t *testing.T) {
	ctx, h, st := worldHost(t)
	_, err := h.Ensure(ctx)
	require.NoError(t, err)
	a := mintDHCPBox(t, ctx, h, "t-dhcp-a-")
	b := mintDHCPBox(t, ctx, h, "t-dhcp-b-")
	require.Contains(t, b.greet(t), "BOXWORLD canary", "box-b reaches the canary before the attack")
	require.Equal(t, b.ip, leasedTo(t, st, b.mac), "box-b's lease is in dnsmasq's lease file before the attack")
	gw, gwMAC := gatewayOf(t, ctx, h, st)
	subnet := netip.PrefixFrom(a.ip, 24)

	a.probe(t, probes.ProbeSpec{ID: "release", Kind: probes.KindDHCPForge, Via: subnet, DHCP: probes.DHCPRelease,
		ClientHW: b.mac.String(), Target: b.ip, ServerID: gw, DstMAC: gwMAC.String(), DeadlineMS: 1500})
	a.probe(t, probes.ProbeSpec{ID: "decline", Kind: probes.KindDHCPForge, Via: subnet, DHCP: probes.DHCPDecline,
		ClientHW: b.mac.String(), Target: b.ip, ServerID: gw, DeadlineMS: 1500})
	time.Sleep(500 * time.Millisecond)
	assert.Equal(t, b.ip, leasedTo(t, st, b.mac), "box-b's lease is still in dnsmasq's lease file after the attack")

	// The next box command refreshes the pins.
	c := mintDHCPBox(t, ctx, h, "t-dhcp-c-")
	assert.NotEqual(t, b.ip, c.ip)
	assert.Contains(t, b.greet(t), "BOXWORLD canary", "box-b reaches the canary after the attack and the next box command")

	// Its renewal, which dnsmasq answers from what it holds now.
	assert.Equal(t, b.ip, b.renew(t), "box-b holds its address after renewing")
	assert.Equal(t, b.ip, leasedTo(t, st, b.mac), "and the lease file has it")
	assert.Contains(t, b.greet(t), "BOXWORLD canary", "box-b reaches the canary after renewing")
}

// TestSystemDHCPPoolStarvation: box-a asks, from its own port, MAC and
// (none) address, for a lease for as many made-up hardware addresses as
// the pool has addresses (each a DISCOVER with rapid commit and an
// INIT-REBOOT request). dnsmasq leases none of them, and a box minted
// afterwards gets its address. The made-up leases an open stack hands
// out are released again at the end (they would hold the pool for the
// lease time, across dnsmasq restarts).
func TestSystemDHCPPoolStarvation(t *testing.T) {
	ctx, h, st := worldHost(t)
	_, err := h.Ensure(ctx)
	require.NoError(t, err)
	a := mintDHCPBox(t, ctx, h, "t-dhcp-a-")
	gw, _ := gatewayOf(t, ctx, h, st)
	subnet := netip.PrefixFrom(a.ip, 24)
	pool := 253 // .2 to .254: Incus's dynamic range on a /24
	prefix := make([]byte, 3)
	_, err = rand.Read(prefix)
	require.NoError(t, err)
	prefix[0] = prefix[0]&0xfc | 0x02 // locally administered, unicast
	hwPrefix := net.HardwareAddr(append(prefix, 0, 0, 0)).String()[:8]
	madeUp := func() [][]string {
		var out [][]string
		for _, l := range leaseFile(t, st) {
			if strings.HasPrefix(strings.ToLower(l[1]), hwPrefix) {
				out = append(out, l)
			}
		}
		return out
	}
	t.Cleanup(func() {
		assert.Eventually(t, func() bool {
			left := madeUp()
			releaseFromHost(t, st, gw, left)
			return len(left) == 0
		}, 10*time.Second, 300*time.Millisecond, "the made-up leases were released")
	})

	t0 := time.Now()
	a.probe(t, probes.ProbeSpec{ID: "flood", Kind: probes.KindDHCPFlood, Via: subnet, Count: pool, HWPrefix: hwPrefix,
		Target: subnet.Masked().Addr().Next().Next(), DeadlineMS: 5000})
	sent := time.Since(t0)
	// dnsmasq works through its socket's queue after the last message.
	time.Sleep(time.Second)
	taken := madeUp()
	t.Logf("measured: %d made-up clients asked in %s; dnsmasq leased %d of the pool's %d addresses to them", pool, sent.Round(time.Millisecond), len(taken), pool)
	assert.Empty(t, taken, "dnsmasq leased nothing to a made-up hardware address")

	n := stacktest.Name(t, "t-dhcp-n-")
	t.Cleanup(func() { _ = boxes.NewManager(h).Remove(context.Background(), n) })
	_, err = boxes.NewManager(h).Mint(ctx, boxes.MintRequest{Name: n, Image: image.DefaultAlias})
	require.NoError(t, err, "a box minted after the attack")
	ip, err := h.Addresses().Wait(ctx, n, 30*time.Second)
	require.NoError(t, err, "a box minted after the attack gets an address")
	t.Logf("the box minted after the attack holds %s", ip)
}
