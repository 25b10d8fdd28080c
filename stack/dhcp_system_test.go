package stack_test

import (
	"bufio"
	"context"
	"crypto/rand"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/box-isolation/box/stack/dnsmasq"
	"github.com/box-isolation/box/stack/stacktest/worldtest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netns"

	"github.com/box-isolation/box/drill/image"
	"github.com/box-isolation/box/fixtures/world"
	"github.com/box-isolation/box/internal/nsrun"
	"github.com/box-isolation/box/probes"
	"github.com/box-isolation/box/stack"
	"github.com/box-isolation/box/stack/boxes"
	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/model"
	"github.com/box-isolation/box/stack/nft"
	"github.com/box-isolation/box/stack/stacktest"
)

// L-DHCP's fixed addresses: a box minted before box stored them is given
// the one it leases, and a clone and a restored box get their own.

// TestSystemDHCPConversion: a box minted before box stored addresses
// (here: made on the stack as it was, with no fixed address and the
// bridge's DHCP open to all) keeps its address and its traffic across
// setup-host, which gives it that address as its fixed one before the
// bridge's DHCP answers known clients only; it keeps it across its
// renewal too.
func TestSystemDHCPConversion(t *testing.T) {
	ctx, h, st := worldtest.Host(t)
	_, err := h.Ensure(ctx)
	require.NoError(t, err)
	// The stack as it was: no DHCP lines.
	n, etag, err := h.Incus.Networks().Get(ctx, model.Current.Network)
	require.NoError(t, err)
	old := n.Config["raw.dnsmasq"]
	for _, l := range []string{"dhcp-ignore=tag:!known\n", "dhcp-ignore-clid\n"} {
		old = strings.Replace(old, l, "", 1)
	}
	n.Config["raw.dnsmasq"] = old
	require.NoError(t, h.Incus.Networks().Update(ctx, model.Current.Network, incus.NetworkPut{Description: n.Description, Config: n.Config}, etag))
	// A box as box minted it then: the profile's NIC, a dynamic lease.
	name := stacktest.Name(t, "t-dhcp-old-")
	t.Cleanup(func() { _ = boxes.NewManager(h).Remove(context.Background(), name) })
	fp, err := image.Ensure(ctx, h.Incus, image.DefaultAlias, image.Options{})
	require.NoError(t, err)
	require.NoError(t, h.Incus.Instances().Create(ctx, incus.InstancesPost{Name: name, Type: model.TypeContainer,
		Config: map[string]string{model.Current.Tag: "1"}, Profiles: []string{model.Current.Profile},
		Source: incus.InstanceSource{Type: "image", Fingerprint: fp.Fingerprint}, Start: true}))
	// Waited for as Incus sees it: box's own wait refreshes the pins,
	// which gives a box without a fixed address one (this test is of
	// setup-host's).
	ip, err := h.Incus.Instances().WaitAddress(ctx, name, netip.MustParsePrefix(n.Config["ipv4.address"]).Masked(), 30*time.Second)
	require.NoError(t, err)
	box := boxAt(t, ctx, h, name, ip)
	inst, _, err := h.Incus.Instances().Get(ctx, name)
	require.NoError(t, err)
	require.Empty(t, inst.ExpandedDevices["eth0"]["ipv4.address"], "minted with no fixed address")
	// The pins as they were: the lease's address.
	_, nc := worldtest.NFT(t, st)
	port := inst.Config["volatile.eth0.host_name"]
	_, err = nft.SetPins(nc, []string{port}, []nft.Pin{{Port: port, MAC: box.mac, Addrs: []netip.Addr{box.ip}}})
	require.NoError(t, err)
	require.Contains(t, box.greet(t), "BOXWORLD canary")
	v, err := h.Verify(ctx)
	require.NoError(t, err)
	var dhcp []string
	for _, f := range v.Findings {
		if f.Layer == model.LayerDHCP {
			dhcp = append(dhcp, f.String())
		}
	}
	assert.Len(t, dhcp, 2, "doctor names the missing DHCP lines and the box without a fixed address: %v", dhcp)

	rep, err := h.Ensure(ctx)
	require.NoError(t, err)
	var changes []string
	for _, c := range rep.Changes {
		changes = append(changes, c.String())
	}
	assert.Contains(t, changes, "updated box "+name+": fixed address "+box.ip.String(), "the address it leased")
	inst, _, err = h.Incus.Instances().Get(ctx, name)
	require.NoError(t, err)
	assert.Equal(t, box.ip.String(), inst.ExpandedDevices["eth0"]["ipv4.address"])
	n, _, err = h.Incus.Networks().Get(ctx, model.Current.Network)
	require.NoError(t, err)
	assert.Contains(t, n.Config["raw.dnsmasq"], "dhcp-ignore=tag:!known\ndhcp-ignore-clid\n")
	assert.Contains(t, box.greet(t), "BOXWORLD canary", "its traffic goes on across the switch")
	assert.Equal(t, box.ip, box.renew(t), "it keeps its address when it renews")
	assert.Contains(t, box.greet(t), "BOXWORLD canary", "and its traffic")
	v, err = h.Verify(ctx)
	require.NoError(t, err)
	for _, f := range v.Findings {
		assert.True(t, f.Advisory, "converged: %s", f)
	}
	require.NotNil(t, v.Pool)
	t.Logf("%s", v.Pool)
	assert.Equal(t, 253, v.Pool.Size)
}

// TestSystemDHCPFixedAddresses: a minted box, its clone, and a box
// restored to a snapshot its clone carried each get a fixed address of
// their own, and the bridge's DHCP (known clients only) gives each its
// own; Verify finds every box on the stack.
func TestSystemDHCPFixedAddresses(t *testing.T) {
	ctx, h, _ := worldtest.Host(t)
	_, err := h.Ensure(ctx)
	require.NoError(t, err)
	a := mintDHCPBox(t, ctx, h, "t-dhcp-a-")
	fixed := func(name string) netip.Addr {
		inst, _, err := h.Incus.Instances().Get(ctx, name)
		require.NoError(t, err)
		ad, _ := netip.ParseAddr(inst.ExpandedDevices["eth0"]["ipv4.address"])
		return ad
	}
	assert.Equal(t, a.ip, fixed(a.name), "a minted box holds the address box stored for it")
	require.NoError(t, boxes.NewManager(h).Stop(ctx, a.name, false))
	_, err = boxes.NewManager(h).Snapshot(ctx, a.name, "s1")
	require.NoError(t, err)
	require.NoError(t, boxes.NewManager(h).Start(ctx, a.name))

	clone := stacktest.Name(t, "t-dhcp-c-")
	t.Cleanup(func() { _ = boxes.NewManager(h).Remove(context.Background(), clone) })
	_, err = boxes.NewManager(h).Clone(ctx, a.name, "", clone)
	require.NoError(t, err)
	c := openDHCPBox(t, ctx, h, clone)
	assert.Equal(t, c.ip, fixed(clone), "the clone holds its own stored address")
	assert.NotEqual(t, a.ip, c.ip)
	assert.Contains(t, c.greet(t), "BOXWORLD canary")

	// The clone's copy of s1 holds a's address: restored, the clone gets
	// its own again.
	require.NoError(t, boxes.NewManager(h).Stop(ctx, clone, false))
	_, err = boxes.NewManager(h).Restore(ctx, clone, "s1", false)
	require.NoError(t, err)
	require.NoError(t, boxes.NewManager(h).Start(ctx, clone))
	c = openDHCPBox(t, ctx, h, clone)
	assert.NotEqual(t, a.ip, fixed(clone), "not its source's")
	assert.Equal(t, fixed(clone), c.ip, "it leases the address it holds")
	assert.Contains(t, c.greet(t), "BOXWORLD canary")
	a = openDHCPBox(t, ctx, h, a.name)
	assert.Equal(t, fixed(a.name), a.ip, "a keeps its own")
	assert.Contains(t, a.greet(t), "BOXWORLD canary")

	v, err := h.Verify(ctx)
	require.NoError(t, err)
	for _, f := range v.Findings {
		assert.True(t, f.Advisory, "%s", f)
	}
}

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
	var ls []dnsmasq.Lease
	for _, l := range leases {
		ls = append(ls, dnsmasq.Lease{Hwaddr: l[1], Address: netip.MustParseAddr(l[2])})
	}
	require.NoError(t, nsrun.Do(st.Names.HostNS, func() error { return dnsmasq.SendReleases(gw, ls) }))
}

// TestSystemDHCPReleaseOfASibling: box-a releases, and declines, box-b's
// lease from its own pinned address and MAC, naming box-b's hardware
// address and IP. Then a box command runs (a third box is minted: the
// pins are refreshed), and box-b renews. box-b keeps its lease, its
// address and its traffic to the canary.
func TestSystemDHCPReleaseOfASibling(t *testing.T) {
	ctx, h, st := worldtest.Host(t)
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
	ctx, h, st := worldtest.Host(t)
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

// TestSystemHandEditedDnsmasq: an operator sets the bridge's dnsmasq
// settings by hand through a shell's command substitution, which strips
// the trailing newline Incus then stores none of. Box's next changes must
// not glue a line of theirs to the operator's last one (dnsmasq then
// refuses to start: "bad option"): a box's first allowlist leaves the
// settings alone (the allowlist is box's resolver's, not dnsmasq's), and a
// converge writes them whole, every line ended; dnsmasq serves the bridge
// throughout.
func TestSystemHandEditedDnsmasq(t *testing.T) {
	ctx, h, st := worldtest.Host(t)
	_, err := h.Ensure(ctx)
	require.NoError(t, err)
	box := stacktest.Name(t, "t-raw-")
	t.Cleanup(func() { _ = boxes.NewManager(h).Remove(context.Background(), box) })
	_, err = boxes.NewManager(h).Mint(ctx, boxes.MintRequest{Name: box, Image: image.DefaultAlias})
	require.NoError(t, err)

	n, _, err := h.Incus.Networks().Get(ctx, model.Current.Network)
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSuffix(n.Config["raw.dnsmasq"], "\n"), "\n")
	lines = append(lines, "log-async")
	// As an operator types it: printf's last newline is stripped by $(...).
	cmd := exec.CommandContext(ctx, "sh", "-c", `incus network set `+model.Current.Network+` raw.dnsmasq="$(printf '%s\n' "$@")"`, "sh")
	cmd.Args = append(cmd.Args, lines...)
	cmd.Env = append(os.Environ(), "INCUS_DIR="+st.IncusDir)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	n, _, err = h.Incus.Networks().Get(ctx, model.Current.Network)
	require.NoError(t, err)
	edited := n.Config["raw.dnsmasq"]
	require.True(t, strings.HasSuffix(edited, "log-async"), "Incus stored it with no newline at the end: %q", edited)

	t0 := time.Now()
	ch, err := boxes.NewManager(h).SetEgress(ctx, box, []string{"canary.example.net"})
	require.NoError(t, err, "the change after the hand edit")
	t.Logf("new policy %v in %s", ch.NewPolicy, time.Since(t0).Round(time.Millisecond))
	n, _, err = h.Incus.Networks().Get(ctx, model.Current.Network)
	require.NoError(t, err)
	assert.Equal(t, edited, n.Config["raw.dnsmasq"], "an allowlist writes nothing into dnsmasq's settings")
	v, err := h.Verify(ctx)
	require.NoError(t, err)
	assert.NotZero(t, v.DnsmasqPID, "dnsmasq serves the bridge")

	_, err = h.Ensure(ctx)
	require.NoError(t, err, "a converge after the hand edit")
	n, _, err = h.Incus.Networks().Get(ctx, model.Current.Network)
	require.NoError(t, err)
	raw := n.Config["raw.dnsmasq"]
	assert.True(t, strings.HasSuffix(raw, "\n"), "box ends its lines: %q", raw)
	assert.NotContains(t, raw, "log-async", "a converge puts the drift right")
	v, err = h.Verify(ctx)
	require.NoError(t, err)
	assert.NotZero(t, v.DnsmasqPID, "dnsmasq serves the bridge")
}
