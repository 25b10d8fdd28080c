package report

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"html/template"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/box-isolation/box/drill/verdicts"
	"github.com/box-isolation/box/stack/model"
)

//go:embed html.tmpl
var pageTemplate string

var page = template.Must(template.New("page").Funcs(template.FuncMap{
	"verdict": verdictLabel,
}).Parse(pageTemplate))

// label is a verdict or state as words and a CSS class: the words carry
// the meaning, the colour only helps.
type label struct {
	Text, Class string
}

func verdictLabel(v verdicts.Verdict) label {
	if v == "" {
		v = verdicts.Inconclusive
	}
	return label{Text: strings.ToUpper(string(v)), Class: "v-" + string(v)}
}

// htmlPage is what the template draws, worked out from the report so the
// template only lays it out.
type htmlPage struct {
	Rep      *verdicts.Report
	Overall  label
	Exit     string
	Started  string
	Duration string
	Drilled  string
	Claims   []htmlClaim
	Grid     grid
	Failing  []mark
	Layers   []htmlLayer
	Mutation string
	Changed  []htmlChange
}

// htmlChange is a probe verdict a mutation changed; Here says the probe is
// among this report's results, to link to.
type htmlChange struct {
	verdicts.ProbeChange
	Here bool
}

type htmlClaim struct {
	verdicts.ClaimResult
	Label   label
	Counts  string
	Results []htmlResult
}

type htmlResult struct {
	verdicts.Result
	Label  label
	Column string // its matrix column
	Obs    string // the observation as indented JSON
}

type htmlLayer struct {
	Name, State string
	Label       label
}

// HTML writes the run as one self-contained page: the claims and their
// verdicts first, then the reachability matrix, the stack's layers, the
// environment and notes, and every probe with its evidence on demand. No
// file or font is fetched from anywhere: the page works offline, and
// every string from the report is escaped (html/template).
func HTML(w io.Writer, rep *verdicts.Report) error {
	p := htmlPage{Rep: rep, Grid: buildGrid(rep)}
	p.Failing = p.Grid.problems()
	switch rep.ExitCode {
	case verdicts.ExitOK:
		p.Overall, p.Exit = label{"HOLDS", "v-pass"}, "every claim holds"
	case verdicts.ExitViolated:
		p.Overall, p.Exit = label{"VIOLATED", "v-fail"}, "a claim is violated"
	case verdicts.ExitInconclusive:
		p.Overall, p.Exit = label{"INCONCLUSIVE", "v-inconclusive"}, "nothing failed, but something is inconclusive"
	default:
		p.Overall, p.Exit = label{"ERROR", "v-fail"}, "the run's teardown or restore failed (see problems)"
	}
	if !rep.Started.IsZero() {
		p.Started = rep.Started.UTC().Format(time.RFC3339)
	}
	p.Duration = fmt.Sprintf("%.1fs", float64(rep.DurationMS)/1000)
	env := rep.Environment
	p.Drilled = env.InstanceType
	if env.BoxNewType != "" && env.BoxNewType != env.InstanceType {
		p.Drilled += " (box new makes " + env.BoxNewType + " here: not drilled)"
	}
	for _, cr := range rep.Claims {
		c := htmlClaim{ClaimResult: cr, Label: verdictLabel(cr.Verdict)}
		var pass, fail, incon int
		for _, r := range cr.Results {
			hr := htmlResult{Result: r, Label: verdictLabel(r.Verdict), Column: targetKey(r)}
			if r.Obs != nil {
				b, err := json.MarshalIndent(r.Obs, "", "  ")
				if err != nil {
					return fmt.Errorf("rendering observation %s: %w", r.ID, err)
				}
				hr.Obs = string(b)
			}
			c.Results = append(c.Results, hr)
			switch r.Verdict {
			case verdicts.Pass:
				pass++
			case verdicts.Fail:
				fail++
			default:
				incon++
			}
		}
		c.Counts = counts(pass, fail, incon)
		p.Claims = append(p.Claims, c)
	}
	// The layers a report names beyond this build's come after, sorted.
	layers := verdicts.Layers()
	var extra []model.LayerID
	for l := range rep.Stack.Layers {
		if !slices.Contains(layers, l) {
			extra = append(extra, l)
		}
	}
	slices.Sort(extra)
	layers = append(layers, extra...)
	for _, l := range layers {
		state, ok := rep.Stack.Layers[l]
		hl := htmlLayer{Name: string(l), State: state}
		switch {
		case !ok:
			hl.State, hl.Label = "not reported", label{"UNKNOWN", "v-skipped"}
		case strings.HasPrefix(state, "absent"):
			hl.Label = label{"ABSENT", "v-fail"}
			hl.State = strings.TrimPrefix(strings.TrimPrefix(state, "absent"), ": ")
		default:
			hl.Label, hl.State = label{"PRESENT", "v-pass"}, ""
		}
		p.Layers = append(p.Layers, hl)
	}
	if len(rep.MutationResults) > 0 {
		m := rep.MutationResults[0]
		p.Mutation = strings.Join(mutationLines(rep), "; ")
		ids := map[string]bool{}
		for _, cr := range rep.Claims {
			for _, r := range cr.Results {
				ids[r.ID] = true
			}
		}
		for _, c := range m.Changed {
			p.Changed = append(p.Changed, htmlChange{ProbeChange: c, Here: ids[c.ID]})
		}
	}
	return page.Execute(w, p)
}

// counts says how many probes had each verdict, the bad ones first and
// none that no probe had: "25 probes: 1 failed, 24 passed".
func counts(pass, fail, incon int) string {
	n := pass + fail + incon
	if n == 0 {
		return ""
	}
	var parts []string
	for _, c := range []struct {
		n    int
		word string
	}{{fail, "failed"}, {incon, "inconclusive"}, {pass, "passed"}} {
		if c.n > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", c.n, c.word))
		}
	}
	probes := "1 probe"
	if n != 1 {
		probes = fmt.Sprintf("%d probes", n)
	}
	return probes + ": " + strings.Join(parts, ", ")
}
