package nft

import (
	"net"
	"net/netip"
	"os/exec"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"

	"github.com/box-isolation/box/internal/testenv/tier"
)

// The counting chain counts what the host firewall let in, and nothing it
// dropped: the drill's witness after the filter.
func TestPrivilegedCounters(t *testing.T) {
	requireRoot(t)
	w := newWorld(t)
	caps, err := Probe(w.cfg)
	require.NoError(t, err)
	w.host.serve(t, "udp", "10.99.0.1:53", "host-dns")
	w.host.serve(t, "tcp", "10.99.0.1:22", "host-ssh")
	_, err = Apply(w.cfg, caps, w.ports(t))
	require.NoError(t, err)

	src, gw := netip.MustParseAddr("10.99.0.2"), netip.MustParseAddr("10.99.0.1")
	dns := CountKey{Src: src, Dst: gw, Proto: "udp", Port: 53}
	ssh := CountKey{Src: src, Dst: gw, Proto: "tcp", Port: 22}
	echo := CountKey{Src: src, Dst: gw, Proto: "icmp"}
	table := CounterPrefix + w.run
	require.NoError(t, InstallCounters(int(w.host.Handle), table, []CountKey{dns, ssh, echo}))
	t.Cleanup(func() { _, _ = DeleteCounters(int(w.host.Handle), table) })

	assert.Equal(t, reached, w.a.dial(t, "udp", "10.99.0.1:53", "host-dns"), "DNS to the gateway passes the filter")
	assert.Equal(t, silent, w.a.dial(t, "tcp", "10.99.0.1:22", "host-ssh"), "ssh on the gateway is dropped")
	assert.Equal(t, silent, w.a.ping(t, "10.99.0.1"), "echo to the gateway is dropped")
	got, err := ReadCounters(int(w.host.Handle), table)
	require.NoError(t, err)
	assert.NotZero(t, got[dns.String()], "counted after the filter: %v", got)
	assert.Zero(t, got[ssh.String()], "dropped before the counting chain: %v", got)
	assert.Zero(t, got[echo.String()], "dropped before the counting chain: %v", got)

	// With the host firewall gone the same ssh attempt is counted.
	_, err = Delete(w.cfg)
	require.NoError(t, err)
	assert.Equal(t, reached, w.a.dial(t, "tcp", "10.99.0.1:22", "host-ssh"))
	got, err = ReadCounters(int(w.host.Handle), table)
	require.NoError(t, err)
	assert.NotZero(t, got[ssh.String()], "counted once nothing drops it: %v", got)

	// A port the host forwards elsewhere (DNAT) is counted by what the box
	// aimed at, on the forward path.
	{
		nft := tier.Tool(t, "nft", "nftables")
		require.NoError(t, w.host.Sysctl("net.ipv4.ip_forward", "1"))
		rt := w.d.Netlink(t)
		require.NoError(t, rt.RouteAdd(&netlink.Route{LinkIndex: w.d.Link(t, "eth0").Attrs().Index,
			Dst: &net.IPNet{IP: net.IPv4(10, 99, 0, 0), Mask: net.CIDRMask(24, 32)}, Gw: net.IPv4(10, 99, 1, 1)}))
		w.d.serve(t, "tcp", "10.99.1.3:22", "forwarded")
		out, err := exec.Command("ip", "netns", "exec", w.host.Name, nft, "add table ip portfwd; add chain ip portfwd prerouting { type nat hook prerouting priority dstnat; }; add rule ip portfwd prerouting ip daddr 10.99.0.1 tcp dport 2222 dnat to 10.99.1.3:22").CombinedOutput()
		require.NoError(t, err, "%s", out)
		fwd := CountKey{Src: src, Dst: gw, Proto: "tcp", Port: 2222}
		require.NoError(t, InstallCounters(int(w.host.Handle), table+"f", []CountKey{fwd}))
		assert.Equal(t, reached, w.a.dial(t, "tcp", "10.99.0.1:2222", "forwarded"), "the forward works")
		got, err = ReadCounters(int(w.host.Handle), table+"f")
		require.NoError(t, err)
		assert.NotZero(t, got[fwd.String()], "counted on the forward path by its original destination: %v", got)
	}

	removed, err := DeleteCounters(int(w.host.Handle), "")
	require.NoError(t, err)
	assert.Subset(t, removed, []string{"table inet " + table})
	require.Error(t, InstallCounters(int(w.host.Handle), "box", nil), "only drill_ tables")
}
