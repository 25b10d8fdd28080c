package nft

import (
	"fmt"

	"github.com/google/nftables"
)

// IncusTable is the table Incus's nftables firewall driver writes its
// per-network chains into (family inet), for every network it manages.
const IncusTable = "incus"

// IncusChains reads Incus's own table, inet incus, in cfg's namespace: each
// chain's name and how many rules it holds. present is false when the
// table is not there at all (a `flush ruleset`, a `nft delete table`).
// It only reads: the table is Incus's to write.
func IncusChains(cfg Config) (chains map[string]int, present bool, err error) {
	cfg, c, done, err := connect(cfg)
	if err != nil {
		return nil, false, err
	}
	defer done()
	ok, err := tableExists(c, nftables.TableFamilyINet, IncusTable)
	if err != nil || !ok {
		return nil, false, err
	}
	all, err := c.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		return nil, true, fmt.Errorf("listing the chains of table inet %s: %w", IncusTable, err)
	}
	chains = map[string]int{}
	for _, ch := range all {
		if ch.Table == nil || ch.Table.Name != IncusTable {
			continue
		}
		rules, err := c.GetRules(ch.Table, ch)
		if err != nil {
			return nil, true, fmt.Errorf("reading chain inet %s %s: %w", IncusTable, ch.Name, err)
		}
		chains[ch.Name] = len(rules)
	}
	return chains, true, nil
}
