package nft

import (
	"errors"
	"fmt"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"
)

// PortSetMembers reads the bridge drop's port set as the kernel holds it,
// that set alone (not its table: the census and the port benchmark ask it
// often). ok is false when there is no such set: the bridge table is
// missing, or it matches the bridge by name (bridge-meta mode) and needs
// none.
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
	name := cfg.PortSet()
	s, err := c.GetSetByName(&nftables.Table{Family: nftables.TableFamilyBridge, Name: cfg.Table}, name)
	if errors.Is(err, unix.ENOENT) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("reading set %s of table bridge %s: %w", name, cfg.Table, err)
	}
	els, err := c.GetSetElements(s)
	if err != nil {
		return nil, false, fmt.Errorf("listing elements of set %s in table bridge %s: %w", name, cfg.Table, err)
	}
	return elemTexts("ifname", els), true, nil
}
