package verdicts_test

import (
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const module = "github.com/box-isolation/box/"

// deps is every package of the module a package links, by its path in
// the module.
func deps(t *testing.T, pkg string) []string {
	t.Helper()
	out, err := exec.Command("go", "list", "-deps", module+pkg).Output()
	require.NoError(t, err, "go list -deps %s", pkg)
	var ds []string
	for _, d := range strings.Fields(string(out)) {
		if p, ok := strings.CutPrefix(d, module); ok {
			ds = append(ds, p)
		}
	}
	return ds
}

// TestReadersLinkNoEngine: the report's types are a leaf, so the renderer
// and the release gate read a run's report without linking the drill's
// engine, the stack's code, the probes or the world.
func TestReadersLinkNoEngine(t *testing.T) {
	forbidden := []string{"drill", "stack", "stack/nft", "probes"}
	// stack/incus comes in through stack/model alone, as long as the model
	// names Incus's types (its desired state); nothing else may bring it.
	viaModel := slices.Contains(deps(t, "stack/model"), "stack/incus")
	if !viaModel {
		forbidden = append(forbidden, "stack/incus")
	}
	for _, pkg := range []string{"drill/verdicts", "drill/report", "drill/gate"} {
		ds := deps(t, pkg)
		for _, f := range forbidden {
			assert.NotContains(t, ds, f, "%s links %s", pkg, f)
		}
		for _, d := range ds {
			assert.False(t, strings.HasPrefix(d, "fixtures/"), "%s links %s", pkg, d)
		}
	}
}
