package nft

import (
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// testPins pins two ports; vethC is a port of the bridge with no pin.
var (
	testPorts = []string{"vethC", "vethA", "vethB"}
	testPins  = []Pin{
		{Port: "vethB", MAC: net.HardwareAddr{2, 0, 0, 0, 0, 0x0b}, Addrs: []netip.Addr{netip.MustParseAddr("10.88.0.11")}},
		{Port: "vethA", MAC: net.HardwareAddr{2, 0, 0, 0, 0, 0x0a}, Addrs: []netip.Addr{netip.MustParseAddr("10.88.0.10"), netip.MustParseAddr("::ffff:10.88.0.20")}},
	}
)

func TestPinsStringGolden(t *testing.T) {
	for _, tc := range []struct {
		golden string
		caps   Capabilities
	}{
		{"pins-port-set.golden", portSetCaps},
		{"pins-bridge-meta.golden", bridgeMetaCaps},
	} {
		t.Run(tc.golden, func(t *testing.T) {
			r, err := DesiredPins(Config{}, tc.caps, testPorts, testPins)
			require.NoError(t, err)
			assert.Equal(t, tc.caps.Mode(), r.Mode)
			golden(t, tc.golden, r.String())
		})
	}
}

// Every rule of the pin table starts with the bridge's scope, so a frame
// from any other bridge (Docker's) is never looked at, and none of its
// sets is the bridge drop's.
func TestPinsScopedToTheBridge(t *testing.T) {
	for _, caps := range []Capabilities{portSetCaps, bridgeMetaCaps} {
		cfg := Config{Table: "legacy", Bridge: "claudenet"}
		r, err := DesiredPins(cfg, caps, testPorts, testPins)
		require.NoError(t, err)
		require.Len(t, r.Tables, 1)
		tb := r.Tables[0]
		assert.Equal(t, "legacy_pin", tb.Name)
		scope := canonRule(ibrname("claudenet").exprs)
		if caps.Mode() == ModePortSet {
			scope = canonRule(ifnameIn("iifname", expr.MetaKeyIIFNAME, "claudenet_ports").exprs)
		}
		require.Len(t, tb.Chains, 1)
		assert.Equal(t, "prerouting", tb.Chains[0].Hook)
		assert.NotEmpty(t, tb.Chains[0].Rules)
		for _, ru := range tb.Chains[0].Rules {
			assert.True(t, strings.HasPrefix(canonRule(ru.Exprs), scope), "%s: rule %q is not scoped", caps.Mode(), ru.Text)
		}
		for _, drop := range Desired(cfg, caps).Tables {
			assert.NotEqual(t, drop.Family+" "+drop.Name, tb.Family+" "+tb.Name, "the pin table is its own")
		}
	}
}

func TestPinsRefused(t *testing.T) {
	mac := net.HardwareAddr{2, 0, 0, 0, 0, 1}
	a := netip.MustParseAddr("10.88.0.10")
	for name, pins := range map[string][]Pin{
		"bad port name":      {{Port: "bad name", MAC: mac}},
		"no MAC":             {{Port: "vethA"}},
		"multicast MAC":      {{Port: "vethA", MAC: net.HardwareAddr{1, 0, 0x5e, 0, 0, 1}}},
		"IPv6 address":       {{Port: "vethA", MAC: mac, Addrs: []netip.Addr{netip.MustParseAddr("fd00::1")}}},
		"unspecified":        {{Port: "vethA", MAC: mac, Addrs: []netip.Addr{netip.IPv4Unspecified()}}},
		"two pins, one port": {{Port: "vethA", MAC: mac}, {Port: "vethA", MAC: mac}},
		"one address, two ports": {{Port: "vethA", MAC: mac, Addrs: []netip.Addr{a}},
			{Port: "vethB", MAC: net.HardwareAddr{2, 0, 0, 0, 0, 2}, Addrs: []netip.Addr{a}}},
	} {
		_, err := DesiredPins(Config{}, portSetCaps, nil, pins)
		assert.Error(t, err, name)
		var k fakeKernel
		_, err = ApplyPins(k.conf(Config{}), portSetCaps, nil, pins)
		assert.Error(t, err, name)
		_, err = SetPins(k.conf(Config{}), nil, pins)
		assert.Error(t, err, name)
		assert.Empty(t, k.batches, "%s: nothing sent", name)
	}
}

func TestApplyPinsMessagesGolden(t *testing.T) {
	var k fakeKernel
	changes, err := ApplyPins(k.conf(Config{}), portSetCaps, testPorts, testPins)
	require.NoError(t, err)
	assert.Equal(t, []string{"created table bridge box_pin"}, changes)
	require.Len(t, k.batches, 1, "everything goes in one batch")
	var b strings.Builder
	for _, m := range k.batches[0] {
		line := describeMsg(t, m)
		b.WriteString(line + "\n")
		assert.Contains(t, line, " table=box_pin", "message outside the pin table: %s", line)
	}
	golden(t, "apply-pins-port-set.golden", b.String())
}

func TestPinsOnEmptyKernel(t *testing.T) {
	var k fakeKernel
	cfg := k.conf(Config{})
	f, err := VerifyPins(cfg, portSetCaps, testPorts, testPins)
	require.NoError(t, err)
	assert.Equal(t, []Finding{{Object: "table bridge box_pin", Problem: "missing"}}, f)
	present, err := PinsPresent(cfg)
	require.NoError(t, err)
	assert.False(t, present)
	removed, err := DeletePins(cfg)
	require.NoError(t, err)
	assert.False(t, removed)
	_, err = SetPins(cfg, testPorts, testPins)
	assert.ErrorIs(t, err, ErrNotApplied)
	assert.Empty(t, k.batches, "nothing sent")
}

func TestDiffPins(t *testing.T) {
	r, err := DesiredPins(Config{}, portSetCaps, testPorts, testPins)
	require.NoError(t, err)
	want := r.Tables[0]
	for _, tc := range []struct {
		name    string
		mutate  func(*liveTable)
		finds   []Finding
		rebuild bool
	}{
		{name: "clean", mutate: func(*liveTable) {}},
		{name: "lease moved", mutate: func(l *liveTable) {
			l.elems["bind"] = []string{"vethA . 10.88.0.10", "vethA . 10.88.0.5", "vethB . 10.88.0.11"}
		}, finds: []Finding{{"table bridge box_pin set bind", "pin for vethA stale: want 10.88.0.10, 10.88.0.20, has 10.88.0.10, 10.88.0.5"}}},
		{name: "pin missing, stranger pinned", mutate: func(l *liveTable) {
			l.elems["hw"] = []string{"vethA . 02:00:00:00:00:0a", "vethX . 02:00:00:00:00:99"}
		}, finds: []Finding{
			{"table bridge box_pin set hw", "pin for vethB stale: want 02:00:00:00:00:0b, has none"},
			{"table bridge box_pin set hw", "pin for vethX stale: want none, has 02:00:00:00:00:99"},
		}},
		{name: "port set stale", mutate: func(l *liveTable) { l.elems["boxnet_ports"] = []string{"vethA", "vethB"} },
			finds: []Finding{{"table bridge box_pin set boxnet_ports", "port set stale: missing ports vethC"}}},
		{name: "pin set of the wrong type", mutate: func(l *liveTable) {
			l.sets[1] = nftSet(nil, Set{Name: "hw", Type: "ifname"}, 0)
		}, rebuild: true, finds: []Finding{{"table bridge box_pin set hw", "type is ifname, want ifname . ether_addr, lacks flag concatenation"}}},
		{name: "concatenation flag lost", mutate: func(l *liveTable) {
			s := *l.sets[2]
			s.Concatenation = false
			l.sets[2] = &s
		}, rebuild: true, finds: []Finding{{"table bridge box_pin set bind", "lacks flag concatenation"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			live := liveFrom(want)
			tc.mutate(live)
			d := diffTable(want, live)
			assert.Equal(t, tc.finds, d.findings)
			assert.Equal(t, tc.rebuild, len(d.rebuild) > 0, "rebuild: %v", d.rebuild)
			if !tc.rebuild && len(tc.finds) > 0 {
				assert.NotEmpty(t, d.elemFixes, "fixed by updating elements")
			}
		})
	}
}

// The set's live type comes from the kernel's key type magic; the names
// box uses must be the ones google/nftables decodes it to.
func TestPinSetTypesRoundTrip(t *testing.T) {
	for name, dt := range setTypes {
		assert.Equal(t, name, dt.Name)
		s := nftSet(&nftables.Table{Name: "t"}, Set{Name: "s", Type: name}, 0)
		assert.Equal(t, strings.Contains(name, " . "), s.Concatenation, name)
	}
}

// The DHCP rules come before the accept of a client without an address
// (which would let any DHCP message from 0.0.0.0 through), and read the
// message where BOOTP has its fields: htype and hlen at 1 and 2, chaddr at
// 28, past the 8 bytes of the UDP header.
func TestPinsDHCPRules(t *testing.T) {
	r, err := DesiredPins(Config{}, portSetCaps, testPorts, testPins)
	require.NoError(t, err)
	rules := r.Tables[0].Chains[0].Rules
	index := func(text string) int {
		for i, ru := range rules {
			if strings.HasSuffix(ru.Text, text) {
				return i
			}
		}
		t.Fatalf("no rule ends %q", text)
		return -1
	}
	accept := index("ip saddr 0.0.0.0 udp dport 67 accept")
	for _, tc := range []struct {
		text    string
		payload expr.Payload
		cmp     []byte
	}{
		{"udp dport 67 ip frag-off & 16383 != 0 drop", expr.Payload{Base: expr.PayloadBaseNetworkHeader, Offset: 6, Len: 2}, []byte{0, 0}},
		{"meta protocol ip udp dport 67 iifname . @th,288,48 != @hw drop", expr.Payload{DestRegister: 2, Base: expr.PayloadBaseTransportHeader, Offset: 36, Len: 6}, nil},
		{"meta protocol ip udp dport 67 @th,72,16 != 0x106 drop", expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 9, Len: 2}, []byte{1, 6}},
	} {
		i := index(tc.text)
		assert.Less(t, i, accept, "%q comes before the accept of a client without an address", tc.text)
		var found bool
		for _, e := range rules[i].Exprs {
			if p, ok := e.(*expr.Payload); ok && p.Base == tc.payload.Base && p.Offset == tc.payload.Offset {
				found = true
				assert.Equal(t, tc.payload.Len, p.Len, tc.text)
			}
			if c, ok := e.(*expr.Cmp); ok && tc.cmp != nil && c.Op == expr.CmpOpNeq {
				assert.Equal(t, tc.cmp, c.Data, tc.text)
			}
		}
		assert.True(t, found, "%q loads %d bytes at offset %d", tc.text, tc.payload.Len, tc.payload.Offset)
	}
}
