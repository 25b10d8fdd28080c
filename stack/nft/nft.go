package nft

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"golang.org/x/sys/unix"
)

// Finding is one way the live tables differ from the desired ones. Object
// always starts with "table <family> <name>".
type Finding struct {
	Object  string `json:"object"`
	Problem string `json:"problem"`
}

func (f Finding) String() string { return f.Object + ": " + f.Problem }

// ErrNotApplied is returned by SyncPorts and SetPins when their table does
// not exist.
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
	return verifyTables(cfg, Desired(cfg, caps).WithPorts(ports).Tables)
}

// verifyTables reads each of tables from the kernel and reports how it
// differs from the desired one.
func verifyTables(cfg Config, tables []Table) ([]Finding, error) {
	c, done, err := dial(cfg)
	if err != nil {
		return nil, err
	}
	defer done()
	diffs, err := diffAll(c, tables)
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

func diffAll(c *nftables.Conn, tables []Table) ([]tableState, error) {
	var out []tableState
	for _, t := range tables {
		live, err := readTable(c, t.Family, t.Name)
		if err != nil {
			return nil, fmt.Errorf("reading table %s %s: %w", t.Family, t.Name, err)
		}
		out = append(out, tableState{want: t, diff: diffTable(t, live)})
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
	return converge(cfg, Desired(cfg, caps).WithPorts(ports).Tables)
}

// converge makes the live tables what tables say, in one batch, and says
// what it changed.
func converge(cfg Config, tables []Table) ([]string, error) {
	c, done, err := dial(cfg)
	if err != nil {
		return nil, err
	}
	defer done()
	states, err := diffAll(c, tables)
	if err != nil {
		return nil, err
	}

	var changes []string
	for _, st := range states {
		changes = append(changes, plan(c, st.want, st.diff)...)
	}
	if len(changes) == 0 {
		return nil, nil
	}
	if err := c.Flush(); err != nil {
		var names []string
		for _, t := range tables {
			names = append(names, t.Family+" "+t.Name)
		}
		return nil, fmt.Errorf("applying table %s (nothing changed; planned: %s): %w", strings.Join(names, " and "), strings.Join(changes, "; "), err)
	}
	return changes, nil
}

// plan queues the messages that turn the live table into want.
func plan(c *nftables.Conn, want Table, d tableDiff) []string {
	tobj := "table " + want.Family + " " + want.Name
	switch {
	case d.clean():
		return nil
	case d.missing:
		addTable(c, want)
		return []string{"created " + tobj}
	case len(d.rebuild) > 0:
		// Hooks and sets cannot be changed in place while rules use them;
		// replacing the whole table in the batch is atomic. The leading add
		// keeps the delete valid even if the table vanished since it was read.
		t := &nftables.Table{Family: familyOf(want.Family), Name: want.Name}
		c.AddTable(t)
		c.DelTable(t)
		addTable(c, want)
		return []string{"replaced " + tobj + " (" + strings.Join(d.rebuild, "; ") + ")"}
	}
	var changes []string
	t := &nftables.Table{Family: familyOf(want.Family), Name: want.Name}
	// New sets before the rules that look them up, old ones after the
	// rules that did are gone: one batch either way.
	for _, s := range d.addSets {
		_ = c.AddSet(nftSet(t, s, s.id), elements(s.Type, s.Elements))
		changes = append(changes, "added set "+s.Name+" to "+tobj)
	}
	for _, f := range d.chainRules {
		ch := chainOf(t, f.chain)
		c.FlushChain(ch)
		for _, r := range f.chain.Rules {
			c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: r.Exprs})
		}
		changes = append(changes, fmt.Sprintf("replaced the rules of chain %s %s %s (%s)", want.Family, want.Name, f.chain.Name, f.reason))
	}
	for _, f := range d.elemFixes {
		if msg := updateSet(c, t, f); msg != "" {
			changes = append(changes, msg)
		}
	}
	for _, name := range d.delSets {
		c.DelSet(&nftables.Set{Table: t, Name: name})
		changes = append(changes, "deleted set "+name+" from "+tobj)
	}
	return changes
}

func chainOf(t *nftables.Table, c Chain) *nftables.Chain {
	return &nftables.Chain{Name: c.Name, Table: t, Type: nftables.ChainType(c.Type),
		Hooknum: hookNum(c.Hook), Priority: nftables.ChainPriorityRef(nftables.ChainPriority(c.Priority)),
		Policy: policyOf(c.Policy)}
}

// addTable queues want as a new table, its sets filled.
func addTable(c *nftables.Conn, want Table) {
	t := c.AddTable(&nftables.Table{Family: familyOf(want.Family), Name: want.Name})
	for _, s := range want.Sets {
		// AddSet only fails for anonymous sets, which these are not.
		_ = c.AddSet(nftSet(t, s, s.id), elements(s.Type, s.Elements))
	}
	for _, wc := range want.Chains {
		ch := c.AddChain(chainOf(t, wc))
		for _, r := range wc.Rules {
			c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: r.Exprs})
		}
	}
}

// nftSet is s in table t; id 0 refers to a set that exists already.
func nftSet(t *nftables.Table, s Set, id uint32) *nftables.Set {
	set := &nftables.Set{Table: t, Name: s.Name, ID: id, KeyType: setTypes[s.Type], Concatenation: len(fields(s.Type)) > 1,
		HasTimeout: s.Timeout > 0, Timeout: s.Timeout}
	if s.Type == "ifname" {
		// Told nothing, nft reads a plain ifname key as big endian and
		// lists every name as "" (measured); it writes host order itself.
		set.KeyByteOrder = binaryutil.NativeEndian
	}
	return set
}

// elements encodes element texts as set keys. The texts are the desired
// ones (checked when they were made) or decoded from the kernel, so they
// always encode; one that did not would be left out, and the next Verify
// would name it.
func elements(typ string, texts []string) []nftables.SetElement {
	out := make([]nftables.SetElement, 0, len(texts))
	for _, e := range texts {
		if key, err := encodeElem(typ, e); err == nil {
			out = append(out, nftables.SetElement{Key: key})
		}
	}
	return out
}

// updateSet queues adding and removing set elements and describes it.
func updateSet(c *nftables.Conn, t *nftables.Table, f elemFix) string {
	s := nftSet(t, f.set, 0)
	noun := ""
	if f.set.Type == "ifname" {
		noun = "ports "
	}
	if f.set.Name == UplinkSet {
		noun = "interfaces "
	}
	var what []string
	if len(f.add) > 0 {
		_ = c.SetAddElements(s, elements(f.set.Type, f.add))
		what = append(what, "added "+noun+strings.Join(f.add, ", "))
	}
	if len(f.del) > 0 {
		_ = c.SetDeleteElements(s, elements(f.set.Type, f.del))
		what = append(what, "removed "+noun+strings.Join(f.del, ", "))
	}
	if len(what) == 0 {
		return ""
	}
	return fmt.Sprintf("updated set %s in table %s %s: %s", f.set.Name, familyName(t.Family), t.Name, strings.Join(what, "; "))
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

// PortsChange is what SyncPorts did to the port set.
type PortsChange struct {
	Added, Removed []string
	// AddedAt is when the additions were committed: from then on the
	// bridge drop covers the added ports.
	AddedAt time.Time
}

// AddPorts adds ports to the bridge table's port set without reading the
// set or the table (a port already in it is no error): the port watcher's
// first answer to a port that joined, whose cost must not grow with the
// ports beside it. A table or set that is not there is an error; the
// watcher's full refresh that follows sees to it.
func AddPorts(cfg Config, ports []string) error {
	cfg, err := checkArgs(cfg, ports)
	if err != nil {
		return err
	}
	c, done, err := dial(cfg)
	if err != nil {
		return err
	}
	defer done()
	name := cfg.PortSet()
	t := &nftables.Table{Family: nftables.TableFamilyBridge, Name: cfg.Table}
	updateSet(c, t, elemFix{set: Set{Name: name, Type: "ifname"}, add: normPorts(ports)})
	if err := c.Flush(); err != nil {
		return fmt.Errorf("adding ports to set %s in table bridge %s: %w", name, cfg.Table, err)
	}
	return nil
}

// SyncPorts makes the port set hold exactly ports and says what it added
// and what it removed. Without a port set (bridge-meta mode) it does
// nothing; it returns ErrNotApplied when the bridge table is missing
// altogether. Additions are committed first, in a batch of their own:
// a removal's commit is slower by far (docs/measurements.md, "The port
// watcher"), and a port just plugged in must not wait for a stale name to
// go.
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
	set := Set{Name: name, Type: "ifname"}
	add, del := without(want, live.elems[name]), without(live.elems[name], want)
	t := &nftables.Table{Family: nftables.TableFamilyBridge, Name: cfg.Table}
	if updateSet(c, t, elemFix{set: set, add: add}) != "" {
		if err := c.Flush(); err != nil {
			return ch, fmt.Errorf("adding ports to set %s in table bridge %s: %w", name, cfg.Table, err)
		}
		ch.Added, ch.AddedAt = add, time.Now()
	}
	if updateSet(c, t, elemFix{set: set, del: del}) != "" {
		if err := c.Flush(); err != nil {
			return ch, fmt.Errorf("removing ports from set %s in table bridge %s: %w", name, cfg.Table, err)
		}
		ch.Removed = del
	}
	return ch, nil
}

// Delete removes the stack's tables (inet, bridge, the pin, the egress
// and the route tables) that are present and names what it removed; when none exists it
// sends nothing.
func Delete(cfg Config) ([]string, error) {
	cfg, c, done, err := connect(cfg)
	if err != nil {
		return nil, err
	}
	defer done()
	var removed []string
	for _, t := range []nftables.Table{{Family: nftables.TableFamilyINet, Name: cfg.Table},
		{Family: nftables.TableFamilyBridge, Name: cfg.Table}, {Family: nftables.TableFamilyBridge, Name: cfg.PinTable()},
		{Family: nftables.TableFamilyINet, Name: cfg.EgressTable()}, {Family: nftables.TableFamilyINet, Name: cfg.RouteTable()}} {
		ok, err := tableExists(c, t.Family, t.Name)
		if err != nil {
			return nil, err
		}
		if ok {
			c.DelTable(&t)
			removed = append(removed, "table "+familyName(t.Family)+" "+t.Name)
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

// connect normalises cfg and opens a connection in its namespace.
func connect(cfg Config) (Config, *nftables.Conn, func(), error) {
	cfg, err := cfg.normalized()
	if err != nil {
		return cfg, nil, nil, err
	}
	c, done, err := dial(cfg)
	return cfg, c, done, err
}
