package gate_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/drill"
	"github.com/box-isolation/box/drill/gate"
	"github.com/box-isolation/box/drill/gate/gatetest"
)

// code is the repository's code before any run.
var code = map[string]string{
	"go.mod":            "module example.com/gated\n",
	"main.go":           "package main\n\nfunc main() {}\n",
	"stack/rules.nft":   "table inet box {}\n",
	"docs/operators.md": "# operators\n",
}

// repo is a repository with its code committed at X, and a drill build of
// X (its version, as git describe gives it).
type repo struct {
	dir, x, version string
}

func newRepo(t *testing.T) repo {
	t.Helper()
	gatetest.Need(t, "git")
	dir := gatetest.NewRepo(t, code)
	x := gatetest.Git(t, dir, "rev-parse", "HEAD")
	return repo{dir: dir, x: x, version: x[:7]}
}

// record records rep into the repository's RUNS.md and commits it.
func (r repo) record(t *testing.T, rep *drill.Report) {
	t.Helper()
	gatetest.Record(t, filepath.Join(r.dir, "RUNS.md"), rep)
	gatetest.Commit(t, r.dir, "drill run "+rep.RunID)
}

func (r repo) check(t *testing.T, claims []string) *gate.Decision {
	t.Helper()
	d, err := gate.Check(context.Background(), gate.Options{Repo: r.dir, Claims: claims, HostCannot: hostCannot()})
	require.NoError(t, err)
	return d
}

func catalogue() []string {
	var ids []string
	for _, c := range drill.Catalogue {
		ids = append(ids, string(c.ID))
	}
	return ids
}

// hostCannot is what drill record gate passes: the catalogue's claims a
// host never runs.
func hostCannot() map[string]string {
	m := map[string]string{}
	for id, why := range drill.NeverIn(drill.ModeHost) {
		m[string(id)] = why
	}
	return m
}

func TestCheck(t *testing.T) {
	for _, tc := range []struct {
		name string
		// setup makes the repository's state; claims, if set, replace
		// the catalogue.
		setup   func(t *testing.T, r repo) []string
		refused []string // in the newest row's refusal; none: HEAD ships
		blocker string   // a reason that holds whatever the rows say
	}{
		{"no run recorded", func(t *testing.T, r repo) []string {
			header := gatetest.Header(t, filepath.Join("..", "..", "RUNS.md"))
			gatetest.WriteFiles(t, r.dir, map[string]string{"RUNS.md": header})
			gatetest.Commit(t, r.dir, "no runs yet")
			return nil
		}, []string{}, ""},
		{"a passing host run of HEAD's code", func(t *testing.T, r repo) []string {
			r.record(t, gatetest.HostPass("a1b2c3", r.version))
			return nil
		}, nil, ""},
		{"more records after the run", func(t *testing.T, r repo) []string {
			r.record(t, gatetest.HostPass("a1b2c3", r.version))
			world := gatetest.HostPass("d4e5f6", r.version)
			world.Environment.Mode = "world"
			r.record(t, world)
			return nil
		}, nil, ""},
		{"the full commit as version", func(t *testing.T, r repo) []string {
			r.record(t, gatetest.HostPass("a1b2c3", r.x))
			return nil
		}, nil, ""},
		{"a describe version past a tag", func(t *testing.T, r repo) []string {
			gatetest.Git(t, r.dir, "tag", "-a", "v0.1.0", "-m", "v0.1.0", "HEAD~0")
			gatetest.WriteFiles(t, r.dir, map[string]string{"main.go": "package main\n\nfunc main() { println() }\n"})
			x := gatetest.Commit(t, r.dir, "more code")
			r.record(t, gatetest.HostPass("a1b2c3", "v0.1.0-1-g"+x[:7]))
			return nil
		}, nil, ""},
		{"a release tag as version", func(t *testing.T, r repo) []string {
			gatetest.Git(t, r.dir, "tag", "-a", "v0.1.0", "-m", "v0.1.0")
			r.record(t, gatetest.HostPass("a1b2c3", "v0.1.0"))
			return nil
		}, nil, ""},
		{"the report altered by one byte", func(t *testing.T, r repo) []string {
			r.record(t, gatetest.HostPass("a1b2c3", r.version))
			alterByte(t, filepath.Join(r.dir, "drills", "a1b2c3.json"), `"hostname": "incus-7"`, `"hostname": "incus-8"`)
			gatetest.Commit(t, r.dir, "edit the report")
			return nil
		}, []string{"does not match its report", "the report changed after it was recorded"}, "1 rows of RUNS.md do not match their reports"},
		{"the report missing", func(t *testing.T, r repo) []string {
			r.record(t, gatetest.HostPass("a1b2c3", r.version))
			gatetest.Git(t, r.dir, "rm", "-q", "drills/a1b2c3.json")
			gatetest.Commit(t, r.dir, "lose the report")
			return nil
		}, []string{"its report drills/a1b2c3.json is missing"}, "do not match their reports"},
		{"a code file changed after the run", func(t *testing.T, r repo) []string {
			r.record(t, gatetest.HostPass("a1b2c3", r.version))
			gatetest.WriteFiles(t, r.dir, map[string]string{"stack/rules.nft": "table inet box { chain fwd {} }\n"})
			gatetest.Commit(t, r.dir, "change a rule")
			return nil
		}, []string{"files changed since commit {X12}: stack/rules.nft; only RUNS.md and drills/ may change after the run"}, ""},
		{"a doc changed after the run", func(t *testing.T, r repo) []string {
			// Only the record may change: a README could carry a script.
			r.record(t, gatetest.HostPass("a1b2c3", r.version))
			gatetest.WriteFiles(t, r.dir, map[string]string{"docs/operators.md": "# operators\n\nmore\n"})
			gatetest.Commit(t, r.dir, "docs")
			return nil
		}, []string{"files changed since commit", "docs/operators.md"}, ""},
		{"code moved into drills/", func(t *testing.T, r repo) []string {
			r.record(t, gatetest.HostPass("a1b2c3", r.version))
			gatetest.Git(t, r.dir, "mv", "main.go", "drills/main.go")
			gatetest.Commit(t, r.dir, "hide code")
			return nil
		}, []string{"files changed since commit", "main.go"}, ""},
		{"a world-mode run", func(t *testing.T, r repo) []string {
			rep := gatetest.HostPass("a1b2c3", r.version)
			rep.Environment.Mode = "world"
			r.record(t, rep)
			return nil
		}, []string{"a world-mode run: only a run on a real Incus host"}, ""},
		{"an inconclusive run", func(t *testing.T, r repo) []string {
			rep := gatetest.HostPass("a1b2c3", r.version)
			gatetest.Set(rep, "C-LAN", drill.Inconclusive)
			r.record(t, rep)
			return nil
		}, []string{"exited 3: a release needs exit 0", "0 failed, 1 inconclusive, 0 skipped", "C-LAN inconclusive"}, ""},
		{"a failed run", func(t *testing.T, r repo) []string {
			rep := gatetest.HostPass("a1b2c3", r.version)
			gatetest.Set(rep, "C-SIBLING", drill.Fail)
			r.record(t, rep)
			return nil
		}, []string{"exited 1", "1 failed, 0 inconclusive, 0 skipped"}, ""},
		{"a skipped claim", func(t *testing.T, r repo) []string {
			// Exit 0, yet a skipped claim was not proven.
			rep := gatetest.HostPass("a1b2c3", r.version)
			gatetest.Set(rep, "C-INBOUND", drill.Skipped)
			require.Equal(t, drill.ExitOK, rep.ExitCode)
			r.record(t, rep)
			return nil
		}, []string{"0 failed, 0 inconclusive, 1 skipped: every claim must pass (a skipped claim is not proven", "C-INBOUND skipped"}, ""},
		{"the opt-in claim skipped (an unrecorded run's default)", func(t *testing.T, r repo) []string {
			rep := gatetest.HostPass("a1b2c3", r.version)
			gatetest.Set(rep, "C-TIER", drill.Skipped)
			r.record(t, rep)
			return nil
		}, []string{"1 skipped", "C-TIER skipped"}, ""},
		{"a world-only claim failed is not excused", func(t *testing.T, r repo) []string {
			rep := gatetest.HostPass("a1b2c3", r.version)
			gatetest.Set(rep, "C-ALLOW", drill.Inconclusive)
			r.record(t, rep)
			return nil
		}, []string{"0 failed, 1 inconclusive, 0 skipped", "C-ALLOW inconclusive"}, ""},
		{"a claim HEAD's catalogue has that the run did not judge", func(t *testing.T, r repo) []string {
			r.record(t, gatetest.HostPass("a1b2c3", r.version))
			return append(catalogue(), "C-NEW")
		}, []string{"claims of HEAD's catalogue it did not judge: C-NEW"}, ""},
		{"a build from a dirty tree", func(t *testing.T, r repo) []string {
			r.record(t, gatetest.HostPass("a1b2c3", r.version+"-dirty"))
			return nil
		}, []string{"built from a tree with changes (version {V}-dirty)"}, ""},
		{"a build that names no commit", func(t *testing.T, r repo) []string {
			r.record(t, gatetest.HostPass("a1b2c3", "dev"))
			return nil
		}, []string{`version "dev" names no commit`}, ""},
		{"a commit that is not in the repository", func(t *testing.T, r repo) []string {
			r.record(t, gatetest.HostPass("a1b2c3", "0123abc"))
			return nil
		}, []string{"commit 0123abc is not in this repository"}, ""},
		{"a commit on another line of history", func(t *testing.T, r repo) []string {
			gatetest.Git(t, r.dir, "checkout", "-q", "-b", "side")
			gatetest.WriteFiles(t, r.dir, map[string]string{"main.go": "package main\n\nfunc main() { panic(1) }\n"})
			side := gatetest.Commit(t, r.dir, "side")
			gatetest.Git(t, r.dir, "checkout", "-q", "main")
			r.record(t, gatetest.HostPass("a1b2c3", side[:7]))
			return nil
		}, []string{"is not HEAD or an ancestor of it"}, ""},
		{"a later failure of the same code decides", func(t *testing.T, r repo) []string {
			r.record(t, gatetest.HostPass("a1b2c3", r.version))
			rep := gatetest.HostPass("d4e5f6", r.version)
			gatetest.Set(rep, "C-HOST", drill.Fail)
			r.record(t, rep)
			return nil
		}, []string{"exited 1", "it is the newest host run of HEAD's code, so it decides"}, ""},
		{"uncommitted changes", func(t *testing.T, r repo) []string {
			r.record(t, gatetest.HostPass("a1b2c3", r.version))
			gatetest.WriteFiles(t, r.dir, map[string]string{"main.go": "package main\n\nfunc main() { os.Exit(0) }\n"})
			return nil
		}, nil, "the work tree has changes (main.go)"},
		{"an untracked file", func(t *testing.T, r repo) []string {
			r.record(t, gatetest.HostPass("a1b2c3", r.version))
			gatetest.WriteFiles(t, r.dir, map[string]string{"stack/extra.go": "package stack\n"})
			return nil
		}, nil, "the work tree has changes (stack/extra.go)"},
		{"a run recorded but not committed", func(t *testing.T, r repo) []string {
			gatetest.Record(t, filepath.Join(r.dir, "RUNS.md"), gatetest.HostPass("a1b2c3", r.version))
			return nil
		}, nil, "the work tree has changes (RUNS.md, drills/)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRepo(t)
			claims := tc.setup(t, r)
			if claims == nil {
				claims = catalogue()
			}
			d := r.check(t, claims)
			assert.Equal(t, gatetest.Git(t, r.dir, "rev-parse", "HEAD"), d.Head)
			expand := strings.NewReplacer("{X12}", r.x[:12], "{V}", r.version)
			if tc.blocker != "" {
				assert.False(t, d.OK())
				require.NotEmpty(t, d.Blockers)
				assert.Contains(t, strings.Join(d.Blockers, "\n"), expand.Replace(tc.blocker))
			} else {
				assert.Empty(t, d.Blockers)
			}
			switch {
			case tc.refused == nil:
				require.NotNil(t, d.Proof, "refused: %+v", d.Refused)
				assert.Equal(t, "a1b2c3", d.Proof.RunID)
				assert.Equal(t, "drills/a1b2c3.json", d.Proof.Report)
				assert.Len(t, d.Proof.SHA256, 64)
				assert.Equal(t, len(drill.Catalogue), d.Proof.Claims)
				// C-ALLOW, skipped as a host must, named with why.
				require.Len(t, d.Proof.NotRun, 1)
				assert.Contains(t, d.Proof.NotRun[0], "C-ALLOW (it needs the world's second canary")
				// The commit named is the one the run was built from.
				assert.Equal(t, gatetest.Git(t, r.dir, "rev-parse", d.Proof.Version+"^{commit}"), d.Proof.Commit)
				assert.Equal(t, tc.blocker == "", d.OK())
			case len(tc.refused) == 0:
				assert.False(t, d.OK())
				assert.Nil(t, d.Proof)
				assert.Empty(t, d.Refused, "no rows to refuse")
			default:
				assert.False(t, d.OK())
				assert.Nil(t, d.Proof)
				require.NotEmpty(t, d.Refused)
				newest := strings.Join(d.Refused[0].Reasons, "\n")
				for _, want := range tc.refused {
					assert.Contains(t, newest, expand.Replace(want))
				}
				assert.Contains(t, d.Refused[0].Row, "RUNS.md line ")
			}
		})
	}
}

func alterByte(t *testing.T, path, from, to string) {
	t.Helper()
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, len(from), len(to))
	require.Contains(t, string(data), from)
	require.NoError(t, os.WriteFile(path, []byte(strings.Replace(string(data), from, to, 1)), 0o644))
}

func TestCheckErrors(t *testing.T) {
	gatetest.Need(t, "git")
	_, err := gate.Check(context.Background(), gate.Options{Repo: t.TempDir()})
	assert.ErrorContains(t, err, "finding the repository")

	r := newRepo(t)
	_, err = gate.Check(context.Background(), gate.Options{Repo: r.dir})
	assert.ErrorContains(t, err, "reading the record")
	_, err = gate.Check(context.Background(), gate.Options{Repo: r.dir, Runs: filepath.Join(t.TempDir(), "RUNS.md")})
	assert.ErrorContains(t, err, "outside the repository")
}
