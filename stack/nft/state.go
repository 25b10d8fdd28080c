package nft

import (
	"fmt"
	"slices"
	"strings"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"
)

// liveTable is one table as the kernel reports it.
type liveTable struct {
	exists  bool
	dormant bool
	chains  []*nftables.Chain // kernel order
	rules   map[string][]*nftables.Rule
	sets    []*nftables.Set
	elems   map[string][]string // set name -> its elements' text (decodeElem), sorted
}

func familyOf(name string) nftables.TableFamily {
	if name == "bridge" {
		return nftables.TableFamilyBridge
	}
	return nftables.TableFamilyINet
}

// objectName names a table, or something in it, for findings and changes.
// Everything starts with "table <family> <name>" so callers can tell the
// two layers apart by prefix.
func objectName(t Table, kind, name string) string {
	s := "table " + t.Family + " " + t.Name
	if kind != "" {
		s += " " + kind + " " + name
	}
	return s
}

// readTable reads one table, its chains, rules, sets and the elements of
// the sets whose type box uses. A missing table is not an error.
func readTable(c *nftables.Conn, family, name string) (*liveTable, error) {
	fam := familyOf(family)
	tables, err := c.ListTablesOfFamily(fam)
	if err != nil {
		return nil, fmt.Errorf("listing %s tables: %w", family, err)
	}
	lt := &liveTable{rules: map[string][]*nftables.Rule{}, elems: map[string][]string{}}
	var tbl *nftables.Table
	for _, t := range tables {
		if t.Name == name && t.Family == fam {
			tbl = t
		}
	}
	if tbl == nil {
		return lt, nil
	}
	lt.exists = true
	lt.dormant = tbl.Flags&unix.NFT_TABLE_F_DORMANT != 0

	chains, err := c.ListChainsOfTableFamily(fam)
	if err != nil {
		return nil, fmt.Errorf("listing chains of table %s %s: %w", family, name, err)
	}
	for _, ch := range chains {
		if ch.Table == nil || ch.Table.Name != name {
			continue
		}
		ch.Table = tbl
		lt.chains = append(lt.chains, ch)
		rules, err := c.GetRules(tbl, ch)
		if err != nil {
			return nil, fmt.Errorf("listing rules of chain %s %s %s: %w", family, name, ch.Name, err)
		}
		lt.rules[ch.Name] = rules
	}

	sets, err := c.GetSets(tbl)
	if err != nil {
		return nil, fmt.Errorf("listing sets of table %s %s: %w", family, name, err)
	}
	for _, s := range sets {
		if s.Anonymous {
			continue // belongs to a rule, compared with it
		}
		lt.sets = append(lt.sets, s)
		if _, known := setTypes[s.KeyType.Name]; !known || s.IsMap || s.Interval {
			continue // its shape is a finding; its elements are not read
		}
		els, err := c.GetSetElements(s)
		if err != nil {
			return nil, fmt.Errorf("listing elements of set %s in table %s %s: %w", s.Name, family, name, err)
		}
		lt.elems[s.Name] = elemTexts(s.KeyType.Name, els)
	}
	return lt, nil
}

// elemTexts is a set's elements as text, sorted: what a set of that key
// type cannot hold reads as hex, never equal to a desired element.
func elemTexts(typ string, els []nftables.SetElement) []string {
	texts := make([]string, 0, len(els))
	for _, e := range els {
		text, ok := decodeElem(typ, e.Key)
		if !ok {
			text = fmt.Sprintf("0x%x", e.Key)
		}
		texts = append(texts, text)
	}
	return normPorts(texts)
}

// tableDiff is how one live table differs from the desired one, both as
// findings (Verify) and as what Apply has to do about it.
type tableDiff struct {
	findings []Finding
	missing  bool
	// rebuild lists differences that cannot be fixed rule by rule (chain
	// hooks, sets, stray chains): Apply replaces the whole table.
	rebuild []string
	// chainRules maps a chain whose rules differ to a short reason.
	chainRules []chainFix
	// elemFixes are the elements to add to and delete from sets whose
	// shape is right.
	elemFixes []elemFix
	// addSets and delSets are sets to add and delete in place
	// (Table.SetsInPlace).
	addSets []Set
	delSets []string
}

type elemFix struct {
	set      Set
	add, del []string
}

type chainFix struct {
	chain  Chain
	reason string
}

func (d tableDiff) clean() bool { return len(d.findings) == 0 }

// diffTable compares live with want, set elements included.
func diffTable(want Table, live *liveTable) tableDiff {
	var d tableDiff
	tobj := objectName(want, "", "")
	find := func(obj, problem string) { d.findings = append(d.findings, Finding{Object: obj, Problem: problem}) }
	if !live.exists {
		d.missing = true
		find(tobj, "missing")
		return d
	}
	if live.dormant {
		find(tobj, "dormant: its chains see no packets")
		d.rebuild = append(d.rebuild, "table was dormant")
	}

	// Sets.
	for _, ws := range want.Sets {
		obj := objectName(want, "set", ws.Name)
		i := slices.IndexFunc(live.sets, func(s *nftables.Set) bool { return s.Name == ws.Name })
		if i < 0 {
			find(obj, "missing")
			if want.SetsInPlace {
				d.addSets = append(d.addSets, ws)
			} else {
				d.rebuild = append(d.rebuild, "set "+ws.Name+" missing")
			}
			continue
		}
		ls := live.sets[i]
		if p := setShapeProblem(ls, ws); p != "" {
			find(obj, p)
			d.rebuild = append(d.rebuild, "set "+ws.Name+" "+p)
			continue
		}
		if ws.Foreign {
			continue // its elements are not box's
		}
		have := live.elems[ws.Name]
		fix := elemFix{set: ws, add: without(ws.Elements, have), del: without(have, ws.Elements)}
		if len(fix.add)+len(fix.del) == 0 {
			continue
		}
		d.elemFixes = append(d.elemFixes, fix)
		for _, p := range staleProblems(ws, have) {
			find(obj, p)
		}
	}
	for _, ls := range live.sets {
		if !slices.ContainsFunc(want.Sets, func(s Set) bool { return s.Name == ls.Name }) {
			find(objectName(want, "set", ls.Name), "unexpected set")
			if want.SetsInPlace {
				d.delSets = append(d.delSets, ls.Name)
			} else {
				d.rebuild = append(d.rebuild, "unexpected set "+ls.Name)
			}
		}
	}

	// Chains.
	for _, wc := range want.Chains {
		obj := objectName(want, "chain", wc.Name)
		i := slices.IndexFunc(live.chains, func(c *nftables.Chain) bool { return c.Name == wc.Name })
		if i < 0 {
			find(obj, "missing")
			d.rebuild = append(d.rebuild, "chain "+wc.Name+" missing")
			continue
		}
		if probs := chainProblems(want.Family, wc, live.chains[i]); len(probs) > 0 {
			for _, p := range probs {
				find(obj, p)
			}
			d.rebuild = append(d.rebuild, "chain "+wc.Name+" "+strings.Join(probs, ", "))
			continue
		}
		if probs, short := ruleProblems(wc, live.rules[wc.Name]); len(probs) > 0 {
			for _, p := range probs {
				find(obj, p)
			}
			d.chainRules = append(d.chainRules, chainFix{chain: wc, reason: short})
		}
	}
	for _, lc := range live.chains {
		if !slices.ContainsFunc(want.Chains, func(c Chain) bool { return c.Name == lc.Name }) {
			find(objectName(want, "chain", lc.Name), "unexpected chain")
			d.rebuild = append(d.rebuild, "unexpected chain "+lc.Name)
		}
	}
	return d
}

// setShapeProblem says how a live set is not a plain set of want's type
// (a concatenation has the concatenation flag, nothing else does; a set
// with a timeout has the timeout flag and that default timeout).
func setShapeProblem(s *nftables.Set, want Set) string {
	typ := want.Type
	var p []string
	if s.KeyType.Name != typ {
		p = append(p, fmt.Sprintf("type is %s, want %s", s.KeyType.Name, typ))
	}
	concat := len(fields(typ)) > 1
	for _, f := range []struct {
		on   bool
		name string
	}{{s.IsMap, "map"}, {s.Interval, "interval"}, {s.Constant, "constant"}, {s.HasTimeout && want.Timeout == 0, "timeout"}, {s.Dynamic, "dynamic"}, {s.Concatenation && !concat, "concatenation"}} {
		if f.on {
			p = append(p, "has flag "+f.name)
		}
	}
	if concat && !s.Concatenation {
		p = append(p, "lacks flag concatenation")
	}
	if want.Timeout > 0 && setTimeoutOf(s) != want.Timeout {
		p = append(p, fmt.Sprintf("timeout is %s, want %s", setTimeoutOf(s), want.Timeout))
	}
	return strings.Join(p, ", ")
}

// staleProblems describes how a set's live elements (have, sorted) differ
// from the desired ones: a port set by the ports missing and unexpected, a
// pin set (ifname . something) port by port.
func staleProblems(want Set, have []string) []string {
	what, noun := "port set", "ports "
	switch {
	case want.Name == UplinkSet:
		what, noun = "uplink set", "interfaces "
	case want.Type == "ifname":
	case want.Type == "ipv4_addr":
		what, noun = "address set", "addresses "
	default:
		return stalePinProblems(want, have)
	}
	var stale []string
	if add := without(want.Elements, have); len(add) > 0 {
		stale = append(stale, "missing "+noun+strings.Join(add, ", "))
	}
	if del := without(have, want.Elements); len(del) > 0 {
		stale = append(stale, "unexpected "+noun+strings.Join(del, ", "))
	}
	return []string{what + " stale: " + strings.Join(stale, "; ")}
}

func chainProblems(family string, want Chain, live *nftables.Chain) []string {
	var p []string
	if string(live.Type) != want.Type {
		p = append(p, fmt.Sprintf("type is %q, want %q", live.Type, want.Type))
	}
	if live.Hooknum == nil || live.Priority == nil {
		return append(p, "not a base chain (no hook), want hook "+want.Hook)
	}
	if got := hookName(*live.Hooknum); got != want.Hook {
		p = append(p, fmt.Sprintf("hook is %s, want %s", got, want.Hook))
	}
	if got := int32(*live.Priority); got != want.Priority {
		p = append(p, fmt.Sprintf("priority is %d, want %s (%d)", got, priorityText(family, want.Priority), want.Priority))
	}
	got := "none"
	if live.Policy != nil {
		got = policyName(*live.Policy)
	}
	if got != want.Policy {
		p = append(p, fmt.Sprintf("policy is %s, want %s", got, want.Policy))
	}
	return p
}

// ruleProblems compares a chain's live rules with the desired ones. Order
// decides a packet's fate, so the two lists are aligned (longest common
// subsequence) and what is left over is reported: a rule inserted ahead of
// the others reads as one unexpected rule, not as every rule differing. It
// returns one problem per difference and a short summary for Apply.
func ruleProblems(want Chain, live []*nftables.Rule) ([]string, string) {
	w := make([]string, len(want.Rules))
	for i, r := range want.Rules {
		w[i] = canonRule(r.Exprs)
	}
	l := make([]string, len(live))
	for i, r := range live {
		l[i] = canonRule(r.Exprs)
	}
	// describe shows a live rule as the desired rule it equals, if any.
	describe := func(c string) string {
		if i := slices.Index(w, c); i >= 0 {
			return fmt.Sprintf("`%s`", want.Rules[i].Text)
		}
		return c
	}

	// lcs[i][j] is the common length of l[i:] and w[j:].
	lcs := make([][]int, len(l)+1)
	for i := range lcs {
		lcs[i] = make([]int, len(w)+1)
	}
	for i := len(l) - 1; i >= 0; i-- {
		for j := len(w) - 1; j >= 0; j-- {
			if l[i] == w[j] {
				lcs[i][j] = lcs[i+1][j+1] + 1
			} else {
				lcs[i][j] = max(lcs[i+1][j], lcs[i][j+1])
			}
		}
	}
	var p []string
	differ, missing, extra := 0, 0, 0
	var gapL, gapW []int // unmatched live and desired positions since the last match
	flush := func() {
		n := min(len(gapL), len(gapW))
		for k := 0; k < n; k++ {
			differ++
			p = append(p, fmt.Sprintf("rule %d differs: is %s, want `%s`", gapL[k]+1, describe(l[gapL[k]]), want.Rules[gapW[k]].Text))
		}
		for _, i := range gapL[n:] {
			extra++
			p = append(p, fmt.Sprintf("unexpected rule %d (handle %d): %s", i+1, live[i].Handle, describe(l[i])))
		}
		for _, j := range gapW[n:] {
			missing++
			p = append(p, fmt.Sprintf("rule %d missing: want `%s`", j+1, want.Rules[j].Text))
		}
		gapL, gapW = gapL[:0], gapW[:0]
	}
	i, j := 0, 0
	for i < len(l) || j < len(w) {
		switch {
		case i < len(l) && j < len(w) && l[i] == w[j]:
			flush()
			i, j = i+1, j+1
		case j >= len(w) || (i < len(l) && lcs[i+1][j] >= lcs[i][j+1]):
			gapL = append(gapL, i)
			i++
		default:
			gapW = append(gapW, j)
			j++
		}
	}
	flush()

	var short []string
	for _, c := range []struct {
		n    int
		what string
	}{{differ, "differed"}, {missing, "missing"}, {extra, "unexpected"}} {
		if c.n == 1 {
			short = append(short, "1 rule "+c.what)
		} else if c.n > 1 {
			short = append(short, fmt.Sprintf("%d rules %s", c.n, c.what))
		}
	}
	return p, strings.Join(short, ", ")
}

// hookName names a hook number. The bridge family's hook numbers coincide
// with the inet ones (NF_BR_LOCAL_IN == NF_INET_LOCAL_IN, and so on).
func hookName(h nftables.ChainHook) string {
	switch h {
	case unix.NF_INET_PRE_ROUTING:
		return "prerouting"
	case unix.NF_INET_LOCAL_IN:
		return "input"
	case unix.NF_INET_FORWARD:
		return "forward"
	case unix.NF_INET_LOCAL_OUT:
		return "output"
	case unix.NF_INET_POST_ROUTING:
		return "postrouting"
	}
	return fmt.Sprintf("hook%d", h)
}

func hookNum(name string) *nftables.ChainHook {
	switch name {
	case "prerouting":
		return nftables.ChainHookRef(unix.NF_INET_PRE_ROUTING)
	case "input":
		return nftables.ChainHookRef(unix.NF_INET_LOCAL_IN)
	case "forward":
		return nftables.ChainHookRef(unix.NF_INET_FORWARD)
	}
	panic("nft: unknown hook " + name) // the desired tables only use the ones above
}

func policyName(p nftables.ChainPolicy) string {
	switch p {
	case nftables.ChainPolicyAccept:
		return "accept"
	case nftables.ChainPolicyDrop:
		return "drop"
	}
	return fmt.Sprintf("policy%d", p)
}

func policyOf(name string) *nftables.ChainPolicy {
	p := nftables.ChainPolicyAccept
	if name == "drop" {
		p = nftables.ChainPolicyDrop
	}
	return &p
}

// without returns the elements of a that are not in b (both sorted).
func without(a, b []string) []string {
	var out []string
	for _, x := range a {
		if _, found := slices.BinarySearch(b, x); !found {
			out = append(out, x)
		}
	}
	return out
}
