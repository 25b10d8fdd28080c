package hostscan

import (
	"encoding/binary"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/internal/testenv/tier"
)

// The /proc/net fixtures were printed by a little-endian kernel.
func requireLittleEndian(t *testing.T) {
	t.Helper()
	var b [2]byte
	binary.NativeEndian.PutUint16(b[:], 1)
	if b[0] != 1 {
		tier.Unavailable(t, "the /proc/net fixtures are in little-endian word order: run on a little-endian machine (amd64, arm64)")
	}
}

func parseFixture(t *testing.T, name, proto string, family int) []Listener {
	t.Helper()
	f, err := os.Open(filepath.Join("testdata", name))
	require.NoError(t, err)
	defer f.Close()
	ls, err := ParseProcNet(f, proto, family)
	require.NoError(t, err)
	return ls
}

func addr(s string) netip.Addr { return netip.MustParseAddr(s) }

func TestParseProcNetTCP(t *testing.T) {
	requireLittleEndian(t)
	assert.Equal(t, []Listener{
		{Proto: "tcp", Family: 4, Addr: addr("0.0.0.0"), Port: 22, Inode: 21311},
		{Proto: "tcp", Family: 4, Addr: addr("127.0.0.53"), Port: 53, Inode: 19012, UID: 991, Loopback: true},
		{Proto: "tcp", Family: 4, Addr: addr("10.0.0.1"), Port: 8080, Inode: 40001, UID: 1000},
	}, parseFixture(t, "proc_net_tcp", "tcp", 4), "LISTEN only: the established and time-wait sockets are left out")
}

func TestParseProcNetTCP6(t *testing.T) {
	requireLittleEndian(t)
	ls := parseFixture(t, "proc_net_tcp6", "tcp", 6)
	assert.Equal(t, []Listener{
		{Proto: "tcp", Family: 6, Addr: addr("::"), Port: 22, Inode: 21313},
		{Proto: "tcp", Family: 6, Addr: addr("::1"), Port: 631, Inode: 22001, Loopback: true},
		{Proto: "tcp", Family: 6, Addr: addr("10.0.0.5"), Port: 8081, Inode: 40002, UID: 1000},
	}, ls)
	assert.True(t, ls[0].Addr.Is6() && ls[0].Wildcard(), "the v6 wildcard stays ::, apart from 0.0.0.0")
	assert.True(t, ls[2].Addr.Is4(), "a v4-mapped address is given as IPv4")
}

func TestParseProcNetUDP(t *testing.T) {
	requireLittleEndian(t)
	assert.Equal(t, []Listener{
		{Proto: "udp", Family: 4, Addr: addr("127.0.0.53"), Port: 53, Inode: 19011, UID: 991, Loopback: true},
		{Proto: "udp", Family: 4, Addr: addr("0.0.0.0"), Port: 68, Inode: 18000},
		{Proto: "udp", Family: 4, Addr: addr("10.0.0.1"), Port: 5353, Inode: 40003},
	}, parseFixture(t, "proc_net_udp", "udp", 4), "the connected socket is left out")
	assert.Equal(t, []Listener{
		{Proto: "udp", Family: 6, Addr: addr("::"), Port: 5353, Inode: 17001, UID: 107},
		{Proto: "udp", Family: 6, Addr: addr("fe80::1"), Port: 547, Inode: 17002},
	}, parseFixture(t, "proc_net_udp6", "udp", 6))
}

func TestParseProcNetErrors(t *testing.T) {
	for name, in := range map[string]string{
		"short line":   "sl local\n 0: 00000000:0016 00000000:0000 0A\n",
		"bad address":  "sl\n 0: 0000:0016 00000000:0000 0A 0:0 0:0 0 0 0 1\n",
		"bad inode":    "sl\n 0: 00000000:0016 00000000:0000 0A 0:0 0:0 0 0 0 x\n",
		"no port":      "sl\n 0: 00000000 00000000:0000 0A 0:0 0:0 0 0 0 1\n",
		"bad state":    "sl\n 0: 00000000:0016 00000000:0000 ZZ 0:0 0:0 0 0 0 1\n",
		"v6 too short": "sl\n 0: 00000000:0016 00000000:0000 0A 0:0 0:0 0 0 0 1\n",
	} {
		family := 4
		if strings.HasPrefix(name, "v6") {
			family = 6
		}
		_, err := ParseProcNet(strings.NewReader(in), "tcp", family)
		assert.Error(t, err, name)
	}
	_, err := ParseProcNet(strings.NewReader(""), "sctp", 4)
	assert.Error(t, err)
}

func TestSocketOwners(t *testing.T) {
	// A fake /proc: pid 7 and pid 12 share socket 500, pid 12 also holds
	// 600; pid 3 has no fd directory it may read.
	root := t.TempDir()
	mk := func(pid int, comm string, fds map[string]string) {
		dir := filepath.Join(root, strconv.Itoa(pid))
		require.NoError(t, os.MkdirAll(filepath.Join(dir, "fd"), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(dir, "comm"), []byte(comm+"\n"), 0o644))
		for fd, target := range fds {
			require.NoError(t, os.Symlink(target, filepath.Join(dir, "fd", fd)))
		}
	}
	mk(12, "sshd", map[string]string{"3": "socket:[500]", "4": "socket:[600]", "5": "/dev/null"})
	mk(7, "systemd", map[string]string{"9": "socket:[500]"})
	require.NoError(t, os.MkdirAll(filepath.Join(root, "3"), 0o755))
	require.NoError(t, os.MkdirAll(filepath.Join(root, "self"), 0o755))

	got := SocketOwners(root, []uint64{500, 600, 700}, DefaultOwnerScan)
	assert.Equal(t, map[uint64]Owner{500: {7, "systemd"}, 600: {12, "sshd"}}, got)

	got = SocketOwners(root, []uint64{600}, OwnerScan{MaxProcs: 2, MaxFDs: 100, Budget: DefaultOwnerScan.Budget})
	assert.Empty(t, got, "the scan stops after MaxProcs processes (3 and 7)")
	assert.Empty(t, SocketOwners(root, nil, DefaultOwnerScan))
}
