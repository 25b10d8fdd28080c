package hostscan

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/xt"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/box-isolation/box/internal/nsrun"
	"github.com/box-isolation/box/internal/nstest"
	"github.com/box-isolation/box/internal/testenv/tier"
)

// The privileged tier: throwaway namespaces (internal/nstest) named
// boxhs-<run>-<role>, deleted in t.Cleanup whatever happens. They have no
// link to the machine's network, and nothing here sends a packet.

// init pins the main goroutine to the process's main thread, so no test
// ever runs there: a reader that looked at /proc/self (the main thread's
// namespace) instead of the calling thread's then fails every time, not
// only when a test happens to land on the main thread.
func init() { runtime.LockOSThread() }

func newNS(t *testing.T, role string) *nstest.NS {
	t.Helper()
	tier.Root(t)
	return nstest.New(t, "boxhs-"+nstest.RunID()+"-"+role)
}

// addLink adds an up veth link with the given addresses, its peer
// (name+"p") up in the same namespace: a link to hang addresses and
// neighbours on (this kernel may have no dummy links).
func addLink(t *testing.T, ns *nstest.NS, name string, cidrs ...string) {
	t.Helper()
	v := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: name + "p"}
	require.NoError(t, ns.Netlink(t).LinkAdd(v))
	for _, c := range cidrs {
		ns.AddAddr(t, name, c)
	}
	ns.LinkUp(t, name)
	ns.LinkUp(t, name+"p")
}

func TestPrivilegedListeners(t *testing.T) {
	ns := newNS(t, "listen")
	addLink(t, ns, "d0", "10.250.0.1/24", "fd00:250::1/64")

	// What the test opens in the namespace; nothing else listens there.
	closers := []func() error{}
	t.Cleanup(func() {
		for _, c := range closers {
			_ = c()
		}
	})
	err := ns.Run(func() error {
		for _, a := range []string{"0.0.0.0:2222", "127.0.0.1:2224", "[::]:2223", "[::1]:2225"} {
			network := "tcp4"
			if a[0] == '[' {
				network = "tcp6"
			}
			l, err := net.Listen(network, a)
			if err != nil {
				return err
			}
			closers = append(closers, l.Close)
		}
		pc, err := net.ListenPacket("udp4", "10.250.0.1:5353")
		if err != nil {
			return err
		}
		closers = append(closers, pc.Close)
		// An IPv6 UDP socket bound to a v4-mapped address: Go would open
		// an IPv4 socket for it, so by hand.
		fd, err := unix.Socket(unix.AF_INET6, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		closers = append(closers, func() error { return unix.Close(fd) })
		mapped := netip.MustParseAddr("::ffff:10.250.0.1").As16()
		if err := unix.Bind(fd, &unix.SockaddrInet6{Port: 5354, Addr: mapped}); err != nil {
			return err
		}
		// A connected UDP socket is no listener.
		c, err := net.Dial("udp4", "10.250.0.9:9")
		if err != nil {
			return err
		}
		closers = append(closers, c.Close)
		return nil
	})
	require.NoError(t, err)

	var got []Listener
	require.NoError(t, nsrun.Do(ns.Name, func() (err error) {
		got, err = Listeners()
		return err
	}))
	comm, err := os.ReadFile("/proc/self/comm")
	require.NoError(t, err)
	var names []string
	for _, l := range got {
		assert.Equal(t, os.Getpid(), l.PID, "%s is the test's own socket", l)
		assert.Equal(t, string(comm[:len(comm)-1]), l.Process, "%s", l)
		assert.NotZero(t, l.Inode, "%s", l)
		l.PID, l.Process = 0, ""
		names = append(names, l.String())
	}
	assert.Equal(t, []string{
		"tcp 0.0.0.0:2222",
		"tcp 127.0.0.1:2224 loopback-only",
		"tcp [::]:2223",
		"tcp [::1]:2225 loopback-only",
		"udp 10.250.0.1:5353",
		"udp 10.250.0.1:5354",
	}, names, "exactly the namespace's sockets: none of the machine's own")
	for _, l := range got {
		if l.Port == 5354 {
			assert.Equal(t, 6, l.Family, "the v4-mapped socket is an IPv6 one")
			assert.True(t, l.Addr.Is4())
		}
	}
}

func TestPrivilegedNeighbours(t *testing.T) {
	ns := newNS(t, "neigh")
	addLink(t, ns, "d0", "10.250.1.1/24", "fd00:251::1/64")
	h := ns.Netlink(t)
	idx := ns.Link(t, "d0").Attrs().Index
	for _, n := range []netlink.Neigh{
		{IP: net.ParseIP("10.250.1.2"), HardwareAddr: mac("02:00:00:01:00:02"), State: netlink.NUD_PERMANENT},
		{IP: net.ParseIP("10.250.1.3"), HardwareAddr: mac("02:00:00:01:00:03"), State: netlink.NUD_STALE},
		{IP: net.ParseIP("10.250.1.4"), HardwareAddr: mac("02:00:00:01:00:04"), State: netlink.NUD_NOARP},
		{IP: net.ParseIP("10.250.1.5"), HardwareAddr: mac("02:00:00:01:00:05"), State: netlink.NUD_FAILED},
		{IP: net.ParseIP("fd00:251::2"), HardwareAddr: mac("02:00:00:01:00:06"), State: netlink.NUD_STALE, Flags: netlink.NTF_ROUTER},
	} {
		n.LinkIndex = idx
		n.Family = netlink.FAMILY_V4
		if n.IP.To4() == nil {
			n.Family = netlink.FAMILY_V6
		}
		require.NoError(t, h.NeighAdd(&n), "%s", n.IP)
	}

	var got []Neighbour
	require.NoError(t, nsrun.Do(ns.Name, func() (err error) {
		got, err = Neighbours()
		return err
	}))
	var s []string
	for _, n := range got {
		s = append(s, n.String())
	}
	assert.Equal(t, []string{
		"10.250.1.2 lladdr 02:00:00:01:00:02 dev d0 permanent",
		"10.250.1.3 lladdr 02:00:00:01:00:03 dev d0 stale",
		"fd00:251::2 lladdr 02:00:00:01:00:06 dev d0 stale",
	}, s, "only the namespace's usable entries")
	if len(got) == 3 {
		assert.True(t, got[2].Router)
	}
}

func TestPrivilegedHostname(t *testing.T) {
	tier.Root(t)
	// A throwaway UTS namespace on a thread that dies with its goroutine.
	type result struct {
		name string
		err  error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread exits with the goroutine
		if err := unix.Unshare(unix.CLONE_NEWUTS); err != nil {
			ch <- result{err: err}
			return
		}
		if err := unix.Sethostname([]byte("boxhs-uts")); err != nil {
			ch <- result{err: err}
			return
		}
		h, err := Hostname()
		ch <- result{h, err}
	}()
	r := <-ch
	require.NoError(t, r.err)
	assert.Equal(t, "boxhs-uts", r.name, "the calling thread's UTS namespace")
}

func TestPrivilegedForwards(t *testing.T) {
	ns := newNS(t, "fwd")
	nft := tier.Tool(t, "nft", "nftables") // writes the rules as nft(8) does
	ruleset := `
table ip nat {
	chain prerouting {
		type nat hook prerouting priority dstnat; policy accept;
		tcp dport 8080 dnat to 10.1.2.3:80
		iifname "eth0" udp dport { 53, 5000-5010 } dnat to 10.1.2.4
		tcp dport 2222 redirect to :22
	}
	chain postrouting {
		type nat hook postrouting priority srcnat; policy accept;
		oifname "eth0" masquerade
	}
}
table inet fw {
	chain portfw {
		ip6 daddr fd00::1 tcp dport 443 dnat ip6 to [fd00::9]:8443
		tcp dport != 22 counter
	}
}
`
	cmd := exec.Command("ip", "netns", "exec", ns.Name, nft, "-f", "-")
	cmd.Stdin = strings.NewReader(ruleset)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)

	var fw Forwarding
	require.NoError(t, nsrun.Do(ns.Name, func() (err error) {
		fw, err = Forwards()
		return err
	}))
	var got []string
	for _, f := range fw.Forwards {
		got = append(got, f.String())
		assert.Empty(t, f.Notes, "%s", f)
	}
	assert.ElementsMatch(t, []string{
		"ip nat prerouting: tcp dport 8080 dnat to 10.1.2.3:80",
		`ip nat prerouting: iifname "eth0" udp dport 53,5000-5010 dnat to 10.1.2.4`,
		"ip nat prerouting: tcp dport 2222 redirect to :22",
		"inet fw portfw: daddr fd00::1 tcp dport 443 dnat to [fd00::9]:8443",
	}, got, "only this namespace's rules")
	assert.Empty(t, fw.LegacyTables, "a fresh namespace has no legacy iptables tables")
	t.Logf("forwards:\n%s", strings.Join(got, "\n"))
	for _, f := range fw.Forwards {
		if f.Chain == "prerouting" && f.Proto == "tcp" && f.Kind == KindDNAT {
			assert.Equal(t, []PortRange{{8080, 8080}}, f.Ports)
			assert.Equal(t, netip.MustParseAddr("10.1.2.3"), f.ToAddr)
			assert.Equal(t, PortRange{80, 80}, f.ToPorts)
		}
	}
}

// TestPrivilegedForwardsCompat writes an iptables-nft style rule (xtables
// match and target inside nftables) with google/nftables, as Docker's
// iptables-nft would: ! -i docker0 -p tcp -m tcp --dport 8080 -j DNAT
// --to-destination 172.17.0.2:80.
func TestPrivilegedForwardsCompat(t *testing.T) {
	ns := newNS(t, "compat")
	err := ns.Run(func() error {
		c, err := nftables.New()
		if err != nil {
			return err
		}
		tbl := c.AddTable(&nftables.Table{Family: nftables.TableFamilyIPv4, Name: "nat"})
		ch := c.AddChain(&nftables.Chain{Name: "DOCKER", Table: tbl})
		c.AddRule(&nftables.Rule{Table: tbl, Chain: ch, Exprs: []expr.Any{
			&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: []byte("docker0\x00")},
			&expr.Payload{OperationType: expr.PayloadLoad, DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 9, Len: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
			&expr.Match{Name: "tcp", Info: &xt.Tcp{SrcPorts: [2]uint16{0, 65535}, DstPorts: [2]uint16{8080, 8080}}},
			&expr.Target{Name: "DNAT", Rev: 2, Info: &xt.NatRange2{NatRange: xt.NatRange{
				Flags: uint(xt.NatRangeMapIPs | xt.NatRangeProtoSpecified),
				MinIP: net.ParseIP("172.17.0.2").To4(), MaxIP: net.ParseIP("172.17.0.2").To4(), MinPort: 80, MaxPort: 80,
			}}},
		}})
		return c.Flush()
	})
	if err != nil {
		tier.Unavailable(t, fmt.Sprintf("this kernel takes no xtables match or DNAT target in nftables: load them (modprobe nft_compat xt_tcpudp xt_nat): %v", err))
	}
	var fw Forwarding
	require.NoError(t, nsrun.Do(ns.Name, func() (err error) {
		fw, err = Forwards()
		return err
	}))
	require.Len(t, fw.Forwards, 1)
	assert.Equal(t, `ip nat DOCKER: iifname != "docker0" tcp dport 8080 dnat to 172.17.0.2:80 (iptables-nft)`, fw.Forwards[0].String())
}
