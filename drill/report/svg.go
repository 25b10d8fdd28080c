package report

import (
	"fmt"
	"html"
	"io"
	"strings"

	"github.com/box-isolation/box/drill/verdicts"
)

// The SVG's geometry, in pixels. Text is 12 px monospace (about 7.2 px a
// character), marks 16 px with an 11 px bold letter: readable on a laptop
// at 100%, and a world run's matrix is about 800 px wide.
const (
	svgFont     = 12
	svgCharW    = 7.3
	svgMark     = 16
	svgGap      = 2
	svgPad      = 4
	svgMargin   = 12
	svgLine     = 17
	svgMinWidth = 760
	// svgLabel is the most characters of a column's label; a longer one is
	// cut and spelled out in full under the grid.
	svgLabel = 16
	// svgMostListed is the most marks listed under the grid as not held.
	svgMostListed = 40
)

// Matrix writes the reachability matrix as a self-contained SVG: sources
// down, targets across, and in each cell one mark per claim and channel
// between them, lettered P (held), F (violated) or I (inconclusive) as
// well as coloured, so nothing rests on colour alone. A mark's title (the
// tooltip) says what it is; the marks that did not hold are also listed in
// words under the grid, with the layers and the environment.
func Matrix(w io.Writer, rep *verdicts.Report) error {
	g := buildGrid(rep)
	left := svgMargin + svgPad*2
	for _, s := range g.Sources {
		left = max(left, svgMargin+textW(s)+svgPad*2)
	}
	colX := make([]int, len(g.Targets)+1)
	colX[0] = left
	longest := 0
	var cut []gridTarget
	for i, t := range g.Targets {
		colX[i+1] = colX[i] + t.PerLine*(svgMark+svgGap) - svgGap + 2*svgPad
		l := len([]rune(t.Key))
		if l > svgLabel {
			l = svgLabel
			cut = append(cut, t)
		}
		longest = max(longest, l)
	}
	gridRight := colX[len(g.Targets)]
	width := max(gridRight+svgMargin, svgMinWidth)
	cols := int(float64(width-2*svgMargin) / svgCharW) // characters a line holds

	var b strings.Builder
	y := 0
	line := func(text, attrs string) {
		for _, l := range wrap(text, cols) {
			y += svgLine
			fmt.Fprintf(&b, `<text x="%d" y="%d"%s>%s</text>`+"\n", svgMargin, y, attrs, esc(l))
		}
	}
	s := rep.Summary
	y += 4
	line(fmt.Sprintf("drill run %s: %d passed, %d failed, %d inconclusive, %d skipped (exit %d)",
		rep.RunID, s.Passed, s.Failed, s.Inconclusive, s.Skipped, rep.ExitCode), ` font-size="15" font-weight="bold"`)
	line("Sources down, targets across; each mark is one claim and channel: P held (green), F violated (red), I inconclusive (grey), the worst of its probes. Hover a mark for what it is.", "")

	// Column labels, read bottom to top.
	top := y + 10 + int(float64(longest)*svgCharW)
	for i, t := range g.Targets {
		x := (colX[i]+colX[i+1])/2 + svgFont/3
		fmt.Fprintf(&b, `<g><title>%s</title><text x="%d" y="%d" transform="rotate(-90 %d %d)">%s</text></g>`+"\n",
			esc(t.Title()), x, top-6, x, top-6, esc(clipLabel(t.Key)))
	}
	y = top
	for _, row := range g.Rows {
		h := row.Lines*(svgMark+svgGap) - svgGap + 2*svgPad
		fmt.Fprintf(&b, `<text x="%d" y="%d" font-weight="bold">%s</text>`+"\n", svgMargin, y+svgPad+12, esc(row.Source))
		for i, c := range row.Cells {
			fill := "white"
			if len(c.Marks) == 0 {
				fill = "#f4f4f4"
			}
			fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%d" height="%d" fill="%s" stroke="#cccccc"/>`+"\n", colX[i], y, colX[i+1]-colX[i], h, fill)
			per := g.Targets[i].PerLine
			for j, m := range c.Marks {
				mx := colX[i] + svgPad + (j%per)*(svgMark+svgGap)
				my := y + svgPad + (j/per)*(svgMark+svgGap)
				fmt.Fprintf(&b, `<g class="mark"><title>%s</title><rect x="%d" y="%d" width="%d" height="%d" rx="2" fill="%s"/><text x="%d" y="%d" fill="white" font-size="11" font-weight="bold" text-anchor="middle">%s</text></g>`+"\n",
					esc(m.Title()), mx, my, svgMark, svgMark, markFill(m.Verdict), mx+svgMark/2, my+12, m.Letter())
			}
		}
		y += h
	}
	y += 8
	if len(cut) > 0 {
		var parts []string
		for _, t := range cut {
			parts = append(parts, clipLabel(t.Key)+" = "+t.Key)
		}
		line("Columns cut short: "+strings.Join(parts, "; "), "")
	}
	if bad := g.problems(); len(bad) > 0 {
		y += 6
		line("Did not hold:", ` font-weight="bold"`)
		for i, m := range bad {
			if i == svgMostListed {
				line(fmt.Sprintf("... and %d more (the JSON or HTML report has them all)", len(bad)-i), "")
				break
			}
			line(m.Letter()+" "+m.Title(), "")
		}
	}
	y += 6
	line("layers: "+layerLine(rep), "")
	env := rep.Environment
	line(fmt.Sprintf("%s on %s, kernel %s, incus %s, %s boxes, bridge netfilter %s", env.Mode, env.Hostname, env.Kernel,
		env.IncusVersion, env.InstanceType, onOff(env.BridgeNetfilter)), "")
	y += svgMargin

	if _, err := fmt.Fprintf(w, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="monospace" font-size="%d">`+"\n"+
		`<rect width="100%%" height="100%%" fill="white"/>`+"\n", width, y, width, y, svgFont); err != nil {
		return err
	}
	_, err := io.WriteString(w, b.String()+"</svg>\n")
	return err
}

func textW(s string) int { return int(float64(len([]rune(s)))*svgCharW + 0.5) }

// clipLabel cuts a column label to svgLabel characters, marked with "~".
func clipLabel(s string) string {
	r := []rune(s)
	if len(r) <= svgLabel {
		return s
	}
	return string(r[:svgLabel-1]) + "~"
}

func markFill(v verdicts.Verdict) string {
	switch v {
	case verdicts.Pass:
		return "#2e7d32"
	case verdicts.Fail:
		return "#c62828"
	}
	return "#757575"
}

// wrap breaks text into lines of at most n characters, at spaces where it
// can.
func wrap(text string, n int) []string {
	var out []string
	var cur []rune
	for _, f := range strings.Fields(text) {
		word := []rune(f)
		for len(word) > n {
			if len(cur) > 0 {
				out = append(out, string(cur))
				cur = nil
			}
			out = append(out, string(word[:n]))
			word = word[n:]
		}
		switch {
		case len(cur) == 0:
			cur = word
		case len(cur)+1+len(word) <= n:
			cur = append(append(cur, ' '), word...)
		default:
			out = append(out, string(cur))
			cur = word
		}
	}
	if len(cur) > 0 || len(out) == 0 {
		out = append(out, string(cur))
	}
	return out
}

func layerLine(rep *verdicts.Report) string {
	var parts []string
	for _, l := range verdicts.Layers() {
		state, ok := rep.Stack.Layers[l]
		switch {
		case !ok:
			state = "?"
		case strings.HasPrefix(state, "absent"):
			state = "ABSENT"
		}
		parts = append(parts, string(l)+"="+state)
	}
	return strings.Join(parts, " ")
}

func esc(s string) string { return html.EscapeString(s) }
