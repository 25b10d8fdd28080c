package drill

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/fixtures/world"
	"github.com/box-isolation/box/probes"
)

// TestAllowTunnelJudgedAtTheWitness: box-w's questions for other names
// are judged at the witness nameserver, alive by box-a's question for the
// same zone; what box-w was told never passes on its own.
func TestAllowTunnelJudgedAtTheWitness(t *testing.T) {
	scene := testTopology()
	dir := t.TempDir()
	scene.Allow.WitnessLog = filepath.Join(dir, world.WitnessLogName)
	sc := BuildScenario(scene, []Claim{claimAllow})
	var tunnel []Action
	for _, a := range sc.Actions {
		if a.Expect == ExpectNotForwarded {
			tunnel = append(tunnel, a)
		}
	}
	require.Len(t, tunnel, 3, "under the allowed name, beside it, elsewhere")
	zones := []string{"canary.example.net", "other.example.net", "attacker.example"}
	for i, a := range tunnel {
		assert.True(t, strings.HasSuffix(a.Probe.Name, "."+zones[i]), a.Probe.Name)
		assert.Equal(t, PlaceW, a.From)
		assert.Equal(t, PlaceA, a.Reference.At, "its control is box-a's")
	}

	started := time.Now().Add(-time.Minute)
	ctlName := func(a Action) string {
		for _, p := range sc.Plans[PlaceA].Probes {
			if p.ID == a.Reference.ID {
				return p.Name
			}
		}
		t.Fatalf("no control %s in box-a's plan", a.Reference.ID)
		return ""
	}
	judgeWith := func(logged []string, a Action, rcode string) Result {
		t.Helper()
		var b strings.Builder
		for _, n := range logged {
			line, _ := json.Marshal(world.WitnessQuery{At: time.Now(), From: "203.0.113.53:1", Name: n + ".", QType: "TXT"})
			b.Write(append(line, '\n'))
		}
		require.NoError(t, os.WriteFile(scene.Allow.WitnessLog, []byte(b.String()), 0o644))
		obs := observations{
			PlaceW: {a.ID: {ID: a.ID, Kind: probes.KindDNS, Outcome: probes.Refused, Reason: "the resolver answered " + rcode,
				Evidence: probes.Evidence{DNS: &probes.DNSEvidence{Name: a.Probe.Name + ".", QType: "TXT", Rcode: rcode, EDE: "15 box egress: not on the allowlist"}}}},
			PlaceA: {a.Reference.ID: {ID: a.Reference.ID, Kind: probes.KindDNS, Outcome: probes.Refused,
				Evidence: probes.Evidence{DNS: &probes.DNSEvidence{Name: ctlName(a) + ".", QType: "TXT", Rcode: "NXDOMAIN"}}}},
		}
		r := &run{cfg: Config{Topology: scene.Topology}, rep: &Report{Started: started}, obs: obs, state: claimStates{AllowID: &allowRun{}}}
		res := judge(a, obs, scene, true, nil)
		return refineAllow(r, res)
	}
	a := tunnel[2]
	res := judgeWith([]string{ctlName(a)}, a, "REFUSED")
	assert.Equal(t, Pass, res.Verdict, res.Evidence)
	assert.Contains(t, res.Evidence, "REFUSED (15 box egress")
	assert.Contains(t, res.AtTarget, "box-a's")

	res = judgeWith([]string{ctlName(a), a.Probe.Name}, a, "REFUSED")
	assert.Equal(t, Fail, res.Verdict, "the witness got box-w's question: whatever box-w was told")
	assert.Contains(t, res.Evidence, "DNS tunnel")

	res = judgeWith(nil, a, "REFUSED")
	assert.Equal(t, Inconclusive, res.Verdict, "the witness heard nothing, box-a's question neither: silence proves nothing")

	res = judgeWith([]string{ctlName(tunnel[0])}, a, "REFUSED")
	assert.Equal(t, Inconclusive, res.Verdict, "box-a's question for another zone is no control for this one")

	require.NoError(t, os.Remove(scene.Allow.WitnessLog))
	r := &run{cfg: Config{Topology: scene.Topology}, rep: &Report{Started: started}, obs: observations{}, state: claimStates{AllowID: &allowRun{}}}
	res = refineAllow(r, judge(a, observations{}, scene, true, nil))
	assert.Equal(t, Inconclusive, res.Verdict, "no log: nothing to judge by")

	// A name box-w was answered with records fails at the sender already.
	resolved := probes.Observation{ID: a.ID, Kind: probes.KindDNS, Outcome: probes.Reached, Reason: "resolved",
		Evidence: probes.Evidence{DNS: &probes.DNSEvidence{Name: a.Probe.Name + ".", Resolved: true}}}
	res = judge(a, observations{PlaceW: {a.ID: resolved}}, scene, true, nil)
	assert.Equal(t, Fail, res.Verdict)
}
