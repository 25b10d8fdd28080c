// Package gate is the release gate: it decides whether a repository's HEAD
// may be released, from the drill runs recorded in its RUNS.md.
//
// The rows that count are host runs of HEAD's code: a row matching its
// report under drills/, of a host-mode run (a real Incus host), by a drill
// built from a clean tree at a commit X that is HEAD or an ancestor of it,
// with nothing but RUNS.md and drills/ changed from X to HEAD. The newest
// of them decides: HEAD ships only if that run exited 0 with every claim
// of the catalogue passed (none failed, inconclusive or skipped) but those
// a host cannot run at all, which the world proves (make test), so an
// older pass never outvotes a later failure. The work tree must be clean
// and every row must match its report. There is no waiver.
package gate

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"github.com/box-isolation/box/drill/report"
	"github.com/box-isolation/box/drill/verdicts"
)

// Options say what to check.
type Options struct {
	// Repo is a directory in the work tree to release.
	Repo string
	// Runs is the RUNS.md; relative paths are from Repo. Empty: RUNS.md
	// at the work tree's top.
	Runs string
	// Claims are the ids of the claims a run must have judged: the
	// catalogue of the drill at HEAD (which is X's, nothing but the record
	// having changed since).
	Claims []string
	// HostCannot are the claims of Claims that host mode never runs, with
	// why: the catalogue's, not the operator's (drill.NeverIn). A host run
	// skips them; the hermetic world's runs (make test) prove them.
	HostCannot map[string]string
}

// Decision is the gate's answer.
type Decision struct {
	Head string `json:"head"` // HEAD's commit
	Runs string `json:"runs"` // the RUNS.md read, from the work tree's top
	// Blockers are reasons that hold whatever the rows say: a work tree
	// with changes.
	Blockers []string `json:"blockers"`
	// Proof is the row that lets HEAD ship, the newest host run of its
	// code; nil if there is none or it did not pass.
	Proof *Proof `json:"proof,omitempty"`
	// Refused are the rows looked at before the decision, newest first,
	// with why each does not let HEAD ship.
	Refused []Refusal `json:"refused"`
}

// OK says HEAD may be released.
func (d *Decision) OK() bool { return d.Proof != nil && len(d.Blockers) == 0 }

// Proof is the row a release rests on.
type Proof struct {
	Line    int    `json:"line"`
	RunID   string `json:"run_id"`
	Host    string `json:"host"`
	Started string `json:"started"`
	Version string `json:"version"` // the drill build, as recorded
	Commit  string `json:"commit"`  // the commit it names
	Claims  int    `json:"claims"`  // all passed but NotRun
	// NotRun are the claims a host cannot run, skipped, with why.
	NotRun   []string `json:"not_run"`
	Report   string   `json:"report"`
	SHA256   string   `json:"sha256"`
	Incus    string   `json:"incus"`
	Kernel   string   `json:"kernel"`
	Instance string   `json:"instance_type"`
}

// Refusal is why one row cannot ship HEAD.
type Refusal struct {
	Line    int      `json:"line"`
	Row     string   `json:"row"` // the row named for people
	Reasons []string `json:"reasons"`
}

// Check decides whether HEAD may be released. The error is for a check
// that could not be made (no git repository, no RUNS.md).
func Check(ctx context.Context, o Options) (*Decision, error) {
	g := git{dir: o.Repo}
	top, err := g.run(ctx, "rev-parse", "--show-toplevel")
	if err != nil {
		return nil, fmt.Errorf("finding the repository: %w", err)
	}
	head, err := g.run(ctx, "rev-parse", "--verify", "HEAD^{commit}")
	if err != nil {
		return nil, fmt.Errorf("reading HEAD: %w (a release needs a commit)", err)
	}
	runs := o.Runs
	switch {
	case runs == "":
		runs = filepath.Join(top, "RUNS.md")
	case !filepath.IsAbs(runs):
		runs = filepath.Join(o.Repo, runs)
	}
	// The paths the record may change after the run, relative to the top.
	runsRel, err := relTo(top, runs)
	if err != nil {
		return nil, err
	}
	drillsRel := filepath.ToSlash(filepath.Join(filepath.Dir(runsRel), report.ReportsDir)) + "/"
	runsRel = filepath.ToSlash(runsRel)

	d := &Decision{Head: head, Runs: runsRel, Blockers: []string{}, Refused: []Refusal{}}
	status, err := g.run(ctx, "status", "--porcelain", "--untracked-files=normal")
	if err != nil {
		return nil, fmt.Errorf("reading the work tree's status: %w", err)
	}
	if status != "" {
		paths := strings.Split(status, "\n")
		d.Blockers = append(d.Blockers, fmt.Sprintf("the work tree has changes (%s): a release is cut from a commit; commit them (RUNS.md and drills/ included) or stash them",
			listSome(trimStatus(paths), 5)))
	}

	checks, err := report.Verify(runs)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("reading the record: %w (no drill run is recorded: drill run --host --canary ADDR:PORT --record RUNS.md on a real Incus host makes it)", err)
	}
	if err != nil {
		return nil, fmt.Errorf("reading the record: %w", err)
	}
	if bad := unverified(checks); bad > 0 {
		d.Blockers = append(d.Blockers, fmt.Sprintf("%d rows of %s do not match their reports under %s/ (drill record verify says how): restore what changed, or record a new run",
			bad, runsRel, report.ReportsDir))
	}
	want := slices.Clone(o.Claims)
	slices.Sort(want)
	// The newest host run of HEAD's code decides: an older pass does not
	// outvote a later failure.
	for i := len(checks) - 1; i >= 0; i-- {
		c := checks[i]
		refuse := func(reasons ...string) {
			d.Refused = append(d.Refused, Refusal{Line: c.Line, Row: c.Name(runsRel), Reasons: reasons})
		}
		if !c.OK() {
			refuse("does not match its report: " + strings.Join(c.Problems, "; "))
			continue
		}
		rep := c.Report
		if m := rep.Environment.Mode; m != "host" {
			refuse(fmt.Sprintf("a %s-mode run: only a run on a real Incus host (drill run --host) proves a release", m))
			continue
		}
		rev, why := commitOf(rep.Version)
		if why != "" {
			refuse(why)
			continue
		}
		commit, why, err := sameCode(ctx, g, rev, runsRel, drillsRel)
		if err != nil {
			return nil, err
		}
		if why != "" {
			refuse(why)
			continue
		}
		if reasons := passReasons(rep, want, o.HostCannot); len(reasons) > 0 {
			refuse(append(reasons, "it is the newest host run of HEAD's code, so it decides: run the drill again")...)
			break
		}
		d.Proof = &Proof{Line: c.Line, RunID: rep.RunID, Host: rep.Environment.Hostname, Started: rep.Started.UTC().Format("2006-01-02T15:04:05Z"),
			Version: rep.Version, Commit: commit, Claims: len(rep.Claims), NotRun: notRun(rep, o.HostCannot), Report: c.Cells["report"], SHA256: c.SHA256,
			Incus: rep.Environment.IncusVersion, Kernel: rep.Environment.Kernel, Instance: rep.Environment.InstanceType}
		break
	}
	return d, nil
}

func unverified(checks []report.RowCheck) int {
	n := 0
	for _, c := range checks {
		if !c.OK() {
			n++
		}
	}
	return n
}

// notRun names the claims rep skipped because a host cannot run them.
func notRun(rep *verdicts.Report, hostCannot map[string]string) []string {
	notRun := []string{}
	for _, cr := range rep.Claims {
		if why, ok := hostCannot[string(cr.ID)]; ok && cr.Verdict == verdicts.Skipped {
			notRun = append(notRun, fmt.Sprintf("%s (%s)", cr.ID, why))
		}
	}
	return notRun
}

// passReasons are why a run does not prove every claim: its exit code,
// any claim not passed (a skipped claim is not proven, unless a host can
// never run it), a claim of the catalogue it did not judge.
func passReasons(rep *verdicts.Report, claims []string, hostCannot map[string]string) []string {
	var reasons []string
	if len(rep.Mutations) > 0 || rep.Clean != nil {
		reasons = append(reasons, fmt.Sprintf("a mutation run (%s): its claims were meant to fail", strings.Join(rep.Mutations, ", ")))
	}
	if rep.ExitCode != verdicts.ExitOK {
		reasons = append(reasons, fmt.Sprintf("exited %d: a release needs exit 0", rep.ExitCode))
	}
	s := rep.Summary
	if skipped := s.Skipped - len(notRun(rep, hostCannot)); s.Failed+s.Inconclusive+skipped > 0 {
		reasons = append(reasons, fmt.Sprintf("%d failed, %d inconclusive, %d skipped: every claim must pass (a skipped claim is not proven; only those a host cannot run are skipped)", s.Failed, s.Inconclusive, skipped))
	}
	var judged, notPassed []string
	for _, cr := range rep.Claims {
		judged = append(judged, string(cr.ID))
		if _, never := hostCannot[string(cr.ID)]; never && cr.Verdict == verdicts.Skipped {
			continue
		}
		if cr.Verdict != verdicts.Pass {
			notPassed = append(notPassed, fmt.Sprintf("%s %s", cr.ID, cr.Verdict))
		}
	}
	if len(notPassed) > 0 {
		reasons = append(reasons, "claims not passed: "+strings.Join(notPassed, ", "))
	}
	slices.Sort(judged)
	if missing := minus(claims, judged); len(missing) > 0 {
		reasons = append(reasons, "claims of HEAD's catalogue it did not judge: "+strings.Join(missing, ", "))
	}
	if extra := minus(judged, claims); len(extra) > 0 {
		reasons = append(reasons, "claims HEAD's catalogue does not have: "+strings.Join(extra, ", "))
	}
	return reasons
}

var (
	hexRE      = regexp.MustCompile(`^[0-9a-f]{7,40}$`)
	describeRE = regexp.MustCompile(`^.+-[0-9]+-g([0-9a-f]{7,40})$`)
	tagRE      = regexp.MustCompile(`^v?[0-9]+\.[0-9]+\.[0-9]+([-+][0-9A-Za-z.-]+)?$`)
)

// commitOf reads the commit a drill version names (git describe's output:
// a hash, TAG-N-gHASH, or a release tag), or says why it names none.
func commitOf(version string) (rev, why string) {
	switch {
	case strings.HasSuffix(version, "-dirty"):
		return "", fmt.Sprintf("built from a tree with changes (version %s): build from a clean checkout (make build) and run again", version)
	case hexRE.MatchString(version):
		return version, ""
	case describeRE.MatchString(version):
		return describeRE.FindStringSubmatch(version)[1], ""
	case tagRE.MatchString(version):
		// A release build's version is its tag, with or without the v.
		return "refs/tags/v" + strings.TrimPrefix(version, "v"), ""
	}
	return "", fmt.Sprintf("version %q names no commit (a drill built without make build): build it with make build and run again", version)
}

// sameCode resolves rev and says why HEAD's code is not the code at it:
// rev must be HEAD or its ancestor, and nothing but the record may have
// changed since.
func sameCode(ctx context.Context, g git, rev, runsRel, drillsRel string) (commit, why string, err error) {
	commit, err = g.run(ctx, "rev-parse", "--verify", "--quiet", rev+"^{commit}")
	if err != nil {
		return "", fmt.Sprintf("commit %s is not in this repository (or is ambiguous)", strings.TrimPrefix(rev, "refs/tags/")), nil
	}
	short := commit[:min(12, len(commit))]
	if err := g.quiet(ctx, "merge-base", "--is-ancestor", commit, "HEAD"); err != nil {
		var exit *exec.ExitError
		if errors.As(err, &exit) && exit.ExitCode() == 1 {
			return "", fmt.Sprintf("commit %s is not HEAD or an ancestor of it: the run proved another line of history", short), nil
		}
		return "", "", fmt.Errorf("git merge-base: %w", err)
	}
	// Renames off, so a file moved into drills/ shows where it came from.
	out, err := g.run(ctx, "diff", "--name-only", "--no-renames", "--no-relative", "-z", commit, "HEAD")
	if err != nil {
		return "", "", fmt.Errorf("git diff: %w", err)
	}
	var changed []string
	for _, p := range strings.Split(out, "\x00") {
		if p != "" && p != runsRel && !strings.HasPrefix(p, drillsRel) {
			changed = append(changed, p)
		}
	}
	if len(changed) > 0 {
		return "", fmt.Sprintf("files changed since commit %s: %s; only %s and %s may change after the run: run the drill on HEAD",
			short, listSome(changed, 5), runsRel, drillsRel), nil
	}
	return commit, "", nil
}

func minus(a, b []string) []string {
	var out []string
	for _, s := range a {
		if _, found := slices.BinarySearch(b, s); !found {
			out = append(out, s)
		}
	}
	return out
}

func listSome(items []string, n int) string {
	if len(items) <= n {
		return strings.Join(items, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(items[:n], ", "), len(items)-n)
}

func trimStatus(lines []string) []string {
	out := make([]string, 0, len(lines))
	for _, l := range lines {
		if len(l) > 3 {
			l = l[3:]
		}
		out = append(out, l)
	}
	return out
}

func relTo(top, path string) (string, error) {
	t, err := filepath.EvalSymlinks(top)
	if err != nil {
		return "", err
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", err
	}
	// RUNS.md may not exist yet: resolve its directory.
	dir, err := filepath.EvalSymlinks(filepath.Dir(abs))
	if err != nil {
		return "", fmt.Errorf("reading the record: %w", err)
	}
	rel, err := filepath.Rel(t, filepath.Join(dir, filepath.Base(abs)))
	if err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
		return "", fmt.Errorf("%s is outside the repository %s: the record must be committed with the code it proves", path, top)
	}
	return rel, nil
}

// git runs git in a directory.
type git struct{ dir string }

func (g git) cmd(ctx context.Context, args ...string) *exec.Cmd {
	c := exec.CommandContext(ctx, "git", append([]string{"-C", g.dir}, args...)...)
	c.Env = append(c.Environ(), "LC_ALL=C", "GIT_OPTIONAL_LOCKS=0")
	return c
}

// run returns git's output, trimmed.
func (g git) run(ctx context.Context, args ...string) (string, error) {
	var out, errb bytes.Buffer
	c := g.cmd(ctx, args...)
	c.Stdout, c.Stderr = &out, &errb
	if err := c.Run(); err != nil {
		if msg := strings.TrimSpace(errb.String()); msg != "" {
			return "", fmt.Errorf("git %s: %s: %w", args[0], msg, err)
		}
		return "", fmt.Errorf("git %s: %w", args[0], err)
	}
	return strings.TrimRight(out.String(), "\n"), nil
}

// quiet runs git for its exit code.
func (g git) quiet(ctx context.Context, args ...string) error {
	return g.cmd(ctx, args...).Run()
}
