package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"github.com/box-isolation/box/drill"
	"github.com/box-isolation/box/drill/report"
	"github.com/box-isolation/box/internal/suggest"
)

const reportSynopsis = "report html|matrix|junit|text|json REPORT.json|- [OUT]"

// renderers are drill report's formats: what drill run writes with --html,
// --matrix, --junit, by default and with --json.
var renderers = map[string]func(io.Writer, *drill.Report) error{
	"html":   report.HTML,
	"matrix": report.Matrix,
	"junit":  report.JUnit,
	"text":   func(w io.Writer, rep *drill.Report) error { report.Text(w, rep); return nil },
	"json":   report.JSON,
}

// runReport renders a recorded JSON report (drill run --json) again: to
// look at a run later, or in another form than it was written.
func setupReport(fs *flag.FlagSet) runner {
	return func(_ context.Context, s stdio, args []string) int {
		return renderReport(s, args)
	}
}

func renderReport(s stdio, args []string) int {
	if len(args) < 2 {
		fmt.Fprintf(s.err, "usage: drill %s\n", reportSynopsis)
		return exitUsage
	}
	args = append(args, "")
	format, in, out := args[0], args[1], args[2]
	write, ok := renderers[format]
	if !ok {
		var names []string
		for n := range renderers {
			names = append(names, n)
		}
		slices.Sort(names)
		fmt.Fprintf(s.err, "drill report: unknown format %q%s; the formats are %s\n", format, suggest.DidYouMean(format, names), strings.Join(names, ", "))
		return exitUsage
	}
	rep, err := readReport(s, in)
	if err != nil {
		return fail(s, err)
	}
	if out == "" || out == "-" {
		if err := write(s.out, rep); err != nil {
			return fail(s, fmt.Errorf("writing the %s report: %w", format, err))
		}
		return exitOK
	}
	if err := writeFile(out, rep, write); err != nil {
		return fail(s, err)
	}
	return exitOK
}

// readReport reads a JSON report from a file, or from stdin for "-". A
// report of an older schema version is read as it is (what the renderers
// show has not changed meaning); one of a newer version is refused.
func readReport(s stdio, path string) (*drill.Report, error) {
	var data []byte
	var err error
	if path == "-" {
		data, err = io.ReadAll(s.in)
	} else {
		data, err = os.ReadFile(path)
	}
	if err != nil {
		return nil, fmt.Errorf("reading the report: %w", err)
	}
	var rep drill.Report
	if err := json.Unmarshal(data, &rep); err != nil {
		return nil, fmt.Errorf("reading the report %s: %w (want the JSON of drill run --json)", path, err)
	}
	switch {
	case rep.SchemaVersion == 0:
		return nil, fmt.Errorf("%s is not a drill report: it has no schema_version (want the JSON of drill run --json)", path)
	case rep.SchemaVersion > drill.SchemaVersion:
		return nil, fmt.Errorf("%s has schema_version %d, newer than this drill's %d: render it with the drill that wrote it", path, rep.SchemaVersion, drill.SchemaVersion)
	}
	return &rep, nil
}
