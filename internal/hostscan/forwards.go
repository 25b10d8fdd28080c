package hostscan

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/xt"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// PortRange is an inclusive range of ports; First == Last for one port.
type PortRange struct{ First, Last uint16 }

func (p PortRange) String() string {
	if p.First == p.Last {
		return fmt.Sprint(p.First)
	}
	return fmt.Sprintf("%d-%d", p.First, p.Last)
}

// Forward kinds.
const (
	KindDNAT     = "dnat"     // destination NAT to an address (and port)
	KindRedirect = "redirect" // destination NAT to the host itself
)

// Forward is an nftables rule that rewrites the destination of what it
// matches: traffic sent to the host that is delivered elsewhere, or to
// another local port. Only the rule's own conditions are read: those of
// rules jumping to its chain are not followed.
type Forward struct {
	Family string // the table's family: "ip", "ip6", "inet", "bridge", "netdev", ...
	Table  string
	Chain  string
	Handle uint64
	Kind   string // KindDNAT or KindRedirect
	// Compat marks a rule written by iptables-nft: xtables targets or
	// matches inside nftables.
	Compat bool

	// Proto is the matched L4 protocol ("tcp", "udp", "sctp", or the
	// number), "" when the rule matches none.
	Proto string
	// Ports are the matched destination ports; none means the rule
	// matches no destination port (every port of Proto is forwarded),
	// unless PortUnknown.
	Ports []PortRange
	// PortUnknown says the rule matches destination ports in a way this
	// package does not decode (a negation, a concatenation, an xtables
	// match such as multiport): Ports may be incomplete, or empty though
	// the rule does not forward every port.
	PortUnknown bool
	// InIface is the matched input interface ("" when none; a trailing
	// "*" is a prefix match), InIfaceNot a negated match (iifname !=).
	// InIfIndex is set instead when the rule matches an interface index.
	InIface    string
	InIfaceNot bool
	InIfIndex  int
	// Daddr is the matched destination address, when the rule compares it
	// with one.
	Daddr netip.Addr

	// ToAddr is the new destination address (invalid for a redirect or
	// when not readable); ToPorts the new destination ports (zero when the
	// rule keeps the port or it is not readable).
	ToAddr  netip.Addr
	ToPorts PortRange

	// Notes say what was not decoded.
	Notes []string
}

// AllPorts reports whether the rule forwards every destination port (of
// Proto, or of every protocol when Proto is "").
func (f Forward) AllPorts() bool { return len(f.Ports) == 0 && !f.PortUnknown }

func (f Forward) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s %s:", f.Family, f.Table, f.Chain)
	if f.InIface != "" {
		op := ""
		if f.InIfaceNot {
			op = "!= "
		}
		fmt.Fprintf(&b, " iifname %s%q", op, f.InIface)
	}
	if f.InIfIndex != 0 {
		fmt.Fprintf(&b, " iif %d", f.InIfIndex)
	}
	if f.Daddr.IsValid() {
		fmt.Fprintf(&b, " daddr %s", f.Daddr)
	}
	proto := f.Proto
	if proto == "" {
		proto = "any"
	}
	fmt.Fprintf(&b, " %s", proto)
	switch {
	case f.PortUnknown:
		b.WriteString(" port unknown")
		if len(f.Ports) > 0 {
			b.WriteString(" (at least")
		}
	case len(f.Ports) == 0:
		b.WriteString(" any port")
	}
	for i, p := range f.Ports {
		sep := ","
		if i == 0 {
			sep = " dport "
		}
		b.WriteString(sep + p.String())
	}
	if f.PortUnknown && len(f.Ports) > 0 {
		b.WriteString(")")
	}
	b.WriteString(" " + f.Kind)
	switch {
	case f.ToAddr.IsValid() && f.ToPorts != (PortRange{}):
		b.WriteString(" to " + netip.AddrPortFrom(f.ToAddr, f.ToPorts.First).String())
		if f.ToPorts.Last != f.ToPorts.First {
			fmt.Fprintf(&b, "-%d", f.ToPorts.Last)
		}
	case f.ToAddr.IsValid():
		b.WriteString(" to " + f.ToAddr.String())
	case f.ToPorts != (PortRange{}):
		b.WriteString(" to :" + f.ToPorts.String())
	}
	if f.Compat {
		b.WriteString(" (iptables-nft)")
	}
	return b.String()
}

// Forwarding is what Forwards found in a namespace.
type Forwarding struct {
	Forwards []Forward
	// LegacyTables lists the legacy (non-nftables) iptables tables that
	// exist in the namespace, as "ip/nat" or "ip6/filter". Their rules
	// are not read: a caller must say that forwards may be missing.
	LegacyTables []string
}

// Forwards reads every nftables table of the calling thread's network
// namespace (wrap it in nsrun.Do for another one) and returns the rules,
// in any chain, that carry a destination NAT (nft's dnat and redirect,
// iptables-nft's DNAT and REDIRECT targets), and the legacy iptables
// tables whose rules it cannot read.
func Forwards() (Forwarding, error) {
	var fw Forwarding
	legacy, err := legacyTables("/proc/thread-self/net")
	if err != nil {
		return Forwarding{}, err
	}
	fw.LegacyTables = legacy

	ns, err := netns.Get() // the calling thread's namespace
	if err != nil {
		return Forwarding{}, fmt.Errorf("opening the current network namespace: %w", err)
	}
	defer ns.Close()
	c, err := nftables.New(nftables.AsLasting(), nftables.WithNetNSFd(int(ns)))
	if err != nil {
		return Forwarding{}, fmt.Errorf("opening an nftables netlink socket: %w", err)
	}
	defer func() { _ = c.CloseLasting() }()

	tables, err := c.ListTables()
	if err != nil {
		return Forwarding{}, fmt.Errorf("listing nftables tables: %w", err)
	}
	chains, err := c.ListChains()
	if err != nil {
		return Forwarding{}, fmt.Errorf("listing nftables chains: %w", err)
	}
	for _, t := range tables {
		sets, err := portSets(c, t)
		if err != nil {
			return Forwarding{}, err
		}
		for _, ch := range chains {
			if ch.Table.Name != t.Name || ch.Table.Family != t.Family {
				continue
			}
			rules, err := c.GetRules(t, ch)
			if err != nil {
				return Forwarding{}, fmt.Errorf("listing the rules of %s %s %s: %w", familyName(t.Family), t.Name, ch.Name, err)
			}
			for _, r := range rules {
				if r.Table == nil {
					r.Table = t
				}
				if r.Chain == nil {
					r.Chain = ch
				}
				if f, ok := DecodeRule(r, sets); ok {
					fw.Forwards = append(fw.Forwards, f)
				}
			}
		}
	}
	return fw, nil
}

// portSets reads the sets and maps of table t keyed by a port
// (inet_service), by name, as port ranges.
func portSets(c *nftables.Conn, t *nftables.Table) (map[string][]PortRange, error) {
	sets, err := c.GetSets(t)
	if err != nil {
		return nil, fmt.Errorf("listing the sets of %s %s: %w", familyName(t.Family), t.Name, err)
	}
	out := map[string][]PortRange{}
	for _, s := range sets {
		if s.Concatenation || s.KeyType.Bytes != 2 {
			continue
		}
		els, err := c.GetSetElements(s)
		if err != nil {
			return nil, fmt.Errorf("reading set %s of %s %s: %w", s.Name, familyName(t.Family), t.Name, err)
		}
		if prs, ok := SetPortRanges(els, s.Interval); ok {
			out[s.Name] = prs
		}
	}
	return out, nil
}

// SetPortRanges decodes the elements of a set keyed by a port. In an
// interval set an element flagged IntervalEnd closes the range (its key is
// one past the last port) that the nearest lower key opens. It returns
// false for keys that are not two bytes.
func SetPortRanges(els []nftables.SetElement, interval bool) ([]PortRange, bool) {
	var starts, ends []int
	for _, e := range els {
		if len(e.Key) != 2 {
			return nil, false
		}
		k := int(binary.BigEndian.Uint16(e.Key))
		if interval && e.IntervalEnd {
			ends = append(ends, k)
		} else {
			starts = append(starts, k)
		}
	}
	slices.Sort(starts)
	slices.Sort(ends)
	out := make([]PortRange, 0, len(starts))
	for i, s := range starts {
		last := s
		if interval {
			// The range runs up to the next end above s, or to the next
			// start, or to the last port.
			last = 65535
			if j, _ := slices.BinarySearch(ends, s+1); j < len(ends) {
				last = ends[j] - 1
			}
			if i+1 < len(starts) && starts[i+1]-1 < last {
				last = starts[i+1] - 1
			}
		}
		out = append(out, PortRange{uint16(s), uint16(last)})
	}
	return out, true
}

// What a register holds, for DecodeRule.
type regKind int

const (
	regOther   regKind = iota
	regL4Proto         // meta l4proto, or the IPv4 protocol field
	regDport           // transport header, offset 2, 2 bytes
	regIifname
	regIif
	regDaddr  // IPv4 or IPv6 destination address
	regImm    // an immediate value
	regMapped // the value of a map lookup
)

type reg struct {
	kind regKind
	data []byte // regImm
}

// reg32 maps a register to its first 32-bit register, so the 128-bit
// names (NFT_REG_1..4) and the 32-bit ones (NFT_REG32_00..15) that nft
// mixes meet.
func reg32(r uint32) uint32 {
	if r >= unix.NFT_REG_1 && r <= unix.NFT_REG_4 {
		return unix.NFT_REG32_00 + (r-unix.NFT_REG_1)*4
	}
	return r
}

// DecodeRule reads one nftables rule (its Table and Chain set) and, when
// it carries a destination NAT, returns it as a Forward. sets holds the
// port sets of the rule's table by name (see SetPortRanges); a lookup in a
// set missing from it makes the ports unknown.
func DecodeRule(r *nftables.Rule, sets map[string][]PortRange) (Forward, bool) {
	var f Forward
	var family nftables.TableFamily
	if r.Table != nil {
		family = r.Table.Family
		f.Family, f.Table = familyName(family), r.Table.Name
	}
	if r.Chain != nil {
		f.Chain = r.Chain.Name
	}
	f.Handle = r.Handle
	regs := map[uint32]reg{}
	dportLoaded, dportUsed := false, false
	note := func(s string) {
		if !slices.Contains(f.Notes, s) {
			f.Notes = append(f.Notes, s)
		}
	}
	unknownPorts := func(why string) {
		f.PortUnknown = true
		note(why)
	}

	for _, e := range r.Exprs {
		if dst, v, ok := loaded(e, family); ok {
			regs[reg32(dst)] = v
			if v.kind == regDport {
				dportLoaded = true
			}
			continue
		}
		switch e := e.(type) {
		case *expr.Cmp:
			src := regs[reg32(e.Register)]
			if src.kind == regDport {
				dportUsed = true
			}
			cmpCondition(&f, src.kind, e, unknownPorts)
		case *expr.Range:
			if regs[reg32(e.Register)].kind == regDport {
				dportUsed = true
				rangePorts(&f, e, unknownPorts)
			}
		case *expr.Lookup:
			src := regs[reg32(e.SourceRegister)]
			if e.IsDestRegSet {
				regs[reg32(e.DestRegister)] = reg{kind: regMapped}
			}
			if src.kind == regDport {
				dportUsed = true
				lookupPorts(&f, e, sets, unknownPorts)
			}
		case *expr.Match:
			xtMatch(&f, e, unknownPorts)
		case *expr.NAT:
			if e.Type == expr.NATTypeDestNAT {
				dnat(&f, e, regs, note)
			}
		case *expr.Redir:
			f.Kind = KindRedirect
			f.ToPorts = natPorts(regs, e.RegisterProtoMin, e.RegisterProtoMax, note)
		case *expr.Target:
			xtTarget(&f, e, note)
		}
	}
	if f.Kind == "" {
		return Forward{}, false
	}
	if dportLoaded && !dportUsed {
		unknownPorts("destination port matched in a way not decoded")
	}
	return f, true
}

// loaded reads an expression that loads a register (meta, payload,
// immediate): the register and what it now holds. ok is false for any
// other expression, which only reads registers.
func loaded(e expr.Any, family nftables.TableFamily) (dst uint32, r reg, ok bool) {
	switch e := e.(type) {
	case *expr.Meta:
		if !e.SourceRegister {
			return e.Register, reg{kind: metaKind(e.Key)}, true
		}
	case *expr.Payload:
		if e.OperationType == expr.PayloadLoad {
			return e.DestRegister, reg{kind: payloadKind(e, family)}, true
		}
	case *expr.Immediate:
		if e.Register != unix.NFT_REG_VERDICT {
			return e.Register, reg{kind: regImm, data: e.Data}, true
		}
	}
	return 0, reg{}, false
}

// metaKind is what a meta load of key puts in its register: only the
// protocol and the input interface are conditions a Forward names.
func metaKind(key expr.MetaKey) regKind {
	switch key {
	case expr.MetaKeyL4PROTO:
		return regL4Proto
	case expr.MetaKeyIIFNAME:
		return regIifname
	case expr.MetaKeyIIF:
		return regIif
	}
	return regOther
}

// payloadKind is what a payload load e puts in its register. An offset in
// the network header names a field only in a family whose header it can
// be: the protocol byte in an ip table (nft matches meta l4proto
// elsewhere), the IPv4 address outside ip6 tables, the IPv6 one outside ip.
func payloadKind(e *expr.Payload, family nftables.TableFamily) regKind {
	switch {
	case e.Base == expr.PayloadBaseTransportHeader && e.Offset == 2 && e.Len == 2:
		return regDport
	case e.Base == expr.PayloadBaseNetworkHeader && e.Offset == 9 && e.Len == 1 && family == nftables.TableFamilyIPv4:
		return regL4Proto
	case e.Base == expr.PayloadBaseNetworkHeader && e.Offset == 16 && e.Len == 4 && family != nftables.TableFamilyIPv6,
		e.Base == expr.PayloadBaseNetworkHeader && e.Offset == 24 && e.Len == 16 && family != nftables.TableFamilyIPv4:
		return regDaddr
	}
	return regOther
}

// cmpCondition applies a comparison of a register holding src to f. A
// destination port compared other than with == makes the ports unknown;
// another condition it cannot read is left out.
func cmpCondition(f *Forward, src regKind, e *expr.Cmp, unknownPorts func(string)) {
	eq := e.Op == expr.CmpOpEq
	switch src {
	case regL4Proto:
		if eq && len(e.Data) == 1 {
			f.Proto = protoName(e.Data[0])
		}
	case regDport:
		if eq && len(e.Data) == 2 {
			p := binary.BigEndian.Uint16(e.Data)
			f.Ports = append(f.Ports, PortRange{p, p})
		} else {
			unknownPorts("destination port compared other than with ==")
		}
	case regIifname:
		if eq || e.Op == expr.CmpOpNeq {
			f.InIface, f.InIfaceNot = ifname(e.Data), !eq
		}
	case regIif:
		if eq && len(e.Data) == 4 {
			f.InIfIndex = int(binary.NativeEndian.Uint32(e.Data))
		}
	case regDaddr:
		if a, ok := netip.AddrFromSlice(e.Data); ok && eq {
			f.Daddr = a.Unmap()
		}
	}
}

// rangePorts applies a range match on the destination port; a negated
// one leaves the ports unknown.
func rangePorts(f *Forward, e *expr.Range, unknownPorts func(string)) {
	if e.Op == expr.CmpOpEq && len(e.FromData) == 2 && len(e.ToData) == 2 {
		f.Ports = append(f.Ports, PortRange{binary.BigEndian.Uint16(e.FromData), binary.BigEndian.Uint16(e.ToData)})
	} else {
		unknownPorts("destination port range negated")
	}
}

// lookupPorts applies a lookup of the destination port in a set: its
// ports when the set was read, unknown ports when it was not or the lookup
// is negated.
func lookupPorts(f *Forward, e *expr.Lookup, sets map[string][]PortRange, unknownPorts func(string)) {
	prs, ok := sets[e.SetName]
	switch {
	case e.Invert:
		unknownPorts("destination port not in set @" + e.SetName)
	case !ok:
		unknownPorts("destination port set @" + e.SetName + " not read")
	default:
		f.Ports = append(f.Ports, prs...)
	}
}

// xtMatch applies an xtables match: it marks the rule as iptables-nft's,
// and a port match it cannot decode leaves the ports unknown.
func xtMatch(f *Forward, e *expr.Match, unknownPorts func(string)) {
	switch info := e.Info.(type) {
	case *xt.Tcp:
		f.Compat, f.Proto = true, "tcp"
		xtPorts(f, info.DstPorts, info.InvFlags&xt.TcpInvDestPorts != 0, unknownPorts)
	case *xt.Udp:
		f.Compat, f.Proto = true, "udp"
		xtPorts(f, info.DstPorts, info.InvFlags&xt.UdpInvDestPorts != 0, unknownPorts)
	default:
		f.Compat = true
		if e.Name == "tcp" || e.Name == "udp" || e.Name == "multiport" || e.Name == "sctp" {
			unknownPorts("xtables match " + e.Name + " not decoded")
		}
	}
}

// dnat reads an nft dnat statement's new address and ports from the
// registers it names.
func dnat(f *Forward, e *expr.NAT, regs map[uint32]reg, note func(string)) {
	f.Kind = KindDNAT
	if e.RegAddrMin != 0 {
		switch a := regs[reg32(e.RegAddrMin)]; a.kind {
		case regImm:
			if ip, ok := netip.AddrFromSlice(trimAddr(a.data, e.Family)); ok {
				f.ToAddr = ip.Unmap()
			}
		case regMapped:
			note("new address from a map")
		default:
			note("new address not read")
		}
	}
	f.ToPorts = natPorts(regs, e.RegProtoMin, e.RegProtoMax, note)
}

// xtPorts applies an xtables tcp/udp match's destination port range.
func xtPorts(f *Forward, pr [2]uint16, inverted bool, unknown func(string)) {
	switch {
	case inverted:
		unknown("destination port range negated")
	case pr == [2]uint16{0, 65535}:
		// every port: no port condition
	default:
		f.Ports = append(f.Ports, PortRange{pr[0], pr[1]})
	}
}

// xtTarget reads an xtables DNAT or REDIRECT target and its range; any
// other target forwards nothing.
func xtTarget(f *Forward, e *expr.Target, note func(string)) {
	switch e.Name {
	case "DNAT":
		f.Kind, f.Compat = KindDNAT, true
	case "REDIRECT":
		f.Kind, f.Compat = KindRedirect, true
	default:
		return
	}
	var flags uint
	var minIP []byte
	var minPort, maxPort uint16
	switch i := e.Info.(type) {
	case *xt.NatIPv4MultiRangeCompat:
		if len(*i) == 0 {
			note("target range not read")
			return
		}
		r := (*i)[0]
		flags, minIP, minPort, maxPort = r.Flags, r.MinIP, r.MinPort, r.MaxPort
	case *xt.NatRange:
		flags, minIP, minPort, maxPort = i.Flags, i.MinIP, i.MinPort, i.MaxPort
	case *xt.NatRange2:
		flags, minIP, minPort, maxPort = i.Flags, i.MinIP, i.MinPort, i.MaxPort
	default:
		note("target range not read")
		return
	}
	if flags&uint(xt.NatRangeMapIPs) != 0 {
		if a, ok := netip.AddrFromSlice(minIP); ok {
			f.ToAddr = a.Unmap()
		}
	}
	if flags&uint(xt.NatRangeProtoSpecified) != 0 {
		f.ToPorts = PortRange{minPort, maxPort}
	}
}

// natPorts reads a NAT expression's port registers.
func natPorts(regs map[uint32]reg, min, max uint32, note func(string)) PortRange {
	if min == 0 {
		return PortRange{}
	}
	lo := regs[reg32(min)]
	if lo.kind != regImm || len(lo.data) < 2 {
		note("new port not read")
		return PortRange{}
	}
	p := PortRange{binary.BigEndian.Uint16(lo.data), binary.BigEndian.Uint16(lo.data)}
	if hi := regs[reg32(max)]; max != 0 && hi.kind == regImm && len(hi.data) >= 2 {
		p.Last = binary.BigEndian.Uint16(hi.data)
	}
	return p
}

// trimAddr cuts an immediate (padded to a register's 4 or 16 bytes) to the
// NAT family's address length.
func trimAddr(b []byte, family uint32) []byte {
	n := 16
	if family == unix.NFPROTO_IPV4 {
		n = 4
	}
	if len(b) < n {
		return b
	}
	return b[:n]
}

// ifname reads a name compared as iifname: NUL-terminated for an exact
// name, without the NUL for a prefix (shown with a trailing "*").
func ifname(b []byte) string {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		return string(b[:i])
	}
	return string(b) + "*"
}

func protoName(p byte) string {
	switch p {
	case unix.IPPROTO_TCP:
		return "tcp"
	case unix.IPPROTO_UDP:
		return "udp"
	case unix.IPPROTO_SCTP:
		return "sctp"
	case unix.IPPROTO_DCCP:
		return "dccp"
	case unix.IPPROTO_UDPLITE:
		return "udplite"
	case unix.IPPROTO_ICMP:
		return "icmp"
	case unix.IPPROTO_ICMPV6:
		return "ipv6-icmp"
	}
	return fmt.Sprint(p)
}

func familyName(f nftables.TableFamily) string {
	switch f {
	case nftables.TableFamilyIPv4:
		return "ip"
	case nftables.TableFamilyIPv6:
		return "ip6"
	case nftables.TableFamilyINet:
		return "inet"
	case nftables.TableFamilyARP:
		return "arp"
	case nftables.TableFamilyBridge:
		return "bridge"
	case nftables.TableFamilyNetdev:
		return "netdev"
	}
	return fmt.Sprintf("family-%d", f)
}

// legacyTables lists the legacy iptables tables registered in the
// namespace whose /proc/<...>/net directory is netDir. A missing names
// file (the legacy modules not loaded) means none.
func legacyTables(netDir string) ([]string, error) {
	var out []string
	for _, f := range []struct{ file, family string }{
		{"ip_tables_names", "ip"},
		{"ip6_tables_names", "ip6"},
	} {
		b, err := os.ReadFile(netDir + "/" + f.file)
		if errorsIsNotExist(err) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("reading legacy iptables tables: %w", err)
		}
		for _, name := range strings.Fields(string(b)) {
			out = append(out, f.family+"/"+name)
		}
	}
	return out, nil
}
