package drill

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/stack"
)

// specClaims is SPEC section 4's table, in its order.
var specClaims = []string{"C-EGRESS", "C-DNS", "C-DHCP", "C-SIBLING", "C-HOST", "C-LAN", "C-NAMES", "C-V6", "C-INBOUND", "C-CLONE", "C-SPOOF", "C-FLEET", "C-TIER", "C-ALLOW", "C-EXPOSE"}

func TestCatalogueMatchesSpec(t *testing.T) {
	ids := make([]string, 0, len(Catalogue))
	for _, c := range Catalogue {
		ids = append(ids, c.ID)
	}
	require.Equal(t, specClaims, ids, "the catalogue is SPEC section 4's claims, in report order")

	baselines := map[string]bool{"C-EGRESS": true, "C-DNS": true, "C-DHCP": true}
	for _, c := range Catalogue {
		t.Run(c.ID, func(t *testing.T) {
			assert.NotEmpty(t, c.From, "from")
			assert.NotEmpty(t, c.To, "to")
			assert.NotEmpty(t, c.Channels, "channels")
			assert.NotEmpty(t, c.Layers, "layers")
			assert.NotEmpty(t, c.Expect, "expect")
			assert.NotEmpty(t, c.Why, "why")
			assert.Equal(t, baselines[c.ID], c.Baseline, "only C-EGRESS, C-DNS and C-DHCP are positive controls")
			for _, l := range c.Layers {
				if l != string(stack.LayerStack) {
					assert.Contains(t, Layers, l, "a claim's layer is one the report accounts for")
				}
			}
			got, ok := ClaimByID(c.ID)
			assert.True(t, ok)
			assert.Equal(t, c.ID, got.ID)
		})
	}
	_, ok := ClaimByID("C-NOPE")
	assert.False(t, ok)
}

func TestSelect(t *testing.T) {
	all := specClaims
	without := func(drop ...string) []string {
		var out []string
		for _, id := range all {
			keep := true
			for _, d := range drop {
				keep = keep && id != d
			}
			if keep {
				out = append(out, id)
			}
		}
		return out
	}
	tests := []struct {
		name    string
		include []string
		skip    []string
		want    []string
		wantErr []string // substrings of the error
	}{
		{name: "no patterns selects all", want: all},
		{name: "by id", include: []string{"C-SIBLING"}, want: []string{"C-SIBLING"}},
		{name: "several ids come back in catalogue order", include: []string{"C-CLONE", "C-DNS"}, want: []string{"C-DNS", "C-CLONE"}},
		{name: "glob", include: []string{"C-SI*"}, want: []string{"C-SIBLING"}},
		{name: "glob matching several", include: []string{"C-D*"}, want: []string{"C-DNS", "C-DHCP"}},
		{name: "case insensitive", include: []string{"c-sibling"}, want: []string{"C-SIBLING"}},
		{name: "case insensitive glob", include: []string{"c-h*"}, want: []string{"C-HOST"}},
		{name: "bang excludes", include: []string{"!C-V6"}, want: without("C-V6")},
		{name: "bang excludes, lower case", include: []string{"!c-v6"}, want: without("C-V6")},
		{name: "include and bang", include: []string{"C-*", "!C-V6", "!C-E*", "!C-N*"}, want: without("C-V6", "C-EGRESS", "C-NAMES", "C-EXPOSE")},
		{name: "skip", skip: []string{"C-V6"}, want: without("C-V6")},
		{name: "skip glob", skip: []string{"C-D*"}, want: without("C-DNS", "C-DHCP")},
		{name: "include and skip", include: []string{"C-SIBLING", "C-HOST"}, skip: []string{"C-HOST"}, want: []string{"C-SIBLING"}},
		{name: "typo is an error naming it", include: []string{"C-SIBLNG"}, wantErr: []string{`"C-SIBLNG"`, "matches no claim"}},
		{name: "typo among good patterns", include: []string{"C-DNS", "C-NOPE*"}, wantErr: []string{`"C-NOPE*"`}},
		{name: "excluding a typo is an error", include: []string{"!C-VV6"}, wantErr: []string{`"C-VV6"`}},
		{name: "skipping a typo is an error", skip: []string{"X-*"}, wantErr: []string{`"X-*"`}},
		{name: "nothing left", include: []string{"C-V6"}, skip: []string{"C-V6"}, wantErr: []string{"no claim"}},
		{name: "everything excluded", include: []string{"!C-*"}, wantErr: []string{"leaves no claim"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Select(tt.include, tt.skip)
			if len(tt.wantErr) > 0 {
				require.Error(t, err)
				assert.Nil(t, got)
				for _, s := range tt.wantErr {
					assert.Contains(t, err.Error(), s)
				}
				return
			}
			require.NoError(t, err)
			ids := make([]string, 0, len(got))
			for _, c := range got {
				ids = append(ids, c.ID)
			}
			assert.Equal(t, tt.want, ids)
		})
	}
}
