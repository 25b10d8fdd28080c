package hostscan

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseDhclientLeases(t *testing.T) {
	f, err := os.Open("testdata/root-dhcp/var/lib/dhcp/dhclient.eth0.leases")
	require.NoError(t, err)
	defer f.Close()
	ls, err := ParseDhclientLeases(f)
	require.NoError(t, err)
	assert.Equal(t, []DHCPLease{
		{Server: addr("10.0.2.2"), Address: addr("10.0.2.15"), Interface: "eth0"},
		{Server: addr("10.0.2.2"), Address: addr("10.0.2.16"), Interface: "eth0"},
		{Server: addr("192.168.7.1"), Address: addr("192.168.7.20"), Interface: "eth0"},
	}, ls, "the lease without a server identifier is left out; braces in strings do not count")

	f6, err := os.Open("testdata/root-dhcp/var/lib/dhcp/dhclient6.eth0.leases")
	require.NoError(t, err)
	defer f6.Close()
	ls, err = ParseDhclientLeases(f6)
	require.NoError(t, err)
	assert.Empty(t, ls, "lease6 blocks and their nested blocks are skipped")

	for _, bad := range []string{"lease {\n  interface \"x\";\n", "}\n"} {
		_, err := ParseDhclientLeases(strings.NewReader(bad))
		assert.Error(t, err, "%q", bad)
	}
}

func TestParseNetworkdLease(t *testing.T) {
	f, err := os.Open("testdata/root-dhcp/run/systemd/netif/leases/2")
	require.NoError(t, err)
	defer f.Close()
	l, err := ParseNetworkdLease(f)
	require.NoError(t, err)
	assert.Equal(t, DHCPLease{Server: addr("10.20.0.2"), Address: addr("10.20.0.44")}, l)

	l, err = ParseNetworkdLease(strings.NewReader("ADDRESS=10.0.0.1\nSERVER_ADDRESS=bogus\nnoise\n"))
	require.NoError(t, err)
	assert.False(t, l.Server.IsValid())
}

func TestDHCPServers(t *testing.T) {
	ls, err := DHCPServers(filepath.Join("testdata", "root-dhcp"))
	require.NoError(t, err)
	assert.Equal(t, []DHCPLease{
		{Server: addr("10.0.2.2"), Address: addr("10.0.2.16"), Interface: "eth0", Client: ClientDhclient,
			File: "/var/lib/dhcp/dhclient.eth0.leases"},
		{Server: addr("192.168.7.1"), Address: addr("192.168.7.20"), Interface: "eth0", Client: ClientDhclient,
			File: "/var/lib/dhcp/dhclient.eth0.leases"},
		{Server: addr("172.16.5.254"), Address: addr("172.16.5.10"), Interface: "ens3", Client: ClientDhclient,
			File: "/var/lib/dhclient/dhclient--ens3.lease"},
		{Server: addr("10.20.0.2"), Address: addr("10.20.0.44"), IfIndex: 2, Client: ClientNetworkd,
			File: "/run/systemd/netif/leases/2"},
		{Server: addr("192.168.1.1"), Address: addr("192.168.1.23"), Interface: "wlan0", Client: ClientNetworkManager,
			File: "/var/lib/NetworkManager/internal-6a1f0e7e-7c2b-4d1e-9a2c-2f1e0c7b9a11-wlan0.lease"},
		{Server: addr("10.44.0.1"), Address: addr("10.44.0.9"), Interface: "eth1", Client: ClientNetworkManager,
			File: "/var/lib/NetworkManager/dhclient-0c9d4b7a-1e2f-4a3b-8c4d-5e6f7a8b9c0d-eth1.lease"},
	}, ls)

	ls, err = DHCPServers(t.TempDir())
	assert.NoError(t, err, "no lease files at all is no error")
	assert.Empty(t, ls)
}

func TestDHCPServersBadFile(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "var/lib/dhcp")
	require.NoError(t, os.MkdirAll(dir, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "broken.leases"), []byte("lease {\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "good.leases"),
		[]byte("lease {\n option dhcp-server-identifier 10.1.1.1;\n}\n"), 0o644))
	ls, err := DHCPServers(root)
	assert.ErrorContains(t, err, "/var/lib/dhcp/broken.leases")
	assert.Equal(t, []DHCPLease{{Server: addr("10.1.1.1"), Client: ClientDhclient, File: "/var/lib/dhcp/good.leases"}}, ls,
		"the readable files' leases still come back")
}
