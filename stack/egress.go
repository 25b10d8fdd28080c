package stack

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/netip"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/miekg/dns"

	"github.com/box-isolation/box/internal/nsrun"
	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/nft"
)

// Egress policies (layer L-EGRESS). A box is open (today's default: the
// internet, nothing private) or under an allowlist of names. The allowlist
// is enforced on the host: the bridge's dnsmasq puts the addresses it
// answers for a policy's names into that policy's nft set (its nftset
// option), and a box under the policy has every new connection it forwards
// dropped unless the destination is in the set. DNS to the gateway is not
// forwarded, so it is untouched. The policy is only ever an extra drop: an
// allowed name that resolves to a private or host address stays as
// unreachable as it was (the ACL and the host firewall still drop it).
//
// dnsmasq's nftset works per name, not per asking box, so sets are per
// policy and boxes join one by their address (the pins keep a box to its
// own). A policy is named by its names (PolicyID), stored on the bridge
// (user.box.egress.<id> = the names), and written into the bridge's
// dnsmasq settings: a new policy restarts the bridge's resolver; moving a
// box between policies that exist does not.
const (
	// KeyEgress on a box: the id of its policy; absent (or "") is open.
	// KeyEgressNames beside it: the policy's names, so the box carries its
	// allowlist to another host (export, import).
	KeyEgress      = "user.box.egress"
	KeyEgressNames = "user.box.egress_names"
	// keyEgressPolicy on the bridge, followed by a policy id: its names.
	keyEgressPolicy = "user.box.egress."
	// EgressOpen is how an open box's policy is shown.
	EgressOpen = "open"
)

var nameRE = regexp.MustCompile(`^(\*\.)?([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\.)+[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// NormalizeNames checks an allowlist (a name, or *.suffix for everything
// under a suffix), lower-cases it, drops trailing dots and duplicates and
// sorts it. dnsmasq matches a name and every name under it, so "a.example"
// also allows "x.a.example"; "*.example" is written the same way.
func NormalizeNames(names []string) ([]string, error) {
	var out []string
	for _, n := range names {
		n = strings.TrimSuffix(strings.ToLower(strings.TrimSpace(n)), ".")
		if n == "" {
			continue
		}
		if len(n) > 253 || !nameRE.MatchString(n) {
			return nil, fmt.Errorf("%q is not a name an allowlist takes (a DNS name with a dot, such as api.example.com, or *.example.com)", n)
		}
		if !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	if len(out) == 0 {
		return nil, errors.New("an allowlist needs at least one name")
	}
	sort.Strings(out)
	return out, nil
}

// ParseAllowlist reads an allowlist file: one name or *.suffix a line;
// blank lines and # comments are skipped.
func ParseAllowlist(r io.Reader) ([]string, error) {
	var names []string
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		line, _, _ := strings.Cut(sc.Text(), "#")
		if line = strings.TrimSpace(line); line == "" {
			continue
		}
		if strings.ContainsAny(line, " \t,") {
			return nil, fmt.Errorf("line %d: %q: one name a line", n, line)
		}
		names = append(names, line)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return NormalizeNames(names)
}

// PolicyID names the policy of a normalised allowlist: the same names are
// the same policy, whichever box asks.
func PolicyID(names []string) string {
	sum := sha256.Sum256([]byte(strings.Join(names, "\n")))
	return "p" + hex.EncodeToString(sum[:])[:10]
}

// policiesOf reads the policies stored on the bridge's config.
func policiesOf(cfg map[string]string) map[string][]string {
	out := map[string][]string{}
	for k, v := range cfg {
		if id, ok := strings.CutPrefix(k, keyEgressPolicy); ok && id != "" && !strings.Contains(id, ".") {
			out[id] = strings.Split(v, ",")
		}
	}
	return out
}

// withoutNftset is dnsmasq settings without their nftset lines.
func withoutNftset(raw string) string {
	var b strings.Builder
	for _, l := range strings.SplitAfter(raw, "\n") {
		if l != "" && !strings.HasPrefix(l, "nftset=") {
			b.WriteString(l)
		}
	}
	return b.String()
}

// dnsmasqDomain is a name as dnsmasq's domain matching takes it.
func dnsmasqDomain(name string) string { return strings.TrimPrefix(name, "*.") }

// maxDnsmasqLine bounds one dnsmasq settings line: dnsmasq refuses a
// longer one ("bad option"; docs/measurements.md, "Egress allowlists"), so
// names are split over as many lines as it takes.
const maxDnsmasqLine = 1000

// nftsetLines are the dnsmasq settings that fill the policies' allow sets.
//
// dnsmasq takes, for an answer, the one nftset entry whose domain matches
// the name longest (docs/measurements.md, "Egress allowlists"). So each
// domain's entry names the sets of every policy that allows it, its own
// names or a name it is under; domains with the same sets share lines.
func nftsetLines(policies map[string][]string, table string) string {
	sets := map[string]map[string]bool{} // domain -> policy ids
	for id, names := range policies {
		for _, n := range names {
			d := dnsmasqDomain(n)
			if sets[d] == nil {
				sets[d] = map[string]bool{}
			}
			sets[d][id] = true
		}
	}
	// A domain under another listed one also fills that one's sets.
	byKey := map[string][]string{} // the sets' text -> domains
	for d, ids := range sets {
		all := maps.Clone(ids)
		for parent := d; ; {
			_, rest, ok := strings.Cut(parent, ".")
			if !ok {
				break
			}
			parent = rest
			maps.Copy(all, sets[parent])
		}
		var specs []string
		for _, id := range slices.Sorted(maps.Keys(all)) {
			specs = append(specs, fmt.Sprintf("4#inet#%s#%s", table, nft.EgressAllowSet(id)))
		}
		key := strings.Join(specs, ",")
		byKey[key] = append(byKey[key], d)
	}
	var b strings.Builder
	for _, key := range slices.Sorted(maps.Keys(byKey)) {
		domains := byKey[key]
		sort.Strings(domains)
		tail := "/" + key + "\n"
		line := "nftset="
		for _, d := range domains {
			if len(line)+1+len(d)+len(tail) > maxDnsmasqLine && line != "nftset=" {
				b.WriteString(line + tail)
				line = "nftset="
			}
			line += "/" + d
		}
		b.WriteString(line + tail)
	}
	return b.String()
}

// egressPlanOf puts each box under a policy into that policy's boxes set,
// by the addresses leased to its NIC's MAC on the bridge. Every stored
// policy is in the plan, with or without boxes; a box naming a policy the
// bridge does not store is a finding (its traffic is not allowlisted).
func egressPlanOf(bridge string, policies map[string][]string, insts []incus.Instance, leases []incus.NetworkLease) ([]nft.EgressPolicy, []Finding) {
	byMAC := map[string][]netip.Addr{}
	for _, l := range leases {
		a, err := netip.ParseAddr(l.Address)
		mac, merr := net.ParseMAC(l.Hwaddr)
		if err != nil || merr != nil || !a.Is4() || l.Type == "gateway" {
			continue
		}
		byMAC[mac.String()] = append(byMAC[mac.String()], a)
	}
	boxes := map[string][]netip.Addr{}
	var findings []Finding
	for i := range insts {
		id := insts[i].Config[KeyEgress]
		if id == "" {
			continue
		}
		if _, ok := policies[id]; !ok {
			findings = append(findings, Finding{Layer: LayerEgress, Object: "box " + insts[i].Name,
				Problem: fmt.Sprintf("its egress policy %s is not on %s: it is not allowlisted", id, bridge),
				Fix:     fmt.Sprintf("box egress %s allow NAME... (or open)", insts[i].Name)})
			continue
		}
		for _, n := range bridgeNICs(bridge, &insts[i]) {
			if mac, err := net.ParseMAC(n.mac); err == nil {
				boxes[id] = append(boxes[id], byMAC[mac.String()]...)
			}
		}
	}
	var out []nft.EgressPolicy
	for _, id := range slices.Sorted(maps.Keys(policies)) {
		out = append(out, nft.EgressPolicy{ID: id, Boxes: boxes[id]})
	}
	return out, findings
}

// egressPlan reads the stored policies and says what the egress table
// must hold now.
func (host *Host) egressPlan(ctx context.Context, f fleet) ([]nft.EgressPolicy, []Finding, error) {
	n, _, err := host.Incus.Network(ctx, Current.Network)
	if err != nil {
		return nil, nil, err
	}
	ps, fs := egressPlanOf(Current.Network, policiesOf(n.Config), f.insts, f.leases)
	return ps, fs, nil
}

// applyEgress makes the egress table hold the policies and their boxes as
// they are now: only boxes sets, and new policies' sets and rules, change
// (dnsmasq's allow elements stay). With no policy there is no table.
func (host *Host) applyEgress(ctx context.Context, g *ground, f fleet) ([]string, error) {
	ps, _, err := host.egressPlan(ctx, f)
	if err != nil {
		return nil, fmt.Errorf("reading the egress policies: %w", err)
	}
	ncfg := g.nftConfig(Current)
	if len(ps) == 0 {
		if gone, err := nft.DeleteEgress(ncfg); err != nil || !gone {
			return nil, err
		}
		return []string{"deleted table inet " + ncfg.EgressTable() + " (no egress policy left)"}, nil
	}
	changes, err := nft.ApplyEgress(ncfg, ps)
	if err != nil {
		return nil, fmt.Errorf("applying the egress table: %w", err)
	}
	return changes, nil
}

// verifyEgress reports how the egress table and the boxes' policies differ
// from what they should be.
func (host *Host) verifyEgress(ctx context.Context, g *ground, f fleet) ([]Finding, error) {
	ps, out, err := host.egressPlan(ctx, f)
	if err != nil {
		return nil, fmt.Errorf("reading the egress policies: %w", err)
	}
	ncfg := g.nftConfig(Current)
	if len(ps) == 0 {
		if present, err := nft.EgressPresent(ncfg); err != nil || !present {
			return out, err
		}
		return append(out, Finding{Layer: LayerEgress, Object: "nft table inet " + ncfg.EgressTable(), Problem: "present with no egress policy", Fix: fixEnsure}), nil
	}
	nf, err := nft.VerifyEgress(ncfg, ps)
	if err != nil {
		return nil, fmt.Errorf("reading the egress table: %w", err)
	}
	for _, f := range nf {
		out = append(out, Finding{Layer: LayerEgress, Object: "nft " + f.Object, Problem: f.Problem, Fix: fixEnsure})
	}
	return out, nil
}

// EgressChange is what SetEgress did.
type EgressChange struct {
	Box    string   `json:"box"`
	Policy string   `json:"policy"` // the id, or "open"
	Names  []string `json:"names,omitempty"`
	// NewPolicy: the bridge's resolver was restarted to learn the names;
	// ResolverDown is how long it did not answer.
	NewPolicy    bool          `json:"new_policy"`
	ResolverDown time.Duration `json:"resolver_down_ns,omitempty"`
}

// SetEgress puts a box under an allowlist (names) or opens it (names nil).
// Between policies that exist it takes effect at the next refresh, which
// it makes at once; a new policy restarts the bridge's resolver first.
func (host *Host) SetEgress(ctx context.Context, box string, names []string) (*EgressChange, error) {
	inst, etag, err := host.resolve(ctx, box)
	if err != nil {
		return nil, err
	}
	ch := &EgressChange{Box: box, Policy: EgressOpen}
	id := ""
	if names != nil {
		if names, err = NormalizeNames(names); err != nil {
			return nil, err
		}
		id = PolicyID(names)
		ch.Policy, ch.Names = id, names
		if ch.NewPolicy, ch.ResolverDown, err = host.ensurePolicy(ctx, id, names); err != nil {
			return nil, fmt.Errorf("egress of %s: %w", box, err)
		}
	}
	if inst.Config[KeyEgress] != id {
		put := inst.Writable()
		put.Config = maps.Clone(put.Config)
		if id == "" {
			delete(put.Config, KeyEgress)
			delete(put.Config, KeyEgressNames)
		} else {
			put.Config[KeyEgress] = id
			put.Config[KeyEgressNames] = strings.Join(names, ",")
		}
		if err := host.Incus.UpdateInstance(ctx, box, put, etag); err != nil {
			return nil, fmt.Errorf("egress of %s: %w", box, err)
		}
	}
	if _, err := host.refreshPorts(ctx); err != nil {
		return nil, fmt.Errorf("egress of %s: %w", box, err)
	}
	return ch, nil
}

// ensurePolicy stores a policy on the bridge (its sets and rule first, so
// dnsmasq finds them) and waits for the restarted resolver to answer.
func (host *Host) ensurePolicy(ctx context.Context, id string, names []string) (bool, time.Duration, error) {
	n, etag, err := host.Incus.Network(ctx, Current.Network)
	if err != nil {
		return false, 0, err
	}
	if have, ok := policiesOf(n.Config)[id]; ok && slices.Equal(have, names) {
		return false, 0, nil
	}
	if host.Tier {
		return false, 0, fmt.Errorf("the allowlist %v is not on this host yet, and only its admin can add one (box egress BOX allow %s, as root, on any box)", names, strings.Join(names, " "))
	}
	f, err := host.readFleet(ctx)
	if err != nil {
		return false, 0, err
	}
	policies := policiesOf(n.Config)
	policies[id] = names
	g, err := host.ground()
	if err != nil {
		return false, 0, err
	}
	defer g.close()
	ps, _ := egressPlanOf(Current.Network, policies, f.insts, f.leases)
	if _, err := nft.ApplyEgress(g.nftConfig(Current), ps); err != nil {
		return false, 0, fmt.Errorf("adding the policy's sets: %w", err)
	}
	cfg := maps.Clone(n.Config)
	cfg[keyEgressPolicy+id] = strings.Join(names, ",")
	p, err := netip.ParsePrefix(n.Config["ipv4.address"])
	if err != nil {
		return false, 0, fmt.Errorf("%s has ipv4.address=%q: run box doctor", Current.Network, n.Config["ipv4.address"])
	}
	// Only the nftset lines change: the rest of the settings stay as they
	// are (a converge, not this, puts drift right).
	cfg["raw.dnsmasq"] = dnsmasqJoin(withoutNftset(n.Config["raw.dnsmasq"]), nftsetLines(policies, g.nftConfig(Current).EgressTable()))
	before := g.dnsmasqFor(Current.Network)
	t0 := time.Now()
	if err := host.Incus.UpdateNetwork(ctx, Current.Network, incus.NetworkPut{Description: n.Description, Config: cfg}, etag); err != nil {
		return false, 0, fmt.Errorf("storing the policy on %s: %w", Current.Network, err)
	}
	if err := host.waitResolver(ctx, g, before, p.Addr()); err != nil {
		return true, 0, err
	}
	return true, time.Since(t0), nil
}

// waitResolver waits until a dnsmasq other than the one with PID before
// serves the bridge and answers a question on the gateway: changing the
// bridge's dnsmasq settings restarts it (SPEC 7b).
func (host *Host) waitResolver(ctx context.Context, g *ground, before int, gw netip.Addr) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		if pid := g.dnsmasqFor(Current.Network); pid != 0 && pid != before && host.resolverAnswers(gw) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the bridge's resolver did not come back within 30 s after its settings changed: box doctor")
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// resolverAnswers asks the bridge's resolver, from the host's namespace,
// for a name nobody has: any answer means it is serving.
func (host *Host) resolverAnswers(gw netip.Addr) bool {
	ok := false
	_ = nsrun.Do(host.NetNS, func() error {
		m := new(dns.Msg)
		m.SetQuestion("box-resolver-check.invalid.", dns.TypeA)
		c := &dns.Client{Timeout: 200 * time.Millisecond}
		_, _, err := c.Exchange(m, netip.AddrPortFrom(gw, 53).String())
		ok = err == nil
		return nil
	})
	return ok
}

// EgressState is a box's policy as it stands.
type EgressState struct {
	Box     string
	Policy  string // the id, or EgressOpen
	Names   []string
	Allowed []netip.Addr
}

// Egress reads a box's policy and what its allow set holds now.
func (host *Host) Egress(ctx context.Context, box string) (*EgressState, error) {
	inst, _, err := host.resolve(ctx, box)
	if err != nil {
		return nil, err
	}
	st := &EgressState{Box: box, Policy: EgressOpen}
	id := inst.Config[KeyEgress]
	if id == "" {
		return st, nil
	}
	st.Policy = id
	n, _, err := host.Incus.Network(ctx, Current.Network)
	if err != nil {
		return nil, err
	}
	st.Names = policiesOf(n.Config)[id]
	if host.Tier {
		return st, nil // the kernel's sets are the admin's to read
	}
	g, err := host.ground()
	if err != nil {
		return nil, err
	}
	defer g.close()
	if st.Allowed, err = nft.EgressAllowed(g.nftConfig(Current), id); err != nil {
		return nil, err
	}
	return st, nil
}

// usedPolicies keeps the policies some instance names: the others go at
// the next converge (their dnsmasq lines and sets with them; that restarts
// the bridge's resolver, which is why a box leaving a policy does not do
// it at once).
func (host *Host) usedPolicies(ctx context.Context, policies map[string][]string) (map[string][]string, error) {
	if len(policies) == 0 {
		return policies, nil
	}
	insts, err := host.Incus.AllInstances(ctx)
	if err != nil {
		return nil, err
	}
	used := map[string][]string{}
	for i := range insts {
		if id := insts[i].Config[KeyEgress]; policies[id] != nil {
			used[id] = policies[id]
		}
	}
	return used, nil
}

// unusedPolicyKeys names the stored policies a converge drops.
func unusedPolicyKeys(live, want map[string]string) []string {
	var out []string
	for _, k := range slices.Sorted(maps.Keys(live)) {
		if _, ok := want[k]; !ok && strings.HasPrefix(k, keyEgressPolicy) {
			out = append(out, k+" (no box names it)")
		}
	}
	return out
}
