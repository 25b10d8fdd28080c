package stack

import (
	"context"
	"net/http"
	"net/netip"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/model"
	"github.com/box-isolation/box/stack/nft"
	"github.com/box-isolation/box/stack/stacktest"
)

// A hand-set raw.dnsmasq has no trailing newline when it went through a
// shell's command substitution; the next line box appends must not be
// glued to its last one.
func TestDnsmasqJoin(t *testing.T) {
	for _, tc := range []struct{ raw, lines, want string }{
		{"no-resolv\nserver=1.1.1.1", "nftset=/a/4#inet#box_egress#p\n", "no-resolv\nserver=1.1.1.1\nnftset=/a/4#inet#box_egress#p\n"},
		{"no-resolv\nserver=1.1.1.1\n", "nftset=/a/x\n", "no-resolv\nserver=1.1.1.1\nnftset=/a/x\n"},
		{"", "nftset=/a/x\n", "nftset=/a/x\n"},
		{"no-resolv", "", "no-resolv\n"},
	} {
		got := dnsmasqJoin(tc.raw, tc.lines)
		assert.Equal(t, tc.want, got, "%q + %q", tc.raw, tc.lines)
		assert.True(t, got == "" || strings.HasSuffix(got, "\n"), "every line ends")
	}
	// What box writes always ends its lines.
	d := model.BuildDesired(netip.MustParsePrefix("10.88.0.0/24"), model.Options{Egress: map[string][]string{"p": {"example.com"}}})
	assert.True(t, strings.HasSuffix(d.Network.Config["raw.dnsmasq"], "\n"))
	for _, l := range strings.Split(strings.TrimSuffix(d.Network.Config["raw.dnsmasq"], "\n"), "\n") {
		assert.NotEmpty(t, l)
	}
}

// The L-DHCP lines of raw.dnsmasq are L-DHCP's; the rest stays L-DNS's.
func TestRawDnsmasqFindings(t *testing.T) {
	want := model.BuildDesired(netip.MustParsePrefix("10.88.0.0/24"), model.Options{}).Network.Config["raw.dnsmasq"]
	assert.Empty(t, rawDnsmasqFindings("network boxnet", want, want))
	noDHCP, had := withoutDHCPLines(want)
	require.True(t, had)
	layers := func(fs []model.Finding) []model.LayerID {
		var out []model.LayerID
		for _, f := range fs {
			out = append(out, f.Layer)
			assert.False(t, f.Advisory)
			assert.Equal(t, model.FixEnsure, f.Fix)
		}
		return out
	}
	var fs []model.Finding
	fs = rawDnsmasqFindings("network boxnet", noDHCP, want)
	assert.Equal(t, []model.LayerID{model.LayerDHCP}, layers(fs), "the operator dropped the DHCP lines by hand")
	assert.Contains(t, fs[0].Problem, "lacks dhcp-ignore=tag:!known and dhcp-ignore-clid")
	// One line gone is enough.
	assert.Equal(t, []model.LayerID{model.LayerDHCP}, layers(rawDnsmasqFindings("b", strings.Replace(want, "dhcp-ignore-clid\n", "", 1), want)))
	assert.Equal(t, []model.LayerID{model.LayerDNS}, layers(rawDnsmasqFindings("b", strings.Replace(want, "no-hosts\n", "", 1), want)))
	assert.Equal(t, []model.LayerID{model.LayerDHCP, model.LayerDNS}, layers(rawDnsmasqFindings("b", strings.Replace(noDHCP, "no-hosts\n", "", 1), want)))
	// The same lines, the last without its newline (a hand edit through
	// $(...)): named, advisory.
	fs = rawDnsmasqFindings("b", strings.TrimSuffix(want, "\n"), want)
	require.Len(t, fs, 1)
	assert.True(t, fs[0].Advisory)
	assert.Contains(t, fs[0].Problem, "no newline")
	// The DHCP lines dropped by hand that way: L-DHCP's alone.
	fs = rawDnsmasqFindings("b", strings.TrimSuffix(noDHCP, "\n"), want)
	require.Len(t, fs, 1)
	assert.Equal(t, model.LayerDHCP, fs[0].Layer)
}

// Stray leases are advisory (a fixed address is never another client's,
// and a stray goes at its expiry); so is a full pool.
func TestPoolFindings(t *testing.T) {
	assert.Empty(t, poolFindings(DHCPPool{Ranges: []string{"10.88.0.2-10.88.0.254"}, Size: 253, Leased: 2}))
	var strays []DHCPLease
	for i := range 10 {
		strays = append(strays, DHCPLease{Hwaddr: "02:00:00:00:00:0" + string(rune('0'+i)), Address: netip.AddrFrom4([4]byte{10, 88, 0, byte(2 + i)})})
	}
	p := DHCPPool{LeaseFile: "/x/dnsmasq.leases", Ranges: []string{"10.88.0.2-10.88.0.11"}, Size: 10, Leased: 10, Strays: strays}
	fs := poolFindings(p)
	require.Len(t, fs, 2)
	for _, f := range fs {
		assert.Equal(t, model.LayerDHCP, f.Layer)
		assert.True(t, f.Advisory)
	}
	assert.Contains(t, fs[0].Problem, "10 lease(s) belong to no instance on boxnet: 02:00:00:00:00:00 at 10.88.0.2")
	assert.Contains(t, fs[0].Problem, "and 2 more")
	assert.Contains(t, fs[1].Problem, "is full (10 of 10 leased)")
	assert.Equal(t, "DHCP pool 10.88.0.2-10.88.0.11: 10 of 10 addresses leased; 10 lease(s) belong to no box", p.String())
}

// A dnsmasq writing to a deleted lease file, and a box's lease astray
// from its fixed address, are findings that remove a layer (not
// advisory), each with its fix.
func TestPoolFindingsLeaseFileGoneAndAstray(t *testing.T) {
	p := DHCPPool{LeaseFile: "/x/dnsmasq.leases", PID: 42, LeaseFileGone: true,
		Astray: []AstrayLease{{Box: "a", Fixed: netip.MustParseAddr("10.88.0.16"), Lease: DHCPLease{Hwaddr: "10:66:6a:00:00:01", Address: netip.MustParseAddr("10.88.0.122")}}}}
	fs := poolFindings(p)
	require.Len(t, fs, 2)
	assert.Equal(t, "dnsmasq (pid 42)", fs[0].Object)
	assert.Contains(t, fs[0].Problem, "deleted from disk (/x/dnsmasq.leases was replaced while it ran")
	assert.Equal(t, "box a", fs[1].Object)
	assert.Equal(t, "it holds a lease for 10.88.0.122, not its fixed address 10.88.0.16: its pins drop what it sends from there", fs[1].Problem)
	for _, f := range fs {
		assert.False(t, f.Advisory)
		assert.Contains(t, f.Fix, "box doctor --fix")
	}
}

// Converting a host: every box without a fixed address gets the one it
// leases now (it keeps its address and its connections), unless another
// NIC asks for it; a box with no lease, a free one. Instances box did not
// mint are left alone.
func TestFixAllAddressesKeepsTheLease(t *testing.T) {
	f, h := newClusterFake(t)
	f.Clustered = false
	f.Add("old", "", "Running", "")
	f.Add("taken", "", "Running", "")
	f.Add("gone", "", "Stopped", "")
	f.Add("fixed", "", "Running", "10.88.0.40")
	f.Add("foreign", "", "Running", "")
	f.Insts["old"].Config["volatile.eth0.hwaddr"] = "10:66:6a:00:00:0a"
	f.Insts["taken"].Config["volatile.eth0.hwaddr"] = "10:66:6a:00:00:0b"
	f.Insts["gone"].Config["volatile.eth0.hwaddr"] = "10:66:6a:00:00:0c"
	delete(f.Insts["foreign"].Config, model.Current.Tag)
	f.Leases = []incus.NetworkLease{
		{Address: "10.88.0.1", Type: "gateway"},
		{Hwaddr: "10:66:6a:00:00:0a", Address: "10.88.0.77", Type: "dynamic"},
		// A lease whose address another box was given since.
		{Hwaddr: "10:66:6a:00:00:0b", Address: "10.88.0.40", Type: "dynamic"},
	}
	ci, err := h.Cluster(context.Background())
	require.NoError(t, err)
	changes, err := h.Addresses().fixAllAddresses(context.Background(), ci)
	require.NoError(t, err)
	var got []string
	for _, c := range changes {
		got = append(got, c.String())
	}
	assert.Equal(t, []string{"updated box gone: fixed address 10.88.0.2", "updated box old: fixed address 10.88.0.77",
		"updated box taken: fixed address 10.88.0.3"}, got, "in the listing's order, each the first free address or its lease's")
	assert.Equal(t, "10.88.0.77", model.FixedAddressOf(f.Inst(t, "old")).String(), "the address it leases")
	assert.Equal(t, "10.88.0.40", model.FixedAddressOf(f.Inst(t, "fixed")).String())
	assert.False(t, model.FixedAddressOf(f.Inst(t, "foreign")).IsValid(), "not box's")
	assert.Empty(t, dhcpFindings(boxesOnly(f)), "every box has one now")
	changes, err = h.Addresses().fixAllAddresses(context.Background(), ci)
	require.NoError(t, err)
	assert.Empty(t, changes, "a second run changes nothing")
}

func boxesOnly(f *stacktest.ClusterFake) []incus.Instance {
	var out []incus.Instance
	for name, i := range f.Insts {
		if i.Config[model.Current.Tag] == "1" {
			out = append(out, *f.Render(f.Insts[name]))
		}
	}
	return out
}

// A box whose port is up with no fixed address (a granted user's, whose
// user could pick none) gets one at the next refresh; its NIC's own keys
// stay (C-TIER's box-t has port isolation off in its own NIC).
func TestFixMissingAddresses(t *testing.T) {
	f, h := newClusterFake(t)
	f.Clustered = false
	f.Add("up", "", "Running", "")
	f.Add("down", "", "Stopped", "")
	f.Insts["up"].Config["volatile.eth0.host_name"] = "veth-up"
	f.Insts["up"].Devices["eth0"] = map[string]string{"type": "nic", "name": "eth0", "network": "boxnet", "security.port_isolation": "false"}
	insts, err := h.Incus.Instances().All(context.Background())
	require.NoError(t, err)
	f.Starting = "up"
	fixed, busy, err := h.Addresses().fixMissingAddresses(context.Background(), Fleet{insts: insts})
	require.NoError(t, err, "a box Incus is starting is no failure")
	assert.False(t, fixed)
	assert.Equal(t, []string{"up"}, busy, "to be looked at again soon")
	f.Starting = ""
	fixed, busy, err = h.Addresses().fixMissingAddresses(context.Background(), Fleet{insts: insts})
	require.NoError(t, err)
	assert.True(t, fixed)
	assert.Empty(t, busy)
	up := f.Inst(t, "up")
	assert.Equal(t, "10.88.0.2", model.FixedAddressOf(up).String())
	assert.Equal(t, "false", up.Devices["eth0"]["security.port_isolation"], "its own NIC's keys are kept")
	assert.False(t, model.FixedAddressOf(f.Inst(t, "down")).IsValid(), "no port: Start or Ensure gives it one")
	n := len(f.Srv.Find(http.MethodPut, "/1.0/instances/up"))
	insts, err = h.Incus.Instances().All(context.Background())
	require.NoError(t, err)
	fixed, _, err = h.Addresses().fixMissingAddresses(context.Background(), Fleet{insts: insts})
	require.NoError(t, err)
	assert.False(t, fixed)
	assert.Len(t, f.Srv.Find(http.MethodPut, "/1.0/instances/up"), n, "nothing more to do")
}

// A DHCP drop of the pin table missing is L-DHCP's, not L-PIN's: the
// claims resting on the pins alone stand.
func TestPinFindingsOfDHCPRules(t *testing.T) {
	fs := pinFindings([]nft.Finding{
		{Object: "table bridge box_pin chain prerouting", Problem: "rule 8 missing: want `iifname @boxnet_ports meta protocol ip udp dport 67 iifname . @th,288,48 != @hw drop`"},
		{Object: "table bridge box_pin chain prerouting", Problem: "rule 10 missing: want `iifname @boxnet_ports ip saddr 0.0.0.0 udp dport 67 accept`"},
		{Object: "table bridge box_pin chain prerouting", Problem: "rule 1 missing: want `iifname @boxnet_ports iifname . ether saddr != @hw drop`"},
	}, &PinPlan{})
	require.Len(t, fs, 3)
	assert.Equal(t, []model.LayerID{model.LayerDHCP, model.LayerPin, model.LayerPin}, []model.LayerID{fs[0].Layer, fs[1].Layer, fs[2].Layer})
}
