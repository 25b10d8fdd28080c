package nft

import (
	"fmt"
	"slices"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
)

// Blocker is another table's forward base chain whose policy drops: a
// packet any base chain drops is dropped, so it drops the boxes' egress
// (forwarded from the bridge to the uplink) whatever our tables say.
type Blocker struct {
	Family string `json:"family"`
	Table  string `json:"table"`
	Chain  string `json:"chain"`
	// Owner is who set it, when the table says: "docker" (a DOCKER-USER
	// chain beside it), "ufw" (ufw-* chains) or "".
	Owner string `json:"owner"`
}

func (b Blocker) String() string {
	s := fmt.Sprintf("table %s %s chain %s (policy drop)", b.Family, b.Table, b.Chain)
	if b.Owner != "" {
		s += " set by " + b.Owner
	}
	return s
}

// ForwardBlockers lists the forward base chains with a drop policy in
// tables other than ours, in the namespace netNS (0 or less: this one),
// unless the table already accepts the bridge's traffic somewhere (a rule
// naming the bridge with an accept verdict, as `iptables -I DOCKER-USER -i
// boxnet -j ACCEPT` or `ufw route allow in on boxnet` leave).
func ForwardBlockers(netNS int, ours, bridge string) ([]Blocker, error) {
	c, done, err := dial(Config{NetNS: netNS})
	if err != nil {
		return nil, err
	}
	defer done()
	chains, err := c.ListChains()
	if err != nil {
		return nil, fmt.Errorf("listing chains: %w", err)
	}
	byTable := map[string][]string{}
	for _, ch := range chains {
		k := familyName(ch.Table.Family) + " " + ch.Table.Name
		byTable[k] = append(byTable[k], ch.Name)
	}
	var out []Blocker
	for _, ch := range chains {
		if ch.Table.Name == ours || ch.Hooknum == nil || *ch.Hooknum != *nftables.ChainHookForward ||
			ch.Policy == nil || *ch.Policy != nftables.ChainPolicyDrop {
			continue
		}
		if ok, err := acceptsBridge(c, ch.Table, chains, bridge); err != nil {
			return nil, err
		} else if ok {
			continue
		}
		fam := familyName(ch.Table.Family)
		if fam != "ip" && fam != "ip6" && fam != "inet" {
			continue // a bridge-family forward chain sees bridged frames, not routed egress
		}
		b := Blocker{Family: fam, Table: ch.Table.Name, Chain: ch.Name}
		siblings := byTable[fam+" "+ch.Table.Name]
		switch {
		case slices.Contains(siblings, "DOCKER-USER"):
			b.Owner = "docker"
		case slices.ContainsFunc(siblings, func(n string) bool { return strings.HasPrefix(n, "ufw-") }):
			b.Owner = "ufw"
		}
		out = append(out, b)
	}
	return out, nil
}

// acceptsBridge reports whether any chain of the table has a rule that
// compares against the bridge's name and accepts.
func acceptsBridge(c *nftables.Conn, t *nftables.Table, chains []*nftables.Chain, bridge string) (bool, error) {
	for _, ch := range chains {
		if ch.Table.Name != t.Name || ch.Table.Family != t.Family {
			continue
		}
		rules, err := c.GetRules(t, ch)
		if err != nil {
			return false, fmt.Errorf("reading rules of %s %s: %w", t.Name, ch.Name, err)
		}
		for _, r := range rules {
			names, accepts := false, false
			for _, e := range r.Exprs {
				switch e := e.(type) {
				case *expr.Cmp:
					if strings.TrimRight(string(e.Data), "\x00") == bridge {
						names = true
					}
				case *expr.Verdict:
					if e.Kind == expr.VerdictAccept {
						accepts = true
					}
				}
			}
			if names && accepts {
				return true, nil
			}
		}
	}
	return false, nil
}
