package nft

import (
	"fmt"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
)

// L-ROUTE, table inet box_route, chain forward (hook forward, priority
// filter, policy accept): a box's forwarded traffic (iifname the bridge)
// may leave only by an interface in the set uplinks, the interfaces of the
// host's default routes, which the caller keeps current from the kernel's
// route events (SetUplinks). Whatever the host routes any other way (a LAN
// router's prefixes, a VPN's split routes, another bridge, a cluster's
// own network) is dropped, private or not: the ACL drops only the private
// ranges. Replies (ct state established,related) pass, so a connection
// opened into a box from outside (an exposed port) is answered by the way
// it came. An empty set drops every new connection a box opens: with no
// default route there is no internet to reach.
//
// It is a table of its own so that it can be removed apart from the host
// firewall (the drill's route mutation does).

// RouteTable names the route table (inet family): Table + "_route".
func (c Config) RouteTable() string { return cmpOr(c.Table, DefaultTable) + "_route" }

// UplinkSet is the route table's set of the default routes' interfaces.
const UplinkSet = "uplinks"

// uplinkSetID is the set's batch-local id when it is created with its rule.
const uplinkSetID = 20

// DesiredRoute returns the route table for cfg, its set holding uplinks.
func DesiredRoute(cfg Config, uplinks []string) (Ruleset, error) {
	cfg, err := cfg.normalized()
	if err != nil {
		return Ruleset{}, err
	}
	for _, u := range uplinks {
		if err := checkIfname(u); err != nil {
			return Ruleset{}, fmt.Errorf("uplink: %w", err)
		}
		if u == cfg.Bridge {
			return Ruleset{}, fmt.Errorf("uplink %s is the bridge itself", u)
		}
	}
	return Ruleset{Tables: []Table{routeTable(cfg, uplinks)}}, nil
}

func routeTable(cfg Config, uplinks []string) Table {
	br := cfg.Bridge
	notUplink := part{fmt.Sprintf("oifname != @%s", UplinkSet), []expr.Any{
		&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1},
		&expr.Lookup{SourceRegister: 1, SetName: UplinkSet, SetID: uplinkSetID, Invert: true},
	}}
	return Table{Family: "inet", Name: cfg.RouteTable(),
		Sets: []Set{{Name: UplinkSet, Type: "ifname", Elements: normPorts(uplinks), id: uplinkSetID}},
		Chains: []Chain{{
			Name: "forward", Type: "filter", Hook: "forward", Priority: priorityFilter("inet"), Policy: "accept",
			Rules: []Rule{
				rule(accept(), iifname(br), ctStateEstablishedRelated()),
				rule(drop(), iifname(br), notUplink),
			},
		}},
	}
}

// ApplyRoute converges the route table to DesiredRoute in one batch and
// says what it changed.
func ApplyRoute(cfg Config, uplinks []string) ([]string, error) {
	r, err := DesiredRoute(cfg, uplinks)
	if err != nil {
		return nil, err
	}
	cfg, _ = cfg.normalized()
	return converge(cfg, r.Tables)
}

// VerifyRoute compares the live route table with DesiredRoute; no findings
// means they match, the set's elements included.
func VerifyRoute(cfg Config, uplinks []string) ([]Finding, error) {
	r, err := DesiredRoute(cfg, uplinks)
	if err != nil {
		return nil, err
	}
	cfg, _ = cfg.normalized()
	return verifyTables(cfg, r.Tables)
}

// RoutePresent reports whether the route table exists.
func RoutePresent(cfg Config) (bool, error) { return tablePresent(cfg, "inet", cfg.RouteTable()) }

// DeleteRoute removes the route table and reports whether it was there.
func DeleteRoute(cfg Config) (bool, error) { return deleteTable(cfg, "inet", cfg.RouteTable()) }

// SetUplinks makes the uplink set hold exactly uplinks, adding before
// removing in one batch (the kernel switches at once), and says what it
// changed. It returns ErrNotApplied when the table is missing (ApplyRoute
// makes it; the watcher only keeps its set) and an error when its shape
// needs ApplyRoute.
func SetUplinks(cfg Config, uplinks []string) (string, error) {
	r, err := DesiredRoute(cfg, uplinks)
	if err != nil {
		return "", err
	}
	cfg, _ = cfg.normalized()
	c, done, err := dial(cfg)
	if err != nil {
		return "", err
	}
	defer done()
	name := cfg.RouteTable()
	live, err := readTable(c, "inet", name)
	if err != nil {
		return "", fmt.Errorf("reading table inet %s: %w", name, err)
	}
	if !live.exists {
		return "", fmt.Errorf("setting uplinks in table inet %s: %w", name, ErrNotApplied)
	}
	d := diffTable(r.Tables[0], live)
	if len(d.rebuild) > 0 {
		return "", fmt.Errorf("table inet %s is not as ApplyRoute leaves it (%s): apply it again", name, strings.Join(d.rebuild, "; "))
	}
	t := &nftables.Table{Family: nftables.TableFamilyINet, Name: name}
	var changes []string
	for _, f := range d.elemFixes {
		if msg := updateSet(c, t, f); msg != "" {
			changes = append(changes, msg)
		}
	}
	if len(changes) == 0 {
		return "", nil
	}
	if err := c.Flush(); err != nil {
		return "", fmt.Errorf("updating uplinks (nothing changed; planned: %s): %w", strings.Join(changes, "; "), err)
	}
	return strings.Join(changes, "; "), nil
}
