package drill

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/stack/model"
)

// specClaims is docs/claims.md's list of claims, in its order.
var specClaims = []ClaimID{"C-EGRESS", "C-DNS", "C-DHCP", "C-SIBLING", "C-HOST", "C-LAN", "C-NAMES", "C-V6", "C-INBOUND", "C-CLONE", "C-SPOOF", "C-FLEET", "C-TIER", "C-ALLOW", "C-EXPOSE", "C-NESTED", "C-KERNEL"}

func TestCatalogueMatchesSpec(t *testing.T) {
	ids := make([]ClaimID, 0, len(Catalogue))
	for _, c := range Catalogue {
		ids = append(ids, c.ID)
	}
	require.Equal(t, specClaims, ids, "the catalogue is docs/claims.md's claims, in report order")

	var layers []model.LayerID
	for _, l := range model.Layers {
		layers = append(layers, l.ID)
	}
	baselines := map[ClaimID]bool{"C-EGRESS": true, "C-DNS": true, "C-DHCP": true}
	seen := map[ClaimID]bool{}
	for _, c := range Catalogue {
		t.Run(string(c.ID), func(t *testing.T) {
			assert.False(t, seen[c.ID], "one claim per id")
			seen[c.ID] = true
			assert.Regexp(t, `^C-[A-Z0-9]+$`, c.ID)
			assert.NotEmpty(t, c.From, "from")
			assert.NotEmpty(t, c.To, "to")
			assert.NotEmpty(t, c.Channels, "channels")
			assert.NotEmpty(t, c.Layers, "layers")
			assert.NotEmpty(t, c.Expect, "expect (the statement)")
			assert.NotEmpty(t, c.Why, "why")
			assert.Equal(t, baselines[c.ID], c.Baseline, "only C-EGRESS, C-DNS and C-DHCP are positive controls")
			for _, l := range c.Layers {
				assert.Contains(t, layers, l, "a claim's layer is one of the stack's")
			}
			// Modes: each mode says whether it runs; a mode that does not
			// run it, or only on request, says why.
			for _, a := range []Availability{c.Modes.World, c.Modes.Host} {
				assert.Contains(t, []Availability{Runs, OptIn, Never}, a, "a mode's availability")
				if a != Runs {
					assert.NotEmpty(t, c.Modes.Why, "why a mode does not simply run it")
				}
			}
			assert.False(t, c.Modes.World == Never && c.Modes.Host == Never, "it runs somewhere")
			// Evidence: at least one phase gathers it, and each named
			// phase is there.
			require.NotEmpty(t, c.Evidence, "an evidence phase")
			assert.Equal(t, slices.Contains(c.Evidence, EvidenceProbes), c.build != nil, "probes are evidence exactly when it builds actions")
			assert.Equal(t, slices.Contains(c.Evidence, EvidenceRequests), c.requests != nil || c.after != nil, "requests are evidence exactly when it makes them (before the probes or after)")
			if slices.Contains(c.Evidence, EvidenceCensus) {
				assert.NotNil(t, c.judge, "census evidence is judged by the claim's own judging")
			}
			got, ok := ClaimByID(c.ID)
			assert.True(t, ok)
			assert.Equal(t, c.ID, got.ID)
		})
	}
	_, ok := ClaimByID("C-NOPE")
	assert.False(t, ok)
}

func TestResolve(t *testing.T) {
	all := specClaims
	without := func(drop ...ClaimID) []ClaimID {
		return slices.DeleteFunc(slices.Clone(all), func(id ClaimID) bool { return slices.Contains(drop, id) })
	}
	hostAll := without("C-TIER", "C-ALLOW")
	tests := []struct {
		name    string
		mode    Mode
		include []string
		skip    []string
		optIn   bool // a recorded run's selection
		want    []ClaimID
		whole   bool
		left    map[ClaimID]string // substrings of the reasons
		wantErr []string           // substrings of the error
	}{
		{name: "no patterns selects all", want: all, whole: true},
		{name: "by id", include: []string{"C-SIBLING"}, want: []ClaimID{"C-SIBLING"}, left: map[ClaimID]string{"C-HOST": "not selected"}},
		{name: "several ids come back in catalogue order", include: []string{"C-CLONE", "C-DNS"}, want: []ClaimID{"C-DNS", "C-CLONE"}},
		{name: "glob", include: []string{"C-SI*"}, want: []ClaimID{"C-SIBLING"}},
		{name: "glob matching several", include: []string{"C-D*"}, want: []ClaimID{"C-DNS", "C-DHCP"}},
		{name: "case insensitive", include: []string{"c-sibling"}, want: []ClaimID{"C-SIBLING"}},
		{name: "case insensitive glob", include: []string{"c-h*"}, want: []ClaimID{"C-HOST"}},
		{name: "bang excludes", include: []string{"!C-V6"}, want: without("C-V6"), left: map[ClaimID]string{"C-V6": "left out"}},
		{name: "bang excludes, lower case", include: []string{"!c-v6"}, want: without("C-V6")},
		{name: "include and bang", include: []string{"C-*", "!C-V6", "!C-E*", "!C-N*"}, want: without("C-V6", "C-EGRESS", "C-NAMES", "C-EXPOSE", "C-NESTED")},
		{name: "skip", skip: []string{"C-V6"}, want: without("C-V6")},
		{name: "skip glob", skip: []string{"C-D*"}, want: without("C-DNS", "C-DHCP")},
		{name: "include and skip", include: []string{"C-SIBLING", "C-HOST"}, skip: []string{"C-HOST"}, want: []ClaimID{"C-SIBLING"}},
		{name: "typo is an error naming it", include: []string{"C-SIBLNG"}, wantErr: []string{`"C-SIBLNG"`, "matches no claim"}},
		{name: "typo among good patterns", include: []string{"C-DNS", "C-NOPE*"}, wantErr: []string{`"C-NOPE*"`}},
		{name: "excluding a typo is an error", include: []string{"!C-VV6"}, wantErr: []string{`"C-VV6"`}},
		{name: "skipping a typo is an error", skip: []string{"X-*"}, wantErr: []string{`"X-*"`}},
		{name: "nothing left", include: []string{"C-V6"}, skip: []string{"C-V6"}, wantErr: []string{"no claim"}},
		{name: "everything excluded", include: []string{"!C-*"}, wantErr: []string{"leaves no claim"}},

		// Host mode: C-TIER only when named, C-ALLOW never.
		{name: "host: no patterns leaves the opt-in and world-only claims out, saying why", mode: ModeHost, want: hostAll, whole: true,
			left: map[ClaimID]string{"C-TIER": "only when named (--claim C-TIER)", "C-ALLOW": "not run in host mode: it needs the world's second canary"}},
		{name: "host: naming the opt-in claim selects it", mode: ModeHost, include: []string{"C-TIER"}, want: []ClaimID{"C-TIER"}},
		{name: "host: naming it in lower case selects it", mode: ModeHost, include: []string{"c-tier"}, want: []ClaimID{"C-TIER"}},
		{name: "host: a glob that matches it alone names it", mode: ModeHost, include: []string{"c-t*"}, want: []ClaimID{"C-TIER"}},
		{name: "host: a wide glob does not name it", mode: ModeHost, include: []string{"C-*"}, want: hostAll,
			left: map[ClaimID]string{"C-TIER": "only when named"}},
		{name: "host: a wide glob and its name", mode: ModeHost, include: []string{"C-*", "C-TIER"}, want: without("C-ALLOW")},
		{name: "host: naming a world-only claim is an error naming it", mode: ModeHost, include: []string{"C-ALLOW"}, wantErr: []string{"C-ALLOW does not run in host mode", "second canary", "drop it from --claim"}},
		{name: "host: naming it in lower case too", mode: ModeHost, include: []string{"c-allow"}, wantErr: []string{"C-ALLOW does not run in host mode"}},
		{name: "host: a glob that names it alone too", mode: ModeHost, include: []string{"C-AL*"}, wantErr: []string{"C-ALLOW does not run in host mode"}},
		{name: "host: beside the opt-in claim", mode: ModeHost, include: []string{"C-TIER", "C-ALLOW"}, wantErr: []string{"C-ALLOW does not run in host mode"}},
		{name: "host: only world-only claims matched", mode: ModeHost, include: []string{"C-A*", "C-E*"}, wantErr: []string{"C-ALLOW does not run in host mode"}},
		{name: "host: skipping the world-only claim is fine", mode: ModeHost, skip: []string{"C-ALLOW"}, want: hostAll},
		{name: "host, recorded: the opt-in claim runs unnamed, the world-only one never", mode: ModeHost, optIn: true, want: without("C-ALLOW"), whole: true,
			left: map[ClaimID]string{"C-ALLOW": "not run in host mode"}},
		{name: "world, recorded: the same as unrecorded", optIn: true, want: all, whole: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			mode := tt.mode
			if mode == "" {
				mode = ModeWorld
			}
			got, err := Resolve(mode, tt.include, tt.skip, tt.optIn)
			if len(tt.wantErr) > 0 {
				require.Error(t, err)
				assert.Nil(t, got.Claims)
				for _, s := range tt.wantErr {
					assert.Contains(t, err.Error(), s)
				}
				return
			}
			require.NoError(t, err)
			ids := make([]ClaimID, 0, len(got.Claims))
			for _, c := range got.Claims {
				ids = append(ids, c.ID)
			}
			assert.Equal(t, tt.want, ids)
			assert.Equal(t, tt.whole, got.Whole, "whole")
			// Every claim is either selected or left out with a reason.
			for _, c := range Catalogue {
				assert.NotEqual(t, got.Selected(c.ID), got.Left[c.ID] != "", "%s: selected or left with a reason", c.ID)
			}
			for id, why := range tt.left {
				assert.Contains(t, got.Left[id], why, id)
			}
		})
	}
}

// TestIDsAreSpelledOnce holds the rule that a claim's ID is spelled only in
// its own file and the catalogue, and a layer's only in the stack's layer
// table: everything else refers to the constants, so an ID can never be
// mistyped where it is compared.
func TestIDsAreSpelledOnce(t *testing.T) {
	root, err := filepath.Abs("..")
	require.NoError(t, err)
	claimID := regexp.MustCompile(`\bC-[A-Z]{2,}`)
	layerID := regexp.MustCompile(`\bL-[A-Z]{2,}`)
	var bad []string
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		rel, _ := filepath.Rel(root, path)
		claimFile := strings.HasPrefix(rel, "drill/claim_") || rel == "drill/claims.go"
		layerFile := rel == "stack/model/layers.go"
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			lit, ok := n.(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				return true
			}
			if claimID.MatchString(lit.Value) && !claimFile {
				bad = append(bad, fset.Position(lit.Pos()).String()+": claim id in "+lit.Value)
			}
			if layerID.MatchString(lit.Value) && !layerFile {
				bad = append(bad, fset.Position(lit.Pos()).String()+": layer id in "+lit.Value)
			}
			return true
		})
		return nil
	})
	require.NoError(t, err)
	assert.Empty(t, bad, "spell a claim id only in drill/claim_*.go (use its constant elsewhere), a layer id only in stack/model/layers.go")
}
