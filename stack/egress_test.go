package stack

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/nft"
)

func TestAllowlistNames(t *testing.T) {
	got, err := ParseAllowlist(strings.NewReader("# the agent's APIs\nAPI.example.com.\n\n*.pypi.org   # packages\napi.example.com\n"))
	require.NoError(t, err)
	assert.Equal(t, []string{"*.pypi.org", "api.example.com"}, got, "lower-cased, trailing dot and duplicate gone, sorted")
	for _, bad := range []string{"localhost", "exa mple.com", "http://example.com", "*.", "*example.com", "a..b", "-a.example.com", "10.0.0.1/8", "a.example.com,b.example.com"} {
		_, err := ParseAllowlist(strings.NewReader(bad + "\n"))
		assert.Error(t, err, "%q is refused", bad)
	}
	_, err = ParseAllowlist(strings.NewReader("# nothing\n"))
	assert.ErrorContains(t, err, "at least one name")
	// An address is a name of digits here: allowed by the syntax, and
	// harmless (dnsmasq never answers for it).
	id1, id2 := PolicyID([]string{"a.example", "b.example"}), PolicyID([]string{"a.example", "b.example"})
	assert.Equal(t, id1, id2, "the same names are the same policy")
	assert.NotEqual(t, id1, PolicyID([]string{"a.example"}))
	assert.Regexp(t, `^p[0-9a-f]{10}$`, id1)
}

func TestNftsetLines(t *testing.T) {
	got := nftsetLines(map[string][]string{"pb": {"*.pypi.org", "api.example.com"}, "pa": {"canary.example.net"}}, "box_egress")
	assert.Equal(t, "nftset=/canary.example.net/4#inet#box_egress#allow_pa\nnftset=/api.example.com/pypi.org/4#inet#box_egress#allow_pb\n", got)
	assert.Empty(t, nftsetLines(nil, "box_egress"))

	// One entry per domain, naming every policy that allows it: dnsmasq
	// uses the longest matching entry only.
	got = nftsetLines(map[string][]string{"pa": {"canary.example.net"}, "pb": {"canary.example.net", "x.example"}, "pc": {"*.example.net"}}, "t")
	assert.Equal(t, "nftset=/canary.example.net/4#inet#t#allow_pa,4#inet#t#allow_pb,4#inet#t#allow_pc\n"+
		"nftset=/x.example/4#inet#t#allow_pb\n"+
		"nftset=/example.net/4#inet#t#allow_pc\n", got, "a name under another policy's suffix fills that policy's set too")

	// A long allowlist is split over lines dnsmasq takes, all for one set.
	var many []string
	for i := range 300 {
		many = append(many, fmt.Sprintf("n%05d.example.net", i))
	}
	lines := strings.Split(strings.TrimSuffix(nftsetLines(map[string][]string{"pl": many}, "box_egress"), "\n"), "\n")
	assert.Greater(t, len(lines), 5)
	seen := 0
	for _, l := range lines {
		assert.LessOrEqual(t, len(l)+1, maxDnsmasqLine, l)
		assert.True(t, strings.HasSuffix(l, "/4#inet#box_egress#allow_pl"), l)
		seen += strings.Count(l, ".example.net")
	}
	assert.Equal(t, 300, seen, "every name on some line")

	// Stored on the bridge and back.
	back := policiesOf(map[string]string{keyEgressPolicy + "pb": "*.pypi.org,api.example.com", KeyDNS: "1.1.1.1", "user.box.egress.x.y": "not a policy"})
	assert.Equal(t, map[string][]string{"pb": {"*.pypi.org", "api.example.com"}}, back)
}

func TestDesiredCarriesThePolicies(t *testing.T) {
	opts, err := Options{}.With(map[string]string{keyEgressPolicy + "pa": "canary.example.net"})
	require.NoError(t, err)
	d := BuildDesired(DefaultSubnet, opts)
	assert.Contains(t, d.Network.Config["raw.dnsmasq"], "nftset=/canary.example.net/4#inet#box_egress#allow_pa\n")
	assert.Equal(t, "canary.example.net", d.Network.Config[keyEgressPolicy+"pa"])
	assert.NotContains(t, BuildDesired(DefaultSubnet, Options{}).Network.Config["raw.dnsmasq"], "nftset", "no policy, no line")
}

func TestEgressPlan(t *testing.T) {
	withPolicy := func(name, mac, policy string) incus.Instance {
		return fleetInst(name, func(i *incus.Instance) {
			i.Config["volatile.eth0.hwaddr"] = mac
			if policy != "" {
				i.Config[KeyEgress] = policy
			}
		})
	}
	insts := []incus.Instance{
		withPolicy("a", "10:66:6a:00:00:0a", "pa"),
		withPolicy("b", "10:66:6a:00:00:0b", ""),
		withPolicy("c", "10:66:6a:00:00:0c", "pa"),
		withPolicy("lost", "10:66:6a:00:00:0d", "pgone"),
	}
	leases := []incus.NetworkLease{
		{Address: "10.88.0.1", Type: "gateway"},
		{Address: "10.88.0.10", Hwaddr: "10:66:6a:00:00:0a", Type: "dynamic"},
		{Address: "10.88.0.11", Hwaddr: "10:66:6a:00:00:0b", Type: "dynamic"},
		{Address: "10.88.0.12", Hwaddr: "10:66:6a:00:00:0c", Type: "dynamic"},
		{Address: "10.88.0.13", Hwaddr: "10:66:6a:00:00:0d", Type: "dynamic"},
	}
	ps, fs := egressPlanOf("boxnet", map[string][]string{"pa": {"x.example"}, "pb": {"y.example"}}, insts, leases)
	assert.Equal(t, []nft.EgressPolicy{
		{ID: "pa", Boxes: []netip.Addr{netip.MustParseAddr("10.88.0.10"), netip.MustParseAddr("10.88.0.12")}},
		{ID: "pb"},
	}, ps, "each box under its policy by its lease; an open box in none; a policy with no box keeps its sets")
	require.Len(t, fs, 1)
	assert.Equal(t, LayerEgress, fs[0].Layer)
	assert.Contains(t, fs[0].Problem, "pgone", "a box naming a policy the bridge lacks is named, not silently open")
}

func TestWithoutNftset(t *testing.T) {
	raw := "no-resolv\nserver=203.0.113.53\nnftset=/a.example/4#inet#box_egress#allow_pa\nlog-queries\nnftset=/b.example/4#inet#box_egress#allow_pb\n"
	assert.Equal(t, "no-resolv\nserver=203.0.113.53\nlog-queries\n", withoutNftset(raw),
		"a new policy rewrites only the nftset lines: everything else (drift included) stays for doctor to see")
	assert.Empty(t, withoutNftset(""))
}
