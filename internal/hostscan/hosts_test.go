package hostscan

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseHosts(t *testing.T) {
	hs, err := ReadHosts(filepath.Join("testdata", "hosts"))
	require.NoError(t, err)
	assert.Equal(t, []HostsEntry{
		{Addr: addr("127.0.0.1"), Name: "localhost"},
		{Addr: addr("127.0.1.1"), Name: "web1.corp.example", Aliases: []string{"web1"}},
		{Addr: addr("::1"), Name: "localhost", Aliases: []string{"ip6-localhost", "ip6-loopback"}},
		{Addr: addr("ff02::1"), Name: "ip6-allnodes"},
		{Addr: addr("ff02::2"), Name: "ip6-allrouters"},
		{Addr: addr("fe80::1%eth0"), Name: "router-ll"},
		{Addr: addr("10.0.0.5"), Name: "db1", Aliases: []string{"db1.corp.example"}},
		{Addr: addr("192.0.2.7"), Name: "BUILD.corp.example.", Aliases: []string{"build"}},
	}, hs)

	_, err = ReadHosts(filepath.Join("testdata", "no-such-hosts"))
	assert.Error(t, err)
}

func TestFQDN(t *testing.T) {
	hs, err := ParseHosts(strings.NewReader(`
127.0.0.1 localhost
127.0.1.1 web1.corp.example web1
10.0.0.5 db1 db1.corp.example
10.0.0.6 cache
192.0.2.7 BUILD.corp.example. build
`))
	require.NoError(t, err)
	withDomain := ResolvConf{Domain: "lan.example", Search: []string{"lan.example"}}
	withSearch := ResolvConf{Search: []string{"s1.example", "s2.example"}}
	for _, c := range []struct {
		host string
		rc   ResolvConf
		want string
	}{
		{"web1", withSearch, "web1.corp.example"},   // hosts canonical name for the alias
		{"WEB1", ResolvConf{}, "web1.corp.example"}, // case does not matter
		{"db1", withSearch, "db1.corp.example"},     // a dotted alias hostname.<domain>
		{"build", ResolvConf{}, "BUILD.corp.example"},
		{"cache", withDomain, "cache.lan.example"}, // hosts has no dotted name: resolv.conf
		{"cache", withSearch, "cache.s1.example"},
		{"other", withDomain, "other.lan.example"},
		{"other", ResolvConf{}, ""},
		{"h.already.example", ResolvConf{}, "h.already.example"},
		{"", withDomain, ""},
	} {
		assert.Equal(t, c.want, FQDN(c.host, hs, c.rc), "%s with %+v", c.host, c.rc)
	}
}
