package nft

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// Defaults for Config.
const (
	DefaultTable  = "box"
	DefaultBridge = "boxnet"
)

// ifnameSize is IFNAMSIZ: the kernel loads interface names into a register
// as 16 NUL-padded bytes, so a 16-byte compare is an exact match.
const ifnameSize = unix.IFNAMSIZ

// Config names the tables, the bridge they protect and the network
// namespace they live in. The zero value means box's tables for boxnet in
// the current namespace.
type Config struct {
	Table  string // nft table name in both families; "" means DefaultTable
	Bridge string // bridge interface; "" means DefaultBridge
	NetNS  int    // fd of the network namespace; 0 or -1 means the current one
	// Gateway is the bridge's own IPv4 address: the only host address a
	// box may send DNS and DHCP to (DHCP also to the broadcast address).
	// Apply and Verify refuse without one; Desired renders an invalid one
	// as 0.0.0.0, which matches no packet (DNS and DHCP closed, not open).
	Gateway netip.Addr

	// connOpts are extra nftables options; tests use them to record the
	// netlink messages instead of sending them.
	connOpts []nftables.ConnOption
}

func (c Config) normalized() (Config, error) {
	if c.Table == "" {
		c.Table = DefaultTable
	}
	if c.Bridge == "" {
		c.Bridge = DefaultBridge
	}
	if err := checkIfname(c.Bridge); err != nil {
		return c, fmt.Errorf("bridge name: %w", err)
	}
	if strings.ContainsRune(c.Table, 0) {
		return c, fmt.Errorf("table name %q contains NUL", c.Table)
	}
	return c, nil
}

// PortSet is the name of the fallback set holding the bridge's ports.
func (c Config) PortSet() string {
	b := c.Bridge
	if b == "" {
		b = DefaultBridge
	}
	return b + "_ports"
}

func checkIfname(n string) error {
	switch {
	case n == "":
		return fmt.Errorf("empty interface name")
	case len(n) >= ifnameSize:
		return fmt.Errorf("interface name %q is longer than %d bytes", n, ifnameSize-1)
	case strings.ContainsAny(n, "\x00/ \t\n"):
		return fmt.Errorf("interface name %q has a character the kernel refuses", n)
	}
	return nil
}

// BridgeMode is the form of the bridge drop in force.
type BridgeMode string

const (
	// ModeBridgeMeta matches the bridge by name (meta ibrname/obrname).
	ModeBridgeMeta BridgeMode = "bridge-meta"
	// ModePortSet matches the bridge's ports by name from a set that the
	// caller keeps current (SyncPorts).
	ModePortSet BridgeMode = "port-set"
)

// Capabilities is what Probe found the kernel supports.
type Capabilities struct {
	BridgeMeta bool   // meta ibrname/obrname work in the bridge family
	Detail     string // what the probe saw, for doctor output
}

// Mode is the bridge drop form these capabilities allow.
func (c Capabilities) Mode() BridgeMode {
	if c.BridgeMeta {
		return ModeBridgeMeta
	}
	return ModePortSet
}

// Ruleset is the whole desired state of the two tables, as data.
type Ruleset struct {
	Mode   BridgeMode
	Tables []Table
}

// Table is one nft table that the package owns entirely.
type Table struct {
	Family string // "inet" or "bridge"
	Name   string
	Sets   []Set
	Chains []Chain
	// SetsInPlace: a set missing or unexpected is added or deleted in the
	// batch that fixes the rules, instead of the table being replaced, so
	// the other sets keep elements box does not own (dnsmasq's).
	SetsInPlace bool
}

// Set is a named set. Elements are in their nft text, sorted (an ifname
// set holds interface names, a concatenation "vethA . 10.88.0.2"); a port
// set's are only known when the Ruleset came from WithPorts, Desired leaves
// them empty.
type Set struct {
	Name     string
	Type     string // nft type name: a key of setTypes
	Elements []string
	// Timeout, when set, gives the set the timeout flag and this default
	// timeout for elements added without one.
	Timeout time.Duration
	// Foreign: someone else (dnsmasq) writes the elements; box neither
	// compares nor touches them.
	Foreign bool

	// id is the batch-local id the rules' lookups name the set by when
	// it is created in the same batch as they are.
	id uint32
}

// Chain is a base chain.
type Chain struct {
	Name     string
	Type     string // "filter"
	Hook     string // "input", "forward"
	Priority int32
	Policy   string // "accept"
	Rules    []Rule
}

// Rule is one rule: Text is its nft syntax, Exprs what the kernel is sent.
// Both are built from the same parts so they cannot drift apart.
type Rule struct {
	Text  string
	Exprs []expr.Any
}

// Desired returns the tables box wants for cfg on a kernel with caps.
func Desired(cfg Config, caps Capabilities) Ruleset {
	if c, err := cfg.normalized(); err == nil {
		cfg = c
	} else {
		// A bad name surfaces as an error from Apply and Verify; rendering
		// still works so doctor can show what was asked for.
		cfg.Table, cfg.Bridge = cmpOr(cfg.Table, DefaultTable), cmpOr(cfg.Bridge, DefaultBridge)
	}
	br := cfg.Bridge
	gw := cfg.Gateway
	if !gw.Is4() {
		gw = netip.IPv4Unspecified()
	}
	inet := Table{Family: "inet", Name: cfg.Table, Chains: []Chain{{
		Name: "input", Type: "filter", Hook: "input", Priority: priorityFilter("inet"), Policy: "accept",
		Rules: []Rule{
			rule(accept(), iifname(br), ctReplyOfFlow()),
			// DNS and DHCP to the gateway only: the resolver and the DHCP
			// server listen there, and every other host address (the LAN
			// side, the uplink) stays closed on every port.
			rule(accept(), iifname(br), ipDaddr(gw), dport("udp", 53)),
			rule(accept(), iifname(br), ipDaddr(gw), dport("tcp", 53)),
			rule(accept(), iifname(br), ipDaddr(gw), dport("udp", 67)),
			// A client without a lease asks by broadcast.
			rule(accept(), iifname(br), ipDaddr(limitedBroadcast), dport("udp", 67)),
			// Router solicitations reach the host so that silence to one
			// is evidence (docs/claims.md, "Evidence rules"): with IPv6 wrongly on at the bridge, a
			// router answers at once, and the drill's C-V6 probe fails
			// instead of waiting out unsolicited advertisements (minutes
			// apart). With L-V6 intact the bridge has IPv6 disabled and the
			// kernel drops the frame before any netfilter hook.
			rule(accept(), iifname(br), icmpv6Type(133, "nd-router-solicit")),
			// An allowlisted box's DNS, sent on to box's resolver by the
			// egress table's destination NAT (only there: asked directly,
			// that address is as closed as any other), and its web
			// traffic, handed to box's proxy by TPROXY (egress.go).
			rule(accept(), iifname(br), ipDaddr(EgressDNSAddr), dport("udp", 53), ctStatusDNAT()),
			rule(accept(), iifname(br), ipDaddr(EgressDNSAddr), dport("tcp", 53), ctStatusDNAT()),
			rule(accept(), iifname(br), markIs(EgressMark)),
			rule(drop(), iifname(br)),
		},
	}}}

	bridge := Table{Family: "bridge", Name: cfg.Table}
	fwd := Chain{Name: "forward", Type: "filter", Hook: "forward", Priority: priorityFilter("bridge"), Policy: "accept"}
	mode := caps.Mode()
	switch mode {
	case ModeBridgeMeta:
		fwd.Rules = []Rule{rule(drop(), ibrname(br), obrname(br))}
	default:
		set := cfg.PortSet()
		bridge.Sets = []Set{{Name: set, Type: "ifname", id: portSetID}}
		fwd.Rules = []Rule{rule(drop(), ifnameIn("iifname", expr.MetaKeyIIFNAME, set), ifnameIn("oifname", expr.MetaKeyOIFNAME, set))}
	}
	bridge.Chains = []Chain{fwd}
	return Ruleset{Mode: mode, Tables: []Table{inet, bridge}}
}

func cmpOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// WithPorts returns a copy whose port sets (type ifname) hold ports
// (sorted, deduplicated), for rendering the state Apply converges to.
func (r Ruleset) WithPorts(ports []string) Ruleset {
	out := Ruleset{Mode: r.Mode, Tables: slices.Clone(r.Tables)}
	for i := range out.Tables {
		out.Tables[i] = out.Tables[i].withPorts(ports)
	}
	return out
}

func (t Table) withPorts(ports []string) Table {
	t.Sets = slices.Clone(t.Sets)
	for j := range t.Sets {
		if t.Sets[j].Type == "ifname" {
			t.Sets[j].Elements = normPorts(ports)
		}
	}
	return t
}

// String renders the ruleset as `nft list table` prints it, so it can be
// compared with the kernel's own listing and loaded with `nft -f`.
func (r Ruleset) String() string {
	var b strings.Builder
	for _, t := range r.Tables {
		fmt.Fprintf(&b, "table %s %s {\n", t.Family, t.Name)
		for i, s := range t.Sets {
			if i > 0 {
				b.WriteString("\n")
			}
			fmt.Fprintf(&b, "\tset %s {\n\t\ttype %s\n", s.Name, s.Type)
			if s.Timeout > 0 {
				fmt.Fprintf(&b, "\t\tflags timeout\n\t\ttimeout %s\n", nftDuration(s.Timeout))
			}
			if len(s.Elements) > 0 {
				q := make([]string, len(s.Elements))
				for k, e := range s.Elements {
					q[k] = elemListing(s.Type, e)
				}
				fmt.Fprintf(&b, "\t\telements = { %s }\n", strings.Join(q, ", "))
			}
			b.WriteString("\t}\n")
		}
		for i, c := range t.Chains {
			if i > 0 || len(t.Sets) > 0 {
				b.WriteString("\n")
			}
			fmt.Fprintf(&b, "\tchain %s {\n", c.Name)
			fmt.Fprintf(&b, "\t\ttype %s hook %s priority %s; policy %s;\n", c.Type, c.Hook, priorityText(t.Family, c.Priority), c.Policy)
			for _, ru := range c.Rules {
				fmt.Fprintf(&b, "\t\t%s\n", ru.Text)
			}
			b.WriteString("\t}\n")
		}
		b.WriteString("}\n")
	}
	return b.String()
}

// nftDuration is a timeout as nft prints it (1h, 30m, 10s).
func nftDuration(d time.Duration) string {
	switch {
	case d%time.Hour == 0:
		return fmt.Sprintf("%dh", d/time.Hour)
	case d%time.Minute == 0:
		return fmt.Sprintf("%dm", d/time.Minute)
	}
	return fmt.Sprintf("%ds", d/time.Second)
}

// priorityFilter is the value nft's "priority filter" stands for: the
// bridge family's filter priority is -200, not 0.
func priorityFilter(family string) int32 {
	if family == "bridge" {
		return -200
	}
	return 0
}

func priorityText(family string, p int32) string {
	switch {
	case p == priorityFilter(family):
		return "filter"
	case family != "bridge" && p == priorityMangle:
		return "mangle"
	case family != "bridge" && p == priorityDstNAT:
		return "dstnat"
	}
	return fmt.Sprint(p)
}

// part is one piece of a rule: its nft text and its expressions.
type part struct {
	text  string
	exprs []expr.Any
}

func accept() part { return part{"accept", []expr.Any{&expr.Verdict{Kind: expr.VerdictAccept}}} }
func drop() part   { return part{"drop", []expr.Any{&expr.Verdict{Kind: expr.VerdictDrop}}} }

func rule(verdict part, matches ...part) Rule {
	var r Rule
	var texts []string
	for _, m := range append(matches, verdict) {
		if m.text != "" {
			texts = append(texts, m.text)
		}
		r.Exprs = append(r.Exprs, m.exprs...)
	}
	r.Text = strings.Join(texts, " ")
	return r
}

func ifnameBytes(n string) []byte {
	b := make([]byte, ifnameSize)
	copy(b, n)
	return b
}

func metaIs(key expr.MetaKey, name string) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: key, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifnameBytes(name)},
	}
}

func iifname(n string) part {
	return part{fmt.Sprintf("iifname %q", n), metaIs(expr.MetaKeyIIFNAME, n)}
}
func ibrname(n string) part {
	return part{fmt.Sprintf("meta ibrname %q", n), metaIs(expr.MetaKeyBRIIIFNAME, n)}
}
func obrname(n string) part {
	return part{fmt.Sprintf("meta obrname %q", n), metaIs(expr.MetaKeyBRIOIFNAME, n)}
}

func ifnameIn(word string, key expr.MetaKey, set string) part {
	return part{fmt.Sprintf("%s @%s", word, set), []expr.Any{
		&expr.Meta{Key: key, Register: 1},
		&expr.Lookup{SourceRegister: 1, SetName: set, SetID: portSetID},
	}}
}

func ctStateEstablishedRelated() part {
	return ctStateMask(expr.CmpOpNeq, "ct state established,related")
}

// ipCtDirReply is the kernel's IP_CT_DIR_REPLY (ct direction reply).
const ipCtDirReply = 1

// ctReplyOfFlow matches a packet in the reply direction of an established
// or related flow: a box's answer in a flow something else began. A flow
// a box began is never let on by being established: one that got through
// while box's tables were gone (a flush ruleset by another tool, the
// moments before the healer put them back) would otherwise stay open
// after they are back (measured: a box's ping stream to the host's
// address, started in such a window, went on at 1000 a second).
func ctReplyOfFlow() part {
	st := ctStateEstablishedRelated()
	return part{"ct direction reply " + st.text, append([]expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeyDIRECTION},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{ipCtDirReply}},
	}, st.exprs...)}
}

// ctStateMask tests ct state, a host-endian bitmask, against established
// and related as nft does: (state & mask) != 0 (CmpOpNeq) or == 0.
func ctStateMask(op expr.CmpOp, text string) part {
	return part{text, []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(expr.CtStateBitESTABLISHED | expr.CtStateBitRELATED),
			Xor:  binaryutil.NativeEndian.PutUint32(0)},
		&expr.Cmp{Op: op, Register: 1, Data: binaryutil.NativeEndian.PutUint32(0)},
	}}
}

// dport matches a transport protocol and destination port. nft first
// loads meta l4proto so the port is read from the right header in both
// IPv4 and IPv6.
func dport(proto string, port uint16) part {
	num := byte(unix.IPPROTO_TCP)
	if proto == "udp" {
		num = unix.IPPROTO_UDP
	}
	return part{fmt.Sprintf("%s dport %d", proto, port), []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{num}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(port)},
	}}
}

// limitedBroadcast is where a DHCP client without an address sends.
var limitedBroadcast = netip.AddrFrom4([4]byte{255, 255, 255, 255})

// ipDaddr matches an IPv4 destination address.
func ipDaddr(a netip.Addr) part { return ipAddr("daddr", 16, a) }

// ipAddr matches an IPv4 source (offset 12) or destination (16) address,
// with the nfproto dependency nft adds for it in the inet family.
func ipAddr(word string, offset uint32, a netip.Addr) part {
	b := a.As4()
	return payloadIs("ip "+word+" "+a.String(), expr.PayloadBaseNetworkHeader, offset, b[:]).after(nfproto(unix.NFPROTO_IPV4))
}

// icmpv6Type matches an ICMPv6 message type, with the nfproto dependency
// nft adds for it in the inet family.
func icmpv6Type(t byte, name string) part {
	return icmpType(unix.IPPROTO_ICMPV6, t, "icmpv6 type "+name).after(nfproto(unix.NFPROTO_IPV6))
}

// nfproto is the inet family's dependency for an IPv4 or IPv6 header
// field; nft does not print it.
func nfproto(v byte) part {
	return part{"", []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{v}},
	}}
}

// after puts a dependency's expressions before p's, keeping p's text.
func (p part) after(dep part) part {
	p.exprs = append(slices.Clone(dep.exprs), p.exprs...)
	return p
}

// payloadIs matches len(data) bytes of a header at offset.
func payloadIs(text string, base expr.PayloadBase, offset uint32, data []byte) part {
	return part{text, []expr.Any{
		&expr.Payload{DestRegister: 1, Base: base, Offset: offset, Len: uint32(len(data))},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: data},
	}}
}

// payloadIsNot matches when len(data) bytes of a header at offset differ
// from data.
func payloadIsNot(text string, base expr.PayloadBase, offset uint32, data []byte) part {
	return part{text, []expr.Any{
		&expr.Payload{DestRegister: 1, Base: base, Offset: offset, Len: uint32(len(data))},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: data},
	}}
}

// icmpType matches an ICMP (or ICMPv6) message type by the transport
// protocol and the header's first byte.
func icmpType(proto, t byte, text string) part {
	return part{text, []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 0, Len: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{t}},
	}}
}

// portSetID is the batch-local id of the port set when Apply creates it in
// the same batch as the rules that look it up. Ids only need to be unique
// within one batch; a fixed one keeps the recorded messages deterministic.
const portSetID = 1

// normPorts sorts and deduplicates port names.
func normPorts(ports []string) []string {
	out := slices.Clone(ports)
	slices.Sort(out)
	return slices.Compact(out)
}

// setTypes are the key types of box's sets, by their nft names.
var setTypes = map[string]nftables.SetDatatype{
	"ifname":              nftables.TypeIFName,
	"ifname . ether_addr": nftables.MustConcatSetType(nftables.TypeIFName, nftables.TypeEtherAddr),
	"ifname . ipv4_addr":  nftables.MustConcatSetType(nftables.TypeIFName, nftables.TypeIPAddr),
	"ipv4_addr":           nftables.TypeIPAddr,
}

// fieldSize is how many bytes of a key each field of a set type takes,
// before the padding to a whole register word.
var fieldSize = map[string]int{"ifname": ifnameSize, "ether_addr": 6, "ipv4_addr": 4}

// fields splits a concatenated type or element into its parts.
func fields(s string) []string { return strings.Split(s, " . ") }

// encodeElem turns an element's text into the key the kernel stores: the
// fields one after the other, each padded to a multiple of 4 bytes as it
// is in the registers the lookup reads.
func encodeElem(typ, text string) ([]byte, error) {
	ts, vs := fields(typ), fields(text)
	if len(ts) != len(vs) {
		return nil, fmt.Errorf("element %q does not have the fields of type %s", text, typ)
	}
	var key []byte
	for i, t := range ts {
		var b []byte
		switch t {
		case "ifname":
			b = ifnameBytes(vs[i])
		case "ether_addr":
			mac, err := net.ParseMAC(vs[i])
			if err != nil || len(mac) != 6 {
				return nil, fmt.Errorf("element %q: %q is not an Ethernet address", text, vs[i])
			}
			b = mac
		case "ipv4_addr":
			a, err := netip.ParseAddr(vs[i])
			if err != nil || !a.Is4() {
				return nil, fmt.Errorf("element %q: %q is not an IPv4 address", text, vs[i])
			}
			a4 := a.As4()
			b = a4[:]
		default:
			return nil, fmt.Errorf("set type %s is not one box uses", typ)
		}
		key = append(key, b...)
		key = append(key, make([]byte, (4-len(b)%4)%4)...)
	}
	return key, nil
}

// decodeElem is encodeElem's inverse, for keys read from the kernel; ok is
// false for a key of another shape.
func decodeElem(typ string, key []byte) (text string, ok bool) {
	var out []string
	for _, t := range fields(typ) {
		n, known := fieldSize[t]
		if !known || len(key) < n+(4-n%4)%4 {
			return "", false
		}
		v := key[:n]
		key = key[n+(4-n%4)%4:]
		switch t {
		case "ifname":
			out = append(out, strings.TrimRight(string(v), "\x00"))
		case "ether_addr":
			out = append(out, net.HardwareAddr(v).String())
		case "ipv4_addr":
			out = append(out, netip.AddrFrom4([4]byte(v)).String())
		}
	}
	if len(key) != 0 {
		return "", false
	}
	return strings.Join(out, " . "), true
}

// elemListing is an element as `nft list` prints it: interface names
// quoted.
func elemListing(typ, text string) string {
	ts, vs := fields(typ), fields(text)
	for i := range vs {
		if i < len(ts) && ts[i] == "ifname" {
			vs[i] = strconv.Quote(vs[i])
		}
	}
	return strings.Join(vs, " . ")
}
