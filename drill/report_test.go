package drill

import (
	"reflect"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/drill/verdicts"
	"github.com/box-isolation/box/internal/jsonkeys"
)

// TestReportKeysGolden holds the JSON report's key paths to those of
// schema_version 4 (docs/drill-report.md): a key added, renamed or removed
// must say what changed in the docs (bumping SchemaVersion where it is
// incompatible) and rewrite the golden file.
func TestReportKeysGolden(t *testing.T) {
	want, err := jsonkeys.Golden("testdata/report-keys.golden")
	require.NoError(t, err)
	assert.Equal(t, 4, SchemaVersion, "the golden file is schema 4's")
	assert.Equal(t, want, jsonkeys.Paths(reflect.TypeFor[Report]()))
}

func TestReportFinish(t *testing.T) {
	cr := func(id ClaimID, v Verdict) ClaimResult {
		c, ok := ClaimByID(id)
		require.True(t, ok, id)
		return ClaimResult{Claim: c.Reported(), Verdict: v}
	}
	allPass := func(over map[ClaimID]Verdict) []ClaimResult {
		var out []ClaimResult
		for _, id := range specClaims {
			v := Pass
			if o, ok := over[id]; ok {
				v = o
			}
			out = append(out, cr(id, v))
		}
		return out
	}
	n := len(Catalogue)
	tests := []struct {
		name    string
		claims  []ClaimResult
		exit    int
		summary Summary
	}{
		{name: "all pass", claims: allPass(nil), exit: ExitOK, summary: Summary{Passed: n}},
		{name: "claims left out do not change the exit code", claims: allPass(map[ClaimID]Verdict{"C-V6": Skipped, "C-LAN": Skipped}),
			exit: ExitOK, summary: Summary{Passed: n - 2, Skipped: 2}},
		{name: "a selected claim that could not run is no pass", claims: func() []ClaimResult {
			cs := allPass(nil)
			last, _ := ClaimByID(cs[len(cs)-1].ID)
			cs[len(cs)-1] = aggregate(last, nil)
			return cs
		}(), exit: ExitInconclusive, summary: Summary{Passed: n - 1, Skipped: 1}},
		{name: "a blocked claim fails", claims: allPass(map[ClaimID]Verdict{"C-SIBLING": Fail}),
			exit: ExitViolated, summary: Summary{Passed: n - 1, Failed: 1}},
		{name: "a violation wins over a broken baseline", claims: allPass(map[ClaimID]Verdict{"C-EGRESS": Fail, "C-SIBLING": Fail, "C-LAN": Inconclusive}),
			exit: ExitViolated, summary: Summary{Passed: n - 3, Failed: 2, Inconclusive: 1}},
		// One exit rule (docs/claims.md, "Verdicts and exit codes"): a failed baseline is a violated claim.
		{name: "a failed baseline is a violation, the claims it leaves are inconclusive", claims: allPass(map[ClaimID]Verdict{"C-EGRESS": Fail, "C-SIBLING": Inconclusive, "C-HOST": Inconclusive}),
			exit: ExitViolated, summary: Summary{Passed: n - 3, Failed: 1, Inconclusive: 2}},
		{name: "a failed baseline alone is a violation", claims: allPass(map[ClaimID]Verdict{"C-DNS": Fail}),
			exit: ExitViolated, summary: Summary{Passed: n - 1, Failed: 1}},
		{name: "an inconclusive claim", claims: allPass(map[ClaimID]Verdict{"C-HOST": Inconclusive}),
			exit: ExitInconclusive, summary: Summary{Passed: n - 1, Inconclusive: 1}},
		{name: "an inconclusive baseline", claims: allPass(map[ClaimID]Verdict{"C-DHCP": Inconclusive}),
			exit: ExitInconclusive, summary: Summary{Passed: n - 1, Inconclusive: 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rep := &Report{Claims: tt.claims, Summary: Summary{Probes: 92}}
			finish(rep)
			assert.Equal(t, tt.exit, rep.ExitCode)
			tt.summary.Probes = 92
			assert.Equal(t, tt.summary, rep.Summary)
		})
	}
}

// TestReportGroupsByMember: finish sums each member's results and names
// the boxes that ran there; off a cluster there is no group.
func TestReportGroupsByMember(t *testing.T) {
	res := func(member string, v Verdict) verdicts.Result { return verdicts.Result{Member: member, Verdict: v} }
	rep := &Report{
		Environment: Environment{Members: []string{"m1", "m2"}},
		Boxes:       []BoxEnd{{Place: PlaceA, Member: "m1"}, {Place: PlaceB, Member: "m1"}, {Place: memberBoxPlace("m2"), Member: "m2"}},
		Claims: []ClaimResult{
			{Results: []verdicts.Result{res("m1", Pass), res("m2", Fail), res("", Pass)}},
			{Results: []verdicts.Result{res("m2", Inconclusive), res("m2", Pass), res("m1", Pass)}},
		},
	}
	finish(rep)
	assert.Equal(t, []MemberResult{
		{Member: "m1", Boxes: []Place{PlaceA, PlaceB}, Passed: 2},
		{Member: "m2", Boxes: []Place{"box@m2"}, Passed: 1, Failed: 1, Inconclusive: 1},
	}, rep.Members)
	rep.Environment.Members = nil
	finish(rep)
	assert.Empty(t, rep.Members)
}
