package nft

import (
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/stretchr/testify/assert"
)

// liveFrom builds the live view the kernel would report for want, with the
// kernel's own habits: no set id in lookups.
func liveFrom(want Table) *liveTable {
	lt := &liveTable{exists: true, rules: map[string][]*nftables.Rule{}, elems: map[string][]string{}}
	t := &nftables.Table{Family: familyOf(want.Family), Name: want.Name}
	for _, s := range want.Sets {
		lt.sets = append(lt.sets, nftSet(t, s, 0))
		lt.elems[s.Name] = s.Elements
	}
	for i, c := range want.Chains {
		ch := chainOf(t, c)
		lt.chains = append(lt.chains, ch)
		for j, r := range c.Rules {
			var exprs []expr.Any
			for _, e := range r.Exprs {
				if l, ok := e.(*expr.Lookup); ok {
					cp := *l
					cp.SetID = 0
					e = &cp
				}
				exprs = append(exprs, e)
			}
			lt.rules[c.Name] = append(lt.rules[c.Name], &nftables.Rule{Table: t, Chain: ch, Handle: uint64(10*i + j + 2), Exprs: exprs})
		}
	}
	return lt
}

func TestDiffTable(t *testing.T) {
	r := Desired(Config{Gateway: testGW}, portSetCaps)
	inet, bridge := r.Tables[0], r.Tables[1]
	ports := []string{"vethA", "vethB"}

	for _, tc := range []struct {
		name    string
		want    Table
		mutate  func(*liveTable)
		ports   []string
		finds   []Finding
		rebuild bool
		rules   bool
	}{
		{name: "clean inet", want: inet, mutate: func(*liveTable) {}},
		{name: "clean bridge", want: bridge, mutate: func(*liveTable) {}},
		{name: "missing table", want: bridge, mutate: func(l *liveTable) { *l = liveTable{} },
			finds: []Finding{{"table bridge box", "missing"}}},
		{name: "hole punched first", want: inet, mutate: func(l *liveTable) {
			rs := l.rules["input"]
			hole := &nftables.Rule{Handle: 99, Exprs: rule(accept(), iifname("boxnet")).Exprs}
			l.rules["input"] = append([]*nftables.Rule{hole}, rs...)
		}, rules: true, finds: []Finding{
			{"table inet box chain input", "unexpected rule 1 (handle 99): [ meta load iifname => reg 1 ] [ cmp eq reg 1 0x626f786e657400000000000000000000 ] [ verdict accept ]"},
		}},
		{name: "two rules swapped", want: inet, mutate: func(l *liveTable) {
			rs := l.rules["input"]
			last := len(rs) - 1
			rs[1], rs[last] = rs[last], rs[1]
		}, rules: true, finds: []Finding{
			{"table inet box chain input", "rule 2 differs: is `iifname \"boxnet\" drop`, want `iifname \"boxnet\" ip daddr 10.88.0.1 udp dport 53 accept`"},
			{"table inet box chain input", "rule 10 differs: is `iifname \"boxnet\" ip daddr 10.88.0.1 udp dport 53 accept`, want `iifname \"boxnet\" drop`"},
		}},
		// DNS to every host address, as the stack had it before DNS was
		// scoped to the gateway.
		{name: "rule widened in place", want: inet, mutate: func(l *liveTable) {
			l.rules["input"][2] = &nftables.Rule{Handle: 7, Exprs: rule(accept(), iifname("boxnet"), dport("tcp", 53)).Exprs}
		}, rules: true, finds: []Finding{
			{"table inet box chain input", "rule 3 differs: is [ meta load iifname => reg 1 ] [ cmp eq reg 1 0x626f786e657400000000000000000000 ] [ meta load l4proto => reg 1 ] [ cmp eq reg 1 0x06 ] [ payload load 2b @ transport header + 2 => reg 1 ] [ cmp eq reg 1 0x0035 ] [ verdict accept ], want `iifname \"boxnet\" ip daddr 10.88.0.1 tcp dport 53 accept`"},
		}},
		{name: "drop rule flushed", want: bridge, mutate: func(l *liveTable) { l.rules["forward"] = nil },
			rules: true, finds: []Finding{{"table bridge box chain forward", "rule 1 missing: want `iifname @boxnet_ports oifname @boxnet_ports drop`"}}},
		{name: "policy drop", want: inet, mutate: func(l *liveTable) { l.chains[0].Policy = policyOf("drop") },
			rebuild: true, finds: []Finding{{"table inet box chain input", "policy is drop, want accept"}}},
		{name: "wrong hook and priority", want: bridge, mutate: func(l *liveTable) {
			l.chains[0].Hooknum = hookNum("input")
			l.chains[0].Priority = nftables.ChainPriorityRef(0)
		}, rebuild: true, finds: []Finding{
			{"table bridge box chain forward", "hook is input, want forward"},
			{"table bridge box chain forward", "priority is 0, want filter (-200)"},
		}},
		{name: "not a base chain", want: inet, mutate: func(l *liveTable) { l.chains[0].Hooknum = nil },
			rebuild: true, finds: []Finding{{"table inet box chain input", "not a base chain (no hook), want hook input"}}},
		{name: "stray chain", want: inet, mutate: func(l *liveTable) {
			l.chains = append(l.chains, &nftables.Chain{Name: "sneaky"})
		}, rebuild: true, finds: []Finding{{"table inet box chain sneaky", "unexpected chain"}}},
		{name: "dormant", want: inet, mutate: func(l *liveTable) { l.dormant = true },
			rebuild: true, finds: []Finding{{"table inet box", "dormant: its chains see no packets"}}},
		{name: "ports stale", want: bridge, ports: []string{"vethA", "vethC"}, mutate: func(*liveTable) {},
			finds: []Finding{{"table bridge box set boxnet_ports", "port set stale: missing ports vethC; unexpected ports vethB"}}},
		{name: "set missing", want: bridge, mutate: func(l *liveTable) { l.sets = nil },
			rebuild: true, finds: []Finding{{"table bridge box set boxnet_ports", "missing"}}},
		{name: "set is interval", want: bridge, mutate: func(l *liveTable) { l.sets[0].Interval = true },
			rebuild: true, finds: []Finding{{"table bridge box set boxnet_ports", "has flag interval"}}},
		{name: "leftover set in bridge-meta mode", want: Desired(Config{Gateway: testGW}, bridgeMetaCaps).Tables[1], mutate: func(l *liveTable) {
			l.sets = []*nftables.Set{nftSet(nil, Set{Name: "boxnet_ports", Type: "ifname"}, 0)}
		}, rebuild: true, finds: []Finding{{"table bridge box set boxnet_ports", "unexpected set"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			live := liveFrom(tc.want.withPorts(ports))
			tc.mutate(live)
			want := ports
			if tc.ports != nil {
				want = tc.ports
			}
			d := diffTable(tc.want.withPorts(want), live)
			assert.Equal(t, tc.finds, d.findings)
			assert.Equal(t, tc.rebuild, len(d.rebuild) > 0, "rebuild: %v", d.rebuild)
			assert.Equal(t, tc.rules, len(d.chainRules) > 0, "rule fixes: %v", d.chainRules)
		})
	}
}

func TestDiffBridgeMetaIgnoresPorts(t *testing.T) {
	b := Desired(Config{Gateway: testGW}, bridgeMetaCaps).Tables[1]
	d := diffTable(b.withPorts([]string{"veth0"}), liveFrom(b))
	assert.True(t, d.clean(), "%v", d.findings)
}
