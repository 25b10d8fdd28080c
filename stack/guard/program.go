// Package guard is layer L-GUARD's program: a tc eBPF classifier for the
// clsact ingress hook of box's bridge, which no firewall tool's `nft flush
// ruleset` touches. It sees what the bridge passes up to the host (to the
// host's MAC, broadcast, multicast): everything a box sends to the host or
// routes through it, after the bridge's forwarding decision. It passes
// only what a box may send there, from an address of the bridge's subnet
// (or from 0.0.0.0, for DHCP):
//
//   - ARP;
//   - DHCP (UDP to port 67) to the gateway or the broadcast address;
//   - DNS (UDP or TCP to port 53) to the gateway or box's egress resolver;
//   - IPv4 to a destination outside the private, CGNAT, link-local,
//     loopback, multicast, reserved and "this network" ranges that the
//     kernel's own routing table (bpf_fib_lookup, with the packet's source)
//     forwards, not delivers, by the default route: out of its interface
//     and through its gateway (looked up with the same source, so policy
//     routing by source agrees; the uplink's own subnet and a prefix
//     routed by another gateway on the same interface are not the default
//     route; with multipath default routes a destination hashed onto
//     another path than 0.0.0.0's is dropped);
//
// and drops the rest (IPv6, VLAN tags, whether in the frame or already
// taken off by the device, other ethertypes, anything else to the host,
// other sources), counting each verdict by its reason in a per-CPU
// array. The program decides from the routing table at the moment of the
// packet, so it holds while box's watcher is stopped. A second program (BuildUplink),
// on the egress hook of the interfaces the default routes leave by, drops
// what would leave with a source in the bridge's subnet: a box's packet
// whose masquerade rule was flushed.
//
// The program is assembled in Go (cilium/ebpf's asm), with the gateway and
// resolver addresses in its instructions: its kernel tag, which a netlink
// filter dump reports, says whether what is attached is box's own build
// for this bridge (Program.KernelTag). Attach, Find and Detach
// (attach.go) work through a netlink handle in the bridge's namespace.
//
// The layer (layer.go) is the programs put in place and verified in the
// host's namespace: Ensure (setup-host, the boot unit, the healer),
// Verify, Remove (teardown), Hooks (doctor, the drill's report).
package guard

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
)

// Config is what the program is built for.
type Config struct {
	// Subnet is the bridge's: a box's packets come from an address in it
	// (or from 0.0.0.0, for DHCP only).
	Subnet netip.Prefix
	// Gateway is the bridge's own IPv4 address: DHCP and DNS to it pass,
	// anything else to it is dropped.
	Gateway netip.Addr
	// Resolver is box's egress resolver address, where DNS of a box under
	// an allowlist goes (invalid: none).
	Resolver netip.Addr
}

// Reason is why the program passed or dropped a frame: the index of its
// counter.
type Reason uint32

// The reasons, passes first (the bridge's program counts all but
// PassUplink and DropUnNATed, the uplinks' program only those two).
const (
	PassARP Reason = iota
	PassDHCP
	PassDNS
	PassForward
	PassUplink // leaving by an uplink: not from the bridge's subnet, or not IPv4
	DropIPv6
	DropVLAN
	DropEthertype
	DropHost      // to the gateway, not DHCP or DNS
	DropRange     // to a private, CGNAT, link-local, loopback, multicast, reserved or "this network" address
	DropRoute     // the routing table delivers it locally, has no route, or routes it elsewhere than the default route's interface
	DropTruncated // a header too short to read
	DropSource    // a source outside the bridge's subnet (0.0.0.0 only for DHCP)
	DropUnNATed   // leaving by an uplink with a source in the bridge's subnet: not masqueraded
	numReasons
)

var reasonNames = [...]string{"pass_arp", "pass_dhcp", "pass_dns", "pass_forward", "pass_uplink", "drop_ipv6", "drop_vlan", "drop_ethertype", "drop_host", "drop_range", "drop_route", "drop_truncated", "drop_source", "drop_unnated"}

func (r Reason) String() string {
	if int(r) < len(reasonNames) {
		return reasonNames[r]
	}
	return fmt.Sprintf("reason_%d", uint32(r))
}

// Reasons are all the reasons, in counter order.
func Reasons() []Reason {
	out := make([]Reason, numReasons)
	for i := range out {
		out[i] = Reason(i)
	}
	return out
}

// Names of the programs and their counters, as the kernel lists them:
// the bridge's (on its ingress) and the uplinks' (on their egress).
const (
	ProgramName       = "box_guard"
	UplinkProgramName = "box_guard_up"
	countersName      = "box_guard_cnt"
)

// Hooks a program is attached to.
const (
	Ingress = "ingress"
	Egress  = "egress"
)

// forbidden are the destination ranges a box's traffic may not be routed
// to through the host, whatever the routing table says.
var forbidden = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),      // this network
	netip.MustParsePrefix("10.0.0.0/8"),     // private
	netip.MustParsePrefix("100.64.0.0/10"),  // CGNAT
	netip.MustParsePrefix("127.0.0.0/8"),    // loopback
	netip.MustParsePrefix("169.254.0.0/16"), // link-local
	netip.MustParsePrefix("172.16.0.0/12"),  // private
	netip.MustParsePrefix("192.0.0.0/24"),   // IETF protocol assignments (box's egress resolver lives here)
	netip.MustParsePrefix("192.168.0.0/16"), // private
	netip.MustParsePrefix("198.18.0.0/15"),  // benchmarking
	netip.MustParsePrefix("224.0.0.0/4"),    // multicast
	netip.MustParsePrefix("240.0.0.0/4"),    // reserved, and the broadcast address
}

// Forbidden reports whether a is in a range the guard never routes to.
func Forbidden(a netip.Addr) bool {
	for _, p := range forbidden {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// Stack layout of the program (offsets from r10).
const (
	stKey     = -4   // u32: the counter's index
	stEth     = -8   // u16: the ethertype
	stL4      = -12  // u32: source and destination port, as in the packet
	stIP      = -32  // 20 bytes: the IPv4 header
	stFib     = -96  // 64 bytes: struct bpf_fib_lookup
	stEgress  = -100 // u32: the interface the destination leaves by
	stSrcZero = -104 // u32: the source, in host order
	stNextHop = -108 // u32: the next hop toward the destination (network order)
)

// Offsets in the kernel's structures.
const (
	skbProtocol    = 16 // struct __sk_buff: protocol (network order)
	skbVLANPresent = 20 // vlan_present: a tag the device took off into vlan_tci
	skbIfindex     = 40 // ifindex
	fibFamily      = 0  // struct bpf_fib_lookup
	fibProto       = 1
	fibIfindex     = 8
	fibSrc         = 16
	fibDst         = 32
	fibSize        = 64
	fibSuccess     = 0 // BPF_FIB_LKUP_RET_SUCCESS
	fibNoNeigh     = 7 // BPF_FIB_LKUP_RET_NO_NEIGH: routed, its next hop not resolved yet
	fibFragNeed    = 8 // BPF_FIB_LKUP_RET_FRAG_NEEDED: routed, larger than the way out's MTU (the forward path answers it)
	hdrStartNet    = 1 // BPF_HDR_START_NET
	tcActOK        = 0
	tcActShot      = 2
	ethHeader      = 14
	etherARP       = 0x0806
	etherIPv4      = 0x0800
	etherIPv6      = 0x86dd
	etherVLAN      = 0x8100
	etherQinQ      = 0x88a8
	protoTCP       = 6
	protoUDP       = 17
	portDHCP       = 67
	portDNS        = 53
	afInet         = 2
	broadcastIP    = 0xffffffff
)

// wire is a 16-bit value as a little-endian load of its network-order
// bytes reads it (the program runs on little-endian machines only).
func wire16(v uint16) int32 { return int32(v>>8 | (v&0xff)<<8) }

// subnetMask is p's mask as a 32-bit immediate (host order).
func subnetMask(p netip.Prefix) int32 {
	if p.Bits() == 0 {
		return 0
	}
	return int32(^uint32(0) << (32 - p.Bits()))
}

// be32 is an address as a 32-bit immediate compared after a byte swap to
// host order.
func be32(a netip.Addr) int32 {
	b := a.As4()
	return int32(binary.BigEndian.Uint32(b[:]))
}

// Program is a guard program built: the bridge's or the uplinks'.
type Program struct {
	name string // ProgramName or UplinkProgramName
	hook string // Ingress or Egress
	spec *ebpf.CollectionSpec
}

// newProgram is the collection of one program and its counters.
func newProgram(name, hook string, ins asm.Instructions) *Program {
	return &Program{name: name, hook: hook, spec: &ebpf.CollectionSpec{
		Maps: map[string]*ebpf.MapSpec{
			countersName: {Name: countersName, Type: ebpf.PerCPUArray, KeySize: 4, ValueSize: 8, MaxEntries: uint32(numReasons)},
		},
		Programs: map[string]*ebpf.ProgramSpec{
			name: {Name: name, Type: ebpf.SchedCLS, License: "GPL", Instructions: ins},
		},
	}}
}

// Build assembles the program for cfg.
func Build(cfg Config) (*Program, error) {
	if !cfg.Gateway.Is4() || !cfg.Subnet.Addr().Is4() || !cfg.Subnet.Contains(cfg.Gateway) {
		return nil, errors.New("building the guard: the subnet must be IPv4 and hold the gateway")
	}
	if cfg.Resolver.IsValid() && !cfg.Resolver.Is4() {
		return nil, errors.New("building the guard: the resolver must be an IPv4 address")
	}
	if binary.NativeEndian.Uint16([]byte{1, 0}) != 1 {
		return nil, errors.New("building the guard: a big-endian machine is not supported")
	}
	return newProgram(ProgramName, Ingress, instructions(cfg)), nil
}

// BuildUplink assembles the uplinks' program, for the egress hook of each
// interface a default route leaves by: IPv4 with a source in subnet (the
// bridge's) is dropped, as it would leave un-masqueraded (its NAT rule
// gone); the rest passes. tc's egress hook runs after netfilter's
// postrouting, so a masqueraded packet shows the uplink's source here.
func BuildUplink(subnet netip.Prefix) (*Program, error) {
	if !subnet.Addr().Is4() {
		return nil, errors.New("building the uplinks' guard: the subnet must be IPv4")
	}
	subnet = subnet.Masked()
	mask := subnetMask(subnet)
	// skb->protocol and the network header, not the frame: an uplink may
	// have no link-layer header (WireGuard, tun, PPP).
	ins := asm.Instructions{
		asm.Mov.Reg(asm.R6, asm.R1),
		asm.LoadMem(asm.R1, asm.R6, skbProtocol, asm.Word),
		asm.Mov.Imm(asm.R7, int32(PassUplink)),
		asm.JNE.Imm(asm.R1, wire16(etherIPv4), "count"),
		asm.Mov.Reg(asm.R1, asm.R6),
		asm.Mov.Imm(asm.R2, 12),
		asm.Mov.Reg(asm.R3, asm.R10),
		asm.Add.Imm(asm.R3, stIP),
		asm.Mov.Imm(asm.R4, 4),
		asm.Mov.Imm(asm.R5, hdrStartNet),
		asm.FnSkbLoadBytesRelative.Call(),
		asm.Mov.Imm(asm.R7, int32(PassUplink)),
		asm.JNE.Imm(asm.R0, 0, "count"),
	}
	ins = append(ins,
		asm.LoadMem(asm.R1, asm.R10, stIP, asm.Word),
		asm.HostTo(asm.BE, asm.R1, asm.Word),
		asm.And.Imm32(asm.R1, mask),
		asm.Mov.Imm(asm.R7, int32(PassUplink)),
		asm.JNE.Imm32(asm.R1, be32(subnet.Addr()), "count"),
		asm.Mov.Imm(asm.R7, int32(DropUnNATed)),
	)
	ins = append(ins, countTail()...)
	return newProgram(UplinkProgramName, Egress, ins), nil
}

// KernelTag is the tag the kernel gives this build (what a filter dump
// reports for it): the program is loaded to ask, not attached. The kernel
// hashes the instructions as it received them (SHA-1 before Linux 6.18,
// SHA-256 since), so the same build has the same tag at every load.
func (p *Program) KernelTag() (string, error) {
	coll, err := ebpf.NewCollection(p.spec)
	if err != nil {
		return "", fmt.Errorf("loading the guard: %w", err)
	}
	defer coll.Close()
	info, err := coll.Programs[p.name].Info()
	if err != nil {
		return "", fmt.Errorf("reading the guard's tag: %w", err)
	}
	return info.Tag, nil
}

// loadBytes reads n bytes at packet offset off into the stack at st; a
// failure (a packet too short) goes to the verdict short.
func loadBytes(off int32, st int16, n int32, short Reason) asm.Instructions {
	return asm.Instructions{
		asm.Mov.Reg(asm.R1, asm.R6),
		asm.Mov.Imm(asm.R2, off),
		asm.Mov.Reg(asm.R3, asm.R10),
		asm.Add.Imm(asm.R3, int32(st)),
		asm.Mov.Imm(asm.R4, n),
		asm.FnSkbLoadBytes.Call(),
		asm.Mov.Imm(asm.R7, int32(short)),
		asm.JNE.Imm(asm.R0, 0, "count"),
	}
}

// verdict sets the reason and goes to the counter.
func verdict(r Reason) asm.Instructions {
	return asm.Instructions{
		asm.Mov.Imm(asm.R7, int32(r)),
		asm.Ja.Label("count"),
	}
}

// fibLookup zeroes the lookup's parameters, fills in the family, the
// ingress interface, the packet's source and, withDst, its protocol and
// destination (else the destination is 0.0.0.0: the default route), and
// calls bpf_fib_lookup: r0 is its answer, the parameters' ifindex the
// interface it leaves by, r7 the route verdict for the caller to count.
func fibLookup(withDst bool) asm.Instructions {
	ins := asm.Instructions{asm.Mov.Imm(asm.R1, 0)}
	for off := int16(0); off < fibSize; off += 8 {
		ins = append(ins, asm.StoreMem(asm.R10, stFib+off, asm.R1, asm.DWord))
	}
	ins = append(ins,
		asm.StoreImm(asm.R10, stFib+fibFamily, afInet, asm.Byte),
		asm.LoadMem(asm.R1, asm.R6, skbIfindex, asm.Word),
		asm.StoreMem(asm.R10, stFib+fibIfindex, asm.R1, asm.Word),
	)
	// The source in both lookups: a rule routing the bridge's subnet by a
	// table of its own (policy routing) then gives both the same answer.
	ins = append(ins,
		asm.LoadMem(asm.R1, asm.R10, stIP+12, asm.Word),
		asm.StoreMem(asm.R10, stFib+fibSrc, asm.R1, asm.Word),
	)
	if withDst {
		ins = append(ins,
			asm.LoadMem(asm.R1, asm.R10, stIP+9, asm.Byte),
			asm.StoreMem(asm.R10, stFib+fibProto, asm.R1, asm.Byte),
			asm.LoadMem(asm.R1, asm.R10, stIP+16, asm.Word),
			asm.StoreMem(asm.R10, stFib+fibDst, asm.R1, asm.Word),
		)
	}
	ins = append(ins,
		asm.Mov.Reg(asm.R1, asm.R6),
		asm.Mov.Reg(asm.R2, asm.R10),
		asm.Add.Imm(asm.R2, stFib),
		asm.Mov.Imm(asm.R3, fibSize),
		asm.Mov.Imm(asm.R4, 0),
		asm.FnFibLookup.Call(),
		asm.Mov.Imm(asm.R7, int32(DropRoute)),
	)
	return ins
}

// instructions is the program. Registers: r6 the packet's context, r7 the
// reason, r8 the IPv4 header's length, r9 the destination in host order.
func instructions(cfg Config) asm.Instructions {
	ins := asm.Instructions{
		asm.Mov.Reg(asm.R6, asm.R1),
		// A tag the device took off already (into vlan_tci).
		asm.LoadMem(asm.R1, asm.R6, skbVLANPresent, asm.Word),
		asm.JNE.Imm(asm.R1, 0, "vlan"),
	}
	ins = append(ins, loadBytes(12, stEth, 2, DropTruncated)...)
	ins = append(ins,
		asm.LoadMem(asm.R1, asm.R10, stEth, asm.Half),
		asm.JEq.Imm(asm.R1, wire16(etherARP), "arp"),
		asm.JEq.Imm(asm.R1, wire16(etherIPv6), "ipv6"),
		asm.JEq.Imm(asm.R1, wire16(etherVLAN), "vlan"),
		asm.JEq.Imm(asm.R1, wire16(etherQinQ), "vlan"),
		asm.JEq.Imm(asm.R1, wire16(etherIPv4), "ipv4"),
	)
	ins = append(ins, verdict(DropEthertype)...)
	ins = append(ins, verdict(PassARP)...)
	ins[len(ins)-2] = ins[len(ins)-2].WithSymbol("arp")
	ins = append(ins, verdict(DropIPv6)...)
	ins[len(ins)-2] = ins[len(ins)-2].WithSymbol("ipv6")
	ins = append(ins, verdict(DropVLAN)...)
	ins[len(ins)-2] = ins[len(ins)-2].WithSymbol("vlan")

	// IPv4: the header, its length, the destination.
	hdr := loadBytes(ethHeader, stIP, 20, DropTruncated)
	hdr[0] = hdr[0].WithSymbol("ipv4")
	ins = append(ins, hdr...)
	ins = append(ins,
		asm.LoadMem(asm.R8, asm.R10, stIP, asm.Byte),
		asm.And.Imm(asm.R8, 0x0f),
		asm.LSh.Imm(asm.R8, 2),
		asm.Mov.Imm(asm.R7, int32(DropTruncated)),
		asm.JLT.Imm(asm.R8, 20, "count"),
		asm.LoadMem(asm.R9, asm.R10, stIP+16, asm.Word),
		asm.HostTo(asm.BE, asm.R9, asm.Word),
		// The source: in the bridge's subnet, or 0.0.0.0 (DHCP, below).
		asm.LoadMem(asm.R1, asm.R10, stIP+12, asm.Word),
		asm.HostTo(asm.BE, asm.R1, asm.Word),
		asm.StoreMem(asm.R10, stSrcZero, asm.R1, asm.Word),
		asm.And.Imm32(asm.R1, subnetMask(cfg.Subnet)),
		asm.JEq.Imm32(asm.R1, be32(cfg.Subnet.Masked().Addr()), "source ok"),
		asm.LoadMem(asm.R1, asm.R10, stSrcZero, asm.Word),
		asm.Mov.Imm(asm.R7, int32(DropSource)),
		asm.JNE.Imm32(asm.R1, 0, "count"),
		asm.Mov.Imm(asm.R1, 0).WithSymbol("source ok"),
		// The ports, for the first fragment of TCP and UDP; 0 otherwise.
		asm.StoreImm(asm.R10, stL4, 0, asm.Word),
		asm.LoadMem(asm.R1, asm.R10, stIP+6, asm.Half),
		asm.And.Imm(asm.R1, wire16(0x1fff)),
		asm.JNE.Imm(asm.R1, 0, "ports done"),
		asm.LoadMem(asm.R1, asm.R10, stIP+9, asm.Byte),
		asm.JEq.Imm(asm.R1, protoUDP, "ports"),
		asm.JNE.Imm(asm.R1, protoTCP, "ports done"),
		asm.Mov.Reg(asm.R1, asm.R6).WithSymbol("ports"),
		asm.Mov.Reg(asm.R2, asm.R8),
		asm.Add.Imm(asm.R2, ethHeader),
		asm.Mov.Reg(asm.R3, asm.R10),
		asm.Add.Imm(asm.R3, stL4),
		asm.Mov.Imm(asm.R4, 4),
		asm.FnSkbLoadBytes.Call(),
		asm.Mov.Imm(asm.R7, int32(DropTruncated)),
		asm.JNE.Imm(asm.R0, 0, "count"),
		// r2: the destination port (host order), r3: the protocol.
		asm.LoadMem(asm.R2, asm.R10, stL4+2, asm.Half).WithSymbol("ports done"),
		asm.HostTo(asm.BE, asm.R2, asm.Half),
		asm.LoadMem(asm.R3, asm.R10, stIP+9, asm.Byte),

		// DHCP to the gateway or the broadcast address.
		asm.JNE.Imm(asm.R3, protoUDP, "not dhcp"),
		asm.JNE.Imm(asm.R2, portDHCP, "not dhcp"),
		asm.JEq.Imm32(asm.R9, be32(cfg.Gateway), "dhcp"),
		asm.JEq.Imm32(asm.R9, -1, "dhcp"), // 255.255.255.255
		asm.Ja.Label("not dhcp"),
	)
	ins = append(ins, verdict(PassDHCP)...)
	ins[len(ins)-2] = ins[len(ins)-2].WithSymbol("dhcp")

	// DNS to the gateway or the resolver.
	ins = append(ins,
		asm.LoadMem(asm.R1, asm.R10, stSrcZero, asm.Word).WithSymbol("not dhcp"),
		asm.Mov.Imm(asm.R7, int32(DropSource)),
		asm.JEq.Imm32(asm.R1, 0, "count"),
		asm.JNE.Imm(asm.R2, portDNS, "not dns"),
		asm.JEq.Imm(asm.R3, protoUDP, "dns proto"),
		asm.JNE.Imm(asm.R3, protoTCP, "not dns"),
		asm.JEq.Imm32(asm.R9, be32(cfg.Gateway), "dns").WithSymbol("dns proto"),
	)
	if cfg.Resolver.IsValid() {
		ins = append(ins, asm.JEq.Imm32(asm.R9, be32(cfg.Resolver), "dns"))
	}
	ins = append(ins, asm.Ja.Label("not dns"))
	ins = append(ins, verdict(PassDNS)...)
	ins[len(ins)-2] = ins[len(ins)-2].WithSymbol("dns")

	// Anything else to the gateway.
	ins = append(ins, asm.JNE.Imm32(asm.R9, be32(cfg.Gateway), "ranges").WithSymbol("not dns"))
	ins = append(ins, verdict(DropHost)...)

	// The ranges never routed to.
	for i, p := range forbidden {
		mask := subnetMask(p)
		first := asm.Mov.Reg(asm.R1, asm.R9)
		if i == 0 {
			first = first.WithSymbol("ranges")
		}
		ins = append(ins,
			first,
			asm.And.Imm32(asm.R1, mask),
			asm.JEq.Imm32(asm.R1, be32(p.Addr()), "forbidden"),
		)
	}
	ins = append(ins, asm.Ja.Label("route"))
	ins = append(ins, verdict(DropRange)...)
	ins[len(ins)-2] = ins[len(ins)-2].WithSymbol("forbidden")

	// The routing table: forwarded, out of the default route's interface.
	route := fibLookup(true)
	route[0] = route[0].WithSymbol("route")
	ins = append(ins, route...)
	ins = append(ins,
		asm.JEq.Imm(asm.R0, fibSuccess, "routed"),
		asm.JEq.Imm(asm.R0, fibFragNeed, "routed"),
		asm.JNE.Imm(asm.R0, fibNoNeigh, "count"),
		asm.LoadMem(asm.R1, asm.R10, stFib+fibIfindex, asm.Word).WithSymbol("routed"),
		asm.StoreMem(asm.R10, stEgress, asm.R1, asm.Word),
		// The lookup leaves the route's gateway in ipv4_dst (the
		// destination itself where the route has none).
		asm.LoadMem(asm.R1, asm.R10, stFib+fibDst, asm.Word),
		asm.StoreMem(asm.R10, stNextHop, asm.R1, asm.Word),
	)
	ins = append(ins, fibLookup(false)...)
	ins = append(ins,
		asm.JEq.Imm(asm.R0, fibSuccess, "default"),
		asm.JEq.Imm(asm.R0, fibFragNeed, "default"),
		asm.JNE.Imm(asm.R0, fibNoNeigh, "count"),
		asm.LoadMem(asm.R1, asm.R10, stFib+fibIfindex, asm.Word).WithSymbol("default"),
		asm.LoadMem(asm.R2, asm.R10, stEgress, asm.Word),
		asm.JNE.Reg(asm.R1, asm.R2, "count"),
		// And by the default route's gateway: not the uplink's own subnet
		// or a prefix routed by another gateway on the same interface. A
		// default route with no gateway (a point-to-point link) left
		// 0.0.0.0: the interface alone decides.
		asm.LoadMem(asm.R1, asm.R10, stFib+fibDst, asm.Word),
		asm.JEq.Imm(asm.R1, 0, "forward"),
		asm.LoadMem(asm.R2, asm.R10, stNextHop, asm.Word),
		asm.JNE.Reg(asm.R1, asm.R2, "count"),
		// The default route's gateway itself is its own next hop, on the
		// uplink's subnet: not through it.
		asm.LoadMem(asm.R3, asm.R10, stIP+16, asm.Word),
		asm.JEq.Reg(asm.R2, asm.R3, "count"),
	)
	ins = append(ins, verdict(PassForward)...)
	ins[len(ins)-2] = ins[len(ins)-2].WithSymbol("forward")

	return append(ins, countTail()...)
}

// countTail is every program's end, at the label "count": the reason in r7
// counted, then the packet passed or dropped by it.
func countTail() asm.Instructions {
	return asm.Instructions{
		asm.StoreMem(asm.R10, stKey, asm.R7, asm.Word).WithSymbol("count"),
		asm.LoadMapPtr(asm.R1, 0).WithReference(countersName),
		asm.Mov.Reg(asm.R2, asm.R10),
		asm.Add.Imm(asm.R2, stKey),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "decide"),
		asm.LoadMem(asm.R1, asm.R0, 0, asm.DWord),
		asm.Add.Imm(asm.R1, 1),
		asm.StoreMem(asm.R0, 0, asm.R1, asm.DWord),
		asm.Mov.Imm(asm.R0, tcActShot).WithSymbol("decide"),
		asm.JGE.Imm(asm.R7, int32(DropIPv6), "out"),
		asm.Mov.Imm(asm.R0, tcActOK),
		asm.Return().WithSymbol("out"),
	}
}
