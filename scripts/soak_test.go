package scripts_test

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/drill"
)

// TestSoakRunsEveryMutation holds scripts/soak.sh's list of mutation runs
// to the drill's: every mutation the drill offers is soaked, and nothing
// the drill does not offer.
func TestSoakRunsEveryMutation(t *testing.T) {
	b, err := os.ReadFile("soak.sh")
	require.NoError(t, err)
	m := regexp.MustCompile(`(?m)^mutations=\(([^)]*)\)`).FindSubmatch(b)
	require.NotNil(t, m, "soak.sh lists its mutation runs as mutations=(...)")
	var soaked []string
	for _, run := range strings.Fields(string(m[1])) {
		soaked = append(soaked, strings.Split(run, ",")...)
	}
	var offered []string
	for _, mu := range drill.Mutations {
		offered = append(offered, mu.Name)
	}
	slices.Sort(soaked)
	slices.Sort(offered)
	// The guard goes with each layer it holds too (host-fw, acl, route).
	assert.Equal(t, offered, slices.Compact(soaked), "soak.sh runs each mutation the drill offers")
	for _, run := range strings.Fields(string(m[1])) {
		assert.True(t, run != "guard", "the guard alone flips nothing (the nft layers hold): soak.sh runs it with a layer it holds")
	}
}
