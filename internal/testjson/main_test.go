package main

import (
	"bytes"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// goTestJSON runs the real `go test -json` on testdata/sample (a module
// of its own: a pass, a failure, skips, subtests, a package without
// tests), so the test holds to what go writes, not to a copy of it.
func goTestJSON(t *testing.T, env ...string) []byte {
	t.Helper()
	cmd := exec.Command("go", "test", "-json", "-count=1", "./...")
	cmd.Dir = "testdata/sample"
	cmd.Env = append(os.Environ(), append([]string{"GOFLAGS=-mod=mod", "GOWORK=off"}, env...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit, "the sample has a failing test: %s", stderr.String())
	return out
}

func TestSkipsListedWithReasons(t *testing.T) {
	var out bytes.Buffer
	s, err := run(bytes.NewReader(goTestJSON(t)), &out)
	require.NoError(t, err)
	text := out.String()
	t.Logf("printed:\n%s", text)

	assert.Equal(t, 4, s.Passed, "TestPasses, TestSubtests and its subtest runs, TestDies")
	assert.Equal(t, 1, s.Failed)
	assert.Equal(t, []skipped{
		{"example.com/sample", "TestSkips", "sample_test.go:14: needs a thing: install it"},
		{"example.com/sample", "TestSubtests/skips", "sample_test.go:19: needs root"},
	}, s.Skipped)
	assert.Equal(t, []string{"example.com/sample"}, s.FailedPackages)
	assert.False(t, s.ok())

	assert.Contains(t, text, "the failure's own words", "a failing test's output is shown")
	assert.Contains(t, text, "--- FAIL: TestFails")
	assert.NotContains(t, text, "fine", "a passing test's output is not")
	assert.NotContains(t, text, "=== RUN")
	assert.Contains(t, text, "FAIL\texample.com/sample\t")
	assert.Contains(t, text, "--- SKIP: example.com/sample TestSkips: sample_test.go:14: needs a thing: install it\n", "said as it happens")
	assert.True(t, strings.HasSuffix(text, `testjson: 4 passed, 1 failed, 2 skipped, packages failed: example.com/sample
testjson: 2 tests skipped (0 expected: BOX_REQUIRE_TIERS=1 requires every tier):
  example.com/sample TestSkips: sample_test.go:14: needs a thing: install it
  example.com/sample TestSubtests/skips: sample_test.go:19: needs root
`), "the summary ends the output:\n%s", text)
	assert.Contains(t, text, "?   \texample.com/sample/empty\t[no test files]\n", "a package without tests is said as go test says it, and is no skip")
}

func TestAllPassedIsOK(t *testing.T) {
	stream := `{"Action":"start","Package":"p"}
{"Action":"run","Package":"p","Test":"TestA"}
{"Action":"output","Package":"p","Test":"TestA","Output":"=== RUN   TestA\n"}
{"Action":"output","Package":"p","Test":"TestA","Output":"--- PASS: TestA (0.00s)\n"}
{"Action":"pass","Package":"p","Test":"TestA","Elapsed":0}
{"Action":"output","Package":"p","Output":"PASS\n"}
{"Action":"output","Package":"p","Output":"ok  \tp\t0.01s\n"}
{"Action":"pass","Package":"p","Elapsed":0.01}
{"Action":"skip","Package":"q","Elapsed":0}
`
	var out bytes.Buffer
	s, err := run(strings.NewReader(stream), &out)
	require.NoError(t, err)
	assert.True(t, s.ok())
	assert.Equal(t, "ok  \tp\t0.01s\n\ntestjson: 1 passed, 0 failed, 0 skipped\n", out.String())
}

// Top-level tests of 30 s or more are listed at the end, the slowest
// first; subtests and quicker tests are not.
func TestSlowestListed(t *testing.T) {
	stream := `{"Action":"pass","Package":"example.com/a","Test":"TestQuick","Elapsed":29.9}
{"Action":"pass","Package":"example.com/a","Test":"TestSlow","Elapsed":45}
{"Action":"pass","Package":"example.com/a","Test":"TestSlow/part","Elapsed":44}
{"Action":"fail","Package":"example.com/b/c","Test":"TestSlower","Elapsed":120.25}
{"Action":"fail","Package":"example.com/b/c","Elapsed":121}
`
	var out bytes.Buffer
	s, err := run(strings.NewReader(stream), &out)
	require.NoError(t, err)
	assert.False(t, s.ok())
	assert.Contains(t, out.String(), "testjson: the tests that took 30s or more, slowest first:\n    120.2s c.TestSlower\n     45.0s a.TestSlow\n")
}

// A test binary that dies leaves its test with no end: the package's
// failure shows what the test said, and lines that are not JSON (go's
// own errors) pass through.
func TestDeadBinaryAndPlainLines(t *testing.T) {
	var out bytes.Buffer
	s, err := run(bytes.NewReader(append([]byte("# example.com/broken\nbroken.go:3:1: syntax error\n"), goTestJSON(t, "SAMPLE_DIE=1")...)), &out)
	require.NoError(t, err)
	text := out.String()
	t.Logf("printed:\n%s", text)
	assert.True(t, strings.HasPrefix(text, "# example.com/broken\nbroken.go:3:1: syntax error\n"))
	assert.Regexp(t, `(?s)last words\n.*FAIL\texample.com/sample\t`, text, "before the package's FAIL line")
	assert.Equal(t, []string{"example.com/sample"}, s.FailedPackages)
	assert.False(t, s.ok())
}
