package hostscan

import (
	"io/fs"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func addrs(ss ...string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}

func TestParseResolvConf(t *testing.T) {
	for _, c := range []struct {
		name, in string
		want     ResolvConf
	}{
		{"empty", "", ResolvConf{}},
		{"domain then search: search wins", "domain d.example\nsearch s1 s2\n",
			ResolvConf{Search: []string{"s1", "s2"}, Domain: "d.example"}},
		{"search then domain: domain wins", "search s1 s2\ndomain d.example.\n",
			ResolvConf{Search: []string{"d.example"}, Domain: "d.example"}},
		{"last search wins", "search a\nsearch b c\n", ResolvConf{Search: []string{"b", "c"}}},
		{"keyword without value", "nameserver\nsearch\n", ResolvConf{}},
		{"comments", "# nameserver 192.0.2.1\n;nameserver 192.0.2.2\nnameserver 192.0.2.3;x\n",
			ResolvConf{Nameservers: addrs("192.0.2.3")}},
	} {
		got, err := ParseResolvConf(strings.NewReader(c.in))
		require.NoError(t, err, c.name)
		assert.Equal(t, c.want, got, c.name)
	}
}

func TestResolversPlain(t *testing.T) {
	d, err := Resolvers(filepath.Join("testdata", "root-plain"))
	require.NoError(t, err)
	assert.Equal(t, DNS{Conf: ResolvConf{
		Nameservers: addrs("192.0.2.53", "fe80::1%eth0", "192.0.2.54"),
		Search:      []string{"a.example", "b.example"},
		Domain:      "example.org",
	}}, d)
	assert.Equal(t, addrs("192.0.2.53", "fe80::1%eth0", "192.0.2.54"), d.Servers())
	assert.Equal(t, []string{"a.example", "b.example"}, d.SearchDomains())
}

func TestResolversStub(t *testing.T) {
	// etc/resolv.conf is an absolute symlink: it must resolve inside the
	// fixture root, not to this machine's /run.
	d, err := Resolvers(filepath.Join("testdata", "root-stub"))
	require.NoError(t, err)
	assert.True(t, d.Stub)
	assert.Equal(t, addrs("127.0.0.53"), d.Conf.Nameservers)
	require.NotNil(t, d.Upstream)
	assert.Equal(t, addrs("10.0.0.1", "2001:db8::53"), d.Servers(), "the stub replaced by its upstreams, once each")
	assert.Equal(t, []string{"corp.example", "lab.example"}, d.SearchDomains())

	d, err = Resolvers(filepath.Join("testdata", "root-stub-only"))
	require.NoError(t, err, "a missing upstream file is no error")
	assert.True(t, d.Stub)
	assert.Nil(t, d.Upstream)
	assert.Equal(t, addrs("127.0.0.54"), d.Servers(), "the stub stays when its upstreams are unknown")
	assert.Equal(t, []string{"lan"}, d.SearchDomains())
}

func TestResolversMissing(t *testing.T) {
	_, err := Resolvers(t.TempDir())
	assert.ErrorIs(t, err, fs.ErrNotExist)
}
