package model

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

// plannedLayers are the layers docs/design.md's layer map marks planned:
// designed, not built yet. When one lands in Layers, mark it built there
// and take it off this list.
var plannedLayers = []LayerID{}

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

// TestLayersMatchDesign holds Layers to the layer map of docs/design.md:
// its built rows are Layers, in the same order, and its planned rows are
// plannedLayers, none of them in Layers.
func TestLayersMatchDesign(t *testing.T) {
	const path = "../../docs/design.md"
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	_, table, ok := strings.Cut(string(raw), "\n## The layer map\n")
	require.True(t, ok, "%s has a section \"The layer map\"", path)
	table, _, _ = strings.Cut(table, "\n## ")
	var built, planned []LayerID
	for _, line := range strings.Split(table, "\n") {
		cells := strings.Split(line, "|")
		if !strings.HasPrefix(line, "| ") || len(cells) < 4 || !layerRE.MatchString(cells[1]) {
			continue
		}
		id := LayerID(strings.TrimSpace(cells[1]))
		require.Regexp(t, `^L-[A-Z0-9]+$`, string(id), "a layer map row starts with the layer's ID alone")
		switch state := strings.TrimSpace(cells[2]); state {
		case "built":
			built = append(built, id)
		case "planned":
			planned = append(planned, id)
		default:
			t.Errorf("%s: layer map row %s has state %q: want built or planned", path, id, state)
		}
	}
	require.NotEmpty(t, built, "%s's layer map lists the layers", path)
	var have []LayerID
	for _, l := range Layers {
		have = append(have, l.ID)
	}
	assert.Equal(t, have, built, "the built rows of %s's layer map are Layers, in order: add a new layer to both, or mark it planned there and add it to plannedLayers", path)
	assert.ElementsMatch(t, plannedLayers, planned, "the planned rows of %s's layer map are plannedLayers", path)
	for _, id := range plannedLayers {
		assert.False(t, slices.Contains(have, id), "%s is built now: mark it built in %s and take it off plannedLayers", id, path)
	}
}

// TestNoLayerLiterals: a layer's ID is spelled once, in model/layers.go; the
// rest of the stack's code names its constant.
func TestNoLayerLiterals(t *testing.T) {
	fset := token.NewFileSet()
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") || path == filepath.Join("..", "model", "layers.go") {
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
