package probes

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"syscall"
	"time"

	"github.com/box-isolation/box/probes/observation"
	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// A plan with a NestSpec runs in a workload nested in the box, as the
// containers an agent starts inside its box would: in a network namespace
// of its own, either behind a bridge in the box whose traffic the box NATs
// out of its interface (Docker's default bridge), or on a macvlan child of
// the box's interface with a MAC of its own (a container given the box's
// link). The agent builds it, runs the rest of the plan there as a child
// process (every thread of it in that namespace), and takes it all down
// again.

// Kinds of nested workload.
const (
	NestNAT     = "nat"     // a namespace behind a bridge in the box, NATed out of its interface
	NestMACVLAN = "macvlan" // a namespace on a macvlan child of the box's interface, its own MAC
)

// NestSpec is the nested workload a plan runs in.
type NestSpec struct {
	Kind string `json:"kind"`
	// Via is the box's subnet: the box's interface is found by it.
	Via netip.Prefix `json:"via"`
	// Address is the workload's address and prefix: on the box's bridge
	// (nat), or in the box's subnet (macvlan).
	Address netip.Prefix `json:"address"`
	// Gateway is the workload's default route: the bridge's address in the
	// box (nat), or the box subnet's gateway (macvlan).
	Gateway netip.Addr `json:"gateway"`
	// MAC is the macvlan child's own MAC.
	MAC string `json:"mac,omitempty"`
}

func (n *NestSpec) validate() error {
	switch n.Kind {
	case NestNAT, NestMACVLAN:
	default:
		return fmt.Errorf("kind %q is not %s or %s", observation.Truncate(n.Kind, 16), NestNAT, NestMACVLAN)
	}
	if !n.Via.IsValid() || !n.Via.Addr().Is4() {
		return errors.New("via must be the box's IPv4 subnet")
	}
	if !n.Address.IsValid() || !n.Address.Addr().Is4() || !n.Gateway.Is4() {
		return errors.New("address and gateway must be IPv4")
	}
	if !n.Address.Masked().Contains(n.Gateway) || n.Address.Addr() == n.Gateway {
		return errors.New("the gateway must be another address of the workload's subnet")
	}
	switch n.Kind {
	case NestNAT:
		if n.Address.Masked().Overlaps(n.Via.Masked()) {
			return errors.New("a nat workload's subnet must not overlap the box's")
		}
		if n.MAC != "" {
			return errors.New("mac is for a macvlan workload")
		}
	case NestMACVLAN:
		if n.Address.Masked() != n.Via.Masked() {
			return errors.New("a macvlan workload's address must be in the box's subnet")
		}
		if err := checkMAC(n.MAC); err != nil {
			return fmt.Errorf("mac: %w", err)
		}
	}
	return nil
}

// Names of what a nested workload puts in the box.
const (
	nestBridge = "drlnest0"  // nat: the workload's bridge
	nestHost   = "drlnest0h" // nat: the box's end of the workload's veth
	nestPeer   = "drlnest0c" // nat: the workload's end, renamed eth0 in its namespace
	nestMACVLN = "drlnest0m" // macvlan: the child, renamed eth0 in its namespace
	nestTable  = "drill_nest"
	nestIface  = "eth0"
)

// NestChild is the command that runs a plan in the nested workload: this
// binary's agent, reading the plan on stdin. Tests point it at their own
// binary.
var NestChild = func() *exec.Cmd { return exec.Command("/proc/self/exe", "agent") }

// RunNested builds the plan's nested workload, runs the rest of the plan
// in it, takes it down and returns the workload's report. What could not
// be built is the report's error, and every probe of the plan is then
// missing (the drill judges that inconclusive, never silent).
func RunNested(ctx context.Context, p *Plan) *Report {
	start := time.Now()
	fail := func(err error) *Report {
		now := time.Now()
		return &Report{Version: ReportVersion, StartedAt: start, FinishedAt: now, Observations: []Observation{}, Error: "nested " + p.Nest.Kind + " workload: " + err.Error()}
	}
	// The workload waits for the plan's start itself; its deadline counts
	// from there.
	ctx, cancel := context.WithDeadline(ctx, p.Start(start).Add(p.Deadline()))
	defer cancel()
	child := *p
	child.Nest = nil
	// The workload's own probes run to the same deadline, less what
	// building it took.
	plan, err := json.Marshal(&child)
	if err != nil {
		return fail(err)
	}
	undo, err := nestBoxSide(p.Nest)
	defer undo()
	if err != nil {
		return fail(err)
	}
	cmd := NestChild()
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: unix.CLONE_NEWNET}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return fail(err)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		return fail(fmt.Errorf("starting the workload in a namespace of its own: %w", err))
	}
	waited := false
	defer func() {
		if !waited {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	}()
	// The child reads its plan only once its network is there: it waits on
	// stdin until then.
	if err := nestWorkloadSide(p.Nest, cmd.Process.Pid); err != nil {
		return fail(err)
	}
	if _, err := stdin.Write(plan); err != nil {
		return fail(fmt.Errorf("handing the workload its plan: %w", err))
	}
	stdin.Close()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err = <-done:
	case <-ctx.Done():
		_ = cmd.Process.Kill()
		err = <-done
	}
	waited = true
	rep, derr := DecodeReport(&stdout)
	if derr != nil {
		return fail(fmt.Errorf("its report: %v (exit: %v; stderr: %.300s)", derr, err, stderr.String()))
	}
	return rep
}

// nestBoxSide builds the box's side of the workload and returns what
// takes it down (to be called whatever happened).
func nestBoxSide(n *NestSpec) (func(), error) {
	var undos []func()
	undo := func() {
		for i := len(undos) - 1; i >= 0; i-- {
			undos[i]()
		}
	}
	ifi, _, err := InterfaceForSubnet(n.Via)
	if err != nil {
		return undo, err
	}
	parent, err := netlink.LinkByIndex(ifi.Index)
	if err != nil {
		return undo, err
	}
	switch n.Kind {
	case NestMACVLAN:
		mac, _ := net.ParseMAC(n.MAC)
		mv := &netlink.Macvlan{LinkAttrs: netlink.LinkAttrs{Name: nestMACVLN, ParentIndex: parent.Attrs().Index, HardwareAddr: mac}, Mode: netlink.MACVLAN_MODE_BRIDGE}
		if err := netlink.LinkAdd(mv); err != nil {
			return undo, fmt.Errorf("a macvlan child of %s: %w", ifi.Name, err)
		}
		// Once moved into the workload's namespace it dies with it; this
		// is for a failure before.
		undos = append(undos, func() { deleteLink(nestMACVLN) })
	case NestNAT:
		br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: nestBridge}}
		if err := netlink.LinkAdd(br); err != nil {
			return undo, fmt.Errorf("the workload's bridge: %w", err)
		}
		undos = append(undos, func() { deleteLink(nestBridge) })
		gw := netip.PrefixFrom(n.Gateway, n.Address.Bits())
		if err := netlink.AddrAdd(br, &netlink.Addr{IPNet: prefixNet(gw)}); err != nil {
			return undo, fmt.Errorf("the workload's bridge address %s: %w", gw, err)
		}
		veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: nestHost, MasterIndex: br.Attrs().Index}, PeerName: nestPeer}
		if err := netlink.LinkAdd(veth); err != nil {
			return undo, fmt.Errorf("the workload's veth: %w", err)
		}
		undos = append(undos, func() { deleteLink(nestHost) })
		for _, l := range []netlink.Link{br, veth} {
			if err := netlink.LinkSetUp(l); err != nil {
				return undo, err
			}
		}
		old, err := os.ReadFile("/proc/sys/net/ipv4/ip_forward")
		if err != nil {
			return undo, err
		}
		if err := os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644); err != nil {
			return undo, fmt.Errorf("forwarding in the box: %w", err)
		}
		undos = append(undos, func() { _ = os.WriteFile("/proc/sys/net/ipv4/ip_forward", bytes.TrimSpace(old), 0o644) })
		if err := nestMasquerade(ifi.Name, n.Address.Masked()); err != nil {
			return undo, fmt.Errorf("NAT out of %s: %w", ifi.Name, err)
		}
		undos = append(undos, nestUnmasquerade)
	}
	return undo, nil
}

// nestWorkloadSide moves the workload's link into the child's namespace
// and gives it its address and route there.
func nestWorkloadSide(n *NestSpec, pid int) error {
	ns, err := netns.GetFromPid(pid)
	if err != nil {
		return err
	}
	defer ns.Close()
	name := nestPeer
	if n.Kind == NestMACVLAN {
		name = nestMACVLN
	}
	l, err := netlink.LinkByName(name)
	if err != nil {
		return err
	}
	if err := netlink.LinkSetNsFd(l, int(ns)); err != nil {
		return fmt.Errorf("moving %s into the workload's namespace: %w", name, err)
	}
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return err
	}
	defer h.Close()
	if lo, err := h.LinkByName("lo"); err == nil {
		_ = h.LinkSetUp(lo)
	}
	l, err = h.LinkByName(name)
	if err != nil {
		return err
	}
	if err := h.LinkSetName(l, nestIface); err != nil {
		return err
	}
	if err := h.AddrAdd(l, &netlink.Addr{IPNet: prefixNet(n.Address)}); err != nil {
		return fmt.Errorf("the workload's address %s: %w", n.Address, err)
	}
	if err := h.LinkSetUp(l); err != nil {
		return err
	}
	if err := h.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Gw: n.Gateway.AsSlice()}); err != nil {
		return fmt.Errorf("the workload's default route via %s: %w", n.Gateway, err)
	}
	return nil
}

// nestMasquerade NATs the workload's subnet out of the box's interface,
// as Docker does for its default bridge.
func nestMasquerade(oif string, from netip.Prefix) error {
	c, err := nftables.New()
	if err != nil {
		return err
	}
	t := c.AddTable(&nftables.Table{Family: nftables.TableFamilyIPv4, Name: nestTable})
	ch := c.AddChain(&nftables.Chain{Name: "postrouting", Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource})
	src := from.Addr().As4()
	mask := net.CIDRMask(from.Bits(), 32)
	c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: []expr.Any{
		&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifname(oif)},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: []byte{0, 0, 0, 0}},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: src[:]},
		&expr.Masq{},
	}})
	return c.Flush()
}

func nestUnmasquerade() {
	if c, err := nftables.New(); err == nil {
		c.DelTable(&nftables.Table{Family: nftables.TableFamilyIPv4, Name: nestTable})
		_ = c.Flush()
	}
}

// ifname is an interface name as nft compares it: NUL-padded to IFNAMSIZ.
func ifname(n string) []byte {
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, n)
	return b
}

func deleteLink(name string) {
	if l, err := netlink.LinkByName(name); err == nil {
		_ = netlink.LinkDel(l)
	}
}

func prefixNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}
