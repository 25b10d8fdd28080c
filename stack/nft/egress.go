package nft

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// The egress table (layer L-EGRESS) holds the allowlisted boxes to names:
//
//   - DNS: a box under a policy asks the gateway, and its question (udp and
//     tcp 53) is sent on, by destination NAT, to box's own resolver on a
//     host-local address (EgressDNSAddr): the answer comes back from the
//     gateway. That resolver answers only the policy's names and fills the
//     policy's allow set with its answers; nothing else it is asked ever
//     leaves the host. The port stays 53: Incus's own input chain accepts
//     DNS from the bridge on any address, and drops every other port to a
//     private address.
//   - Names at the connection: tcp 80 and 443 from the boxes go by TPROXY to
//     box's proxy (127.0.0.1:EgressProxyPort, marked EgressMark, which a
//     policy route delivers locally), which checks the TLS server name or
//     the HTTP Host, then dials itself. When no proxy listens (TPROXY finds
//     no socket), the next rule drops the packet; a marked packet that is
//     forwarded (the policy route is gone) is dropped too: closed, never
//     open.
//   - Every other new connection a box forwards goes only to the addresses
//     the resolver answered for the box's policy (its allow set); never to
//     UDP 443 (QUIC: no name to check), to port 853 (DNS over TLS or QUIC),
//     or to a resolver in EgressResolvers (DNS over HTTPS), whatever the
//     answers said.
//
// Replies and established connections are not looked at, so a long
// download outlives an allow element's timeout. The forward chain only
// ever drops: an allowed name that resolves to a private address stays as
// unreachable as it was (the ACL and the host firewall still drop it).
type EgressPolicy struct {
	ID    string // [a-z0-9]{1,16}
	Boxes []netip.Addr
}

// Egress is what the egress table holds: the policies and the resolvers
// (DNS over HTTPS and TLS endpoints, the stack's own upstream) no
// allowlisted box reaches directly.
type Egress struct {
	Policies  []EgressPolicy
	Resolvers []netip.Addr
}

// The egress design's fixed points, shared by the table, the host
// firewall's accepts, the policy route and box's resolver and proxy.
var (
	// EgressDNSAddr is where box's resolver listens (udp and tcp 53), an
	// address of the host's loopback device: not the gateway's, where the
	// bridge's dnsmasq listens for open boxes. It is RFC 7600's IPv4 dummy
	// address: special-purpose, routed nowhere, in no private range a LAN
	// or a VPN takes, and not link-local (a link-local address needs an
	// interface named wherever it is used).
	EgressDNSAddr = netip.MustParseAddr("192.0.0.8")
	// EgressProxyAddr is where box's proxy listens (IP_TRANSPARENT).
	EgressProxyAddr = netip.MustParseAddr("127.0.0.1")
)

const (
	// EgressProxyPort is the proxy's port, above the kernel's ephemeral
	// range (32768-60999), so no outgoing connection takes it first.
	EgressProxyPort = 61080
	// EgressMark marks the packets TPROXY hands to the proxy; the policy
	// route (EgressRouteTable) delivers them locally. "box\0".
	EgressMark = 0x626f7800
	// EgressRouteTable holds the one route the mark is routed by (local
	// 0.0.0.0/0 dev lo); EgressRulePriority is its rule's priority.
	EgressRouteTable   = 25199
	EgressRulePriority = 25199
)

// EgressTable names the egress table (inet family): Table + "_egress".
func (c Config) EgressTable() string { return cmpOr(c.Table, DefaultTable) + "_egress" }

// EgressAllowSet and EgressBoxesSet name one policy's sets.
func EgressAllowSet(id string) string { return "allow_" + id }
func EgressBoxesSet(id string) string { return "boxes_" + id }

// The egress table's own sets: every allowlisted box, and the resolvers.
const (
	EgressAllowlistedSet = "allowlisted"
	EgressResolversSet   = "resolvers"
)

// EgressTimeout is how long an address the resolver answered with stays
// allowed (the allow sets' default timeout; the resolver adds elements
// without one, and a repeated answer refreshes it).
const EgressTimeout = time.Hour

var policyIDRE = regexp.MustCompile(`^[a-z0-9]{1,16}$`)

// ValidPolicyID says whether id can name a policy's sets.
func ValidPolicyID(id string) bool { return policyIDRE.MatchString(id) }

// Set ids in one batch: the table's own sets, then two a policy.
const (
	allowlistedSetID = 10
	resolversSetID   = 11
)

// table is the egress table for cfg (normalised) and e.
func (e Egress) table(cfg Config) (Table, error) {
	t := Table{Family: "inet", Name: cfg.EgressTable(), SetsInPlace: true}
	ps := slices.Clone(e.Policies)
	slices.SortFunc(ps, func(a, b EgressPolicy) int {
		if a.ID < b.ID {
			return -1
		}
		if a.ID > b.ID {
			return 1
		}
		return 0
	})
	gw := cfg.Gateway
	if !gw.Is4() {
		gw = netip.IPv4Unspecified()
	}
	var all, resolvers []string
	for _, a := range e.Resolvers {
		if !a.Is4() {
			continue // the table is IPv4 only, like the boxes' network
		}
		resolvers = append(resolvers, a.String())
	}
	var fwd []Rule
	for i, p := range ps {
		if !ValidPolicyID(p.ID) {
			return Table{}, fmt.Errorf("egress policy id %q: want 1 to 16 lower-case letters and digits", p.ID)
		}
		if i > 0 && ps[i-1].ID == p.ID {
			return Table{}, fmt.Errorf("egress policy %s given twice", p.ID)
		}
		var boxes []string
		for _, a := range p.Boxes {
			if !a.Is4() {
				return Table{}, fmt.Errorf("egress policy %s: box address %s is not IPv4", p.ID, a)
			}
			boxes = append(boxes, a.String())
		}
		all = append(all, boxes...)
		allowID, boxesID := uint32(16+2*i), uint32(17+2*i)
		t.Sets = append(t.Sets,
			Set{Name: EgressAllowSet(p.ID), Type: "ipv4_addr", Timeout: EgressTimeout, Foreign: true, id: allowID},
			Set{Name: EgressBoxesSet(p.ID), Type: "ipv4_addr", Elements: normPorts(boxes), id: boxesID})
		fwd = append(fwd, rule(drop(),
			iifname(cfg.Bridge),
			ipInSet("saddr", 12, EgressBoxesSet(p.ID), boxesID, false),
			ctStateNew(),
			ipInSet("daddr", 16, EgressAllowSet(p.ID), allowID, true)))
	}
	t.Sets = append([]Set{
		{Name: EgressAllowlistedSet, Type: "ipv4_addr", Elements: normPorts(all), id: allowlistedSetID},
		{Name: EgressResolversSet, Type: "ipv4_addr", Elements: normPorts(resolvers), id: resolversSetID},
	}, t.Sets...)
	from := func() []part {
		return []part{iifname(cfg.Bridge), ipInSet("saddr", 12, EgressAllowlistedSet, allowlistedSetID, false)}
	}
	with := func(ps ...part) []part { return append(from(), ps...) }
	dns := EgressDNSAddr
	t.Chains = []Chain{
		{Name: "dns", Type: "nat", Hook: "prerouting", Priority: priorityDstNAT, Policy: "accept", Rules: []Rule{
			rule(dnatTo(dns), with(ipDaddr(gw), dport("udp", 53))...),
			rule(dnatTo(dns), with(ipDaddr(gw), dport("tcp", 53))...),
		}},
		{Name: "names", Type: "filter", Hook: "prerouting", Priority: priorityMangle, Policy: "accept", Rules: []Rule{
			rule(accept(), with(dport("tcp", 80), tproxyTo(EgressProxyAddr, EgressProxyPort), markSet(EgressMark))...),
			rule(accept(), with(dport("tcp", 443), tproxyTo(EgressProxyAddr, EgressProxyPort), markSet(EgressMark))...),
			// TPROXY found no proxy listening: closed, never open.
			rule(drop(), with(dport("tcp", 80))...),
			rule(drop(), with(dport("tcp", 443))...),
		}},
		{Name: "forward", Type: "filter", Hook: "forward", Priority: priorityFilter("inet"), Policy: "accept", Rules: append([]Rule{
			// Handed to the proxy, yet routed on: the policy route is
			// missing.
			rule(drop(), iifname(cfg.Bridge), markIs(EgressMark)),
			rule(drop(), with(dport("udp", 443))...),
			rule(drop(), with(dport("tcp", 853))...),
			rule(drop(), with(dport("udp", 853))...),
			rule(drop(), with(ipInSet("daddr", 16, EgressResolversSet, resolversSetID, false))...),
		}, fwd...)},
	}
	return t, nil
}

// Chain priorities nft calls mangle and dstnat.
const (
	priorityMangle int32 = -150
	priorityDstNAT int32 = -100
)

// ipInSet matches an IPv4 source (offset 12) or destination (16) in a set
// (or, inverted, not in it).
func ipInSet(word string, offset uint32, set string, id uint32, invert bool) part {
	op := ""
	if invert {
		op = "!= "
	}
	return part{fmt.Sprintf("ip %s %s@%s", word, op, set), []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: 4},
		&expr.Lookup{SourceRegister: 1, SetName: set, SetID: id, Invert: invert},
	}}.after(nfproto(unix.NFPROTO_IPV4))
}

// ctStateNew matches a packet that opens a connection: neither established
// nor related (nor untracked).
func ctStateNew() part { return ctStateMask(expr.CmpOpEq, "ct state != established,related") }

// ctStatusDNAT matches a packet whose connection was destination-NATed.
func ctStatusDNAT() part {
	return part{"ct status dnat", []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATUS},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(ipsDstNAT), Xor: binaryutil.NativeEndian.PutUint32(0)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(0)},
	}}
}

// ipsDstNAT is the conntrack status bit IPS_DST_NAT.
const ipsDstNAT = 1 << 5

// markIs matches a packet's mark.
func markIs(m uint32) part {
	return part{fmt.Sprintf("meta mark 0x%08x", m), []expr.Any{
		&expr.Meta{Key: expr.MetaKeyMARK, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(m)},
	}}
}

// markSet sets a packet's mark.
func markSet(m uint32) part {
	return part{fmt.Sprintf("meta mark set 0x%08x", m), []expr.Any{
		&expr.Immediate{Register: 1, Data: binaryutil.NativeEndian.PutUint32(m)},
		&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: 1},
	}}
}

// dnatTo rewrites an IPv4 destination address, keeping the port.
func dnatTo(a netip.Addr) part {
	b := a.As4()
	return part{"dnat ip to " + a.String(), []expr.Any{
		&expr.Immediate{Register: 1, Data: b[:]},
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1, RegAddrMax: 1},
	}}
}

// tproxyTo hands a packet to a local socket without changing it.
func tproxyTo(a netip.Addr, port uint16) part {
	b := a.As4()
	p := make([]byte, 2)
	binary.BigEndian.PutUint16(p, port)
	return part{fmt.Sprintf("tproxy ip to %s:%d", a, port), []expr.Any{
		&expr.Immediate{Register: 1, Data: b[:]},
		&expr.Immediate{Register: 2, Data: p},
		&expr.TProxy{Family: unix.NFPROTO_IPV4, TableFamily: unix.NFPROTO_INET, RegAddr: 1, RegPort: 2},
	}}
}

// Desired is the egress table for e.
func (e Egress) Desired(cfg Config) (Ruleset, error) {
	cfg, err := checkRules(cfg, nil)
	if err != nil {
		return Ruleset{}, err
	}
	t, err := e.table(cfg)
	if err != nil {
		return Ruleset{}, err
	}
	return Ruleset{Tables: []Table{t}}, nil
}

// Apply converges the egress table to Desired in one batch and
// says what it changed. The allow sets' elements are the resolver's and
// are never touched.
func (e Egress) Apply(cfg Config) ([]string, error) {
	r, err := e.Desired(cfg)
	if err != nil {
		return nil, err
	}
	cfg, _ = cfg.normalized()
	return converge(cfg, r.Tables)
}

// Verify compares the live egress table with Desired.
func (e Egress) Verify(cfg Config) ([]Finding, error) {
	r, err := e.Desired(cfg)
	if err != nil {
		return nil, err
	}
	cfg, _ = cfg.normalized()
	return verifyTables(cfg, r.Tables)
}

// EgressPresent reports whether the egress table exists.
func EgressPresent(cfg Config) (bool, error) { return tablePresent(cfg, "inet", cfg.EgressTable()) }

// DeleteEgress removes the egress table; a missing one is no error.
func DeleteEgress(cfg Config) (bool, error) { return deleteTable(cfg, "inet", cfg.EgressTable()) }

// EgressAllowed lists what one policy's allow set holds now (the
// resolver's answers not yet timed out).
func EgressAllowed(cfg Config, id string) ([]netip.Addr, error) {
	cfg, c, done, err := connect(cfg)
	if err != nil {
		return nil, err
	}
	defer done()
	live, err := readTable(c, "inet", cfg.EgressTable())
	if err != nil {
		return nil, err
	}
	var out []netip.Addr
	for _, e := range live.elems[EgressAllowSet(id)] {
		if a, err := netip.ParseAddr(e); err == nil {
			out = append(out, a)
		}
	}
	return out, nil
}

// EgressAllower adds the resolver's answers to the policies' allow sets,
// over one netlink connection it keeps open.
type EgressAllower struct {
	cfg  Config
	c    *nftables.Conn
	done func()
}

// NewEgressAllower opens the allower's connection in cfg's namespace.
func NewEgressAllower(cfg Config) (*EgressAllower, error) {
	cfg, c, done, err := connect(cfg)
	if err != nil {
		return nil, err
	}
	return &EgressAllower{cfg: cfg, c: c, done: done}, nil
}

// Allow adds addresses to a policy's allow set with the set's default
// timeout (an element already there gets it afresh), in one batch.
func (a *EgressAllower) Allow(id string, addrs []netip.Addr) error {
	var els []nftables.SetElement
	for _, ad := range addrs {
		if ad.Is4() {
			b := ad.As4()
			els = append(els, nftables.SetElement{Key: b[:]})
		}
	}
	if len(els) == 0 {
		return nil
	}
	t := &nftables.Table{Family: nftables.TableFamilyINet, Name: a.cfg.EgressTable()}
	s := &nftables.Set{Table: t, Name: EgressAllowSet(id), KeyType: nftables.TypeIPAddr}
	if err := a.c.SetAddElements(s, els); err != nil {
		return err
	}
	if err := a.c.Flush(); err != nil {
		return fmt.Errorf("adding %v to set %s of table inet %s: %w", addrs, s.Name, t.Name, err)
	}
	return nil
}

// Close closes the connection.
func (a *EgressAllower) Close() { a.done() }

// setTimeoutOf is a live set's default timeout (0 without the flag).
func setTimeoutOf(s *nftables.Set) time.Duration {
	if !s.HasTimeout {
		return 0
	}
	return s.Timeout
}
