// Command testjson reads `go test -json` on stdin and prints what
// `go test` prints without -v: each package's result line, a failing
// test's output, and build errors. Each skipped test gets a line as it
// happens, and at the end every skipped test is listed again with its
// reason, and counted, after the top-level tests that took 30 s or more,
// slowest first. It exits 1 when a test failed or skipped, or a
// package failed: scripts/test.sh runs every tier with
// BOX_REQUIRE_TIERS=1, where a skip is a tier that did not run.
//
//	go test -json ./... 2>&1 | go run ./internal/testjson
package main

import (
	"bufio"
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"path"
	"slices"
	"strings"
)

func main() {
	s, err := run(os.Stdin, os.Stdout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "testjson:", err)
		os.Exit(2)
	}
	if !s.ok() {
		os.Exit(1)
	}
}

// event is one line of `go test -json` (cmd/test2json).
type event struct {
	Action     string
	Package    string
	ImportPath string // build-output, build-fail
	Test       string
	Output     string
	Elapsed    float64 // seconds, on a test's or package's end
}

// skipped is one skipped test and the last thing it said.
type skipped struct {
	Package, Test, Reason string
}

// summary is what a stream held.
type summary struct {
	Passed, Failed int
	Skipped        []skipped
	FailedPackages []string
	// Slowest holds the top-level tests that took slowTest or longer,
	// the slowest first: where a slow machine's run spends its time.
	Slowest []timed
}

// timed is a top-level test and how long it ran.
type timed struct {
	Name    string
	Seconds float64
}

// slowTest is the time from which a test is listed among the slowest.
const slowTest = 30

func (s summary) ok() bool {
	return s.Failed == 0 && len(s.Skipped) == 0 && len(s.FailedPackages) == 0
}

// run copies the stream in to out as go test would print it, then the
// summary, and returns it.
func run(in io.Reader, out io.Writer) (summary, error) {
	var s summary
	// A test's output is held until it ends: shown if it fails.
	held := map[[2]string][]string{}
	r := bufio.NewReader(in)
	for {
		line, err := r.ReadString('\n')
		if line != "" {
			var e event
			if json.Unmarshal([]byte(line), &e) != nil || e.Action == "" {
				// Not an event: go's own errors on the same stream.
				fmt.Fprint(out, line)
			} else {
				handle(&s, held, e, out)
			}
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return s, err
		}
	}
	fmt.Fprintf(out, "\ntestjson: %d passed, %d failed, %d skipped", s.Passed, s.Failed, len(s.Skipped))
	if len(s.FailedPackages) > 0 {
		fmt.Fprintf(out, ", packages failed: %s", strings.Join(s.FailedPackages, " "))
	}
	fmt.Fprintln(out)
	if len(s.Slowest) > 0 {
		slices.SortStableFunc(s.Slowest, func(a, b timed) int { return cmp.Compare(b.Seconds, a.Seconds) })
		fmt.Fprintf(out, "testjson: the tests that took %ds or more, slowest first:\n", slowTest)
		for _, t := range s.Slowest {
			fmt.Fprintf(out, "  %7.1fs %s\n", t.Seconds, t.Name)
		}
	}
	if len(s.Skipped) > 0 {
		fmt.Fprintf(out, "testjson: %d tests skipped (0 expected: BOX_REQUIRE_TIERS=1 requires every tier):\n", len(s.Skipped))
		for _, k := range s.Skipped {
			fmt.Fprintf(out, "  %s %s: %s\n", k.Package, k.Test, k.Reason)
		}
	}
	return s, nil
}

func handle(s *summary, held map[[2]string][]string, e event, out io.Writer) {
	key := [2]string{e.Package, e.Test}
	if (e.Action == "pass" || e.Action == "fail") && e.Test != "" && !strings.Contains(e.Test, "/") && e.Elapsed >= slowTest {
		s.Slowest = append(s.Slowest, timed{Name: path.Base(e.Package) + "." + e.Test, Seconds: e.Elapsed})
	}
	switch e.Action {
	case "build-output":
		fmt.Fprint(out, e.Output)
	case "build-fail":
		s.FailedPackages = append(s.FailedPackages, e.ImportPath)
	case "output":
		if e.Test != "" {
			if !strings.HasPrefix(e.Output, "=== ") { // RUN, PAUSE, CONT: -v only
				held[key] = append(held[key], e.Output)
			}
		} else if e.Output != "PASS\n" && !strings.HasPrefix(e.Output, "=== ") {
			if strings.HasPrefix(e.Output, "FAIL") {
				unended(held, e.Package, out)
			}
			fmt.Fprint(out, e.Output)
		}
	case "pass":
		if e.Test != "" {
			s.Passed++
		}
		delete(held, key)
	case "skip":
		if e.Test == "" {
			return // a package with no test files
		}
		k := skipped{Package: e.Package, Test: e.Test, Reason: reason(held[key])}
		s.Skipped = append(s.Skipped, k)
		fmt.Fprintf(out, "--- SKIP: %s %s: %s\n", k.Package, k.Test, k.Reason)
		delete(held, key)
	case "fail":
		if e.Test != "" {
			s.Failed++
			for _, l := range held[key] {
				fmt.Fprint(out, l)
			}
			delete(held, key)
			return
		}
		s.FailedPackages = append(s.FailedPackages, e.Package)
		unended(held, e.Package, out)
	}
}

// unended prints what the tests of pkg that have not ended said: a test
// binary that died (a panic, the timeout) leaves its running tests without
// an end, and their output explains it.
func unended(held map[[2]string][]string, pkg string, out io.Writer) {
	for _, k := range slices.SortedFunc(maps.Keys(held), func(a, b [2]string) int { return strings.Compare(a[1], b[1]) }) {
		if k[0] == pkg {
			for _, l := range held[k] {
				fmt.Fprint(out, l)
			}
			delete(held, k)
		}
	}
}

// reason is the last line a skipped test wrote before its --- SKIP line:
// the skip's own message.
func reason(lines []string) string {
	for i := len(lines) - 1; i >= 0; i-- {
		l := strings.TrimSpace(lines[i])
		if l == "" || strings.HasPrefix(l, "--- ") {
			continue
		}
		return l
	}
	return "(no reason given)"
}
