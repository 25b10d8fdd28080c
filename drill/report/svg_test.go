package report_test

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"io"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/drill"
	"github.com/box-isolation/box/drill/report"
	"github.com/box-isolation/box/drill/verdicts"
)

// svgDoc is what the matrix's SVG holds: its size, every <text>'s own
// text (titles aside), every mark (a group with a title and a lettered
// text) and every font size it sets.
type svgDoc struct {
	width, height int
	texts         []string
	marks         [][2]string // title, letter
	fontSizes     []int
}

func svgParse(t *testing.T, data []byte) svgDoc {
	t.Helper()
	var doc svgDoc
	d := xml.NewDecoder(bytes.NewReader(data))
	var stack []xml.StartElement
	var cur, title strings.Builder
	inMark := false
	for {
		tok, err := d.Token()
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
		switch tok := tok.(type) {
		case xml.StartElement:
			stack = append(stack, tok)
			for _, a := range tok.Attr {
				switch {
				case a.Name.Local == "font-size":
					n, err := strconv.Atoi(a.Value)
					require.NoError(t, err)
					doc.fontSizes = append(doc.fontSizes, n)
				case tok.Name.Local == "svg" && a.Name.Local == "width":
					doc.width, _ = strconv.Atoi(a.Value)
				case tok.Name.Local == "svg" && a.Name.Local == "height":
					doc.height, _ = strconv.Atoi(a.Value)
				case tok.Name.Local == "g" && a.Name.Local == "class" && a.Value == "mark":
					inMark = true
				}
			}
			switch tok.Name.Local {
			case "text":
				cur.Reset()
			case "title":
				title.Reset()
			}
		case xml.CharData:
			if len(stack) > 0 {
				switch stack[len(stack)-1].Name.Local {
				case "text":
					cur.Write(tok)
				case "title":
					title.Write(tok)
				}
			}
		case xml.EndElement:
			stack = stack[:len(stack)-1]
			switch tok.Name.Local {
			case "text":
				doc.texts = append(doc.texts, cur.String())
				if inMark {
					doc.marks = append(doc.marks, [2]string{title.String(), cur.String()})
				}
			case "g":
				inMark = false
			}
		}
	}
	require.Empty(t, stack)
	return doc
}

func TestMatrix(t *testing.T) {
	for name, rep := range map[string]*drill.Report{"with inbound": withInbound(t, sampleReport(t)), "full": fullReport(t)} {
		t.Run(name, func(t *testing.T) {
			var b bytes.Buffer
			require.NoError(t, report.Matrix(&b, rep))
			doc := svgParse(t, b.Bytes())

			// One mark per source, target, claim and channel.
			sources, targets, marks := map[string]bool{}, map[string]bool{}, map[string]bool{}
			for _, cr := range rep.Claims {
				for _, r := range cr.Results {
					sources[string(r.From)] = true
					targets[r.TargetKey] = true
					marks[strings.Join([]string{string(r.From), r.TargetKey, string(cr.ID), string(r.Channel)}, " ")] = true
				}
			}
			for s := range sources {
				assert.Contains(t, doc.texts, s, "source %s is labelled", s)
			}
			for tg := range targets {
				assert.Contains(t, doc.texts, tg, "target %s is labelled", tg)
			}
			require.Len(t, doc.marks, len(marks), "one mark per claim and channel in a cell")
			word := map[string]string{"P": "PASS", "F": "FAIL", "I": "INCONCLUSIVE"}
			for _, m := range doc.marks {
				title, letter := m[0], m[1]
				require.Contains(t, word, letter, "mark %q carries a letter, not colour alone", title)
				assert.Contains(t, title, ": "+word[letter]+" (", "mark %q", title)
			}
			assert.Contains(t, b.String(), "P held")

			// Readable on a laptop (1366x768): no wider than its screen, no
			// text smaller than 11 px.
			assert.LessOrEqual(t, doc.width, 1366)
			assert.Positive(t, doc.height)
			for _, fs := range doc.fontSizes {
				assert.GreaterOrEqual(t, fs, 11)
			}
			// What did not hold is also said in words.
			for _, cr := range rep.Claims {
				for _, r := range cr.Results {
					if r.Verdict == drill.Fail {
						assert.Contains(t, strings.Join(doc.texts, "\n"), "F "+string(cr.ID)+" "+string(r.Channel)+", "+string(r.From)+" -> "+r.TargetKey+": FAIL")
					}
				}
			}
		})
	}
}

// A host-mode run aims at many LAN targets with long names: the columns
// stay narrow, long labels are cut and spelled out under the grid.
func TestMatrixLongTargets(t *testing.T) {
	rep := sampleReport(t)
	var rs []verdicts.Result
	for i := range 24 {
		key := fmt.Sprintf("router-192.168.%d.254", 100+i)
		rs = append(rs, res(fmt.Sprintf("p%03d", 100+i), "C-LAN", "tcp", drill.PlaceA, key+" 192.168.1.1", key, drill.ExpectBlocked, drill.Pass, "silent", "dropped", "", nil))
	}
	for i, cr := range rep.Claims {
		if cr.ID == "C-LAN" {
			rep.Claims[i].Results = append(rep.Claims[i].Results, rs...)
		}
	}
	var b bytes.Buffer
	require.NoError(t, report.Matrix(&b, rep))
	doc := svgParse(t, b.Bytes())
	assert.LessOrEqual(t, doc.width, 1366, "36 narrow columns fit a laptop's screen")
	assert.Contains(t, doc.texts, "router-192.168.~")
	all := strings.Join(doc.texts, " ")
	assert.Contains(t, all, "router-192.168.~ = router-192.168.100.254")
	assert.Contains(t, all, "router-192.168.~ = router-192.168.123.254")
}

// Hostile strings stay text: the SVG parses, with no element of theirs.
func TestMatrixEscapes(t *testing.T) {
	rep := withInbound(t, sampleReport(t))
	rep.RunID = hostile
	rep.Environment.Hostname = hostile
	rep.Claims[3].Results[0].TargetKey = hostile
	rep.Claims[3].Results[1].Channel = hostile
	var b bytes.Buffer
	require.NoError(t, report.Matrix(&b, rep))
	assert.NotContains(t, b.String(), "<script")
	assert.NotContains(t, b.String(), "<img")
	doc := svgParse(t, b.Bytes())
	assert.Contains(t, strings.Join(doc.texts, ""), "console.error")
}
