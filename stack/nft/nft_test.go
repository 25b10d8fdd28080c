package nft

import (
	"encoding/binary"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		require.NoError(t, os.WriteFile(path, []byte(got), 0o644))
	}
	want, err := os.ReadFile(path)
	require.NoError(t, err, "run go test ./stack/nft/ -run %s -update to create it", t.Name())
	assert.Equal(t, string(want), got, "golden %s differs (rerun with -update if the change is intended)", path)
}

var (
	portSetCaps    = Capabilities{BridgeMeta: false, Detail: "test"}
	bridgeMetaCaps = Capabilities{BridgeMeta: true, Detail: "test"}
)

func TestRulesetStringGolden(t *testing.T) {
	for _, tc := range []struct {
		golden string
		cfg    Config
		caps   Capabilities
		ports  []string
	}{
		{"ruleset-port-set.golden", Config{Gateway: testGW}, portSetCaps, nil},
		{"ruleset-bridge-meta.golden", Config{Gateway: testGW}, bridgeMetaCaps, nil},
		{"ruleset-port-set-ports.golden", Config{Table: "legacy", Bridge: "claudenet", Gateway: testGW}, portSetCaps, []string{"vethB", "vethA", "vethB"}},
	} {
		t.Run(tc.golden, func(t *testing.T) {
			r := Desired(tc.cfg, tc.caps)
			if tc.ports != nil {
				r = r.WithPorts(tc.ports)
			}
			golden(t, tc.golden, r.String())
			assert.Equal(t, r.String(), r.String(), "String is stable")
		})
	}
}

func TestDesiredMode(t *testing.T) {
	assert.Equal(t, ModePortSet, Desired(Config{Gateway: testGW}, portSetCaps).Mode)
	assert.Equal(t, ModeBridgeMeta, Desired(Config{Gateway: testGW}, bridgeMetaCaps).Mode)
	assert.Equal(t, "boxnet_ports", Config{Gateway: testGW}.PortSet())
}

// unscoped reports whether a rule drops without naming the bridge on both
// sides (input and output port), which must never happen in a bridge table:
// such a rule cuts every bridge on the host. It reads the expressions, not
// the text, since the expressions are what the kernel runs.
func unscoped(exprs []expr.Any, bridge, portSet string) bool {
	var in, out bool
	for i := 0; i+1 < len(exprs); i++ {
		m, ok := exprs[i].(*expr.Meta)
		if !ok || m.SourceRegister {
			continue
		}
		switch next := exprs[i+1].(type) {
		case *expr.Cmp:
			if next.Op != expr.CmpOpEq || next.Register != m.Register || string(next.Data) != string(ifnameBytes(bridge)) {
				continue
			}
			in = in || m.Key == expr.MetaKeyBRIIIFNAME
			out = out || m.Key == expr.MetaKeyBRIOIFNAME
		case *expr.Lookup:
			if next.Invert || next.SourceRegister != m.Register || next.SetName != portSet {
				continue
			}
			in = in || m.Key == expr.MetaKeyIIFNAME
			out = out || m.Key == expr.MetaKeyOIFNAME
		}
	}
	for _, e := range exprs {
		if v, ok := e.(*expr.Verdict); ok && v.Kind == expr.VerdictDrop {
			return !(in && out)
		}
	}
	return false
}

func TestUnscopedDetector(t *testing.T) {
	// The checker itself must catch the rules it exists to forbid.
	d := drop()
	for name, exprs := range map[string][]expr.Any{
		"bare drop":       d.exprs,
		"input side only": rule(d, ibrname("boxnet")).Exprs,
		"other bridge":    rule(d, ibrname("docker0"), obrname("boxnet")).Exprs,
		"iifname only":    rule(d, ifnameIn("iifname", expr.MetaKeyIIFNAME, "boxnet_ports")).Exprs,
		"wrong set":       rule(d, ifnameIn("iifname", expr.MetaKeyIIFNAME, "x"), ifnameIn("oifname", expr.MetaKeyOIFNAME, "boxnet_ports")).Exprs,
	} {
		assert.True(t, unscoped(exprs, "boxnet", "boxnet_ports"), name)
	}
	assert.False(t, unscoped(rule(d, ibrname("boxnet"), obrname("boxnet")).Exprs, "boxnet", "boxnet_ports"))
}

func TestDesiredNeverUnscopedBridgeDrop(t *testing.T) {
	for _, cfg := range []Config{{}, {Table: "legacy", Bridge: "claudenet"}, {Bridge: "br-0123456789a"}} {
		for _, caps := range []Capabilities{portSetCaps, bridgeMetaCaps} {
			r := Desired(cfg, caps)
			norm, err := cfg.normalized()
			require.NoError(t, err)
			bridgeRules := 0
			for _, tb := range r.Tables {
				if tb.Family != "bridge" {
					continue
				}
				for _, ch := range tb.Chains {
					for _, ru := range ch.Rules {
						bridgeRules++
						assert.False(t, unscoped(ru.Exprs, norm.Bridge, norm.PortSet()),
							"%s mode %s: rule %q is not scoped to the bridge's ports on both sides", norm.Bridge, r.Mode, ru.Text)
					}
				}
			}
			assert.Positive(t, bridgeRules, "the bridge table has its drop")
		}
	}
}

func TestDesiredHostFirewallOnlyFromBridge(t *testing.T) {
	// Every input rule starts by matching the bridge as input interface, so
	// no rule can touch traffic from anywhere else.
	r := Desired(Config{Bridge: "br7", Gateway: testGW}, portSetCaps)
	want := canonRule(iifname("br7").exprs)
	for _, ru := range r.Tables[0].Chains[0].Rules {
		assert.True(t, strings.HasPrefix(canonRule(ru.Exprs), want), "rule %q", ru.Text)
	}
}

func TestConfigRefusesBadNames(t *testing.T) {
	for _, br := range []string{"a-name-that-is-too-long", "bad name", "a/b"} {
		_, err := Config{Bridge: br}.normalized()
		assert.Error(t, err, br)
	}
	_, err := checkArgs(Config{Gateway: testGW}, []string{"veth0", ""})
	assert.Error(t, err)
}

// fakeKernel answers nftables netlink as an empty kernel would (no tables)
// and records every batch sent.
type fakeKernel struct {
	batches [][]netlink.Message
}

func (f *fakeKernel) conf(c Config) Config {
	c.connOpts = append(c.connOpts, nftables.WithTestDial(f.dial))
	return c
}

func (f *fakeKernel) dial(req []netlink.Message) ([]netlink.Message, error) {
	if len(req) == 0 {
		return nil, nil
	}
	if req[0].Header.Type == netlink.HeaderType(unix.NFNL_MSG_BATCH_BEGIN) {
		f.batches = append(f.batches, req[1:len(req)-1])
		var acks []netlink.Message
		for _, m := range req {
			if m.Header.Flags&netlink.Acknowledge != 0 {
				acks = append(acks, netlink.Message{
					Header: netlink.Header{Type: netlink.Error, Sequence: m.Header.Sequence, PID: m.Header.PID},
					Data:   make([]byte, 4),
				})
			}
		}
		return acks, nil
	}
	// A query: every dump of this empty kernel is empty.
	m := req[0]
	return []netlink.Message{{
		Header: netlink.Header{Type: netlink.Done, Flags: netlink.Multi, Sequence: m.Header.Sequence, PID: m.Header.PID},
		Data:   make([]byte, 4),
	}}, nil
}

func TestApplyMessagesGolden(t *testing.T) {
	for _, tc := range []struct {
		golden string
		caps   Capabilities
	}{
		{"apply-port-set.golden", portSetCaps},
		{"apply-bridge-meta.golden", bridgeMetaCaps},
	} {
		t.Run(tc.golden, func(t *testing.T) {
			var k fakeKernel
			changes, err := Apply(k.conf(Config{Gateway: testGW}), tc.caps, []string{"vethB", "vethA"})
			require.NoError(t, err)
			assert.Equal(t, []string{"created table inet box", "created table bridge box"}, changes)
			require.Len(t, k.batches, 1, "everything goes in one batch")
			var b strings.Builder
			for _, m := range k.batches[0] {
				line := describeMsg(t, m)
				b.WriteString(line + "\n")
				// Only box's own tables, and never a ruleset-wide flush
				// (a DELTABLE without a name).
				assert.Contains(t, line, " table=box", "message outside box's tables: %s", line)
			}
			golden(t, tc.golden, b.String())
		})
	}
}

func TestDeleteOnEmptyKernelSendsNothing(t *testing.T) {
	var k fakeKernel
	removed, err := Delete(k.conf(Config{Gateway: testGW}))
	require.NoError(t, err)
	assert.Empty(t, removed)
	assert.Empty(t, k.batches)

	inet, bridge, err := Present(k.conf(Config{Gateway: testGW}))
	require.NoError(t, err)
	assert.False(t, inet)
	assert.False(t, bridge)

	_, err = SyncPorts(k.conf(Config{Gateway: testGW}), []string{"veth0"})
	assert.ErrorIs(t, err, ErrNotApplied)
}

func TestVerifyOnEmptyKernel(t *testing.T) {
	var k fakeKernel
	f, err := Verify(k.conf(Config{Gateway: testGW}), portSetCaps, nil)
	require.NoError(t, err)
	assert.Equal(t, []Finding{
		{Object: "table inet box", Problem: "missing"},
		{Object: "table bridge box", Problem: "missing"},
	}, f)
	assert.Empty(t, k.batches, "Verify never writes")
}

// describeMsg renders one recorded nftables message as one line.
func describeMsg(t *testing.T, m netlink.Message) string {
	t.Helper()
	kind := msgName(uint16(m.Header.Type) & 0xff)
	fam := familyName(nftables.TableFamily(m.Data[0]))
	attrs, err := netlink.UnmarshalAttributes(m.Data[4:])
	require.NoError(t, err)
	get := func(typ uint16) []byte {
		for _, a := range attrs {
			if a.Type&^(unix.NLA_F_NESTED|unix.NLA_F_NET_BYTEORDER) == typ {
				return a.Data
			}
		}
		return nil
	}
	str := func(b []byte) string { return strings.TrimRight(string(b), "\x00") }
	u32 := func(b []byte) uint32 {
		if len(b) < 4 {
			return 0
		}
		return binary.BigEndian.Uint32(b)
	}
	s := fmt.Sprintf("%s %s", kind, fam)
	switch kind {
	case "NEWTABLE", "DELTABLE":
		s += " table=" + str(get(unix.NFTA_TABLE_NAME))
	case "NEWCHAIN", "DELCHAIN":
		s += fmt.Sprintf(" table=%s chain=%s type=%s", str(get(unix.NFTA_CHAIN_TABLE)), str(get(unix.NFTA_CHAIN_NAME)), str(get(unix.NFTA_CHAIN_TYPE)))
		if h := get(unix.NFTA_CHAIN_HOOK); h != nil {
			hs, err := netlink.UnmarshalAttributes(h)
			require.NoError(t, err)
			for _, a := range hs {
				switch a.Type {
				case unix.NFTA_HOOK_HOOKNUM:
					s += " hook=" + hookName(nftables.ChainHook(u32(a.Data)))
				case unix.NFTA_HOOK_PRIORITY:
					s += fmt.Sprintf(" priority=%d", int32(u32(a.Data)))
				}
			}
		}
		if p := get(unix.NFTA_CHAIN_POLICY); p != nil {
			s += " policy=" + policyName(nftables.ChainPolicy(u32(p)))
		}
	case "NEWRULE":
		s += fmt.Sprintf(" table=%s chain=%s:", str(get(unix.NFTA_RULE_TABLE)), str(get(unix.NFTA_RULE_CHAIN)))
		list, err := netlink.UnmarshalAttributes(get(unix.NFTA_RULE_EXPRESSIONS))
		require.NoError(t, err)
		for _, el := range list {
			ea, err := netlink.UnmarshalAttributes(el.Data)
			require.NoError(t, err)
			var name string
			var data []byte
			for _, a := range ea {
				switch a.Type &^ unix.NLA_F_NESTED {
				case unix.NFTA_EXPR_NAME:
					name = str(a.Data)
				case unix.NFTA_EXPR_DATA:
					data = a.Data
				}
			}
			e := exprOf(name)
			require.NotNil(t, e, "unexpected expression %q", name)
			require.NoError(t, expr.Unmarshal(byte(m.Data[0]), data, e))
			if imm, ok := e.(*expr.Immediate); ok && imm.Register == 0 {
				e = &expr.Verdict{}
				require.NoError(t, expr.Unmarshal(byte(m.Data[0]), data, e))
			}
			s += " [ " + canonExpr(e)
			if l, ok := e.(*expr.Lookup); ok {
				s += fmt.Sprintf(" id %d", l.SetID)
			}
			s += " ]"
		}
	case "NEWSET":
		s += fmt.Sprintf(" table=%s set=%s flags=%#x keytype=%d keylen=%d id=%d", str(get(unix.NFTA_SET_TABLE)), str(get(unix.NFTA_SET_NAME)),
			u32(get(unix.NFTA_SET_FLAGS)), u32(get(unix.NFTA_SET_KEY_TYPE)), u32(get(unix.NFTA_SET_KEY_LEN)), u32(get(unix.NFTA_SET_ID)))
	case "NEWSETELEM", "DELSETELEM":
		s += fmt.Sprintf(" table=%s set=%s id=%d elements:", str(get(unix.NFTA_SET_ELEM_LIST_TABLE)), str(get(unix.NFTA_SET_ELEM_LIST_SET)), u32(get(unix.NFTA_SET_ELEM_LIST_SET_ID)))
		els, err := netlink.UnmarshalAttributes(get(unix.NFTA_SET_ELEM_LIST_ELEMENTS))
		require.NoError(t, err)
		for _, el := range els {
			ea, err := netlink.UnmarshalAttributes(el.Data)
			require.NoError(t, err)
			for _, a := range ea {
				if a.Type&^unix.NLA_F_NESTED == unix.NFTA_SET_ELEM_KEY {
					kv, err := netlink.UnmarshalAttributes(a.Data)
					require.NoError(t, err)
					// The message does not say the set's type; box's key
					// types all differ in length.
					key := kv[0].Data
					typ := map[int]string{ifnameSize: "ifname", 24: "ifname . ether_addr", 20: "ifname . ipv4_addr"}[len(key)]
					text, ok := decodeElem(typ, key)
					require.True(t, ok, "a key of %d bytes is none of box's set types", len(key))
					s += " " + elemListing(typ, text)
				}
			}
		}
	}
	return s
}

func msgName(t uint16) string {
	switch t {
	case unix.NFT_MSG_NEWTABLE:
		return "NEWTABLE"
	case unix.NFT_MSG_DELTABLE:
		return "DELTABLE"
	case unix.NFT_MSG_NEWCHAIN:
		return "NEWCHAIN"
	case unix.NFT_MSG_DELCHAIN:
		return "DELCHAIN"
	case unix.NFT_MSG_NEWRULE:
		return "NEWRULE"
	case unix.NFT_MSG_DELRULE:
		return "DELRULE"
	case unix.NFT_MSG_NEWSET:
		return "NEWSET"
	case unix.NFT_MSG_DELSET:
		return "DELSET"
	case unix.NFT_MSG_NEWSETELEM:
		return "NEWSETELEM"
	case unix.NFT_MSG_DELSETELEM:
		return "DELSETELEM"
	}
	return fmt.Sprintf("MSG%d", t)
}

func exprOf(name string) expr.Any {
	switch name {
	case "meta":
		return &expr.Meta{}
	case "cmp":
		return &expr.Cmp{}
	case "ct":
		return &expr.Ct{}
	case "bitwise":
		return &expr.Bitwise{}
	case "payload":
		return &expr.Payload{}
	case "lookup":
		return &expr.Lookup{}
	case "immediate":
		return &expr.Immediate{}
	}
	return nil
}

// testGW is the gateway address the tests' rules are rendered for.
var testGW = netip.MustParseAddr("10.88.0.1")

func TestEgressStringGolden(t *testing.T) {
	e := Egress{Policies: []EgressPolicy{
		{ID: "pb", Boxes: []netip.Addr{netip.MustParseAddr("10.88.0.12"), netip.MustParseAddr("10.88.0.11")}},
		{ID: "pa", Boxes: []netip.Addr{netip.MustParseAddr("10.88.0.10")}},
		{ID: "pc"},
	}, Resolvers: []netip.Addr{netip.MustParseAddr("1.1.1.1"), netip.MustParseAddr("2606:4700::1111"), netip.MustParseAddr("9.9.9.9")}}
	r, err := e.Desired(Config{Gateway: testGW})
	require.NoError(t, err)
	golden(t, "egress.golden", r.String())

	_, err = e.Desired(Config{})
	assert.ErrorContains(t, err, "gateway", "the DNS rules need the gateway")
	_, err = Egress{Policies: []EgressPolicy{{ID: "P!"}}}.Desired(Config{Gateway: testGW})
	assert.ErrorContains(t, err, "policy id")
}

func TestCanonSkipsTProxy(t *testing.T) {
	// The kernel's tproxy expression is not read back by google/nftables:
	// a rule with it must compare equal to its live form without it.
	r := rule(accept(), tproxyTo(EgressProxyAddr, EgressProxyPort), markSet(EgressMark))
	var live []expr.Any
	for _, e := range r.Exprs {
		if _, ok := e.(*expr.TProxy); !ok {
			live = append(live, e)
		}
	}
	assert.Equal(t, canonRule(r.Exprs), canonRule(live))
	assert.Contains(t, canonRule(r.Exprs), fmt.Sprintf("immediate reg 2 0x%04x", EgressProxyPort), "the port it takes is still compared")
}
