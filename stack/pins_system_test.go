package stack_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/box-isolation/box/stack/stacktest/worldtest"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/box-isolation/box/drill/image"
	"github.com/box-isolation/box/fixtures/world"
	"github.com/box-isolation/box/internal/nstest"
	"github.com/box-isolation/box/stack/boxes"
	"github.com/box-isolation/box/stack/model"
	"github.com/box-isolation/box/stack/nft"
	"github.com/box-isolation/box/stack/stacktest"
)

// TestSystemNATInsideABoxWithPinning: per-port pinning lets a box send only
// with its own MAC and leased address, and a box that runs its own NAT
// inside (as in-box Docker does) keeps working: a network namespace of the
// box's own, masqueraded by the box's kernel, reaches the canary. The
// same namespace without the box's NAT does not get out (its address is
// nobody's lease, and the host's NAT carries only the box subnet).
func TestSystemNATInsideABoxWithPinning(t *testing.T) {
	ctx, h, st := worldtest.Host(t)
	_, err := h.Ensure(ctx)
	require.NoError(t, err)
	box := stacktest.Name(t, "t-nat-")
	t.Cleanup(func() { _ = boxes.NewManager(h).Remove(context.Background(), box) })
	_, err = boxes.NewManager(h).Mint(ctx, boxes.MintRequest{Name: box, Image: image.DefaultAlias})
	require.NoError(t, err)
	_, err = h.Addresses().Wait(ctx, box, 30*time.Second)
	require.NoError(t, err)
	v, err := h.Verify(ctx)
	require.NoError(t, err)
	for _, f := range v.Findings {
		assert.NotEqual(t, model.LayerPin, f.Layer, "the box is pinned: %s", f)
	}
	_, nc := worldtest.NFT(t, st)
	present, err := nft.PinsPresent(nc)
	require.NoError(t, err)
	require.True(t, present, "the pin table is in the path")

	state, err := h.Incus.Instances().State(ctx, box)
	require.NoError(t, err)
	boxNS, err := netns.GetFromPid(int(state.Pid))
	require.NoError(t, err)
	defer boxNS.Close()

	// The box's own network: a namespace behind a veth, 192.168.231.0/24.
	inner := nstest.New(t, "boxnat-"+nstest.RunID()+"-in")
	bh, err := netlink.NewHandleAt(boxNS)
	require.NoError(t, err)
	defer bh.Close()
	require.NoError(t, bh.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "bn0"}, PeerName: "bn1"}))
	peer, err := bh.LinkByName("bn1")
	require.NoError(t, err)
	require.NoError(t, bh.LinkSetNsFd(peer, int(inner.Handle)))
	bn0, err := bh.LinkByName("bn0")
	require.NoError(t, err)
	require.NoError(t, bh.AddrAdd(bn0, &netlink.Addr{IPNet: mustNet("192.168.231.1/24")}))
	require.NoError(t, bh.LinkSetUp(bn0))
	require.NoError(t, inBoxNS(boxNS, func() error {
		return os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644)
	}))
	inner.AddAddr(t, "bn1", "192.168.231.2/24")
	inner.LinkUp(t, "bn1")
	ih := inner.Netlink(t)
	bn1, err := ih.LinkByName("bn1")
	require.NoError(t, err)
	require.NoError(t, ih.RouteAdd(&netlink.Route{LinkIndex: bn1.Attrs().Index, Gw: net.ParseIP("192.168.231.1")}))

	greet := func() (string, error) {
		var got string
		err := inner.Run(func() error {
			c, err := net.DialTimeout("tcp", netip.AddrPortFrom(world.Canary, world.CanaryTCPPort).String(), 3*time.Second)
			if err != nil {
				return err
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(3 * time.Second))
			if _, err := fmt.Fprintf(c, "nat-inside-a-box\n"); err != nil {
				return err
			}
			got, err = bufio.NewReader(c).ReadString('\n')
			return err
		})
		return got, err
	}

	// Without the box's NAT: the namespace's address is no lease.
	_, err = greet()
	require.Error(t, err, "a source that is nobody's lease does not get out")

	// With the box's NAT, as in-box Docker has it.
	bc, err := nftables.New(nftables.WithNetNSFd(int(boxNS)))
	require.NoError(t, err)
	tbl := bc.AddTable(&nftables.Table{Family: nftables.TableFamilyIPv4, Name: "boxnat"})
	ch := bc.AddChain(&nftables.Chain{Name: "post", Table: tbl, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource})
	bc.AddRule(&nftables.Rule{Table: tbl, Chain: ch, Exprs: []expr.Any{
		&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifname("eth0")},
		&expr.Masq{},
	}})
	require.NoError(t, bc.Flush())
	got, err := greet()
	require.NoError(t, err, "the box's own namespace reaches the canary through the box's NAT, with pinning on")
	assert.True(t, strings.HasPrefix(got, "BOXWORLD canary"), "the canary answered: %q", got)
}

func mustNet(cidr string) *net.IPNet {
	ip, n, err := net.ParseCIDR(cidr)
	if err != nil {
		panic(err)
	}
	n.IP = ip
	return n
}

func ifname(n string) []byte {
	b := make([]byte, 16)
	copy(b, n)
	return b
}

// inBoxNS runs fn on a thread in the box's network namespace; the thread
// is thrown away afterwards.
func inBoxNS(ns netns.NsHandle, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with the goroutine
		if err := netns.Set(ns); err != nil {
			errc <- err
			return
		}
		errc <- fn()
	}()
	return <-errc
}
