package report_test

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/drill"
	"github.com/box-isolation/box/drill/report"
)

// splitRuns cuts a RUNS.md into its header (up to the table's separator
// line) and its rows.
func splitRuns(t *testing.T, s string) (string, []string) {
	t.Helper()
	i := strings.Index(s, "| --- |")
	require.GreaterOrEqual(t, i, 0, "no table in %q", s)
	j := strings.Index(s[i:], "\n")
	require.GreaterOrEqual(t, j, 0)
	head := s[:i+j+1]
	var rows []string
	sc := bufio.NewScanner(strings.NewReader(s[i+j+1:]))
	for sc.Scan() {
		if strings.TrimSpace(sc.Text()) != "" {
			rows = append(rows, sc.Text())
		}
	}
	return head, rows
}

func cells(row string) []string {
	row = strings.TrimSpace(row)
	if !strings.HasPrefix(row, "|") || !strings.HasSuffix(row, "|") {
		return nil
	}
	var out []string
	for _, c := range strings.Split(row[1:len(row)-1], "|") {
		out = append(out, strings.TrimSpace(c))
	}
	return out
}

func sha(data []byte) string {
	s := sha256.Sum256(data)
	return hex.EncodeToString(s[:])
}

func lineOf(t *testing.T, path string, n int) string {
	t.Helper()
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	lines := strings.Split(string(data), "\n")
	require.Greater(t, len(lines), n-1)
	return lines[n-1]
}

func TestRecord(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "RUNS.md")
	rep := sampleReport(t)
	rec, err := report.Record(path, rep)
	require.NoError(t, err)
	second := sampleReport(t)
	second.RunID = "d4e5f6"
	second.Started = started.Add(24 * time.Hour)
	second.Version = "b25daff-dirty"
	second.Summary.Failed, second.Summary.Passed = 0, 8
	rec2, err := report.Record(path, second)
	require.NoError(t, err)

	// The report is stored under drills/, and the row hashes its exact bytes.
	for _, tc := range []struct {
		rec report.Recorded
		rep *drill.Report
	}{{rec, rep}, {rec2, second}} {
		assert.Equal(t, "drills/"+tc.rep.RunID+".json", tc.rec.Report)
		stored, err := os.ReadFile(filepath.Join(dir, "drills", tc.rep.RunID+".json"))
		require.NoError(t, err)
		assert.Equal(t, reportJSON(t, tc.rep), stored, "the report stored is the --json report")
		assert.Equal(t, sha(stored), tc.rec.SHA256)
		assert.Equal(t, report.Row(tc.rep, tc.rec.SHA256), lineOf(t, path, tc.rec.Line), "Recorded.Line is the row's line")
	}

	data, err := os.ReadFile(path)
	require.NoError(t, err)
	header, rows := splitRuns(t, string(data))
	require.Len(t, rows, 2, "one row per Record")
	assert.Equal(t, "b25daff-dirty", cells(rows[1])[1], "a dirty build is recorded as dirty")

	// The header Record writes is RUNS.md's at the repository's root.
	repo, err := os.ReadFile(filepath.Join("..", "..", "RUNS.md"))
	require.NoError(t, err)
	repoHeader, _ := splitRuns(t, string(repo))
	assert.Equal(t, repoHeader, header)

	// Recording into an existing file leaves its header alone; a last line
	// without its newline gets one.
	other := t.TempDir()
	existing := filepath.Join(other, "existing.md")
	require.NoError(t, os.WriteFile(existing, bytes.TrimRight(repo, "\n"), 0o644))
	rec3, err := report.Record(existing, rep)
	require.NoError(t, err)
	data, err = os.ReadFile(existing)
	require.NoError(t, err)
	assert.Equal(t, string(bytes.TrimRight(repo, "\n"))+"\n"+report.Row(rep, rec3.SHA256)+"\n", string(data))
	assert.Equal(t, report.Row(rep, rec3.SHA256), lineOf(t, existing, rec3.Line))

	// A report is never replaced: the same run id again is refused, and
	// RUNS.md is left as it was.
	_, err = report.Record(path, rep)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "run the drill again")
	after, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, rows, func() []string { _, r := splitRuns(t, string(after)); return r }())
}

func TestRecordRefusesAnOlderTable(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "RUNS.md")
	old := "# Drill runs\n\n| date | commit | host | kernel | incus | instance type | passed | failed | inconclusive | duration |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n"
	require.NoError(t, os.WriteFile(path, []byte(old), 0o644))
	err := report.CheckRecordTarget(path)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "not drill's")
	_, err = report.Record(path, sampleReport(t))
	require.Error(t, err)
	data, _ := os.ReadFile(path)
	assert.Equal(t, old, string(data), "nothing appended")
	assert.NoDirExists(t, filepath.Join(dir, "drills"), "no report stored")

	assert.NoError(t, report.CheckRecordTarget(filepath.Join(dir, "new.md")), "a missing file is created")
	assert.Error(t, report.CheckRecordTarget(filepath.Join(dir, "nodir", "RUNS.md")))
}

func TestRow(t *testing.T) {
	rep := sampleReport(t)
	rep.Environment.Kernel = "6.18|evil"
	sum := strings.Repeat("ab", 32)
	got := cells(report.Row(rep, sum))
	want := []string{"2025-06-01", "2ce2ced", "world", "ci-7", "6.18/evil", "6.0.4", "container", "1", "7", "1", "1", "1", "93.4s", "drills/0a1b2c.json", sum}
	assert.Equal(t, want, got)

	// As many columns as RUNS.md's header, and the same.
	repo, err := os.ReadFile(filepath.Join("..", "..", "RUNS.md"))
	require.NoError(t, err)
	head, _ := splitRuns(t, string(repo))
	lines := strings.Split(strings.TrimSpace(head), "\n")
	assert.Equal(t, report.RunsColumns, cells(lines[len(lines)-2]))
	assert.Len(t, got, len(report.RunsColumns))
}

// recorded is a temporary RUNS.md with two recorded runs.
func recorded(t *testing.T) (path string, recs []report.Recorded) {
	t.Helper()
	path = filepath.Join(t.TempDir(), "RUNS.md")
	for i, id := range []string{"0a1b2c", "d4e5f6"} {
		rep := sampleReport(t)
		rep.RunID = id
		rep.Started = started.Add(time.Duration(i) * time.Hour)
		rec, err := report.Record(path, rep)
		require.NoError(t, err)
		recs = append(recs, rec)
	}
	return path, recs
}

// editRow replaces one cell of the row at line n.
func editRow(t *testing.T, path string, n int, col, value string) {
	t.Helper()
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	lines := strings.Split(string(data), "\n")
	c := cells(lines[n-1])
	for i, name := range report.RunsColumns {
		if name == col {
			c[i] = value
		}
	}
	lines[n-1] = "| " + strings.Join(c, " | ") + " |"
	require.NoError(t, os.WriteFile(path, []byte(strings.Join(lines, "\n")), 0o644))
}

func TestVerify(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(t *testing.T, path string, recs []report.Recorded)
		want   []string // problems of the second row; none: it matches
	}{
		{"as recorded", func(*testing.T, string, []report.Recorded) {}, nil},
		{"report missing", func(t *testing.T, path string, recs []report.Recorded) {
			require.NoError(t, os.Remove(filepath.Join(filepath.Dir(path), recs[1].Report)))
		}, []string{"its report drills/d4e5f6.json is missing"}},
		{"one byte of the report changed", func(t *testing.T, path string, recs []report.Recorded) {
			file := filepath.Join(filepath.Dir(path), recs[1].Report)
			data, err := os.ReadFile(file)
			require.NoError(t, err)
			data = bytes.Replace(data, []byte(`"kernel": "6.18.2-arch1-1"`), []byte(`"kernel": "6.18.3-arch1-1"`), 1)
			require.NoError(t, os.WriteFile(file, data, 0o644))
		}, []string{"the report changed after it was recorded", `kernel: the row says "6.18.2-arch1-1", its report "6.18.3-arch1-1"`}},
		{"commit edited in the row", func(t *testing.T, path string, recs []report.Recorded) {
			editRow(t, path, recs[1].Line, "commit", "b25daff")
		}, []string{`commit: the row says "b25daff", its report "2ce2ced"`}},
		{"exit code edited in the row", func(t *testing.T, path string, recs []report.Recorded) {
			editRow(t, path, recs[1].Line, "exit", "0")
		}, []string{`exit: the row says "0", its report "1"`}},
		{"counts edited in the row", func(t *testing.T, path string, recs []report.Recorded) {
			editRow(t, path, recs[1].Line, "failed", "0")
			editRow(t, path, recs[1].Line, "inconclusive", "0")
		}, []string{`failed: the row says "0", its report "1"`, `inconclusive: the row says "0", its report "1"`}},
		{"mode edited in the row", func(t *testing.T, path string, recs []report.Recorded) {
			editRow(t, path, recs[1].Line, "mode", "host")
		}, []string{`mode: the row says "host", its report "world"`}},
		{"report rewritten and rehashed", func(t *testing.T, path string, recs []report.Recorded) {
			// The hash alone proves nothing about the fields: a report
			// edited with the row's hash brought along still disagrees.
			file := filepath.Join(filepath.Dir(path), recs[1].Report)
			data, err := os.ReadFile(file)
			require.NoError(t, err)
			data = bytes.Replace(data, []byte(`"exit_code": 1`), []byte(`"exit_code": 0`), 1)
			require.NoError(t, os.WriteFile(file, data, 0o644))
			editRow(t, path, recs[1].Line, "sha256", sha(data))
		}, []string{`exit: the row says "1", its report "0"`}},
		{"row points outside drills/", func(t *testing.T, path string, recs []report.Recorded) {
			editRow(t, path, recs[1].Line, "report", "../d4e5f6.json")
		}, []string{`names report "../d4e5f6.json", not a file under drills/`}},
		{"row names another run's report", func(t *testing.T, path string, recs []report.Recorded) {
			editRow(t, path, recs[1].Line, "report", recs[0].Report)
			editRow(t, path, recs[1].Line, "sha256", recs[0].SHA256)
		}, []string{"names the same report as line"}},
		{"a cell too few", func(t *testing.T, path string, recs []report.Recorded) {
			data, err := os.ReadFile(path)
			require.NoError(t, err)
			lines := strings.Split(string(data), "\n")
			lines[recs[1].Line-1] = strings.Replace(lines[recs[1].Line-1], " | world |", " |", 1)
			require.NoError(t, os.WriteFile(path, []byte(strings.Join(lines, "\n")), 0o644))
		}, []string{"has 14 cells, the table 15 columns"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path, recs := recorded(t)
			tc.change(t, path, recs)
			checks, err := report.Verify(path)
			require.NoError(t, err)
			require.Len(t, checks, 2)
			assert.True(t, checks[0].OK(), "the first row is untouched: %v", checks[0].Problems)
			assert.Equal(t, recs[0].Line, checks[0].Line)
			got := checks[1]
			assert.Equal(t, recs[1].Line, got.Line)
			if tc.want == nil {
				assert.True(t, got.OK(), "%v", got.Problems)
				require.NotNil(t, got.Report, "the stored report reads back")
				assert.Equal(t, "d4e5f6", got.Report.RunID)
				assert.Equal(t, recs[1].SHA256, got.SHA256)
				return
			}
			assert.False(t, got.OK())
			assert.Len(t, got.Problems, len(tc.want), "%q", got.Problems)
			for i, w := range tc.want {
				if i < len(got.Problems) {
					assert.Contains(t, got.Problems[i], w)
				}
			}
			assert.Contains(t, got.Name("RUNS.md"), "RUNS.md line "+strconv.Itoa(recs[1].Line))
		})
	}
}

func TestVerifyTable(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "RUNS.md")
	_, err := report.Verify(path)
	assert.ErrorIs(t, err, os.ErrNotExist)

	require.NoError(t, os.WriteFile(path, []byte("# Drill runs\n\nno table\n"), 0o644))
	_, err = report.Verify(path)
	assert.ErrorContains(t, err, "no table of drill runs")

	// The repository's RUNS.md is a table drill can check.
	checks, err := report.Verify(filepath.Join("..", "..", "RUNS.md"))
	require.NoError(t, err)
	for _, c := range checks {
		assert.True(t, c.OK(), "%s: %v", c.Name("RUNS.md"), c.Problems)
	}
}
