package hostscan

import (
	"encoding/binary"
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/xt"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// The expressions below are what nft(8) and iptables-nft put in the
// kernel for the rule each test names (as `nft --debug=netlink` shows).

var (
	ipNat   = &nftables.Table{Family: nftables.TableFamilyIPv4, Name: "nat"}
	inetNat = &nftables.Table{Family: nftables.TableFamilyINet, Name: "fw"}
	prerout = &nftables.Chain{Name: "prerouting"}
)

func be16(p uint16) []byte { return []byte{byte(p >> 8), byte(p)} }

func l4(proto byte) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
	}
}

func dport(reg uint32) expr.Any {
	return &expr.Payload{OperationType: expr.PayloadLoad, DestRegister: reg, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2}
}

func rule(t *nftables.Table, exprs ...[]expr.Any) *nftables.Rule {
	r := &nftables.Rule{Table: t, Chain: prerout, Handle: 4}
	for _, e := range exprs {
		r.Exprs = append(r.Exprs, e...)
	}
	return r
}

func dnatTo(addr net.IP, port uint16) []expr.Any {
	fam, a := uint32(unix.NFPROTO_IPV4), []byte(addr.To4())
	if a == nil {
		fam, a = unix.NFPROTO_IPV6, addr.To16()
	}
	return []expr.Any{
		&expr.Immediate{Register: 1, Data: a},
		&expr.Immediate{Register: 2, Data: be16(port)},
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: fam, RegAddrMin: 1, RegProtoMin: 2, Specified: true},
	}
}

func decoded(t *testing.T, r *nftables.Rule, sets map[string][]PortRange) Forward {
	t.Helper()
	f, ok := DecodeRule(r, sets)
	require.True(t, ok, "a destination NAT rule")
	return f
}

func TestDecodeRuleNft(t *testing.T) {
	// tcp dport 8080 dnat to 10.1.2.3:80
	f := decoded(t, rule(ipNat, l4(unix.IPPROTO_TCP), []expr.Any{
		dport(1), &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: be16(8080)},
	}, dnatTo(net.ParseIP("10.1.2.3"), 80)), nil)
	assert.Equal(t, Forward{Family: "ip", Table: "nat", Chain: "prerouting", Handle: 4, Kind: KindDNAT,
		Proto: "tcp", Ports: []PortRange{{8080, 8080}}, ToAddr: addr("10.1.2.3"), ToPorts: PortRange{80, 80}}, f)
	assert.Equal(t, "ip nat prerouting: tcp dport 8080 dnat to 10.1.2.3:80", f.String())
	assert.False(t, f.AllPorts())
}

func TestDecodeRuleInetV6Registers(t *testing.T) {
	// inet: iifname "eth*" ip6 daddr 2001:db8::1 udp dport 5000-5010
	// dnat ip6 to [fd00::9]:6000-6010, with nft's 32-bit registers mixed
	// with the 128-bit ones.
	f := decoded(t, rule(inetNat, []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte("eth")},
		&expr.Payload{OperationType: expr.PayloadLoad, DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 24, Len: 16},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: net.ParseIP("2001:db8::1")},
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: unix.NFT_REG32_00},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_UDP}},
		dport(unix.NFT_REG32_00),
		&expr.Range{Op: expr.CmpOpEq, Register: 1, FromData: be16(5000), ToData: be16(5010)},
		&expr.Immediate{Register: 1, Data: net.ParseIP("fd00::9")},
		&expr.Immediate{Register: 2, Data: be16(6000)},
		&expr.Immediate{Register: unix.NFT_REG32_08 + 1, Data: be16(6010)}, // NFT_REG_3 is 32-bit register 08
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV6, RegAddrMin: 1, RegProtoMin: 2, RegProtoMax: unix.NFT_REG32_08 + 1},
	}), nil)
	assert.Equal(t, `inet fw prerouting: iifname "eth*" daddr 2001:db8::1 udp dport 5000-5010 dnat to [fd00::9]:6000-6010`, f.String())
}

func TestDecodeRuleSets(t *testing.T) {
	// tcp dport { 80, 443 } dnat to 10.0.0.9
	r := rule(ipNat, l4(unix.IPPROTO_TCP), []expr.Any{
		dport(1), &expr.Lookup{SourceRegister: 1, SetName: "__set0"},
		&expr.Immediate{Register: 1, Data: net.ParseIP("10.0.0.9").To4()},
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1},
	})
	f := decoded(t, r, map[string][]PortRange{"__set0": {{80, 80}, {443, 443}}})
	assert.Equal(t, "ip nat prerouting: tcp dport 80,443 dnat to 10.0.0.9", f.String())

	f = decoded(t, r, nil)
	assert.True(t, f.PortUnknown, "a set it could not read")
	assert.Equal(t, []string{"destination port set @__set0 not read"}, f.Notes)
	assert.Equal(t, "ip nat prerouting: tcp port unknown dnat to 10.0.0.9", f.String())

	// dnat to tcp dport map { 80 : 10.0.0.1, 81 : 10.0.0.2 }
	f = decoded(t, rule(ipNat, l4(unix.IPPROTO_TCP), []expr.Any{
		dport(1), &expr.Lookup{SourceRegister: 1, DestRegister: 1, IsDestRegSet: true, SetName: "__map0"},
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1},
	}), map[string][]PortRange{"__map0": {{80, 81}}})
	assert.Equal(t, []PortRange{{80, 81}}, f.Ports)
	assert.False(t, f.ToAddr.IsValid())
	assert.Equal(t, []string{"new address from a map"}, f.Notes)
}

func TestDecodeRuleUnknownPorts(t *testing.T) {
	nat := dnatTo(net.ParseIP("10.0.0.9"), 0)
	for name, exprs := range map[string][]expr.Any{
		"tcp dport != 22":  {dport(1), &expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: be16(22)}},
		"tcp dport != 1-9": {dport(1), &expr.Range{Op: expr.CmpOpNeq, Register: 1, FromData: be16(1), ToData: be16(9)}},
		"tcp dport != @s":  {dport(1), &expr.Lookup{SourceRegister: 1, SetName: "s", Invert: true}},
		"ip daddr . tcp dport @s": {
			&expr.Payload{OperationType: expr.PayloadLoad, DestRegister: unix.NFT_REG32_00, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
			dport(unix.NFT_REG32_01),
			&expr.Lookup{SourceRegister: unix.NFT_REG32_00, SetName: "s"},
		},
		"-m multiport --dports 1,2": {&expr.Match{Name: "multiport", Rev: 1, Info: &xt.Unknown{}}},
	} {
		f := decoded(t, rule(ipNat, l4(unix.IPPROTO_TCP), exprs, nat), map[string][]PortRange{"s": {{1, 1}}})
		assert.True(t, f.PortUnknown, name)
		assert.NotEmpty(t, f.Notes, name)
		assert.False(t, f.AllPorts(), name)
	}
}

func TestDecodeRuleIptablesNft(t *testing.T) {
	// Docker's: -A DOCKER ! -i docker0 -p tcp -m tcp --dport 8080
	//           -j DNAT --to-destination 172.17.0.2:80
	f := decoded(t, rule(ipNat, []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: []byte("docker0\x00")},
		&expr.Payload{OperationType: expr.PayloadLoad, DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 9, Len: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
		&expr.Match{Name: "tcp", Info: &xt.Tcp{SrcPorts: [2]uint16{0, 65535}, DstPorts: [2]uint16{8080, 8080}}},
		&expr.Counter{},
		&expr.Target{Name: "DNAT", Rev: 2, Info: &xt.NatRange2{NatRange: xt.NatRange{
			Flags: uint(xt.NatRangeMapIPs | xt.NatRangeProtoSpecified),
			MinIP: net.ParseIP("172.17.0.2").To4(), MaxIP: net.ParseIP("172.17.0.2").To4(), MinPort: 80, MaxPort: 80,
		}}},
	}), nil)
	assert.Equal(t, `ip nat prerouting: iifname != "docker0" tcp dport 8080 dnat to 172.17.0.2:80 (iptables-nft)`, f.String())
	assert.True(t, f.Compat)

	// -p udp -m udp --dport 53 -j REDIRECT --to-ports 5353 (rev 0 target)
	f = decoded(t, rule(ipNat, []expr.Any{
		&expr.Match{Name: "udp", Info: &xt.Udp{SrcPorts: [2]uint16{0, 65535}, DstPorts: [2]uint16{53, 53}}},
		&expr.Target{Name: "REDIRECT", Info: &xt.NatIPv4MultiRangeCompat{{
			Flags: uint(xt.NatRangeProtoSpecified), MinPort: 5353, MaxPort: 5353,
		}}},
	}), nil)
	assert.Equal(t, "ip nat prerouting: udp dport 53 redirect to :5353 (iptables-nft)", f.String())

	// -p tcp -j DNAT --to-destination 10.9.9.9 (every port), and
	// -p tcp ! --dport 22 -j DNAT ...
	f = decoded(t, rule(ipNat, []expr.Any{
		&expr.Match{Name: "tcp", Info: &xt.Tcp{SrcPorts: [2]uint16{0, 65535}, DstPorts: [2]uint16{0, 65535}}},
		&expr.Target{Name: "DNAT", Info: &xt.NatIPv4MultiRangeCompat{{Flags: uint(xt.NatRangeMapIPs), MinIP: net.ParseIP("10.9.9.9").To4()}}},
	}), nil)
	assert.True(t, f.AllPorts())
	assert.Equal(t, "ip nat prerouting: tcp any port dnat to 10.9.9.9 (iptables-nft)", f.String())
	f = decoded(t, rule(ipNat, []expr.Any{
		&expr.Match{Name: "tcp", Info: &xt.Tcp{DstPorts: [2]uint16{22, 22}, InvFlags: xt.TcpInvDestPorts}},
		&expr.Target{Name: "DNAT", Info: &xt.Unknown{}},
	}), nil)
	assert.True(t, f.PortUnknown)
	assert.Contains(t, f.Notes, "target range not read")
}

func TestDecodeRuleRedirect(t *testing.T) {
	// iif 3 tcp dport 80 redirect to :8080
	f := decoded(t, rule(ipNat, []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIF, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binary.NativeEndian.AppendUint32(nil, 3)},
	}, l4(unix.IPPROTO_TCP), []expr.Any{
		dport(1), &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: be16(80)},
		&expr.Immediate{Register: 1, Data: be16(8080)},
		&expr.Redir{RegisterProtoMin: 1},
	}), nil)
	assert.Equal(t, "ip nat prerouting: iif 3 tcp dport 80 redirect to :8080", f.String())
}

func TestDecodeRuleNotForwards(t *testing.T) {
	for name, exprs := range map[string][]expr.Any{
		"accept": {&expr.Verdict{Kind: expr.VerdictAccept}},
		"snat": {
			&expr.Immediate{Register: 1, Data: []byte{10, 0, 0, 1}},
			&expr.NAT{Type: expr.NATTypeSourceNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1},
		},
		"masquerade":    {&expr.Masq{}},
		"iptables SNAT": {&expr.Target{Name: "SNAT", Info: &xt.Unknown{}}},
	} {
		_, ok := DecodeRule(rule(ipNat, l4(unix.IPPROTO_TCP), exprs), nil)
		assert.False(t, ok, name)
	}
}

func TestSetPortRanges(t *testing.T) {
	el := func(p uint16, end bool) nftables.SetElement {
		return nftables.SetElement{Key: be16(p), IntervalEnd: end}
	}
	got, ok := SetPortRanges([]nftables.SetElement{el(443, false), el(80, false)}, false)
	require.True(t, ok)
	assert.Equal(t, []PortRange{{80, 80}, {443, 443}}, got)

	// { 22, 8000-8010, 60000-65535 } as the kernel dumps it: each range
	// closed by an end element one past it, the last open, and nft's
	// leading end element at 0.
	got, ok = SetPortRanges([]nftables.SetElement{
		el(60000, false), el(8011, true), el(8000, false), el(23, true), el(22, false), el(0, true),
	}, true)
	require.True(t, ok)
	assert.Equal(t, []PortRange{{22, 22}, {8000, 8010}, {60000, 65535}}, got)

	_, ok = SetPortRanges([]nftables.SetElement{{Key: []byte{10, 0, 0, 1}}}, false)
	assert.False(t, ok, "not a port key")
}

func TestLegacyTables(t *testing.T) {
	dir := t.TempDir()
	got, err := legacyTables(dir)
	require.NoError(t, err)
	assert.Empty(t, got, "no names files: the legacy modules are not loaded")

	require.NoError(t, os.WriteFile(filepath.Join(dir, "ip_tables_names"), []byte("nat\nfilter\n"), 0o444))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "ip6_tables_names"), nil, 0o444))
	got, err = legacyTables(dir)
	require.NoError(t, err)
	assert.Equal(t, []string{"ip/nat", "ip/filter"}, got)
}
