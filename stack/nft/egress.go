package nft

import (
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// EgressPolicy is one egress allowlist as the kernel enforces it: the boxes
// under it (by address: the pins keep a box to its own) may open
// connections only to the addresses the bridge's dnsmasq answered for the
// policy's names, which dnsmasq itself puts into the policy's allow set
// (its nftset option). Replies and established connections are not
// looked at, so a long download outlives an allow element's timeout.
//
// The table only ever drops: a rule here cannot accept what the host
// firewall or the ACL drops (an allowed name that resolves to a private
// address stays unreachable).
type EgressPolicy struct {
	ID    string // [a-z0-9]{1,16}
	Boxes []netip.Addr
}

// EgressTable names the egress table (inet family): Table + "_egress".
func (c Config) EgressTable() string { return cmpOr(c.Table, DefaultTable) + "_egress" }

// EgressAllowSet and EgressBoxesSet name one policy's sets.
func EgressAllowSet(id string) string { return "allow_" + id }
func EgressBoxesSet(id string) string { return "boxes_" + id }

// EgressTimeout is how long an address dnsmasq answered with stays allowed
// (the allow sets' default timeout; dnsmasq adds elements without one).
const EgressTimeout = time.Hour

var policyIDRE = regexp.MustCompile(`^[a-z0-9]{1,16}$`)

// egressTable is the egress table for cfg (normalised) and policies.
func egressTable(cfg Config, policies []EgressPolicy) (Table, error) {
	t := Table{Family: "inet", Name: cfg.EgressTable(), SetsInPlace: true}
	ps := slices.Clone(policies)
	slices.SortFunc(ps, func(a, b EgressPolicy) int {
		if a.ID < b.ID {
			return -1
		}
		if a.ID > b.ID {
			return 1
		}
		return 0
	})
	var rules []Rule
	for i, p := range ps {
		if !policyIDRE.MatchString(p.ID) {
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
		allowID, boxesID := uint32(16+2*i), uint32(17+2*i)
		t.Sets = append(t.Sets,
			Set{Name: EgressAllowSet(p.ID), Type: "ipv4_addr", Timeout: EgressTimeout, Foreign: true, id: allowID},
			Set{Name: EgressBoxesSet(p.ID), Type: "ipv4_addr", Elements: normPorts(boxes), id: boxesID})
		rules = append(rules, rule(drop(),
			iifname(cfg.Bridge),
			ipInSet("saddr", 12, EgressBoxesSet(p.ID), boxesID, false),
			ctStateNew(),
			ipInSet("daddr", 16, EgressAllowSet(p.ID), allowID, true)))
	}
	t.Chains = []Chain{{Name: "forward", Type: "filter", Hook: "forward", Priority: priorityFilter("inet"), Policy: "accept", Rules: rules}}
	return t, nil
}

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

// DesiredEgress is the egress table for policies.
func DesiredEgress(cfg Config, policies []EgressPolicy) (Ruleset, error) {
	cfg, err := cfg.normalized()
	if err != nil {
		return Ruleset{}, err
	}
	t, err := egressTable(cfg, policies)
	if err != nil {
		return Ruleset{}, err
	}
	return Ruleset{Tables: []Table{t}}, nil
}

// ApplyEgress converges the egress table to DesiredEgress in one batch and
// says what it changed. The allow sets' elements are dnsmasq's and are
// never touched.
func ApplyEgress(cfg Config, policies []EgressPolicy) ([]string, error) {
	r, err := DesiredEgress(cfg, policies)
	if err != nil {
		return nil, err
	}
	cfg, _ = cfg.normalized()
	return converge(cfg, r.Tables)
}

// VerifyEgress compares the live egress table with DesiredEgress.
func VerifyEgress(cfg Config, policies []EgressPolicy) ([]Finding, error) {
	r, err := DesiredEgress(cfg, policies)
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

// EgressAllowed lists what one policy's allow set holds now (dnsmasq's
// answers not yet timed out).
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

// setTimeoutOf is a live set's default timeout (0 without the flag).
func setTimeoutOf(s *nftables.Set) time.Duration {
	if !s.HasTimeout {
		return 0
	}
	return s.Timeout
}
