package tier

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// TestSkipsGoThroughTier: no test in the tree skips, or looks for a tool,
// by hand. A t.Skip outside this package passes CI under
// BOX_REQUIRE_TIERS=1, and so does a test that returns early when
// exec.LookPath finds nothing; Unavailable and Tool fail there instead.
func TestSkipsGoThroughTier(t *testing.T) {
	root := moduleRoot(t)
	for _, v := range handSkips(t, root) {
		t.Error(v)
	}
	t.Logf("%d files with \"testing\" checked under %s", checkedFiles, root)
	if checkedFiles < 50 {
		t.Fatalf("only %d files checked: is %s the module root?", checkedFiles, root)
	}
}

// TestHandSkipsFound: the check finds each way to skip by hand, and
// leaves alone what is not one.
func TestHandSkipsFound(t *testing.T) {
	dir := t.TempDir()
	write := func(path, src string) {
		t.Helper()
		p := filepath.Join(dir, path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("go.mod", "module example.com/m\n")
	write("a/a_test.go", `package a
import ("os/exec"; "testing")
func TestA(t *testing.T) {
	t.Skip("x")
	if _, err := exec.LookPath("groff"); err != nil { return }
}
func BenchmarkA(b *testing.B) { b.SkipNow() }
func helper(tb testing.TB) { tb.Skipf("%d", 1) }
`)
	write("b/helper.go", `package b
import "testing"
func Need(t testing.TB) { t.Skip("no") }
`)
	// Not a test file and no "testing": a method of its own called Skip.
	write("c/c.go", `package c
type r struct{}
func (r) Skip() {}
func f() { r{}.Skip() }
`)
	write("internal/testenv/tier/tier.go", `package tier
import "testing"
func Unavailable(t testing.TB, why string) { t.Skip(why) }
`)
	write("a/testdata/x_test.go", `package x
import "testing"
func TestX(t *testing.T) { t.Skip() }
`)
	got := handSkips(t, dir)
	want := []string{
		"a/a_test.go:4: t.Skip: skip through internal/testenv (Unavailable, Tool, Root, ...) so BOX_REQUIRE_TIERS=1 fails it",
		"a/a_test.go:5: exec.LookPath: find a tool with testenv.Tool (or tier.Tool), which names its Debian package and fails under BOX_REQUIRE_TIERS=1",
		"a/a_test.go:7: b.SkipNow: skip through internal/testenv (Unavailable, Tool, Root, ...) so BOX_REQUIRE_TIERS=1 fails it",
		"a/a_test.go:8: tb.Skipf: skip through internal/testenv (Unavailable, Tool, Root, ...) so BOX_REQUIRE_TIERS=1 fails it",
		"b/helper.go:3: t.Skip: skip through internal/testenv (Unavailable, Tool, Root, ...) so BOX_REQUIRE_TIERS=1 fails it",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("got:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestToolPackagesInstalled: every Debian package a test names in Tool
// (as a literal) is one scripts/deps.sh installs, or one every Debian
// machine that can run the tests has.
func TestToolPackagesInstalled(t *testing.T) {
	root := moduleRoot(t)
	b, err := os.ReadFile(filepath.Join(root, "scripts", "deps.sh"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?s)\npkgs=\(([^)]*)\)`).FindSubmatch(b)
	if m == nil {
		t.Fatal("no pkgs=(...) list in scripts/deps.sh")
	}
	installed := map[string]bool{}
	for _, p := range strings.Fields(string(m[1])) {
		installed[p] = true
	}
	// Essential (or, for golang-go, the toolchain running this test).
	for _, p := range []string{"bash", "dash", "dpkg", "passwd", "golang-go"} {
		installed[p] = true
	}
	named := toolPackages(t, root)
	if len(named) < 5 {
		t.Fatalf("only %d Tool calls found: %v", len(named), named)
	}
	for at, pkg := range named {
		if !installed[pkg] {
			t.Errorf("%s: package %s is not in scripts/deps.sh's pkgs", at, pkg)
		}
	}
}

// toolPackages maps "path:line" of each Tool(t, name, "package") call with
// a literal package to the package.
func toolPackages(t *testing.T, root string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); name == "testdata" || (strings.HasPrefix(name, ".") && path != root) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok || len(call.Args) != 3 {
				return true
			}
			if sel, ok := call.Fun.(*ast.SelectorExpr); !ok || sel.Sel.Name != "Tool" {
				return true
			}
			if lit, ok := call.Args[2].(*ast.BasicLit); ok && lit.Kind == token.STRING {
				pkg, _ := strconv.Unquote(lit.Value)
				rel, _ := filepath.Rel(root, path)
				out[rel+":"+strconv.Itoa(fset.Position(call.Pos()).Line)] = pkg
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

var checkedFiles int

// handSkips lists, as "path:line: what", every Skip, Skipf or SkipNow call
// and every exec.LookPath in the Go files under root that import
// "testing" (tests and their helpers), outside internal/testenv and
// testdata folders.
func handSkips(t *testing.T, root string) []string {
	t.Helper()
	checkedFiles = 0
	var out []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			name := d.Name()
			if rel == "internal/testenv" || name == "testdata" || name == "vendor" || (strings.HasPrefix(name, ".") && rel != ".") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		if !imports(f, "testing") {
			return nil
		}
		checkedFiles++
		exec := localName(f, "os/exec")
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			x, _ := sel.X.(*ast.Ident)
			at := rel + ":" + strconv.Itoa(fset.Position(call.Pos()).Line) + ": "
			switch {
			case sel.Sel.Name == "Skip" || sel.Sel.Name == "Skipf" || sel.Sel.Name == "SkipNow":
				out = append(out, at+exprString(sel)+": skip through internal/testenv (Unavailable, Tool, Root, ...) so BOX_REQUIRE_TIERS=1 fails it")
			case sel.Sel.Name == "LookPath" && x != nil && exec != "" && x.Name == exec:
				out = append(out, at+"exec.LookPath: find a tool with testenv.Tool (or tier.Tool), which names its Debian package and fails under BOX_REQUIRE_TIERS=1")
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func imports(f *ast.File, path string) bool {
	return localName(f, path) != ""
}

// localName is the name f uses for the package at path, "" if it does
// not import it.
func localName(f *ast.File, path string) string {
	for _, imp := range f.Imports {
		if p, _ := strconv.Unquote(imp.Path.Value); p == path {
			if imp.Name != nil {
				return imp.Name.Name
			}
			return path[strings.LastIndex(path, "/")+1:]
		}
	}
	return ""
}

func exprString(sel *ast.SelectorExpr) string {
	if x, ok := sel.X.(*ast.Ident); ok {
		return x.Name + "." + sel.Sel.Name
	}
	return sel.Sel.Name
}

// moduleRoot is the folder of the go.mod above this package.
func moduleRoot(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above " + dir)
		}
		dir = parent
	}
}
