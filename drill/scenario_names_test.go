package drill

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/drill/topo"
	"github.com/box-isolation/box/internal/hostscan"
	"github.com/box-isolation/box/probes"
)

// C-NAMES asks what the host knows, each name once, never localhost, and
// compares every answer with the upstream asked from the host.
func TestNameQuestions(t *testing.T) {
	sc := testTopology()
	sc.Upstream = netip.MustParseAddr("203.0.113.53")
	sc.Hostname, sc.FQDN, sc.SearchDomains = "build7", "build7.corp.internal.", []string{"corp.internal"}
	sc.Names = []topo.Name{{Name: "git.corp.internal.", QType: "A", Provenance: topo.FromLANZone}}
	hosts := []hostscan.HostsEntry{
		{Addr: netip.MustParseAddr("127.0.0.1"), Name: "localhost"},
		{Addr: netip.MustParseAddr("192.168.20.30"), Name: "printer.corp.internal", Aliases: []string{"printer", "GIT.corp.internal."}},
	}
	qs, dropped := nameQuestions(sc, hosts)
	assert.Zero(t, dropped)
	var got []string
	for _, q := range qs {
		got = append(got, q.QType+" "+q.Name+" "+string(q.Provenance))
	}
	for _, want := range []string{
		"A git.corp.internal. lan-zone", "A printer.corp.internal. hosts-file", "A printer. hosts-file", "PTR 192.168.20.30 hosts-file",
		"A build7. hostname", "A build7.corp.internal. hostname", "A wiki.corp.internal. search", "PTR 192.168.20.1 ptr", "PTR 10.20.0.10 ptr",
	} {
		assert.Contains(t, got, want)
	}
	for _, q := range qs {
		assert.NotContains(t, strings.ToLower(q.Name), "localhost")
	}
	assert.NotContains(t, got, "A GIT.corp.internal. hosts-file", "a name is asked once, whatever its case")

	sc.questions = qs
	s := BuildScenario(sc, claimsByID(t, "C-NAMES"))
	upstream := map[string]probes.ProbeSpec{}
	for _, p := range s.Plans[PlaceHost].Probes {
		upstream[p.ID] = p
	}
	compared := 0
	for _, a := range actionsOf(s, "C-NAMES") {
		if a.Provenance == topo.FromSibling {
			assert.False(t, a.Reference.Valid(), "a sibling's name is never public")
			continue
		}
		up, ok := upstream[a.Reference.ID]
		require.True(t, ok, "%s is compared with the upstream", a.Target)
		assert.Equal(t, sc.Upstream, up.Target)
		assert.Equal(t, a.Probe.Name, up.Name)
		assert.Equal(t, a.Probe.QType, up.QType)
		compared++
	}
	assert.Equal(t, len(qs), compared)

	many := make([]hostscan.HostsEntry, 0, 200)
	for i := range 200 {
		many = append(many, hostscan.HostsEntry{Addr: netip.MustParseAddr("192.168.20.30"), Name: fmt.Sprintf("h%d.corp.internal", i)})
	}
	qs, dropped = nameQuestions(sc, many)
	assert.Len(t, qs, maxNames)
	assert.Positive(t, dropped, "the rest is counted, for the report's notes")
}
