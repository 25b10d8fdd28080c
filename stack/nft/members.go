package nft

import (
	"fmt"
	"slices"

	"github.com/google/nftables"
)

// PortSetMembers reads the bridge drop's port set as the kernel holds it.
// ok is false when there is no such set: the bridge table is missing, or it
// matches the bridge by name (bridge-meta mode) and needs none.
func PortSetMembers(cfg Config) (ports []string, ok bool, err error) {
	cfg, err = cfg.normalized()
	if err != nil {
		return nil, false, err
	}
	c, done, err := dial(cfg)
	if err != nil {
		return nil, false, err
	}
	defer done()
	live, err := readTable(c, "bridge", cfg.Table)
	if err != nil {
		return nil, false, fmt.Errorf("reading table bridge %s: %w", cfg.Table, err)
	}
	name := cfg.PortSet()
	if !live.exists || !slices.ContainsFunc(live.sets, func(s *nftables.Set) bool { return s.Name == name }) {
		return nil, false, nil
	}
	return live.elems[name], true, nil
}
