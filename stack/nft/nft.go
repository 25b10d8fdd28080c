package nft

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"
)

// Finding is one way the live tables differ from the desired ones. Object
// always starts with "table <family> <name>".
type Finding struct {
	Object  string `json:"object"`
	Problem string `json:"problem"`
}

func (f Finding) String() string { return f.Object + ": " + f.Problem }

// ErrNotApplied is returned by SetPorts when the bridge table does not exist.
var ErrNotApplied = errors.New("table not present: apply the ruleset first")

// dial opens one nftables connection for a whole operation, in cfg's
// namespace.
func dial(cfg Config) (*nftables.Conn, func(), error) {
	opts := []nftables.ConnOption{nftables.AsLasting()}
	if cfg.NetNS > 0 {
		opts = append(opts, nftables.WithNetNSFd(cfg.NetNS))
	}
	opts = append(opts, cfg.connOpts...)
	c, err := nftables.New(opts...)
	if err != nil {
		return nil, nil, fmt.Errorf("opening nftables netlink socket: %w", err)
	}
	return c, func() { _ = c.CloseLasting() }, nil
}

// Probe finds out whether the kernel can match bridge names (meta
// ibrname/obrname) in cfg's namespace. It adds the rule to a throwaway
// table and deletes that table in the same batch: the kernel validates the
// rule, then either rejects the whole batch or commits a net change of
// nothing, so no packet ever meets the probe.
func Probe(cfg Config) (Capabilities, error) {
	cfg, err := cfg.normalized()
	if err != nil {
		return Capabilities{}, err
	}
	c, done, err := dial(cfg)
	if err != nil {
		return Capabilities{}, err
	}
	defer done()

	t := &nftables.Table{Family: nftables.TableFamilyBridge, Name: cfg.Table + "_probe"}
	// CreateTable fails on an existing table instead of adopting it, so the
	// delete below can only ever remove the probe's own table.
	c.CreateTable(t)
	ch := c.AddChain(&nftables.Chain{Name: "forward", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: hookNum("forward"), Priority: nftables.ChainPriorityRef(nftables.ChainPriority(priorityFilter("bridge"))),
		Policy: policyOf("accept")})
	c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: rule(drop(), ibrname(cfg.Bridge), obrname(cfg.Bridge)).Exprs})
	c.DelTable(t)
	err = c.Flush()
	switch {
	case err == nil:
		return Capabilities{BridgeMeta: true, Detail: "meta ibrname/obrname accepted in a bridge table"}, nil
	case errors.Is(err, unix.EOPNOTSUPP):
		return Capabilities{Detail: "meta ibrname/obrname not supported by this kernel (operation not supported: no CONFIG_NFT_BRIDGE_META)"}, nil
	case errors.Is(err, unix.EEXIST):
		return Capabilities{}, fmt.Errorf("probing bridge meta: a table bridge %s already exists; remove it", t.Name)
	default:
		return Capabilities{}, fmt.Errorf("probing bridge meta: %w", err)
	}
}

// Present reports which of the two tables exist.
func Present(cfg Config) (inet bool, bridge bool, err error) {
	cfg, err = cfg.normalized()
	if err != nil {
		return false, false, err
	}
	c, done, err := dial(cfg)
	if err != nil {
		return false, false, err
	}
	defer done()
	if inet, err = tableExists(c, nftables.TableFamilyINet, cfg.Table); err != nil {
		return false, false, err
	}
	if bridge, err = tableExists(c, nftables.TableFamilyBridge, cfg.Table); err != nil {
		return false, false, err
	}
	return inet, bridge, nil
}

// tableExists lists the family's tables rather than asking for the one by
// name, so "missing" is an empty answer and not an error to interpret.
func tableExists(c *nftables.Conn, fam nftables.TableFamily, name string) (bool, error) {
	ts, err := c.ListTablesOfFamily(fam)
	if err != nil {
		return false, fmt.Errorf("listing tables: %w", err)
	}
	return slices.ContainsFunc(ts, func(t *nftables.Table) bool { return t.Name == name && t.Family == fam }), nil
}

// Verify compares the live tables with the desired ones; no findings means
// they match, the port set included.
func Verify(cfg Config, caps Capabilities, ports []string) ([]Finding, error) {
	cfg, err := checkRules(cfg, ports)
	if err != nil {
		return nil, err
	}
	c, done, err := dial(cfg)
	if err != nil {
		return nil, err
	}
	defer done()
	diffs, err := diffAll(c, cfg, caps, ports)
	if err != nil {
		return nil, err
	}
	var out []Finding
	for _, d := range diffs {
		out = append(out, d.diff.findings...)
	}
	return out, nil
}

type tableState struct {
	want Table
	diff tableDiff
}

// checkArgs normalises cfg and refuses port names the kernel would.
func checkArgs(cfg Config, ports []string) (Config, error) {
	cfg, err := cfg.normalized()
	if err != nil {
		return cfg, err
	}

	for _, p := range ports {
		if err := checkIfname(p); err != nil {
			return cfg, fmt.Errorf("bridge port: %w", err)
		}
	}
	return cfg, nil
}

// checkRules is checkArgs for the calls that render the rules, which need
// the gateway address.
func checkRules(cfg Config, ports []string) (Config, error) {
	cfg, err := checkArgs(cfg, ports)
	if err == nil && !cfg.Gateway.Is4() {
		err = fmt.Errorf("the rules for bridge %s need its IPv4 gateway address (got %v)", cfg.Bridge, cfg.Gateway)
	}
	return cfg, err
}

func diffAll(c *nftables.Conn, cfg Config, caps Capabilities, ports []string) ([]tableState, error) {
	var out []tableState
	for _, t := range Desired(cfg, caps).Tables {
		live, err := readTable(c, t.Family, t.Name)
		if err != nil {
			return nil, fmt.Errorf("reading table %s %s: %w", t.Family, t.Name, err)
		}
		out = append(out, tableState{want: t, diff: diffTable(t, live, ports)})
	}
	return out, nil
}

// Apply converges the live tables to the desired ones and returns what it
// changed; when they already match it sends nothing. Every change goes in
// one batch, which the kernel applies whole or not at all. Only the two
// tables of cfg are touched.
func Apply(cfg Config, caps Capabilities, ports []string) ([]string, error) {
	cfg, err := checkRules(cfg, ports)
	if err != nil {
		return nil, err
	}
	c, done, err := dial(cfg)
	if err != nil {
		return nil, err
	}
	defer done()
	states, err := diffAll(c, cfg, caps, ports)
	if err != nil {
		return nil, err
	}

	var changes []string
	for _, st := range states {
		changes = append(changes, plan(c, st.want, st.diff, ports)...)
	}
	if len(changes) == 0 {
		return nil, nil
	}
	if err := c.Flush(); err != nil {
		return nil, fmt.Errorf("applying tables inet and bridge %s (nothing changed; planned: %s): %w", cfg.Table, strings.Join(changes, "; "), err)
	}
	return changes, nil
}

// plan queues the messages that turn the live table into want.
func plan(c *nftables.Conn, want Table, d tableDiff, ports []string) []string {
	tobj := "table " + want.Family + " " + want.Name
	switch {
	case d.clean():
		return nil
	case d.missing:
		addTable(c, want, ports)
		return []string{"created " + tobj}
	case len(d.rebuild) > 0:
		// Hooks and sets cannot be changed in place while rules use them;
		// replacing the whole table in the batch is atomic. The leading add
		// keeps the delete valid even if the table vanished since it was read.
		t := &nftables.Table{Family: familyOf(want.Family), Name: want.Name}
		c.AddTable(t)
		c.DelTable(t)
		addTable(c, want, ports)
		return []string{"replaced " + tobj + " (" + strings.Join(d.rebuild, "; ") + ")"}
	}
	var changes []string
	t := &nftables.Table{Family: familyOf(want.Family), Name: want.Name}
	for _, f := range d.chainRules {
		ch := chainOf(t, f.chain)
		c.FlushChain(ch)
		for _, r := range f.chain.Rules {
			c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: r.Exprs})
		}
		changes = append(changes, fmt.Sprintf("replaced the rules of chain %s %s %s (%s)", want.Family, want.Name, f.chain.Name, f.reason))
	}
	if len(d.addPorts)+len(d.delPorts) > 0 {
		for _, s := range want.Sets {
			if msg := updatePorts(c, t, s.Name, d.addPorts, d.delPorts); msg != "" {
				changes = append(changes, msg)
			}
		}
	}
	return changes
}

func chainOf(t *nftables.Table, c Chain) *nftables.Chain {
	return &nftables.Chain{Name: c.Name, Table: t, Type: nftables.ChainType(c.Type),
		Hooknum: hookNum(c.Hook), Priority: nftables.ChainPriorityRef(nftables.ChainPriority(c.Priority)),
		Policy: policyOf(c.Policy)}
}

// addTable queues want as a new table, its sets filled with ports.
func addTable(c *nftables.Conn, want Table, ports []string) {
	t := c.AddTable(&nftables.Table{Family: familyOf(want.Family), Name: want.Name})
	for _, s := range want.Sets {
		// AddSet only fails for anonymous sets, which these are not.
		_ = c.AddSet(portSet(t, s.Name, portSetID), elements(normPorts(ports)))
	}
	for _, wc := range want.Chains {
		ch := c.AddChain(chainOf(t, wc))
		for _, r := range wc.Rules {
			c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: r.Exprs})
		}
	}
}

func portSet(t *nftables.Table, name string, id uint32) *nftables.Set {
	return &nftables.Set{Table: t, Name: name, ID: id, KeyType: nftables.TypeIFName}
}

func elements(names []string) []nftables.SetElement {
	out := make([]nftables.SetElement, len(names))
	for i, n := range names {
		out[i] = nftables.SetElement{Key: ifnameBytes(n)}
	}
	return out
}

// updatePorts queues adding and removing set elements and describes it.
func updatePorts(c *nftables.Conn, t *nftables.Table, set string, add, del []string) string {
	// The set exists already: it is referenced by name, id 0.
	s := portSet(t, set, 0)
	var what []string
	if len(add) > 0 {
		_ = c.SetAddElements(s, elements(add))
		what = append(what, "added ports "+strings.Join(add, ", "))
	}
	if len(del) > 0 {
		_ = c.SetDeleteElements(s, elements(del))
		what = append(what, "removed ports "+strings.Join(del, ", "))
	}
	if len(what) == 0 {
		return ""
	}
	return fmt.Sprintf("updated set %s in table %s %s: %s", set, familyName(t.Family), t.Name, strings.Join(what, "; "))
}

// familyName is nft's name for a table family.
func familyName(f nftables.TableFamily) string {
	switch f {
	case nftables.TableFamilyINet:
		return "inet"
	case nftables.TableFamilyBridge:
		return "bridge"
	case nftables.TableFamilyIPv4:
		return "ip"
	case nftables.TableFamilyIPv6:
		return "ip6"
	case nftables.TableFamilyARP:
		return "arp"
	case nftables.TableFamilyNetdev:
		return "netdev"
	}
	return fmt.Sprintf("family%d", f)
}

// SetPorts makes the port set hold exactly ports and reports whether it
// changed anything. Without a port set (bridge-meta mode) it does nothing.
// It returns ErrNotApplied when the bridge table is missing altogether.
func SetPorts(cfg Config, ports []string) (bool, error) {
	ch, err := SyncPorts(cfg, ports)
	return len(ch.Added)+len(ch.Removed) > 0, err
}

// PortsChange is what SyncPorts did to the port set.
type PortsChange struct {
	Added, Removed []string
	// AddedAt is when the additions were committed: from then on the
	// bridge drop covers the added ports.
	AddedAt time.Time
}

// SyncPorts is SetPorts saying what it added to the port set and what it
// removed from it. Additions are committed first, in a batch of their own:
// measured here, a batch that removes an element takes 10 to 20 ms to
// commit and one that only adds takes under 0.3 ms, and a port just
// plugged in must not wait for a stale name to go.
func SyncPorts(cfg Config, ports []string) (PortsChange, error) {
	var ch PortsChange
	cfg, err := checkArgs(cfg, ports)
	if err != nil {
		return ch, err
	}
	c, done, err := dial(cfg)
	if err != nil {
		return ch, err
	}
	defer done()
	live, err := readTable(c, "bridge", cfg.Table)
	if err != nil {
		return ch, fmt.Errorf("reading table bridge %s: %w", cfg.Table, err)
	}
	if !live.exists {
		return ch, fmt.Errorf("setting ports of table bridge %s: %w", cfg.Table, ErrNotApplied)
	}
	name := cfg.PortSet()
	if !slices.ContainsFunc(live.sets, func(s *nftables.Set) bool { return s.Name == name }) {
		return ch, nil
	}
	want := normPorts(ports)
	add, del := without(want, live.elems[name]), without(live.elems[name], want)
	t := &nftables.Table{Family: nftables.TableFamilyBridge, Name: cfg.Table}
	if updatePorts(c, t, name, add, nil) != "" {
		if err := c.Flush(); err != nil {
			return ch, fmt.Errorf("adding ports to set %s in table bridge %s: %w", name, cfg.Table, err)
		}
		ch.Added, ch.AddedAt = add, time.Now()
	}
	if updatePorts(c, t, name, nil, del) != "" {
		if err := c.Flush(); err != nil {
			return ch, fmt.Errorf("removing ports from set %s in table bridge %s: %w", name, cfg.Table, err)
		}
		ch.Removed = del
	}
	return ch, nil
}

// Delete removes both tables if present and names what it removed; when
// neither exists it sends nothing.
func Delete(cfg Config) ([]string, error) {
	cfg, err := cfg.normalized()
	if err != nil {
		return nil, err
	}
	c, done, err := dial(cfg)
	if err != nil {
		return nil, err
	}
	defer done()
	var removed []string
	for _, fam := range []nftables.TableFamily{nftables.TableFamilyINet, nftables.TableFamilyBridge} {
		ok, err := tableExists(c, fam, cfg.Table)
		if err != nil {
			return nil, err
		}
		if ok {
			c.DelTable(&nftables.Table{Family: fam, Name: cfg.Table})
			removed = append(removed, "table "+familyName(fam)+" "+cfg.Table)
		}
	}
	if len(removed) == 0 {
		return nil, nil
	}
	if err := c.Flush(); err != nil {
		return nil, fmt.Errorf("deleting %s: %w", strings.Join(removed, ", "), err)
	}
	return removed, nil
}
