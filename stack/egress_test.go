package stack

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/box-isolation/box/stack/stacktest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/stack/egress"
	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/model"
	"github.com/box-isolation/box/stack/nft"
)

func TestAllowlistNames(t *testing.T) {
	got, err := model.ParseAllowlist(strings.NewReader("# the agent's APIs\nAPI.example.com.\n\n*.pypi.org   # packages\napi.example.com\nbücher.example\n"))
	require.NoError(t, err)
	assert.Equal(t, []string{"*.pypi.org", "api.example.com", "xn--bcher-kva.example"}, got, "lower-cased, IDNA, trailing dot and duplicate gone, sorted")
	for _, bad := range []struct{ line, why string }{
		{"localhost", "single label"},
		{"exa mple.com", "space"},
		{"http://example.com", "not a name"},
		{"*.", "wildcard"},
		{"*example.com", "wildcard"},
		{"a.*.example.com", "wildcard"},
		{"a..b", "not a DNS name"},
		{"-a.example.com", "not a DNS name"},
		{"10.0.0.1/8", "not a name"},
		{"10.0.0.1", "an address"},
		{"[2001:db8::1]", "an address"},
		{"1.2.3", "number"},
		{"a.example.com,b.example.com", "not a name"},
		{"a\x00b.example.com", "control character"},
		{"*.com", "public suffix"},
		{"*.github.io", "public suffix"},
		{"*.co.uk", "public suffix"},
		{"*.example", "public suffix"},
		{"under_score.example.com", "not a DNS name"},
	} {
		_, err := model.ParseAllowlist(strings.NewReader("ok.example.com\n# fine\n" + bad.line + "\n"))
		if assert.Error(t, err, "%q is refused", bad.line) {
			assert.Contains(t, err.Error(), "line 3:", "the line is named")
			assert.Contains(t, err.Error(), bad.why)
		}
	}
	got, err = model.ParseAllowlist(strings.NewReader("*.example.com\ngithub.io\n*.user.github.io\n"))
	require.NoError(t, err)
	assert.Equal(t, []string{"*.example.com", "*.user.github.io", "github.io"}, got, "a name at a public suffix, and a wildcard below one, are fine")
	_, err = model.ParseAllowlist(strings.NewReader("# nothing\n"))
	assert.ErrorContains(t, err, "at least one name")
	_, err = model.NormalizeNames([]string{"ok.example.com", "*.net"})
	assert.ErrorContains(t, err, "entry 2")

	id1, id2 := model.PolicyID([]string{"a.example", "b.example"}), model.PolicyID([]string{"a.example", "b.example"})
	assert.Equal(t, id1, id2, "the same names are the same policy")
	assert.NotEqual(t, id1, model.PolicyID([]string{"a.example"}))
	assert.Regexp(t, `^p[0-9a-f]{10}$`, id1)
}

func TestAllows(t *testing.T) {
	names := []string{"*.pypi.org", "api.example.com", "xn--bcher-kva.example"}
	for q, want := range map[string]bool{
		"api.example.com":            true,
		"API.Example.COM.":           true,
		"x.api.example.com":          false, // a name is that name only
		"example.com":                false,
		"files.pypi.org.":            true,
		"a.b.pypi.org":               true,
		"pypi.org":                   false, // *.x is what is under x
		"evilpypi.org":               false,
		"xn--bcher-kva.example.":     true,
		"canary.example.net":         false,
		"api.example.com.attacker.x": false,
	} {
		assert.Equal(t, want, model.Allows(names, q), q)
		assert.Equal(t, want, model.NewNameMatcher(names).Allows(q), "the matcher agrees: %s", q)
	}
	assert.True(t, egress.IsDoHName("dns.google."))
	assert.True(t, egress.IsDoHName("x.cloudflare-dns.com"))
	assert.False(t, egress.IsDoHName("canary.example.net"))
}

func TestPoliciesOnTheBridge(t *testing.T) {
	back := model.PoliciesOf(map[string]string{model.KeyEgressPolicy + "pb": "*.pypi.org,api.example.com", model.KeyDNS: "1.1.1.1", "user.box.egress.x.y": "not a policy"})
	assert.Equal(t, map[string][]string{"pb": {"*.pypi.org", "api.example.com"}}, back)
	assert.Equal(t, []netip.Addr{netip.MustParseAddr("203.0.113.53"), netip.MustParseAddr("9.9.9.9")},
		model.DnsmasqServers("no-resolv\nserver=203.0.113.53\nno-hosts\nserver=9.9.9.9\nserver=/corp/10.0.0.1\n"), "the pinned upstream, as dnsmasq reads it")
}

func TestDesiredCarriesThePolicies(t *testing.T) {
	opts, err := model.Options{}.With(map[string]string{model.KeyEgressPolicy + "pa": "canary.example.net"})
	require.NoError(t, err)
	d := model.BuildDesired(model.DefaultSubnet, opts)
	assert.NotContains(t, d.Network.Config["raw.dnsmasq"], "nftset", "dnsmasq fills no egress set: box's resolver does")
	assert.Equal(t, "canary.example.net", d.Network.Config[model.KeyEgressPolicy+"pa"])
}

func TestEgressPlan(t *testing.T) {
	withPolicy := func(name, mac, policy string) incus.Instance {
		return stacktest.FleetInst(name, func(i *incus.Instance) {
			i.Config["volatile.eth0.hwaddr"] = mac
			if policy != "" {
				i.Config[model.KeyEgress] = policy
			}
		})
	}
	insts := []incus.Instance{
		withPolicy("a", "10:66:6a:00:00:0a", "pa"),
		withPolicy("b", "10:66:6a:00:00:0b", ""),
		withPolicy("c", "10:66:6a:00:00:0c", "pa"),
		withPolicy("lost", "10:66:6a:00:00:0d", "pgone"),
		withPolicy("odd", "10:66:6a:00:00:0f", "no such; id"),
		// Its stored address, and no lease (yet): under its policy all the
		// same, or its first packets would go out open.
		stacktest.FleetInst("d", func(i *incus.Instance) {
			i.Config["volatile.eth0.hwaddr"] = "10:66:6a:00:00:0e"
			i.Config[model.KeyEgress] = "pb"
			i.ExpandedDevices["eth0"]["ipv4.address"] = "10.88.0.20"
		}),
	}
	leases := []incus.NetworkLease{
		{Address: "10.88.0.1", Type: "gateway"},
		{Address: "10.88.0.10", Hwaddr: "10:66:6a:00:00:0a", Type: "dynamic"},
		{Address: "10.88.0.11", Hwaddr: "10:66:6a:00:00:0b", Type: "dynamic"},
		{Address: "10.88.0.12", Hwaddr: "10:66:6a:00:00:0c", Type: "dynamic"},
		{Address: "10.88.0.13", Hwaddr: "10:66:6a:00:00:0d", Type: "dynamic"},
		{Address: "10.88.0.14", Hwaddr: "10:66:6a:00:00:0f", Type: "dynamic"},
	}
	policies := map[string][]string{"pa": {"x.example"}, "pb": {"y.example"}}
	ps, who, fs := egressPlanOf("boxnet", policies, nil, insts, leases)
	assert.Equal(t, []nft.EgressPolicy{
		{ID: "pa", Boxes: []netip.Addr{netip.MustParseAddr("10.88.0.10"), netip.MustParseAddr("10.88.0.12")}},
		{ID: "pb", Boxes: []netip.Addr{netip.MustParseAddr("10.88.0.20")}},
		{ID: "pgone", Boxes: []netip.Addr{netip.MustParseAddr("10.88.0.13")}},
		{ID: model.PolicyHeld, Boxes: []netip.Addr{netip.MustParseAddr("10.88.0.14")}},
	}, ps, "each box under its policy by its lease or its stored address; an open box in none; a box naming a policy the bridge lacks held closed")
	assert.Equal(t, map[netip.Addr]egress.Box{
		netip.MustParseAddr("10.88.0.10"): {Name: "a", Project: "default", Policy: "pa"},
		netip.MustParseAddr("10.88.0.12"): {Name: "c", Project: "default", Policy: "pa"},
		netip.MustParseAddr("10.88.0.13"): {Name: "lost", Project: "default", Policy: "pgone"},
		netip.MustParseAddr("10.88.0.14"): {Name: "odd", Project: "default", Policy: model.PolicyHeld},
		netip.MustParseAddr("10.88.0.20"): {Name: "d", Project: "default", Policy: "pb"},
	}, who, "the service knows each allowlisted box by its address")
	assert.Equal(t, []string{}, policies["pgone"], "a policy the bridge lacks allows nothing")
	assert.Equal(t, []string{}, policies[model.PolicyHeld], "an id that names no policy allows nothing")
	require.Len(t, fs, 2)
	assert.Equal(t, model.LayerEgress, fs[0].Layer)
	assert.Contains(t, fs[0].Problem, "pgone", "a box naming a policy the bridge lacks is named, not silently open")
	assert.Contains(t, fs[0].Problem, "held closed")
}

// TestEgressPlanFollowsTheRecord: box's record of a box's policy, not its
// config, says what it may reach; a config changed through Incus alone is
// a finding; an allowlist the bridge lost is put back from the record; a
// granted user's box follows its config.
func TestEgressPlanFollowsTheRecord(t *testing.T) {
	inst := func(name, project, mac, policy, names string) incus.Instance {
		return stacktest.FleetInst(name, func(i *incus.Instance) {
			i.Project = project
			i.Config["volatile.eth0.hwaddr"] = mac
			if policy != "" {
				i.Config[model.KeyEgress] = policy
				i.Config[model.KeyEgressNames] = names
			}
		})
	}
	x, y := []string{"x.example"}, []string{"y.example"}
	px, py := model.PolicyID(x), model.PolicyID(y)
	insts := []incus.Instance{
		// Restored by Incus alone to an open snapshot: its record's.
		inst("rolled", "", "10:66:6a:00:00:01", "", ""),
		// Its config names another allowlist than its record: the record's.
		inst("edited", "", "10:66:6a:00:00:02", px, "x.example"),
		// Recorded open, its config allowlisted: open.
		inst("opened", "", "10:66:6a:00:00:03", px, "x.example"),
		// No record: its config.
		inst("unrecorded", "", "10:66:6a:00:00:04", px, "x.example"),
		// A granted user's: its config, whatever a record says.
		inst("mine", "user-1000", "10:66:6a:00:00:05", "", ""),
	}
	leases := []incus.NetworkLease{
		{Address: "10.88.0.11", Hwaddr: "10:66:6a:00:00:01", Type: "dynamic"},
		{Address: "10.88.0.12", Hwaddr: "10:66:6a:00:00:02", Type: "dynamic"},
		{Address: "10.88.0.13", Hwaddr: "10:66:6a:00:00:03", Type: "dynamic"},
		{Address: "10.88.0.14", Hwaddr: "10:66:6a:00:00:04", Type: "dynamic"},
		{Address: "10.88.0.15", Hwaddr: "10:66:6a:00:00:05", Type: "dynamic"},
	}
	recorded := map[string]model.Policy{
		"default.rolled":  {Egress: y},
		"default.edited":  {Egress: y},
		"default.opened":  {},
		"user-1000.mine":  {Egress: x},
		"default.removed": {Egress: x},
	}
	// The bridge has x only: y, which two records name, was dropped.
	policies := map[string][]string{px: x}
	ps, who, fs := egressPlanOf("boxnet", policies, recorded, insts, leases)
	want := []nft.EgressPolicy{
		{ID: px, Boxes: []netip.Addr{netip.MustParseAddr("10.88.0.14")}},
		{ID: py, Boxes: []netip.Addr{netip.MustParseAddr("10.88.0.11"), netip.MustParseAddr("10.88.0.12")}},
	}
	slices.SortFunc(want, func(a, b nft.EgressPolicy) int { return strings.Compare(a.ID, b.ID) })
	assert.Equal(t, want, ps, "the recorded allowlist is enforced; the unrecorded box follows its config; the opened and the granted user's boxes are open")
	assert.Equal(t, y, policies[py], "an allowlist the bridge lost is put back from the record, not held closed")
	assert.Equal(t, "rolled", who[netip.MustParseAddr("10.88.0.11")].Name)
	require.Len(t, fs, 3, "each box whose config differs from its record is named: %v", fs)
	for i, want := range []string{"rolled", "edited", "opened"} {
		assert.Equal(t, "box "+want, fs[i].Object)
		assert.Contains(t, fs[i].Problem, "the record's is enforced")
	}
	assert.Contains(t, fs[0].Problem, "its config says egress open, box's record of its policy says allow y.example")
	assert.Equal(t, "box egress rolled allow y.example puts it on the box too (or box egress with the other, to change it)", fs[0].Fix)
	assert.Contains(t, fs[2].Fix, "box egress opened open")
}
