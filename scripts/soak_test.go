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
// to the drill's: every mutation the drill offers is soaked, each once,
// and nothing the drill does not offer.
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
	assert.Equal(t, offered, soaked, "soak.sh runs each mutation the drill offers, once")
}
