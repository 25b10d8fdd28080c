package report

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/box-isolation/box/drill/verdicts"
)

// RunsColumns are the columns of RUNS.md's table, in order.
var RunsColumns = []string{"date", "commit", "mode", "host", "kernel", "incus", "instance type",
	"exit", "passed", "failed", "inconclusive", "skipped", "duration", "report", "sha256"}

// ReportsDir holds each recorded run's JSON report, beside RUNS.md.
const ReportsDir = "drills"

// runsHeader starts a RUNS.md that does not exist yet.
var runsHeader = `# Drill runs

One row per ` + "`drill run --record RUNS.md`" + `. Rows are appended by the drill,
never edited by hand. Each run's full JSON report is stored under
` + "`drills/`" + ` beside this file, and its row carries the report's SHA-256:
` + "`drill record verify`" + ` holds every row against its report.

- commit: the drill build's version, ` + "`git describe`" + ` of the commit it was
  built from; ` + "`-dirty`" + ` when the tree had changes (such a row never ships).
- mode: ` + "`host`" + ` (a real Incus host, ` + "`--host`" + `) or ` + "`world`" + ` (the hermetic world).
- exit: the drill's exit code; passed to skipped: claims by verdict.
- report, sha256: the report's path and the SHA-256 of its bytes.

A release (` + "`make release VERSION=x.y.z`" + `) ships only on a host run of its
code: built from a clean tree at a commit that HEAD differs from in nothing
but this file and ` + "`drills/`" + `. The newest such run decides, and it must
have exited 0 with every claim passed (none failed, inconclusive or
skipped) but those no host can run, which the hermetic world proves in
` + "`make test`" + ` (docs/release.md). There is no waiver.

` + tableHeader()

func tableHeader() string {
	seps := make([]string, len(RunsColumns))
	for i := range seps {
		seps[i] = "---"
	}
	return "| " + strings.Join(RunsColumns, " | ") + " |\n| " + strings.Join(seps, " | ") + " |\n"
}

// ReportPath is where a run's report is stored, relative to RUNS.md's
// directory (with forward slashes, as the row names it).
func ReportPath(rep *verdicts.Report) string { return ReportsDir + "/" + rep.RunID + ".json" }

// reportPathRE is a report path a row may name: a file directly under
// drills/, so the release gate can tell a report from code.
var reportPathRE = regexp.MustCompile(`^` + ReportsDir + `/[0-9A-Za-z][0-9A-Za-z._-]*\.json$`)

// Recorded is what Record wrote.
type Recorded struct {
	Line   int    // the row's line in RUNS.md, from 1
	Report string // the report's path, relative to RUNS.md's directory
	SHA256 string // of the report's bytes, hex
}

// CheckRecordTarget says whether a run can be recorded into path, before
// the run: a RUNS.md with another table (an older drill's) cannot take the
// row, and finding that out after the run would lose it.
func CheckRecordTarget(path string) error {
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		if _, err := os.Stat(filepath.Dir(path)); err != nil {
			return fmt.Errorf("--record %s: %w", path, err)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("--record: %w", err)
	}
	if _, err := parseRuns(data); err != nil {
		return fmt.Errorf("--record %s: %w", path, err)
	}
	return nil
}

// Record stores the run's report under drills/ beside the RUNS.md at path
// and appends the run's row to it, creating the file with its header when
// it does not exist. The row carries the SHA-256 of the exact bytes
// stored.
func Record(path string, rep *verdicts.Report) (Recorded, error) {
	if !runIDRE.MatchString(rep.RunID) {
		return Recorded{}, fmt.Errorf("run id %q cannot name a report file", rep.RunID)
	}
	if err := CheckRecordTarget(path); err != nil {
		return Recorded{}, err
	}
	var buf bytes.Buffer
	if err := JSON(&buf, rep); err != nil {
		return Recorded{}, fmt.Errorf("encoding the report: %w", err)
	}
	rel := ReportPath(rep)
	file := filepath.Join(filepath.Dir(path), filepath.FromSlash(rel))
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		return Recorded{}, err
	}
	// A report is never replaced: a row elsewhere may hash it.
	f, err := os.OpenFile(file, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return Recorded{}, fmt.Errorf("storing the report: %w (run ids are random: run the drill again)", err)
	}
	if _, err := f.Write(buf.Bytes()); err != nil {
		f.Close()
		return Recorded{}, fmt.Errorf("storing the report: %w", err)
	}
	if err := f.Close(); err != nil {
		return Recorded{}, fmt.Errorf("storing the report: %w", err)
	}
	sum := sha256.Sum256(buf.Bytes())
	rec := Recorded{Report: rel, SHA256: hex.EncodeToString(sum[:])}

	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		if err := os.WriteFile(path, []byte(runsHeader), 0o644); err != nil {
			return Recorded{}, err
		}
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return Recorded{}, err
	}
	// A file whose last line lacks its newline would glue the row onto it.
	prefix := ""
	if len(data) > 0 && data[len(data)-1] != '\n' {
		prefix = "\n"
	}
	rec.Line = bytes.Count(data, []byte("\n")) + len(prefix) + 1
	f, err = os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return Recorded{}, err
	}
	_, err = fmt.Fprintln(f, prefix+Row(rep, rec.SHA256))
	return rec, errors.Join(err, f.Close())
}

var runIDRE = regexp.MustCompile(`^[0-9A-Za-z][0-9A-Za-z_-]*$`)

// Row is the run's RUNS.md table row, for a report whose bytes hash to sum.
func Row(rep *verdicts.Report, sum string) string {
	return "| " + strings.Join(rowCells(rep, sum), " | ") + " |"
}

// rowCells are the row's cells, in RunsColumns' order.
func rowCells(rep *verdicts.Report, sum string) []string {
	cell := func(s string) string {
		return strings.TrimSpace(strings.NewReplacer("|", "/", "\n", " ", "\r", " ").Replace(s))
	}
	s := rep.Summary
	return []string{
		rep.Started.UTC().Format(time.DateOnly), cell(rep.Version), cell(rep.Environment.Mode),
		cell(rep.Environment.Hostname), cell(rep.Environment.Kernel), cell(rep.Environment.IncusVersion),
		cell(rep.Environment.InstanceType), fmt.Sprint(rep.ExitCode),
		fmt.Sprint(s.Passed), fmt.Sprint(s.Failed), fmt.Sprint(s.Inconclusive), fmt.Sprint(s.Skipped),
		fmt.Sprintf("%.1fs", float64(rep.DurationMS)/1000), ReportPath(rep), sum,
	}
}

// runsRow is one table row as read from a RUNS.md.
type runsRow struct {
	line  int
	cells []string
}

// parseRuns finds the table in a RUNS.md and returns its rows. A table
// with other columns than drill writes is an error: its rows cannot be
// checked.
func parseRuns(data []byte) ([]runsRow, error) {
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
	var rows []runsRow
	header := false
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if !strings.HasPrefix(line, "|") {
			continue
		}
		cells := splitCells(line)
		switch {
		case !header:
			if strings.Join(cells, "|") != strings.Join(RunsColumns, "|") {
				return nil, fmt.Errorf("line %d: the table's columns are %q, not drill's %q: record into a RUNS.md with drill's table (a missing file is created with it)",
					n, strings.Join(cells, ", "), strings.Join(RunsColumns, ", "))
			}
			header = true
		case separatorRow(cells):
		default:
			rows = append(rows, runsRow{line: n, cells: cells})
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if !header {
		return nil, fmt.Errorf("no table of drill runs in it: record into a RUNS.md with drill's table (a missing file is created with it)")
	}
	return rows, nil
}

func splitCells(line string) []string {
	line = strings.TrimSuffix(strings.TrimPrefix(line, "|"), "|")
	cells := strings.Split(line, "|")
	for i := range cells {
		cells[i] = strings.TrimSpace(cells[i])
	}
	return cells
}

var separatorRE = regexp.MustCompile(`^:?-+:?$`)

func separatorRow(cells []string) bool {
	for _, c := range cells {
		if !separatorRE.MatchString(c) {
			return false
		}
	}
	return true
}

// RowCheck is one row of a RUNS.md held against its report.
type RowCheck struct {
	Line int `json:"line"`
	// Cells are the row's cells by column.
	Cells map[string]string `json:"cells"`
	// SHA256 is the SHA-256 of the report file as found; empty when it
	// could not be read.
	SHA256 string `json:"report_sha256,omitempty"`
	// Problems say how the row and its report disagree; none when they
	// match.
	Problems []string `json:"problems"`
	// Report is the report as stored, nil when it could not be read.
	Report *verdicts.Report `json:"-"`
}

// OK says the row matches its report.
func (c RowCheck) OK() bool { return len(c.Problems) == 0 }

// Name names the row for people: its line, run and commit.
func (c RowCheck) Name(runs string) string {
	s := fmt.Sprintf("%s line %d", runs, c.Line)
	var parts []string
	if r := c.Cells["report"]; r != "" {
		parts = append(parts, strings.TrimSuffix(filepath.Base(r), ".json"))
	}
	if v := c.Cells["commit"]; v != "" {
		parts = append(parts, "commit "+v)
	}
	if len(parts) > 0 {
		s += " (run " + strings.Join(parts, ", ") + ")"
	}
	return s
}

// Verify holds every row of the RUNS.md at path against its report under
// drills/ beside it: the report must be there, hash to the row's SHA-256,
// and say what the row says. The error is for a file that cannot be read
// as a RUNS.md at all.
func Verify(path string) ([]RowCheck, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	rows, err := parseRuns(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	dir := filepath.Dir(path)
	seen := map[string]int{}
	checks := []RowCheck{}
	for _, r := range rows {
		c := checkRow(dir, r)
		if rel := c.Cells["report"]; rel != "" {
			if first, ok := seen[rel]; ok {
				c.Problems = append(c.Problems, fmt.Sprintf("names the same report as line %d: each run is recorded once", first))
			} else {
				seen[rel] = r.line
			}
		}
		checks = append(checks, c)
	}
	return checks, nil
}

func checkRow(dir string, r runsRow) RowCheck {
	c := RowCheck{Line: r.line, Cells: map[string]string{}, Problems: []string{}}
	for i, v := range r.cells {
		if i < len(RunsColumns) {
			c.Cells[RunsColumns[i]] = v
		}
	}
	if len(r.cells) != len(RunsColumns) {
		c.Problems = append(c.Problems, fmt.Sprintf("has %d cells, the table %d columns: rows are written by drill run --record, never by hand", len(r.cells), len(RunsColumns)))
		return c
	}
	rel := c.Cells["report"]
	if !reportPathRE.MatchString(rel) {
		c.Problems = append(c.Problems, fmt.Sprintf("names report %q, not a file under %s/", rel, ReportsDir))
		return c
	}
	data, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(rel)))
	if errors.Is(err, os.ErrNotExist) {
		c.Problems = append(c.Problems, fmt.Sprintf("its report %s is missing: restore it from git (git log --all -- %s) or record a new run", rel, rel))
		return c
	}
	if err != nil {
		c.Problems = append(c.Problems, fmt.Sprintf("its report %s cannot be read: %v", rel, err))
		return c
	}
	sum := sha256.Sum256(data)
	c.SHA256 = hex.EncodeToString(sum[:])
	if c.SHA256 != c.Cells["sha256"] {
		c.Problems = append(c.Problems, fmt.Sprintf("its report %s has SHA-256 %s, the row says %s: the report changed after it was recorded (git log -p -- %s shows how); restore it or record a new run",
			rel, c.SHA256, c.Cells["sha256"], rel))
	}
	var rep verdicts.Report
	if err := json.Unmarshal(data, &rep); err != nil {
		c.Problems = append(c.Problems, fmt.Sprintf("its report %s is not a drill report: %v", rel, err))
		return c
	}
	c.Report = &rep
	want := rowCells(&rep, c.Cells["sha256"])
	for i, col := range RunsColumns {
		if col == "sha256" {
			continue
		}
		if got := r.cells[i]; got != want[i] {
			c.Problems = append(c.Problems, fmt.Sprintf("%s: the row says %q, its report %q", col, got, want[i]))
		}
	}
	return c
}
