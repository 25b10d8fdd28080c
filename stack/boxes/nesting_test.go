package boxes

import (
	"context"
	"strings"
	"testing"

	"github.com/box-isolation/box/stack/model"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Nesting is set on the instance, in the create request itself (so the
// box's first start already has it), never on the profile; without it no
// security.* key is sent at all.
func TestMintNesting(t *testing.T) {
	f, h := newMintFake(t)
	_, err := (&Manager{host: h}).Mint(context.Background(), MintRequest{Name: "d", Image: "here", Nesting: true})
	require.NoError(t, err)
	req := f.created(t)
	for k, v := range model.NestingConfig() {
		assert.Equal(t, v, req.Config[k], k)
	}
	assert.Equal(t, []string{model.Current.Profile}, req.Profiles, "the box-net profile only, unchanged")
	assert.Empty(t, f.srv.Find("PUT", "/1.0/profiles/"+model.Current.Profile))

	f, h = newMintFake(t)
	_, err = (&Manager{host: h}).Mint(context.Background(), MintRequest{Name: "p", Image: "here"})
	require.NoError(t, err)
	for k := range f.created(t).Config {
		assert.False(t, strings.HasPrefix(k, "security."), "%s sent without nesting", k)
	}
}
