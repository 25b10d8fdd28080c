package stack

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// plannedLayers are layers SPEC names that the stack does not build yet.
// When one lands in Layers, take it off this list.
var plannedLayers = []LayerID{}

// stackOnlyLayers are the stack's layers SPEC's layer list does not name:
// its claim table calls them "stack" and "tier restrictions".
var stackOnlyLayers = []LayerID{LayerFleet, LayerTier, LayerStack}

var layerRE = regexp.MustCompile(`\bL-[A-Z0-9]+\b`)

func TestLayersTable(t *testing.T) {
	seen := map[LayerID]bool{}
	for _, l := range Layers {
		assert.Regexp(t, `^L-[A-Z0-9]+$`, string(l.ID))
		assert.NotEmpty(t, l.What, "%s says what it is", l.ID)
		assert.False(t, seen[l.ID], "%s is listed once", l.ID)
		seen[l.ID] = true
	}
}

// TestLayersInPackageDoc holds the package doc's layer list to Layers:
// the same IDs, in the same order, each with the same words.
func TestLayersInPackageDoc(t *testing.T) {
	fset := token.NewFileSet()
	var doc string
	files, err := filepath.Glob("*.go")
	require.NoError(t, err)
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.ParseComments|parser.PackageClauseOnly)
		require.NoError(t, err)
		if f.Doc != nil {
			require.Empty(t, doc, "one file holds the package doc (%s has another)", name)
			doc = f.Doc.Text()
		}
	}
	require.NotEmpty(t, doc, "the package has a doc")
	var got []Layer
	for _, line := range strings.Split(doc, "\n") {
		fields := strings.Fields(line)
		if len(fields) > 1 && layerRE.MatchString(fields[0]) && layerRE.FindString(fields[0]) == fields[0] {
			got = append(got, Layer{ID: LayerID(fields[0]), What: strings.Join(fields[1:], " ")})
		}
	}
	assert.Equal(t, Layers, got, "the package doc lists every layer of Layers, in order, with its words")
}

// TestLayersMatchSpec holds Layers to SPEC's layer names. SPEC lives
// beside the repository (../shared/SPEC.md), on the project's own machine
// only: elsewhere the test says so and checks nothing more.
func TestLayersMatchSpec(t *testing.T) {
	path := specPath(t)
	if path == "" {
		t.Log("SPEC.md not found beside the repository (../shared/SPEC.md): Layers checked against the package doc only")
		return
	}
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	spec := map[LayerID]bool{}
	for _, m := range layerRE.FindAllString(string(raw), -1) {
		spec[LayerID(m)] = true
	}
	require.NotEmpty(t, spec, "%s names layers", path)
	t.Logf("checking Layers against %s", path)
	have := map[LayerID]bool{}
	for _, l := range Layers {
		have[l.ID] = true
		if slices.Contains(stackOnlyLayers, l.ID) {
			assert.False(t, spec[l.ID], "SPEC now names %s: take it off stackOnlyLayers", l.ID)
			continue
		}
		assert.True(t, spec[l.ID], "%s is not in SPEC: add it there, or to stackOnlyLayers with why", l.ID)
	}
	for id := range spec {
		if slices.Contains(plannedLayers, id) {
			assert.False(t, have[id], "%s is built now: take it off plannedLayers", id)
			continue
		}
		assert.True(t, have[id], "SPEC names %s: add it to Layers, or to plannedLayers until it is built", id)
	}
	for _, id := range plannedLayers {
		assert.True(t, spec[id], "planned layer %s is not in SPEC any more", id)
	}
}

// specPath finds ../shared/SPEC.md beside the repository's root, or
// beside the main checkout when this is a git worktree; "" when absent.
func specPath(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("..")
	require.NoError(t, err)
	roots := []string{root}
	// A worktree's .git is a file: "gitdir: <main>/.git/worktrees/<name>".
	if raw, err := os.ReadFile(filepath.Join(root, ".git")); err == nil {
		gitdir := strings.TrimSpace(strings.TrimPrefix(string(raw), "gitdir:"))
		if i := strings.Index(gitdir, string(filepath.Separator)+filepath.Join(".git", "worktrees")); i > 0 {
			roots = append(roots, gitdir[:i])
		}
	}
	for _, r := range roots {
		p := filepath.Join(filepath.Dir(r), "shared", "SPEC.md")
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	return ""
}

// TestNoLayerLiterals: a layer's ID is spelled once, in layers.go; the
// rest of the stack's code names its constant.
func TestNoLayerLiterals(t *testing.T) {
	fset := token.NewFileSet()
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") || path == "layers.go" {
			return err
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			if lit, ok := n.(*ast.BasicLit); ok && lit.Kind == token.STRING {
				if s, err := strconv.Unquote(lit.Value); err == nil && layerRE.MatchString(s) {
					t.Errorf("%s: layer literal %s: name its constant from layers.go", fset.Position(lit.Pos()), lit.Value)
				}
			}
			return true
		})
		return nil
	})
	require.NoError(t, err)
}
