package report

import (
	"fmt"
	"sort"
	"strings"

	"github.com/box-isolation/box/drill/verdicts"
)

// grid is the reachability matrix both pictures draw (the HTML page and
// the SVG): sources down, targets across, and in each cell one mark per
// claim and channel. A mark stands for every probe of its claim and
// channel between the two, so a cell stays small when a claim asks forty
// names of the same resolver.
type grid struct {
	Sources []string
	Targets []gridTarget
	Rows    []gridRow
}

// gridTarget is one column: its key (the results' target_key) and what
// its probes aimed at, for people.
type gridTarget struct {
	Key string
	// Whats are the distinct targets of its probes, e.g.
	// "host gateway 10.88.0.1 tcp/22 (listener sshd)".
	Whats []string
	// PerLine is how many marks a cell of the column holds side by side
	// before it wraps: narrow columns keep the grid within a laptop's width.
	PerLine int
}

type gridRow struct {
	Source string
	Cells  []gridCell // one per target, in Targets' order
	// Lines is the most lines of marks in any of its cells.
	Lines int
}

type gridCell struct {
	Marks []mark
}

// mark is one claim and channel from a source to a target: the worst
// verdict of its probes (fail over inconclusive over pass), and how many
// had each.
type mark struct {
	Source, Target    string
	Claim, Channel    string
	Verdict           verdicts.Verdict
	Pass, Fail, Incon int
	// First is the id of the first probe with the mark's verdict: where a
	// click on the mark leads.
	First string
}

// maxPerLine is the most marks side by side in a cell.
const maxPerLine = 3

// Letter is the mark's verdict as a letter, so nothing rests on colour.
func (m mark) Letter() string { return verdictLetter(m.Verdict) }

func verdictLetter(v verdicts.Verdict) string {
	switch v {
	case verdicts.Pass:
		return "P"
	case verdicts.Fail:
		return "F"
	}
	return "I"
}

// Title is the mark in words, for a tooltip.
func (m mark) Title() string {
	return fmt.Sprintf("%s %s, %s -> %s: %s (%s)", m.Claim, m.Channel, m.Source, m.Target,
		strings.ToUpper(string(m.Verdict)), counts(m.Pass, m.Fail, m.Incon))
}

// targetKey is a result's matrix column. Reports from before target_key
// was in the JSON lack it: the first word of the target stands in.
func targetKey(r verdicts.Result) string {
	if r.TargetKey != "" {
		return r.TargetKey
	}
	if f := strings.Fields(r.Target); len(f) > 0 {
		return f[0]
	}
	return "-"
}

// worse reports whether verdict a outranks b: fail over inconclusive over
// pass.
func worse(a, b verdicts.Verdict) bool {
	rank := func(v verdicts.Verdict) int {
		switch v {
		case verdicts.Fail:
			return 3
		case verdicts.Inconclusive:
			return 2
		case verdicts.Pass:
			return 1
		}
		return 0
	}
	return rank(a) > rank(b)
}

// buildGrid lays the report's results out. Sources are sorted; targets come
// in the order the claims first aim at them, Verify's own columns (stack,
// census) last.
func buildGrid(rep *verdicts.Report) grid {
	var g grid
	var targets, verifyTargets []string
	seenS, seenT := map[string]bool{}, map[string]bool{}
	whats := map[string][]string{}
	seenWhat := map[[2]string]bool{}
	type cellKey struct{ src, tgt string }
	cells := map[cellKey][]*mark{}
	for _, cr := range rep.Claims {
		for _, r := range cr.Results {
			src, tgt := string(r.From), targetKey(r)
			if !seenS[src] {
				seenS[src] = true
				g.Sources = append(g.Sources, src)
			}
			if !seenT[tgt] {
				seenT[tgt] = true
				if src == string(verdicts.PlaceVerify) {
					verifyTargets = append(verifyTargets, tgt)
				} else {
					targets = append(targets, tgt)
				}
			}
			if w := [2]string{tgt, r.Target}; r.Target != "" && !seenWhat[w] {
				seenWhat[w] = true
				whats[tgt] = append(whats[tgt], r.Target)
			}
			k := cellKey{src, tgt}
			var m *mark
			for _, x := range cells[k] {
				if x.Claim == string(cr.ID) && x.Channel == string(r.Channel) {
					m = x
				}
			}
			if m == nil {
				m = &mark{Source: src, Target: tgt, Claim: string(cr.ID), Channel: string(r.Channel)}
				cells[k] = append(cells[k], m)
			}
			switch r.Verdict {
			case verdicts.Pass:
				m.Pass++
			case verdicts.Fail:
				m.Fail++
			default:
				m.Incon++
			}
			if m.First == "" || worse(r.Verdict, m.Verdict) {
				m.Verdict, m.First = r.Verdict, r.ID
			}
		}
	}
	sort.Strings(g.Sources)
	for _, t := range append(targets, verifyTargets...) {
		most := 1
		for _, s := range g.Sources {
			most = max(most, len(cells[cellKey{s, t}]))
		}
		g.Targets = append(g.Targets, gridTarget{Key: t, Whats: whats[t], PerLine: min(most, maxPerLine)})
	}
	for _, s := range g.Sources {
		row := gridRow{Source: s, Lines: 1}
		for _, t := range g.Targets {
			var c gridCell
			for _, m := range cells[cellKey{s, t.Key}] {
				c.Marks = append(c.Marks, *m)
			}
			row.Lines = max(row.Lines, (len(c.Marks)+t.PerLine-1)/t.PerLine)
			row.Cells = append(row.Cells, c)
		}
		g.Rows = append(g.Rows, row)
	}
	return g
}

// Title is the column in words: its key and what its probes aimed at.
func (t gridTarget) Title() string {
	const most = 6
	w := t.Whats
	more := ""
	if len(w) > most {
		more = fmt.Sprintf("; and %d more", len(w)-most)
		w = w[:most]
	}
	if len(w) == 0 {
		return t.Key
	}
	return t.Key + ": " + strings.Join(w, "; ") + more
}

// problems is every mark that did not hold, in grid order.
func (g grid) problems() []mark {
	var out []mark
	for _, row := range g.Rows {
		for _, c := range row.Cells {
			for _, m := range c.Marks {
				if m.Verdict != verdicts.Pass {
					out = append(out, m)
				}
			}
		}
	}
	return out
}
