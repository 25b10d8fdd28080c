package report

import (
	"encoding/json"
	"encoding/xml"
	"fmt"
	"html"
	"io"
	"sort"
	"strings"

	"github.com/box-isolation/box/drill"
)

// JSON writes the versioned report (schema.json beside this file).
func JSON(w io.Writer, rep *drill.Report) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(rep)
}

type junitSuites struct {
	XMLName  xml.Name     `xml:"testsuites"`
	Name     string       `xml:"name,attr"`
	Tests    int          `xml:"tests,attr"`
	Failures int          `xml:"failures,attr"`
	Errors   int          `xml:"errors,attr"`
	Skipped  int          `xml:"skipped,attr"`
	Time     string       `xml:"time,attr"`
	Suites   []junitSuite `xml:"testsuite"`
}

type junitSuite struct {
	Name     string      `xml:"name,attr"`
	Tests    int         `xml:"tests,attr"`
	Failures int         `xml:"failures,attr"`
	Errors   int         `xml:"errors,attr"`
	Skipped  int         `xml:"skipped,attr"`
	Cases    []junitCase `xml:"testcase"`
}

type junitCase struct {
	Name      string        `xml:"name,attr"`
	Classname string        `xml:"classname,attr"`
	Failure   *junitMessage `xml:"failure,omitempty"`
	Error     *junitMessage `xml:"error,omitempty"`
	Skipped   *junitMessage `xml:"skipped,omitempty"`
	Output    string        `xml:"system-out,omitempty"`
}

type junitMessage struct {
	Message string `xml:"message,attr"`
	Body    string `xml:",chardata"`
}

// JUnit writes one test suite per claim and one test case per claim and
// channel: a violated action is a failure, an inconclusive one an error.
func JUnit(w io.Writer, rep *drill.Report) error {
	out := junitSuites{Name: "drill " + rep.RunID, Time: fmt.Sprintf("%.3f", float64(rep.DurationMS)/1000)}
	for _, cr := range rep.Claims {
		s := junitSuite{Name: cr.ID}
		if cr.Verdict == drill.Skipped {
			s.Cases = append(s.Cases, junitCase{Name: cr.ID, Classname: "drill." + cr.ID, Skipped: &junitMessage{Message: cr.Reason}})
		}
		var channels []string
		byChannel := map[string][]drill.Result{}
		for _, r := range cr.Results {
			if _, ok := byChannel[r.Channel]; !ok {
				channels = append(channels, r.Channel)
			}
			byChannel[r.Channel] = append(byChannel[r.Channel], r)
		}
		for _, ch := range channels {
			tc := junitCase{Name: cr.ID + "/" + ch, Classname: "drill." + cr.ID}
			var lines, failed, inconclusive []string
			for _, r := range byChannel[ch] {
				line := fmt.Sprintf("%s %s -> %s: expected %s, observed %s: %s", strings.ToUpper(string(r.Verdict)), r.From, r.Target, r.Expect, r.Observed, r.Evidence)
				if r.AtTarget != "" {
					line += "; at the target: " + r.AtTarget
				}
				lines = append(lines, line)
				switch r.Verdict {
				case drill.Fail:
					failed = append(failed, line)
				case drill.Inconclusive:
					inconclusive = append(inconclusive, line)
				}
			}
			tc.Output = strings.Join(lines, "\n")
			switch {
			case len(failed) > 0:
				tc.Failure = &junitMessage{Message: fmt.Sprintf("%d of %d probes violated %s", len(failed), len(lines), cr.ID), Body: strings.Join(failed, "\n")}
			case len(inconclusive) > 0:
				tc.Error = &junitMessage{Message: fmt.Sprintf("%d of %d probes inconclusive", len(inconclusive), len(lines)), Body: strings.Join(inconclusive, "\n")}
			}
			s.Cases = append(s.Cases, tc)
		}
		for _, tc := range s.Cases {
			s.Tests++
			switch {
			case tc.Failure != nil:
				s.Failures++
			case tc.Error != nil:
				s.Errors++
			case tc.Skipped != nil:
				s.Skipped++
			}
		}
		out.Tests += s.Tests
		out.Failures += s.Failures
		out.Errors += s.Errors
		out.Skipped += s.Skipped
		out.Suites = append(out.Suites, s)
	}
	if _, err := io.WriteString(w, xml.Header); err != nil {
		return err
	}
	enc := xml.NewEncoder(w)
	enc.Indent("", "  ")
	if err := enc.Encode(out); err != nil {
		return err
	}
	_, err := io.WriteString(w, "\n")
	return err
}

// cell is one source x target square of the matrix: every channel's
// verdict there.
type cell struct {
	channels []string
	verdicts []drill.Verdict
}

// Matrix writes the reachability matrix as a self-contained SVG: sources
// down, targets across, one mark per channel in each cell. Colour follows
// the verdict (green held, red violated, grey inconclusive) and every mark
// also carries a letter (P, F, I) and the channel name, so nothing rests
// on colour alone.
func Matrix(w io.Writer, rep *drill.Report) error {
	var sources, targets []string
	seenS, seenT := map[string]bool{}, map[string]bool{}
	cells := map[[2]string]*cell{}
	for _, cr := range rep.Claims {
		for _, r := range cr.Results {
			src, tgt := r.From, r.TargetKey
			if tgt == "" {
				tgt = r.Target
			}
			if !seenS[src] {
				seenS[src] = true
				sources = append(sources, src)
			}
			if !seenT[tgt] {
				seenT[tgt] = true
				targets = append(targets, tgt)
			}
			k := [2]string{src, tgt}
			if cells[k] == nil {
				cells[k] = &cell{}
			}
			cells[k].channels = append(cells[k].channels, cr.ID+" "+r.Channel)
			cells[k].verdicts = append(cells[k].verdicts, r.Verdict)
		}
	}
	sort.Strings(sources)
	const (
		left, top  = 110, 150
		colW, rowH = 200, 22
		mark       = 18
	)
	rows := map[string]int{}
	y := top
	for _, s := range sources {
		rows[s] = y
		n := 1
		for _, t := range targets {
			if c := cells[[2]string{s, t}]; c != nil && len(c.channels) > n {
				n = len(c.channels)
			}
		}
		y += n*rowH + 12
	}
	width, height := left+len(targets)*colW+20, y+70
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="monospace" font-size="11">`+"\n", width, height)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="10" y="20" font-size="14">drill run %s: %d passed, %d failed, %d inconclusive (exit %d)</text>`+"\n",
		esc(rep.RunID), rep.Summary.Passed, rep.Summary.Failed, rep.Summary.Inconclusive, rep.ExitCode)
	fmt.Fprintf(&b, `<text x="10" y="38">sources down, targets across; each mark is one channel: P held (green), F violated (red), I inconclusive (grey)</text>`+"\n")
	for i, t := range targets {
		x := left + i*colW + 4
		fmt.Fprintf(&b, `<text x="%d" y="%d" transform="rotate(-30 %d %d)">%s</text>`+"\n", x, top-10, x, top-10, esc(t))
	}
	for _, s := range sources {
		fmt.Fprintf(&b, `<text x="10" y="%d" font-weight="bold">%s</text>`+"\n", rows[s]+14, esc(s))
		for i, t := range targets {
			c := cells[[2]string{s, t}]
			if c == nil {
				continue
			}
			for j, ch := range c.channels {
				x, yy := left+i*colW, rows[s]+j*rowH
				fill, letter := "#9e9e9e", "I"
				switch c.verdicts[j] {
				case drill.Pass:
					fill, letter = "#2e7d32", "P"
				case drill.Fail:
					fill, letter = "#c62828", "F"
				}
				fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%d" height="%d" fill="%s"><title>%s: %s</title></rect>`+"\n", x, yy, mark, mark, fill, esc(ch), c.verdicts[j])
				fmt.Fprintf(&b, `<text x="%d" y="%d" fill="white" font-weight="bold">%s</text>`+"\n", x+5, yy+13, letter)
				fmt.Fprintf(&b, `<text x="%d" y="%d">%s</text>`+"\n", x+mark+4, yy+13, esc(shortChannel(ch)))
			}
		}
	}
	fmt.Fprintf(&b, `<text x="10" y="%d">layers: %s</text>`+"\n", height-40, esc(layerLine(rep)))
	fmt.Fprintf(&b, `<text x="10" y="%d">%s, kernel %s, incus %s, bridge netfilter %s</text>`+"\n", height-22, esc(rep.Environment.Mode),
		esc(rep.Environment.Kernel), esc(rep.Environment.IncusVersion), onOff(rep.Environment.BridgeNetfilter))
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

func shortChannel(s string) string {
	if len(s) > 27 {
		return s[:26] + "~"
	}
	return s
}

func layerLine(rep *drill.Report) string {
	var parts []string
	for _, l := range drill.Layers {
		state := rep.Stack.Layers[l]
		if strings.HasPrefix(state, "absent") {
			state = "ABSENT"
		}
		parts = append(parts, l+"="+state)
	}
	return strings.Join(parts, " ")
}

func esc(s string) string { return html.EscapeString(s) }
