package stack

import (
	"context"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"slices"
	"strings"

	"github.com/box-isolation/box/stack/egress"
	"github.com/box-isolation/box/stack/hostns"
	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/model"
	"github.com/box-isolation/box/stack/nft"
)

// egressPlanOf puts each box under a policy into that policy's boxes set,
// by its NIC's stored address and the addresses leased to its MAC on the
// bridge. Every stored policy is in the plan, with or without boxes. A
// box's policy is the one box recorded for it (model.EnforcedEgress): one the
// bridge lost is put back from the record, and a box whose config names
// another is a finding. A box naming a policy neither the bridge nor a
// record has (a snapshot's, restored by hand; an import's) is held
// closed, never open: the policy is added to policies with no names (its
// resolver answers nothing, its set allows nothing), and it is a finding.
func egressPlanOf(bridge string, policies map[string][]string, recorded map[string]model.Policy, insts []incus.Instance, leases []incus.NetworkLease) ([]nft.EgressPolicy, map[netip.Addr]egress.Box, []model.Finding) {
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
	who := map[netip.Addr]egress.Box{}
	var findings []model.Finding
	for i := range insts {
		e := model.EnforcedEgress(&insts[i], recorded)
		if e.Differs {
			live := model.PolicyOf(insts[i].Config, nil).EgressString()
			rec := model.Policy{Egress: e.Names}
			findings = append(findings, model.Finding{Layer: model.LayerEgress, Object: "box " + insts[i].Name,
				Problem: fmt.Sprintf("its config says egress %s, box's record of its policy says %s (the config was changed through Incus alone: a restore, a copy or an edit); the record's is enforced", live, rec.EgressString()),
				Fix:     model.EgressCommand(insts[i].Name, e.Names) + " puts it on the box too (or box egress with the other, to change it)"})
		}
		id := e.ID
		if id == "" {
			continue
		}
		if _, ok := policies[id]; !ok && e.Recorded {
			policies[id] = e.Names
		}
		if _, ok := policies[id]; !ok {
			findings = append(findings, model.Finding{Layer: model.LayerEgress, Object: "box " + insts[i].Name,
				Problem: fmt.Sprintf("its egress policy %q is not on %s: it is held closed (no name resolves, nothing leaves) until it has one", id, bridge),
				Fix:     fmt.Sprintf("box egress %s allow NAME... (or open)", insts[i].Name)})
			if !nft.ValidPolicyID(id) {
				id = model.PolicyHeld
			}
			policies[id] = []string{}
		}
		for _, n := range model.BridgeNICs(bridge, &insts[i]) {
			var addrs []netip.Addr
			if mac, err := net.ParseMAC(n.Mac); err == nil {
				addrs = byMAC[mac.String()]
			}
			// Its stored address too: the one address its pin lets it
			// send from, leased or not (L-DHCP).
			if a, err := netip.ParseAddr(insts[i].ExpandedDevices[n.Dev]["ipv4.address"]); err == nil && !slices.Contains(addrs, a) {
				addrs = append(addrs, a)
			}
			for _, a := range addrs {
				boxes[id] = append(boxes[id], a)
				who[a] = egress.Box{Name: insts[i].Name, Project: insts[i].Project, Policy: id}
			}
		}
	}
	var out []nft.EgressPolicy
	for _, id := range slices.Sorted(maps.Keys(policies)) {
		out = append(out, nft.EgressPolicy{ID: id, Boxes: boxes[id]})
	}
	return out, who, findings
}

// egressPlan is what the egress table, its host objects and the egress
// service's state must be now.
type egressPlan struct {
	policies []nft.EgressPolicy
	state    egress.State
	findings []model.Finding
}

// egressPlan reads the stored policies and the bridge's resolver settings.
func planEgress(ctx context.Context, c *incus.Client, f Fleet) (egressPlan, error) {
	n := f.bridge
	if n == nil {
		var err error
		if n, _, err = c.Networks().Get(ctx, model.Current.Network); err != nil {
			return egressPlan{}, err
		}
	}
	names := model.PoliciesOf(n.Config)
	ps, who, fs := egressPlanOf(model.Current.Network, names, model.PoliciesRecorded(n.Config), f.insts, f.leases)
	st := egress.State{Bridge: model.Current.Network, Table: nft.Config{Table: model.Current.NFTTable}.EgressTable(),
		Upstream: model.DnsmasqServers(n.Config["raw.dnsmasq"]), Policies: names, Boxes: who}
	if p, err := netip.ParsePrefix(n.Config["ipv4.address"]); err == nil {
		st.Gateway, st.Subnet = p.Addr(), p.Masked()
	}
	return egressPlan{policies: ps, state: st, findings: fs}, nil
}

// applyEgress makes the egress table, its host objects and the egress
// service's state what the policies and their boxes are now: only boxes
// sets, and new policies' sets and rules, change (the resolver's allow
// elements stay). With no policy there is none of them.
func applyEgress(ctx context.Context, c *incus.Client, g *hostns.NS, f Fleet, boot BootFiles) ([]string, error) {
	plan, err := planEgress(ctx, c, f)
	if err != nil {
		return nil, fmt.Errorf("reading the egress policies: %w", err)
	}
	ncfg := g.NFTConfig(model.Current)
	ncfg.Gateway = plan.state.Gateway
	if err := boot.SaveFirewall(func(s *SavedFirewall) {
		if plan.state.Gateway.Is4() {
			s.Gateway = plan.state.Gateway
		}
		s.Egress = nil
		if len(plan.policies) > 0 {
			s.Egress = &nft.Egress{Policies: plan.policies, Resolvers: egress.Resolvers(plan.state.Upstream)}
		}
	}); err != nil {
		return nil, err
	}
	if len(plan.policies) == 0 {
		var changes []string
		gone, err := nft.DeleteEgress(ncfg)
		if err != nil {
			return nil, err
		}
		if gone {
			changes = append(changes, "deleted table inet "+ncfg.EgressTable()+" (no egress policy left)")
		}
		did, err := g.DeleteEgressNet()
		changes = append(changes, did...)
		if err != nil {
			return changes, err
		}
		if err := egress.RemoveState(g.Inode); err != nil {
			return changes, err
		}
		return changes, nil
	}
	changes, err := nft.Egress{Policies: plan.policies, Resolvers: egress.Resolvers(plan.state.Upstream)}.Apply(ncfg)
	if err != nil {
		return nil, fmt.Errorf("applying the egress table: %w", err)
	}
	did, err := g.EnsureEgressNet()
	changes = append(changes, did...)
	if err != nil {
		return changes, err
	}
	if err := egress.WriteState(g.Inode, plan.state); err != nil {
		return changes, err
	}
	return changes, nil
}

// verifyEgress reports how the egress table, its host objects and the
// boxes' policies differ from what they should be, and notes when no
// egress service answers for the allowlisted boxes.
func verifyEgress(ctx context.Context, c *incus.Client, g *hostns.NS, f Fleet) ([]model.Finding, []string, error) {
	out, err := verifyEgressLayer(ctx, c, g, f)
	if err != nil {
		return nil, nil, err
	}
	var notes []string
	if present, _ := nft.EgressPresent(g.NFTConfig(model.Current)); present && !egress.Serving(g.Name) {
		notes = append(notes, "no egress service answers here: every allowlisted box resolves nothing and opens nothing on ports 80 and 443 (closed, not open); box guard-and-serve runs it (the boot unit box-guard-and-serve.service runs that)")
	}
	return out, notes, nil
}

func verifyEgressLayer(ctx context.Context, c *incus.Client, g *hostns.NS, f Fleet) ([]model.Finding, error) {
	plan, err := planEgress(ctx, c, f)
	if err != nil {
		return nil, fmt.Errorf("reading the egress policies: %w", err)
	}
	out := plan.findings
	ncfg := g.NFTConfig(model.Current)
	ncfg.Gateway = plan.state.Gateway
	if len(plan.policies) == 0 {
		if present, err := nft.EgressPresent(ncfg); err != nil || !present {
			return out, err
		}
		return append(out, model.Finding{Layer: model.LayerEgress, Object: "nft table inet " + ncfg.EgressTable(), Problem: "present with no egress policy", Fix: model.FixEnsure}), nil
	}
	nf, err := nft.Egress{Policies: plan.policies, Resolvers: egress.Resolvers(plan.state.Upstream)}.Verify(ncfg)
	if err != nil {
		return nil, fmt.Errorf("reading the egress table: %w", err)
	}
	for _, f := range nf {
		out = append(out, model.Finding{Layer: model.LayerEgress, Object: "nft " + f.Object, Problem: f.Problem, Fix: model.FixEnsure})
	}
	probs, err := g.EgressNetProblems()
	if err != nil {
		return nil, err
	}
	for _, p := range probs {
		out = append(out, model.Finding{Layer: model.LayerEgress, Object: "egress routing", Problem: p, Fix: model.FixEnsure})
	}
	if p := egress.StateProblem(g.Inode, plan.state); p != "" {
		out = append(out, model.Finding{Layer: model.LayerEgress, Object: "egress service state " + egress.StatePath(g.Inode), Problem: p, Fix: model.FixEnsure})
	}
	return out, nil
}

// EnsureAllowlist stores an egress allowlist (policy id, of names) on the
// bridge, after its sets and rule are in the egress table.
func (ps *Policies) EnsureAllowlist(ctx context.Context, id string, names []string) (bool, error) {
	host := ps.host
	if !host.Tier.Granted {
		unlock, err := hostns.LockFile(ctx, hostns.PolicyLock, "the policy store")
		if err != nil {
			return false, err
		}
		defer unlock()
	}
	n, etag, err := host.Incus.Networks().Get(ctx, model.Current.Network)
	if err != nil {
		return false, err
	}
	if have, ok := model.PoliciesOf(n.Config)[id]; ok && slices.Equal(have, names) {
		return false, nil
	}
	if host.Tier.Granted {
		// Incus hides the bridge's config from a restricted project: the
		// egress service's state, which every user may read, has the
		// host's allowlists.
		if ino, err := hostns.Inode(host.NetNS); err == nil {
			if st, err := egress.ReadState(ino); err == nil && slices.Equal(st.Policies[id], names) {
				return false, nil
			}
		}
		return false, fmt.Errorf("the allowlist %v is not on this host yet, and only its admin can add one (box egress BOX allow %s, as root, on any box)", names, strings.Join(names, " "))
	}
	f, err := host.ReadFleet(ctx)
	if err != nil {
		return false, err
	}
	policies := model.PoliciesOf(n.Config)
	policies[id] = names
	g, err := host.OpenNS()
	if err != nil {
		return false, err
	}
	defer g.Close()
	plan, _, _ := egressPlanOf(model.Current.Network, policies, model.PoliciesRecorded(n.Config), f.insts, f.leases)
	ncfg := g.NFTConfig(model.Current)
	p, err := netip.ParsePrefix(n.Config["ipv4.address"])
	if err != nil {
		return false, fmt.Errorf("%s has ipv4.address=%q: run box doctor", model.Current.Network, n.Config["ipv4.address"])
	}
	ncfg.Gateway = p.Addr()
	if _, err := (nft.Egress{Policies: plan, Resolvers: egress.Resolvers(model.DnsmasqServers(n.Config["raw.dnsmasq"]))}).Apply(ncfg); err != nil {
		return false, fmt.Errorf("adding the policy's sets: %w", err)
	}
	cfg := maps.Clone(n.Config)
	cfg[model.KeyEgressPolicy+id] = strings.Join(names, ",")
	if err := host.Incus.Networks().Update(ctx, model.Current.Network, incus.NetworkPut{Description: n.Description, Config: cfg}, etag); err != nil {
		return false, fmt.Errorf("storing the policy on %s: %w", model.Current.Network, err)
	}
	return true, nil
}

// usedPolicies keeps the policies some box's enforced allowlist names
// (model.EnforcedEgress, from its record or its config), one a record names
// put back from the record: the others go at the next converge (their
// sets with them), not when their last box leaves (a box moving between
// policies and back finds its policy there).
func usedPolicies(ctx context.Context, c *incus.Client, policies map[string][]string, recorded map[string]model.Policy) (map[string][]string, error) {
	if len(policies) == 0 && len(recorded) == 0 {
		return policies, nil
	}
	insts, err := c.Instances().All(ctx)
	if err != nil {
		return nil, err
	}
	used := map[string][]string{}
	for i := range insts {
		e := model.EnforcedEgress(&insts[i], recorded)
		switch {
		case e.ID == "":
		case policies[e.ID] != nil:
			used[e.ID] = policies[e.ID]
		case e.Recorded:
			used[e.ID] = e.Names
		}
	}
	return used, nil
}
