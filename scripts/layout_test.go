package scripts_test

import (
	"bufio"
	"bytes"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The house's rules (docs/design.md, "Where things live"), held by the
// tree as `go list` and go/types see it.

const mod = "github.com/box-isolation/box/"

// goPackage is one package of the tree as `go list` sees it.
type goPackage struct {
	path    string   // without the module's prefix
	dir     string   // absolute
	imports []string // the tree's own, without the prefix; non-test files only
	deps    []string // every package it links, the tree's own, without the prefix
	files   []string // non-test .go files, absolute
	export  string   // compiled export data
}

// listPackages lists the tree's packages once per test binary.
func listPackages(t *testing.T) map[string]*goPackage {
	t.Helper()
	cmd := exec.Command("go", "list", "-export", "-deps", "-f",
		"{{.ImportPath}}\t{{.Dir}}\t{{join .Imports \",\"}}\t{{join .Deps \",\"}}\t{{join .GoFiles \",\"}}\t{{.Export}}", "./...")
	cmd.Dir = ".."
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	require.NoError(t, err)
	pkgs := map[string]*goPackage{}
	exports := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		f := strings.Split(sc.Text(), "\t")
		require.Len(t, f, 6, "go list line %q", sc.Text())
		exports[f[0]] = f[5]
		if !strings.HasPrefix(f[0], mod) {
			continue
		}
		p := &goPackage{path: strings.TrimPrefix(f[0], mod), dir: f[1], export: f[5]}
		own := func(list string) []string {
			var out []string
			for _, s := range strings.Split(list, ",") {
				if strings.HasPrefix(s, mod) {
					out = append(out, strings.TrimPrefix(s, mod))
				}
			}
			return out
		}
		p.imports, p.deps = own(f[2]), own(f[3])
		for _, name := range strings.Split(f[4], ",") {
			if name != "" {
				p.files = append(p.files, filepath.Join(f[1], name))
			}
		}
		pkgs[p.path] = p
	}
	require.NoError(t, sc.Err())
	exportData = exports
	return pkgs
}

var exportData map[string]string

// under says whether path is pkg or inside it.
func under(path, pkg string) bool { return path == pkg || strings.HasPrefix(path, pkg+"/") }

// TestImportsPointOneWay holds the layers of the tree: data and plumbing
// at the bottom, the stack's convergence above them, the box lifecycle,
// the access tiers and the daemon above the stack, the drill above all of
// the stack, the commands on top; nothing imports upward.
func TestImportsPointOneWay(t *testing.T) {
	pkgs := listPackages(t)
	// may lists what each package of the stack (and the drill's leaves)
	// may import of the tree; "internal" and "templates" are leaves every
	// one may use.
	may := map[string][]string{
		"stack/model":        {"stack/incus"},
		"stack/incus":        {},
		"stack/nft":          {},
		"stack/dnsmasq":      {},
		"stack/btrfs":        {},
		"stack/bootunits":    {},
		"stack/guard":        {"stack/hostns", "stack/model", "stack/nft"},
		"stack/hostns":       {"stack/model", "stack/nft"},
		"stack/egress":       {"stack/hostns", "stack/model", "stack/nft"},
		"stack":              {"stack/bootunits", "stack/btrfs", "stack/dnsmasq", "stack/egress", "stack/guard", "stack/hostns", "stack/incus", "stack/model", "stack/nft"},
		"stack/boxes":        {"stack", "stack/egress", "stack/hostns", "stack/incus", "stack/model", "stack/nft"},
		"stack/access":       {"stack", "stack/hostns", "stack/incus", "stack/model"},
		"stack/daemon":       {"stack", "stack/bootunits", "stack/egress", "stack/guard", "stack/hostns", "stack/incus", "stack/model", "stack/nft"},
		"stack/stacktest":    {"stack/incus", "stack/incus/incustest", "stack/model"},
		"probes/observation": {},
		"drill/verdicts":     {"probes/observation", "stack/model"},
		"drill/report":       {"drill/verdicts", "stack/model"},
		"drill/gate":         {"drill/report", "drill/verdicts"},
	}
	leaf := func(p string) bool { return under(p, "internal") && !under(p, "internal/testenv") || p == "templates" }
	for path, allowed := range may {
		p, ok := pkgs[path]
		if !assert.True(t, ok, "package %s is gone: update this test", path) {
			continue
		}
		for _, imp := range p.imports {
			if leaf(imp) {
				continue
			}
			assert.Contains(t, allowed, imp, "%s imports %s, which is not below it", path, imp)
		}
	}
	// The internal packages are leaves: they import no package of the
	// stack, the drill, the probes or the commands.
	for path, p := range pkgs {
		if !under(path, "internal") || under(path, "internal/testenv") || path == "internal/worldstate" {
			continue
		}
		for _, imp := range p.imports {
			assert.False(t, under(imp, "stack") && imp != "stack/incus" || under(imp, "drill") || under(imp, "cmd") || under(imp, "fixtures"),
				"%s is a leaf and imports %s", path, imp)
		}
	}
	// The report and the gate read a run without linking the engine.
	for _, path := range []string{"drill/report", "drill/gate", "drill/verdicts"} {
		for _, dep := range pkgs[path].deps {
			assert.False(t, dep == "drill" || dep == "stack" || dep == "probes" || under(dep, "fixtures") || dep == "stack/nft",
				"%s links %s", path, dep)
		}
	}
}

// TestFixturesReachedFromOneDoor: the hermetic world is a fixture. Among
// the tree's non-test files only cmd/drill's world verbs, the fixtures
// themselves and test support (packages no non-test code imports: the
// test tiers' gates, the stack's system-test helpers) import it.
func TestFixturesReachedFromOneDoor(t *testing.T) {
	pkgs := listPackages(t)
	// Test support is named so (internal/testenv, *test, */*test/*) and
	// imported by no other code.
	named := func(path string) bool {
		return under(path, "internal/testenv") || strings.HasSuffix(path, "test") || strings.Contains(path, "test/")
	}
	usedByCode := map[string]bool{}
	for path, p := range pkgs {
		for _, imp := range p.imports {
			if !named(path) {
				usedByCode[imp] = true
			}
		}
	}
	testSupport := func(path string) bool { return named(path) && !usedByCode[path] }
	fset := token.NewFileSet()
	for path, p := range pkgs {
		if under(path, "fixtures") || testSupport(path) {
			continue
		}
		for _, file := range p.files {
			f, err := parser.ParseFile(fset, file, nil, parser.ImportsOnly)
			require.NoError(t, err)
			for _, imp := range f.Imports {
				ip := strings.Trim(imp.Path.Value, `"`)
				if !strings.HasPrefix(ip, mod+"fixtures") {
					continue
				}
				rel, _ := filepath.Rel(filepath.Dir(p.dir), file)
				assert.Equal(t, "drill/world.go", rel, "%s imports %s: only cmd/drill/world.go (the world verbs) and tests may", file, ip)
			}
		}
	}
}

// maxMethods is how many methods a type may carry: its method set
// (embedded promotions included) plus the package functions that take it
// first.
const maxMethods = 40

// maxStackLines is how many non-test lines one package of stack/ may have.
const maxStackLines = 6000

// TestNoGodObject holds every type of the tree to maxMethods, counted with
// go/types over the packages' compiled export data, and every package of
// stack/ to maxStackLines.
func TestNoGodObject(t *testing.T) {
	pkgs := listPackages(t)
	largest, most := "", 0
	defer func() { t.Logf("the largest type: %s, %d methods (at most %d)", largest, most, maxMethods) }()
	fset := token.NewFileSet()
	imp := importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) {
		return os.Open(exportData[path])
	})
	for _, path := range slices.Sorted(maps.Keys(pkgs)) {
		p := pkgs[path]
		var files []*ast.File
		for _, file := range p.files {
			f, err := parser.ParseFile(fset, file, nil, 0)
			require.NoError(t, err)
			files = append(files, f)
		}
		if len(files) == 0 {
			continue
		}
		conf := types.Config{Importer: imp}
		tp, err := conf.Check(mod+path, fset, files, nil)
		require.NoError(t, err, "type-checking %s", path)
		first := map[*types.TypeName]int{}
		for _, name := range tp.Scope().Names() {
			fn, ok := tp.Scope().Lookup(name).(*types.Func)
			if !ok {
				continue
			}
			sig := fn.Type().(*types.Signature)
			if sig.Params().Len() == 0 {
				continue
			}
			typ := sig.Params().At(0).Type()
			if ptr, ok := typ.(*types.Pointer); ok {
				typ = ptr.Elem()
			}
			if named, ok := typ.(*types.Named); ok {
				first[named.Obj()]++
			}
		}
		for _, name := range tp.Scope().Names() {
			tn, ok := tp.Scope().Lookup(name).(*types.TypeName)
			if !ok || tn.IsAlias() {
				continue
			}
			named, ok := tn.Type().(*types.Named)
			if !ok {
				continue
			}
			if _, iface := named.Underlying().(*types.Interface); iface {
				continue
			}
			n := types.NewMethodSet(types.NewPointer(named)).Len() + first[tn]
			if n > most {
				largest, most = path+"."+name, n
			}
			assert.LessOrEqual(t, n, maxMethods, "%s.%s has %d methods (with the functions that take it first): split it by concern", path, name, n)
		}
		if under(path, "stack") {
			lines := 0
			for _, file := range p.files {
				b, err := os.ReadFile(file)
				require.NoError(t, err)
				lines += bytes.Count(b, []byte("\n"))
			}
			assert.LessOrEqual(t, lines, maxStackLines, "%s has %d non-test lines: split it by job", path, lines)
		}
	}
}
