package nft

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// Pin is what one port of the bridge may claim to be: the MAC Incus gave
// the box's NIC (config the box cannot change) and the IPv4 addresses it
// holds (its fixed address). A port with no pin has every frame dropped.
type Pin struct {
	Port  string // host-side interface, a port of the bridge
	MAC   net.HardwareAddr
	Addrs []netip.Addr
}

// PinTable names the pin table (bridge family): Table + "_pin". It is a
// table of its own so that it can be removed (the drill's pinning
// mutation) without touching the bridge drop.
func (c Config) PinTable() string { return cmpOr(c.Table, DefaultTable) + "_pin" }

// The pin table's sets beside its own port set, and their batch-local ids.
const (
	hwSet       = "hw"     // ifname . ether_addr: each port's MAC
	bindSet     = "bind"   // ifname . ipv4_addr: each port's addresses
	pinnedSet   = "pinned" // ifname: the ports with a pin
	hwSetID     = 2
	bindSetID   = 3
	pinnedSetID = 4
)

// DesiredPins returns the pin table for cfg on a kernel with caps: ports
// are the bridge's ports (the scope in port-set mode, as for Apply), pins
// what each may claim.
//
// Every rule starts with the scope, so no frame from another bridge is
// ever looked at; in port-set mode a port missing from the set is not
// pinned at all, which VerifyPins reports as a stale set.
func DesiredPins(cfg Config, caps Capabilities, ports []string, pins []Pin) (Ruleset, error) {
	cfg, err := checkArgs(cfg, ports)
	if err != nil {
		return Ruleset{}, err
	}
	t, err := pinTable(cfg, caps, ports, pins)
	if err != nil {
		return Ruleset{}, err
	}
	return Ruleset{Mode: caps.Mode(), Tables: []Table{t}}, nil
}

// pinTable is DesiredPins for a normalised cfg.
func pinTable(cfg Config, caps Capabilities, ports []string, pins []Pin) (Table, error) {
	hw, bind, err := pinElements(pins)
	if err != nil {
		return Table{}, err
	}
	var pinned []string
	for _, p := range pins {
		pinned = append(pinned, p.Port)
	}
	t := Table{Family: "bridge", Name: cfg.PinTable()}
	var scope part
	if caps.Mode() == ModeBridgeMeta {
		scope = ibrname(cfg.Bridge)
	} else {
		// Its own port set, not the bridge drop's: either table can go
		// without taking the other's scope with it.
		t.Sets = append(t.Sets, Set{Name: cfg.PortSet(), Type: "ifname", Elements: normPorts(ports), id: portSetID})
		scope = ifnameIn("iifname", expr.MetaKeyIIFNAME, cfg.PortSet())
	}
	t.Sets = append(t.Sets,
		Set{Name: hwSet, Type: "ifname . ether_addr", Elements: hw, id: hwSetID},
		Set{Name: bindSet, Type: "ifname . ipv4_addr", Elements: bind, id: bindSetID},
		Set{Name: pinnedSet, Type: "ifname", Elements: normPorts(pinned), id: pinnedSetID})

	r := func(verdict part, matches ...part) Rule { return rule(verdict, append([]part{scope}, matches...)...) }
	zero := make([]byte, 4)
	// Prerouting, not forward: a frame to the host itself (an ARP reply
	// poisoning its neighbour table, an IPv4 packet with a forged source)
	// is never forwarded, and every frame from a port passes prerouting.
	t.Chains = []Chain{{Name: "prerouting", Type: "filter", Hook: "prerouting", Priority: priorityFilter("bridge"), Policy: "accept",
		Rules: []Rule{
			// A port in the scope with no pin yet (in bridge-meta mode,
			// whose scope is the bridge, a box just started: Incus names
			// its box a moment later) may only ask for an address: a whole DHCP
			// DISCOVER or REQUEST from 0.0.0.0 (its first option says
			// which; dnsmasq reads the first), naming an Ethernet
			// address. Its DHCP client would otherwise back off for tens
			// of seconds. dnsmasq answers only the MACs Incus names
			// (dhcp-ignore=tag:!known) and a sibling's MAC gets the
			// sibling's own lease; RELEASE, DECLINE and everything else
			// drop until the port is pinned.
			r(accept(), ipv4Dep(), dport("udp", 67), ipWhole(), payloadIs("ip saddr 0.0.0.0", expr.PayloadBaseNetworkHeader, 12, zero),
				ifnameNotIn(pinnedSet, pinnedSetID), payloadIs("@th,72,16 0x106", expr.PayloadBaseTransportHeader, bootpOffset+1, []byte{1, 6}),
				dhcpAsks()),
			r(drop(), notPinned("ether saddr", hwSet, hwSetID, expr.PayloadBaseLLHeader, 6, 6)),
			// 802.1Q: a tagged frame keeps its true MAC (checked above),
			// but its ether type is the tag's, so the ARP rules below
			// (which go by ether type, as nft has them) would not look at
			// it, and the host takes a priority-tagged frame (VID 0) as
			// untagged: measured, a forged ARP in such a tag poisons the
			// host's neighbour table. Boxes have no VLANs on their NIC
			// (Incus tags host-side, if at all), so tagged frames from a
			// port are dropped, and every frame that goes on carries its
			// protocol in its ether type.
			r(drop(), etherType(unix.ETH_P_8021Q, "8021q")),
			r(drop(), etherType(unix.ETH_P_8021AD, "8021ad")),
			r(drop(), arpDep(), notPinned("arp saddr ether", hwSet, hwSetID, expr.PayloadBaseNetworkHeader, 8, 6)),
			// ARP probes (RFC 5227) claim no address.
			r(accept(), arpDep(), payloadIs("arp saddr ip 0.0.0.0", expr.PayloadBaseNetworkHeader, 14, zero)),
			r(drop(), arpDep(), notPinned("arp saddr ip", bindSet, bindSetID, expr.PayloadBaseNetworkHeader, 14, 4)),
			// DHCP (L-DHCP). dnsmasq keys a lease on the message's own
			// hardware type, length and address (chaddr), never on the
			// frame's source, and takes a RELEASE or DECLINE from anyone
			// naming a client: a message from a port must come whole (a
			// fragment could carry chaddr past the rules below) and name
			// the port's own MAC as an Ethernet address (htype 1, hlen 6).
			r(drop(), ipv4Dep(), dport("udp", 67), ipFragment()),
			r(drop(), dhcpDep(), notPinned("@th,288,48", hwSet, hwSetID, expr.PayloadBaseTransportHeader, bootpOffset+28, 6)),
			r(drop(), dhcpDep(), payloadIsNot("@th,72,16 != 0x106", expr.PayloadBaseTransportHeader, bootpOffset+1, []byte{1, 6})),
			// A DHCP client asks before it has an address.
			r(accept(), ipv4Dep(), payloadIs("ip saddr 0.0.0.0", expr.PayloadBaseNetworkHeader, 12, zero), dport("udp", 67)),
			r(drop(), ipv4Dep(), notPinned("ip saddr", bindSet, bindSetID, expr.PayloadBaseNetworkHeader, 12, 4)),
			// Everything else (IPv6 among it) only has its MAC checked:
			// the bridge has IPv6 off (L-V6), and the bridge drop keeps
			// boxes from each other.
		}}}
	return t, nil
}

// pinElements checks pins and renders the hw and bind sets' elements,
// sorted.
func pinElements(pins []Pin) (hw, bind []string, err error) {
	ports := map[string]bool{}
	owner := map[netip.Addr]string{}
	for _, p := range pins {
		if err := checkIfname(p.Port); err != nil {
			return nil, nil, fmt.Errorf("pin: %w", err)
		}
		if ports[p.Port] {
			return nil, nil, fmt.Errorf("two pins for port %s", p.Port)
		}
		ports[p.Port] = true
		if len(p.MAC) != 6 || p.MAC[0]&1 != 0 {
			return nil, nil, fmt.Errorf("pin for %s: %q is not a unicast Ethernet address", p.Port, p.MAC)
		}
		hw = append(hw, p.Port+" . "+p.MAC.String())
		for _, a := range p.Addrs {
			a = a.Unmap()
			if !a.Is4() || a.IsUnspecified() {
				return nil, nil, fmt.Errorf("pin for %s: %v is not an IPv4 address a box can hold", p.Port, a)
			}
			// Pinned to two ports, an address could be claimed by either
			// box: the addresses are wrong, and nothing is pinned until they
			// are not.
			if o, dup := owner[a]; dup && o != p.Port {
				return nil, nil, fmt.Errorf("address %s is pinned to both %s and %s", a, o, p.Port)
			}
			owner[a] = p.Port
			bind = append(bind, p.Port+" . "+a.String())
		}
	}
	return normPorts(hw), normPorts(bind), nil
}

// notPinned matches when the port's name and a header field together are
// not in set: the port claims something that is not its own.
func notPinned(field, set string, id uint32, base expr.PayloadBase, offset, n uint32) part {
	return part{fmt.Sprintf("iifname . %s != @%s", field, set), []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
		// The name fills register 1; the field goes in the next one, and
		// the lookup reads both as one key.
		&expr.Payload{DestRegister: 2, Base: base, Offset: offset, Len: n},
		&expr.Lookup{SourceRegister: 1, SetName: set, SetID: id, Invert: true},
	}}
}

func etherTypeBytes(t uint16) []byte { return []byte{byte(t >> 8), byte(t)} }

// etherType matches the frame's ether type (a tagged frame's is its tag's).
func etherType(t uint16, name string) part {
	return payloadIs("ether type "+name, expr.PayloadBaseLLHeader, 12, etherTypeBytes(t))
}

// arpDep and ipv4Dep are the dependencies nft puts before an ARP or IPv4
// header field in the bridge family (it does not print them).
func arpDep() part {
	p := etherType(unix.ETH_P_ARP, "")
	p.text = ""
	return p
}

// bootpOffset is where a DHCP message (its BOOTP header: op, htype,
// hlen, hops, xid, secs, flags, four addresses, then chaddr at 28) starts
// in a UDP datagram: past the UDP header.
const bootpOffset = 8

// dhcpDep matches an IPv4 datagram to the DHCP server's port, as nft
// prints it before a raw transport header field.
func dhcpDep() part {
	p := ipv4Dep()
	p.text = "meta protocol ip"
	return part{p.text + " udp dport 67", append(p.exprs, dport("udp", 67).exprs...)}
}

// ipFragment matches a fragment of an IPv4 packet: the first one (more
// fragments) or a later one (an offset).
func ipFragment() part {
	return part{"ip frag-off & 16383 != 0", []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 6, Len: 2},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 2, Mask: []byte{0x3f, 0xff}, Xor: []byte{0, 0}},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: []byte{0, 0}},
	}}
}

// ipWhole matches an IPv4 packet that is not a fragment.
func ipWhole() part {
	p := ipFragment()
	p.text = "ip frag-off & 16383 == 0"
	p.exprs[2] = &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{0, 0}}
	return p
}

// ifnameNotIn matches a frame whose in-port is not in an ifname set.
func ifnameNotIn(set string, id uint32) part {
	return part{"iifname != @" + set, []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
		&expr.Lookup{SourceRegister: 1, SetName: set, SetID: id, Invert: true},
	}}
}

// dhcpAsks matches a DHCP message whose first option (past the magic
// cookie, at 236) is the message type, DISCOVER (1) or REQUEST (3): the
// mask 0xfd takes both to 1 and no other type there.
func dhcpAsks() part {
	return part{"@th,1952,56 & 0xfffffffffffffd == 0x63825363350101", []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: bootpOffset + 236, Len: 7},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 7, Mask: []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xfd}, Xor: make([]byte, 7)},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{0x63, 0x82, 0x53, 0x63, 53, 1, 1}},
	}}
}

func ipv4Dep() part {
	return part{"", []expr.Any{
		&expr.Meta{Key: expr.MetaKeyPROTOCOL, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: etherTypeBytes(unix.ETH_P_IP)},
	}}
}

// stalePinProblems describes how a pin set's live elements (have) differ
// from the desired ones, port by port: "pin for vethA stale: want
// 10.88.0.12, has 10.88.0.10".
func stalePinProblems(want Set, have []string) []string {
	byPort := func(elems []string) map[string][]string {
		m := map[string][]string{}
		for _, e := range elems {
			port, val, _ := strings.Cut(e, " . ")
			m[port] = append(m[port], val)
		}
		return m
	}
	w, h := byPort(want.Elements), byPort(have)
	var ports []string
	for p := range w {
		ports = append(ports, p)
	}
	for p := range h {
		ports = append(ports, p)
	}
	var out []string
	for _, p := range normPorts(ports) {
		if !slices.Equal(w[p], h[p]) {
			out = append(out, fmt.Sprintf("pin for %s stale: want %s, has %s", p, listOrNone(w[p]), listOrNone(h[p])))
		}
	}
	return out
}

func listOrNone(vals []string) string {
	if len(vals) == 0 {
		return "none"
	}
	return strings.Join(vals, ", ")
}

// ApplyPins converges the pin table to DesiredPins and says what it
// changed, in one batch like Apply: a missing table is created, one of the
// wrong shape replaced, stale rules or elements fixed, all at once.
func ApplyPins(cfg Config, caps Capabilities, ports []string, pins []Pin) ([]string, error) {
	r, err := DesiredPins(cfg, caps, ports, pins)
	if err != nil {
		return nil, err
	}
	cfg, _ = cfg.normalized() // DesiredPins checked it
	return converge(cfg, r.Tables)
}

// VerifyPins compares the live pin table with DesiredPins; no findings
// means they match, every set's elements included.
func VerifyPins(cfg Config, caps Capabilities, ports []string, pins []Pin) ([]Finding, error) {
	r, err := DesiredPins(cfg, caps, ports, pins)
	if err != nil {
		return nil, err
	}
	cfg, _ = cfg.normalized()
	return verifyTables(cfg, r.Tables)
}

// SetPins makes the pin table's sets (ports, MACs, addresses) hold what
// ports and pins say, and reports whether it changed anything. Only
// elements are added and deleted, in one batch: the kernel switches from
// the old pins to the new ones at once, with no moment in between (an
// empty set would only drop, never admit). The table keeps the mode it was
// applied in. It returns ErrNotApplied when the table is missing, and an
// error when its shape needs ApplyPins.
func SetPins(cfg Config, ports []string, pins []Pin) (bool, error) {
	cfg, err := checkArgs(cfg, ports)
	if err != nil {
		return false, err
	}
	if _, _, err := pinElements(pins); err != nil {
		return false, err
	}
	c, done, err := dial(cfg)
	if err != nil {
		return false, err
	}
	defer done()
	name := cfg.PinTable()
	live, err := readTable(c, "bridge", name)
	if err != nil {
		return false, fmt.Errorf("reading table bridge %s: %w", name, err)
	}
	if !live.exists {
		return false, fmt.Errorf("setting pins in table bridge %s: %w", name, ErrNotApplied)
	}
	// A port set means the table was applied for a kernel without bridge
	// meta.
	caps := Capabilities{BridgeMeta: !slices.ContainsFunc(live.sets, func(s *nftables.Set) bool { return s.Name == cfg.PortSet() })}
	want, _ := pinTable(cfg, caps, ports, pins) // the pins were checked above
	d := diffTable(want, live)
	if len(d.rebuild) > 0 {
		return false, fmt.Errorf("table bridge %s is not as ApplyPins leaves it (%s): apply it again", name, strings.Join(d.rebuild, "; "))
	}
	t := &nftables.Table{Family: nftables.TableFamilyBridge, Name: name}
	var changes []string
	for _, f := range d.elemFixes {
		if msg := updateSet(c, t, f); msg != "" {
			changes = append(changes, msg)
		}
	}
	if len(changes) == 0 {
		return false, nil
	}
	if err := c.Flush(); err != nil {
		return false, fmt.Errorf("updating pins (nothing changed; planned: %s): %w", strings.Join(changes, "; "), err)
	}
	return true, nil
}

// LivePins reads the pins the pin table holds, by port: each pinned
// port's MAC and addresses (none when there is no table).
func LivePins(cfg Config) (map[string]Pin, error) {
	cfg, err := cfg.normalized()
	if err != nil {
		return nil, err
	}
	c, done, err := dial(cfg)
	if err != nil {
		return nil, err
	}
	defer done()
	live, err := readTable(c, "bridge", cfg.PinTable())
	if err != nil || !live.exists {
		return nil, err
	}
	out := map[string]Pin{}
	for _, port := range live.elems[pinnedSet] {
		out[port] = Pin{Port: port}
	}
	for _, e := range live.elems[hwSet] {
		port, m, _ := strings.Cut(e, " . ")
		if p, ok := out[port]; ok {
			p.MAC, _ = net.ParseMAC(m)
			out[port] = p
		}
	}
	for _, e := range live.elems[bindSet] {
		port, a, _ := strings.Cut(e, " . ")
		if p, ok := out[port]; ok {
			if addr, err := netip.ParseAddr(a); err == nil {
				p.Addrs = append(p.Addrs, addr)
				out[port] = p
			}
		}
	}
	return out, nil
}

// PinsHeld reports whether the pin table pins each of pins exactly as
// given: its port pinned, to its MAC and to its addresses and no other.
// Other ports are not looked at: it tells, from the kernel alone, whether
// a refresh would change anything for these ports (a missing table holds
// nothing).
func PinsHeld(cfg Config, pins []Pin) (bool, error) {
	if _, _, err := pinElements(pins); err != nil {
		return false, err
	}
	live, err := LivePins(cfg)
	if err != nil {
		return false, err
	}
	for _, p := range pins {
		l, ok := live[p.Port]
		if !ok || l.MAC.String() != p.MAC.String() || !sameAddrs(l.Addrs, p.Addrs) {
			return false, nil
		}
	}
	return true, nil
}

// sameAddrs says whether a and b hold the same addresses.
func sameAddrs(a, b []netip.Addr) bool {
	norm := func(xs []netip.Addr) []netip.Addr {
		out := make([]netip.Addr, 0, len(xs))
		for _, x := range xs {
			out = append(out, x.Unmap())
		}
		slices.SortFunc(out, netip.Addr.Compare)
		return slices.Compact(out)
	}
	return slices.Equal(norm(a), norm(b))
}

// PinnedAddrs lists the addresses the pin table binds to a port: those of
// the boxes running on the bridge now (none when there is no table).
func PinnedAddrs(cfg Config) ([]netip.Addr, error) {
	live, err := LivePins(cfg)
	if err != nil {
		return nil, err
	}
	var out []netip.Addr
	for _, p := range live {
		out = append(out, p.Addrs...)
	}
	return out, nil
}

// PinsPresent reports whether the pin table exists.
func PinsPresent(cfg Config) (bool, error) { return tablePresent(cfg, "bridge", cfg.PinTable()) }

// DeletePins removes the pin table and reports whether it was there; when
// it is not it sends nothing.
func DeletePins(cfg Config) (bool, error) { return deleteTable(cfg, "bridge", cfg.PinTable()) }

// tablePresent reports whether a table of box's exists.
func tablePresent(cfg Config, family, name string) (bool, error) {
	_, c, done, err := connect(cfg)
	if err != nil {
		return false, err
	}
	defer done()
	return tableExists(c, familyOf(family), name)
}

// deleteTable removes a table of box's and reports whether it was there;
// when it is not it sends nothing.
func deleteTable(cfg Config, family, name string) (bool, error) {
	_, c, done, err := connect(cfg)
	if err != nil {
		return false, err
	}
	defer done()
	ok, err := tableExists(c, familyOf(family), name)
	if err != nil || !ok {
		return false, err
	}
	c.DelTable(&nftables.Table{Family: familyOf(family), Name: name})
	if err := c.Flush(); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return false, nil // gone since it was listed
		}
		return false, fmt.Errorf("deleting table %s %s: %w", family, name, err)
	}
	return true, nil
}
