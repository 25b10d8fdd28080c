// Tests of scripts/release.sh, the release gate, run as `make release`
// in a temporary git repository holding a copy of this source tree, with
// drill runs fabricated (the drill's own report types) and recorded by
// the drill's own recording code. Unit tier: no root, no network (the
// module cache must hold the dependencies, as for any build here).
package scripts_test

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/drill"
	"github.com/box-isolation/box/drill/gate/gatetest"
	"github.com/box-isolation/box/drill/report"
)

var (
	baseOnce sync.Once
	baseDir  string
	baseErr  error
)

// base is a repository holding this source tree (the work tree as it is,
// uncommitted changes included) in one commit. Each test clones it.
func base(t *testing.T) string {
	t.Helper()
	gatetest.Need(t, "git", "make", "go")
	baseOnce.Do(func() {
		baseDir, baseErr = os.MkdirTemp("", "box-release-base-")
		if baseErr != nil {
			return
		}
		if baseErr = copyTree("..", baseDir); baseErr != nil {
			return
		}
		// The base has no runs of its own: each test records its own.
		runs := filepath.Join(baseDir, "RUNS.md")
		if baseErr = os.WriteFile(runs, []byte(gatetest.Header(t, runs)), 0o644); baseErr != nil {
			return
		}
		if baseErr = os.RemoveAll(filepath.Join(baseDir, "drills")); baseErr != nil {
			return
		}
		for _, args := range [][]string{{"init", "-q", "-b", "main"}, {"add", "-A"}, {"commit", "-q", "-m", "the code"}} {
			c := exec.Command("git", append([]string{"-C", baseDir}, args...)...)
			c.Env = gatetest.Env()
			if out, err := c.CombinedOutput(); err != nil {
				baseErr = fmt.Errorf("git %s: %w: %s", args[0], err, out)
				return
			}
		}
	})
	require.NoError(t, baseErr)
	return baseDir
}

func TestMain(m *testing.M) {
	code := m.Run()
	if baseDir != "" {
		os.RemoveAll(baseDir)
	}
	os.Exit(code)
}

// copyTree copies the files git would see in src (tracked or not
// ignored, and present) to dst.
func copyTree(src, dst string) error {
	out, err := exec.Command("git", "-C", src, "ls-files", "-z", "--cached", "--others", "--exclude-standard").Output()
	if err != nil {
		return err
	}
	for _, p := range strings.Split(string(out), "\x00") {
		if p == "" {
			continue
		}
		from := filepath.Join(src, p)
		info, err := os.Lstat(from)
		if err != nil || !info.Mode().IsRegular() {
			continue // deleted in the work tree, or not a file
		}
		data, err := os.ReadFile(from)
		if err != nil {
			return err
		}
		to := filepath.Join(dst, p)
		if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(to, data, info.Mode().Perm()); err != nil {
			return err
		}
	}
	return nil
}

// clone is a fresh repository of the base, and its HEAD.
func clone(t *testing.T) (dir, x string) {
	t.Helper()
	b := base(t)
	dir = filepath.Join(t.TempDir(), "box")
	gatetest.Git(t, filepath.Dir(dir), "clone", "-q", b, dir)
	return dir, gatetest.Git(t, dir, "rev-parse", "HEAD")
}

// record records a fabricated run into the clone's RUNS.md and commits it.
func record(t *testing.T, dir string, rep *drill.Report) report.Recorded {
	t.Helper()
	rec := gatetest.Record(t, filepath.Join(dir, "RUNS.md"), rep)
	gatetest.Commit(t, dir, "drill run "+rep.RunID)
	return rec
}

// release runs make release in dir.
func release(t *testing.T, dir string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	c := exec.Command("make", append([]string{"--no-print-directory", "release"}, args...)...)
	c.Dir = dir
	c.Env = append(gatetest.Env(), "GOPROXY=off")
	var o, e bytes.Buffer
	c.Stdout, c.Stderr = &o, &e
	err := c.Run()
	if err != nil {
		var exit *exec.ExitError
		require.ErrorAs(t, err, &exit, "make release: %v\n%s", err, e.String())
		return exit.ExitCode(), o.String(), e.String()
	}
	return 0, o.String(), e.String()
}

func hasTag(t *testing.T, dir, tag string) bool {
	t.Helper()
	c := exec.Command("git", "-C", dir, "rev-parse", "--verify", "--quiet", "refs/tags/"+tag)
	c.Env = gatetest.Env()
	return c.Run() == nil
}

func TestReleaseRefuses(t *testing.T) {
	v := []string{"VERSION=1.2.3"}
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, dir, x string)
		args  []string
		want  []string // in make's stderr
	}{
		{"no VERSION", func(*testing.T, string, string) {}, []string{},
			[]string{"release: usage: make release VERSION=x.y.z"}},
		{"a VERSION that is not x.y.z", func(*testing.T, string, string) {}, []string{"VERSION=latest"},
			[]string{"VERSION=latest is not x.y.z"}},
		{"no run recorded", func(*testing.T, string, string) {}, v,
			[]string{"RUNS.md records no drill run", "to release: on a real Incus host", "release: no recorded drill run proves HEAD"}},
		{"the report altered by one byte", func(t *testing.T, dir, x string) {
			rec := record(t, dir, gatetest.HostPass("a1b2c3", x[:7]))
			file := filepath.Join(dir, rec.Report)
			data, err := os.ReadFile(file)
			require.NoError(t, err)
			i := bytes.Index(data, []byte(`"incus-7"`))
			require.Positive(t, i)
			data[i+len(`"incus-`)] = '8'
			require.NoError(t, os.WriteFile(file, data, 0o644))
			gatetest.Commit(t, dir, "touch up the report")
		}, v, []string{"FAIL RUNS.md line ", "its report drills/a1b2c3.json has SHA-256", "release: RUNS.md does not match its reports under drills/"}},
		{"a code file changed after the run", func(t *testing.T, dir, x string) {
			record(t, dir, gatetest.HostPass("a1b2c3", x[:7]))
			f := filepath.Join(dir, "cmd", "box", "main.go")
			data, err := os.ReadFile(f)
			require.NoError(t, err)
			require.NoError(t, os.WriteFile(f, append(data, []byte("\n// changed after the drill ran\n")...), 0o644))
			gatetest.Commit(t, dir, "a change after the run")
		}, v, []string{"files changed since commit ", "cmd/box/main.go", "run the drill on HEAD"}},
		{"a world-mode row", func(t *testing.T, dir, x string) {
			rep := gatetest.HostPass("a1b2c3", x[:7])
			rep.Environment.Mode = "world"
			record(t, dir, rep)
		}, v, []string{"a world-mode run: only a run on a real Incus host (drill run --host) proves a release"}},
		{"an inconclusive run", func(t *testing.T, dir, x string) {
			rep := gatetest.HostPass("a1b2c3", x[:7])
			gatetest.Set(rep, "C-NAMES", drill.Inconclusive)
			record(t, dir, rep)
		}, v, []string{"exited 3: a release needs exit 0", "C-NAMES inconclusive"}},
		{"a skipped claim", func(t *testing.T, dir, x string) {
			rep := gatetest.HostPass("a1b2c3", x[:7])
			gatetest.Set(rep, "C-INBOUND", drill.Skipped)
			record(t, dir, rep)
		}, v, []string{"1 skipped: every claim must pass"}},
		{"a dirty build", func(t *testing.T, dir, x string) {
			record(t, dir, gatetest.HostPass("a1b2c3", x[:7]+"-dirty"))
		}, v, []string{"built from a tree with changes"}},
		{"a work tree with changes", func(t *testing.T, dir, x string) {
			record(t, dir, gatetest.HostPass("a1b2c3", x[:7]))
			require.NoError(t, os.WriteFile(filepath.Join(dir, "stack", "extra.go"), []byte("package stack\n"), 0o644))
		}, v, []string{"?? stack/extra.go", "release: the work tree has changes"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir, x := clone(t)
			tc.setup(t, dir, x)
			code, _, stderr := release(t, dir, tc.args...)
			assert.NotEqual(t, 0, code, "make release must refuse:\n%s", stderr)
			for _, w := range tc.want {
				assert.Contains(t, stderr, w)
			}
			assert.False(t, hasTag(t, dir, "v1.2.3"), "no tag on a refusal")
		})
	}
}

func TestReleasePasses(t *testing.T) {
	t.Run("tags", func(t *testing.T) {
		t.Parallel()
		dir, x := clone(t)
		rec := record(t, dir, gatetest.HostPass("a1b2c3", x[:7]))
		head := gatetest.Git(t, dir, "rev-parse", "HEAD")
		code, stdout, stderr := release(t, dir, "VERSION=1.2.3")
		require.Equal(t, 0, code, stderr)
		require.True(t, hasTag(t, dir, "v1.2.3"))
		assert.Equal(t, "tag", gatetest.Git(t, dir, "cat-file", "-t", "v1.2.3"), "an annotated tag")
		assert.Equal(t, head, gatetest.Git(t, dir, "rev-parse", "v1.2.3^{commit}"))
		msg := gatetest.Git(t, dir, "tag", "-l", "--format=%(contents)", "v1.2.3")
		assert.Contains(t, msg, "box v1.2.3")
		assert.Contains(t, msg, "RUNS.md line "+strconv.Itoa(rec.Line))
		assert.Contains(t, msg, "drill run a1b2c3 on host incus-7")
		assert.Contains(t, msg, "(commit "+x+")")
		assert.Contains(t, msg, "report drills/a1b2c3.json sha256 "+rec.SHA256)
		// This tree has `make package`: the release builds the packages,
		// and the row that vouches for them goes beside them, in the sums.
		assert.Contains(t, stdout+stderr, "package: box 1.2.3")
		vouch, err := os.ReadFile(filepath.Join(dir, "dist", "drill-record.txt"))
		require.NoError(t, err)
		assert.Contains(t, string(vouch), "RUNS.md line "+strconv.Itoa(rec.Line))
		assert.Contains(t, string(vouch), "report drills/a1b2c3.json sha256 "+rec.SHA256)
		sums := exec.Command("sha256sum", "-c", "SHA256SUMS")
		sums.Dir = filepath.Join(dir, "dist")
		out, err := sums.CombinedOutput()
		require.NoError(t, err, "%s", out)
		assert.Contains(t, string(out), "drill-record.txt: OK")

		// Once tagged, the version is taken.
		code, _, stderr = release(t, dir, "VERSION=1.2.3")
		assert.NotEqual(t, 0, code)
		assert.Contains(t, stderr, "tag v1.2.3 exists already")
	})
	t.Run("packages when make package exists", func(t *testing.T) {
		t.Parallel()
		dir, _ := clone(t)
		mk := filepath.Join(dir, "Makefile")
		data, err := os.ReadFile(mk)
		require.NoError(t, err)
		data = append(data, []byte("\npackage:\n\techo $(VERSION) > $(CURDIR)/../packaged\n")...)
		require.NoError(t, os.WriteFile(mk, data, 0o644))
		x := gatetest.Commit(t, dir, "a package target")
		record(t, dir, gatetest.HostPass("a1b2c3", x[:7]))
		code, _, stderr := release(t, dir, "VERSION=v2.0.0")
		require.Equal(t, 0, code, stderr)
		assert.True(t, hasTag(t, dir, "v2.0.0"))
		packaged, err := os.ReadFile(filepath.Join(dir, "..", "packaged"))
		require.NoError(t, err, "make package ran")
		assert.Equal(t, "2.0.0\n", string(packaged))
	})
}
