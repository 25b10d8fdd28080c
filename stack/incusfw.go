package stack

import (
	"context"
	"fmt"
	"maps"
	"strings"

	"github.com/box-isolation/box/stack/hostns"
	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/model"
	"github.com/box-isolation/box/stack/nft"
)

// Incus's own firewall. L-ACL and L-NAT are Incus config, but what the
// kernel enforces for them is the chains Incus's nftables driver writes
// into its table inet incus when it sets the bridge up. Another tool's
// `flush ruleset` removes them and Incus never notices, so Verify reads
// them and Ensure makes Incus write them again (docs/heal.md).

// incusChain is one chain Incus writes for the stack's bridge: its name,
// the layer it carries, and the fewest rules it holds when whole.
type incusChain struct {
	name     string
	layer    model.LayerID
	minRules int
	why      string
}

// wantIncusChains lists the chains Incus should have written for d's
// network, as Incus 6.0's NetworkSetup names them (<chain>.<network>): the
// ACL's four when the network has an ACL, the NAT's postrouting chain when
// ipv4.nat is on. Incus's accept-only chains (fwd, in, out) carry no layer
// of the stack and are not required.
func wantIncusChains(d model.Desired) []incusChain {
	br, cfg := d.Network.Name, d.Network.Config
	var out []incusChain
	if acls := cfg["security.acls"]; acls != "" {
		// The ACL's own chain holds at least one rule per ACL rule.
		out = append(out,
			incusChain{"acl." + br, model.LayerACL, len(d.ACL.Egress) + len(d.ACL.Ingress), "the rules of ACL " + acls},
			incusChain{"aclin." + br, model.LayerACL, 1, "the input hook into ACL " + acls},
			incusChain{"aclout." + br, model.LayerACL, 1, "the output hook into ACL " + acls},
			incusChain{"aclfwd." + br, model.LayerACL, 2, "the forward hook into ACL " + acls + " (both directions)"})
	}
	if cfg["ipv4.nat"] == "true" {
		out = append(out, incusChain{"pstrt." + br, model.LayerNAT, 1, "ipv4.nat's masquerade"})
	}
	return out
}

// IncusChainFindings compares what the kernel holds in inet incus with what
// Incus should have written for d.
func IncusChainFindings(d model.Desired, chains map[string]int, present bool) []model.Finding {
	var out []model.Finding
	for _, w := range wantIncusChains(d) {
		obj := "nft chain inet " + nft.IncusTable + " " + w.name
		n, ok := chains[w.name]
		var problem string
		switch {
		case !present:
			problem = fmt.Sprintf("missing: the whole table inet %s is gone from the kernel (a flush ruleset or nft delete table by another tool), so nothing enforces %s", nft.IncusTable, w.why)
		case !ok:
			problem = fmt.Sprintf("missing from the kernel, so nothing enforces %s", w.why)
		case n < w.minRules:
			problem = fmt.Sprintf("holds %d rules, Incus writes at least %d for %s", n, w.minRules, w.why)
		default:
			continue
		}
		out = append(out, model.Finding{Layer: w.layer, Object: obj, Problem: problem, Fix: model.FixEnsure + " (it makes Incus set " + d.Network.Name + " up again, which rewrites its chains)"})
	}
	return out
}

// IncusUsesNft says whether Incus's firewall driver is nftables (the driver
// Incus picks unless the host has iptables rules of its own), and which
// driver it is otherwise.
func IncusUsesNft(ctx context.Context, c *incus.Client) (bool, string, error) {
	srv, err := c.Server(ctx)
	if err != nil {
		return false, "", fmt.Errorf("reading Incus's firewall driver: %w", err)
	}
	fw := srv.Environment.Firewall
	return fw == "nftables", fw, nil
}

// verifyIncusChains reads inet incus in g's namespace into v.
func verifyIncusChains(ctx context.Context, c *incus.Client, g *hostns.NS, d model.Desired, v *Verification) error {
	if ok, fw, err := IncusUsesNft(ctx, c); err != nil {
		return err
	} else if !ok {
		v.Notes = append(v.Notes, fmt.Sprintf("Incus's firewall driver is %q, not nftables: its ACL and NAT rules are not read from the kernel here (Verify reads inet %s only)", fw, nft.IncusTable))
		return nil
	}
	chains, present, err := nft.IncusChains(g.NFTConfig(model.Current))
	if err != nil {
		return fmt.Errorf("reading Incus's firewall: %w", err)
	}
	v.Findings = append(v.Findings, IncusChainFindings(d, chains, present)...)
	return nil
}

// firewallKey is the bridge key whose spelling ReapplyIncusFirewall flips.
const firewallKey = "ipv4.firewall"

// sameMeaning gives another spelling of an ipv4.firewall value that Incus
// reads the same way: unset and "true" both mean on, "false" and "off" off.
func sameMeaning(v string) string {
	switch strings.ToLower(v) {
	case "", "true":
		if v == "" {
			return "true"
		}
		return ""
	case "false":
		return "off"
	default:
		return "false"
	}
}

// ReapplyIncusFirewall makes Incus rewrite its chains for the stack's
// bridge. Incus sets a bridge up again (and so rewrites inet incus) only on
// an update that changes a key outside user.* (Incus 6.0's configChanged),
// so this flips ipv4.firewall between two spellings of the same value: one
// update, one setup. The setup also restarts the bridge's dnsmasq (its
// leases are on disk). It returns what it changed.
func ReapplyIncusFirewall(ctx context.Context, c *incus.Client) (string, error) {
	name := model.Current.Network
	net, etag, err := c.Networks().Get(ctx, name)
	if err != nil {
		return "", fmt.Errorf("re-applying Incus's firewall: %w", err)
	}
	cfg := maps.Clone(net.Config)
	if cfg == nil {
		cfg = map[string]string{}
	}
	old := cfg[firewallKey]
	if next := sameMeaning(old); next == "" {
		delete(cfg, firewallKey)
	} else {
		cfg[firewallKey] = next
	}
	put := incus.NetworkPut{Description: net.Description, Config: cfg}
	if err := c.Networks().Update(ctx, name, put, etag); err != nil {
		return "", fmt.Errorf("re-applying Incus's firewall (network %s %s %q -> %q): %w", name, firewallKey, old, cfg[firewallKey], err)
	}
	return fmt.Sprintf("%s %s %s -> %s: Incus set the bridge up again and rewrote table inet %s", name, firewallKey, spelled(old), spelled(cfg[firewallKey]), nft.IncusTable), nil
}

func spelled(v string) string {
	if v == "" {
		return "unset"
	}
	return fmt.Sprintf("%q", v)
}

// ensureIncusFirewall has Incus rewrite its chains when the kernel lacks
// any the stack needs, and checks that it did.
func ensureIncusFirewall(ctx context.Context, c *incus.Client, g *hostns.NS, d model.Desired, rep *Report) error {
	if ok, _, err := IncusUsesNft(ctx, c); err != nil || !ok {
		return err
	}
	cfg := g.NFTConfig(model.Current)
	chains, present, err := nft.IncusChains(cfg)
	if err != nil {
		return fmt.Errorf("reading Incus's firewall: %w", err)
	}
	if len(IncusChainFindings(d, chains, present)) == 0 {
		return nil
	}
	detail, err := ReapplyIncusFirewall(ctx, c)
	if err != nil {
		return err
	}
	rep.Changes = append(rep.Changes, model.Change{Object: "nft table inet " + nft.IncusTable, Action: "updated", Detail: detail})
	if chains, present, err = nft.IncusChains(cfg); err != nil {
		return fmt.Errorf("reading Incus's firewall: %w", err)
	}
	if fs := IncusChainFindings(d, chains, present); len(fs) > 0 {
		return fmt.Errorf("bridge %s was set up again, but Incus's firewall is still not whole (%s): read incusd's log", d.Network.Name, fs[0].Object)
	}
	return nil
}
