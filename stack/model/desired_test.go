package model_test

import (
	"net/netip"
	"testing"

	"github.com/box-isolation/box/stack/model"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestOptionsFromEnv(t *testing.T) {
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	o, err := model.OptionsFromEnv(env(map[string]string{"BOX_SUBNET": "10.99.0.0/24", "BOX_DNS": "203.0.113.53, 9.9.9.9"}))
	require.NoError(t, err)
	assert.Equal(t, "10.99.0.0/24", o.Subnet.String())
	assert.Equal(t, []netip.Addr{netip.MustParseAddr("203.0.113.53"), netip.MustParseAddr("9.9.9.9")}, o.DNS)
	for _, bad := range []string{"10.99.0.0/16", "10.99.0.5/24", "fd00::/64", "nonsense"} {
		_, err := model.OptionsFromEnv(env(map[string]string{"BOX_SUBNET": bad}))
		assert.Error(t, err, bad)
	}
	_, err = model.OptionsFromEnv(env(map[string]string{"BOX_DNS": "resolver.example"}))
	assert.Error(t, err)
}

func TestDesiredStack(t *testing.T) {
	d := model.BuildDesired(netip.MustParsePrefix("10.88.0.0/24"), model.Options{DNS: []netip.Addr{netip.MustParseAddr("203.0.113.53")}})
	assert.Equal(t, "10.88.0.1", d.Gateway.String())
	c := d.Network.Config
	assert.Equal(t, "10.88.0.1/24", c["ipv4.address"])
	assert.Equal(t, "true", c["ipv4.nat"])
	assert.Equal(t, "none", c["ipv6.address"], "L-V6")
	assert.Equal(t, "false", c["ipv6.nat"], "L-V6")
	assert.Equal(t, "none", c["dns.mode"], "L-DNS: no per-instance records")
	assert.Equal(t, "no-resolv\nno-hosts\ndhcp-ignore-names\nserver=203.0.113.53\ndhcp-ignore=tag:!known\ndhcp-ignore-clid\n", c["raw.dnsmasq"],
		"L-DNS: upstream pinned, the host's hosts file unread, DHCP hostnames never become names; L-DHCP: known clients only, by hardware address")
	assert.Equal(t, "box-isolate", c["security.acls"])
	assert.Equal(t, "drop", c["security.acls.default.ingress.action"])
	assert.Equal(t, "allow", c["security.acls.default.egress.action"])

	var drops []string
	for _, r := range d.ACL.Egress {
		if r.Action == "drop" {
			drops = append(drops, r.Destination)
		}
	}
	assert.Equal(t, []string{"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "169.254.0.0/16"}, drops)

	// The profile is the NIC with port isolation and the root disk, nothing
	// else: no security.* key but the NIC's isolation and the guest API
	// off, no other device.
	assert.Len(t, d.Profile.Devices, 2)
	assert.Equal(t, "true", d.Profile.Devices["eth0"]["security.port_isolation"])
	assert.Equal(t, "boxnet", d.Profile.Devices["eth0"]["network"])
	assert.Equal(t, "/", d.Profile.Devices["root"]["path"])
	assert.Equal(t, map[string]string{"security.guestapi": "false"}, d.Profile.Config)
}

// The operator's choices are stored on the bridge and are what a later run
// without the environment converges on; what the environment says wins.
func TestOptionsStoredOnTheBridge(t *testing.T) {
	chosen := model.Options{DNS: []netip.Addr{netip.MustParseAddr("192.168.20.53"), netip.MustParseAddr("10.0.0.53")},
		Subnet: netip.MustParsePrefix("10.99.0.0/24")}
	d := model.BuildDesired(chosen.Subnet, chosen)
	stored := d.Network.Config
	require.Equal(t, "192.168.20.53,10.0.0.53", stored[model.KeyDNS])
	require.Equal(t, "10.99.0.0/24", stored[model.KeySubnet])

	none, err := model.Options{}.With(stored)
	require.NoError(t, err)
	assert.Equal(t, chosen.DNS, none.DNS, "no BOX_DNS: the stored choice")
	assert.Equal(t, chosen.Subnet, none.Subnet)
	again := model.BuildDesired(chosen.Subnet, none)
	assert.Equal(t, d.Network.Config["raw.dnsmasq"], again.Network.Config["raw.dnsmasq"], "doctor without the environment wants what setup-host made")

	now, err := model.Options{DNS: []netip.Addr{netip.MustParseAddr("9.9.9.9")}}.With(stored)
	require.NoError(t, err)
	assert.Equal(t, []netip.Addr{netip.MustParseAddr("9.9.9.9")}, now.DNS, "BOX_DNS given now wins")

	def := model.BuildDesired(chosen.Subnet, model.Options{})
	assert.NotContains(t, def.Network.Config, model.KeyDNS, "nothing chosen, nothing stored: the defaults stay the defaults")
	assert.Contains(t, def.Network.Config["raw.dnsmasq"], "server=1.1.1.1")

	_, err = model.Options{}.With(map[string]string{model.KeyDNS: "not-an-address"})
	assert.ErrorContains(t, err, "BOX_DNS=... box setup-host")
}
