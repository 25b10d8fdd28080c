package report_test

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/html"

	"github.com/box-isolation/box/drill"
	"github.com/box-isolation/box/drill/report"
	"github.com/box-isolation/box/stack/model"
)

// node helpers over the parsed page.

func attr(n *html.Node, key string) (string, bool) {
	for _, a := range n.Attr {
		if a.Key == key {
			return a.Val, true
		}
	}
	return "", false
}

func hasClass(n *html.Node, class string) bool {
	v, _ := attr(n, "class")
	for _, c := range strings.Fields(v) {
		if c == class {
			return true
		}
	}
	return false
}

func walk(n *html.Node, f func(*html.Node)) {
	f(n)
	for c := n.FirstChild; c != nil; c = c.NextSibling {
		walk(c, f)
	}
}

func elements(root *html.Node, tag string) []*html.Node {
	var out []*html.Node
	walk(root, func(n *html.Node) {
		if n.Type == html.ElementNode && n.Data == tag {
			out = append(out, n)
		}
	})
	return out
}

func text(n *html.Node) string {
	var b strings.Builder
	walk(n, func(n *html.Node) {
		if n.Type == html.TextNode {
			b.WriteString(n.Data)
		}
	})
	return b.String()
}

func byID(root *html.Node) map[string]*html.Node {
	out := map[string]*html.Node{}
	walk(root, func(n *html.Node) {
		if id, ok := attr(n, "id"); ok && n.Type == html.ElementNode {
			out[id] = n
		}
	})
	return out
}

func renderHTML(t *testing.T, rep *drill.Report) (string, *html.Node) {
	t.Helper()
	var b bytes.Buffer
	require.NoError(t, report.HTML(&b, rep))
	doc, err := html.Parse(bytes.NewReader(b.Bytes()))
	require.NoError(t, err)
	return b.String(), doc
}

func TestHTML(t *testing.T) {
	for name, rep := range map[string]*drill.Report{
		"sample":       sampleReport(t),
		"with inbound": withInbound(t, sampleReport(t)),
		"vm host":      vmHost(t),
		"full":         fullReport(t),
	} {
		t.Run(name, func(t *testing.T) {
			raw, doc := renderHTML(t, rep)
			ids := byID(doc)

			// Self-contained: nothing fetched, one script of our own.
			assert.Empty(t, elements(doc, "link"), "no stylesheet or icon fetched")
			assert.Empty(t, elements(doc, "img"))
			assert.Empty(t, elements(doc, "iframe"))
			assert.Len(t, elements(doc, "script"), 1)
			for _, s := range elements(doc, "script") {
				_, src := attr(s, "src")
				assert.False(t, src, "inline script only")
			}
			for _, a := range elements(doc, "a") {
				href, _ := attr(a, "href")
				require.True(t, strings.HasPrefix(href, "#"), "link %q leaves the page", href)
				_, ok := ids[strings.TrimPrefix(href, "#")]
				assert.True(t, ok, "link %q leads nowhere", href)
			}
			assert.NotContains(t, raw, "http://")
			assert.NotContains(t, raw, "https://")

			// The claims first, each with its verdict in words.
			claims := ids["claims"]
			require.NotNil(t, claims)
			table := claims.NextSibling
			for table != nil && table.Type != html.ElementNode {
				table = table.NextSibling
			}
			require.NotNil(t, table)
			claimsText := text(table)
			for _, cr := range rep.Claims {
				assert.Contains(t, claimsText, cr.ID)
				sec := ids["claim-"+string(cr.ID)]
				require.NotNil(t, sec, "a section for %s", cr.ID)
				assert.Contains(t, text(sec), strings.ToUpper(string(cr.Verdict)))
			}
			assert.Less(t, strings.Index(raw, `id="claims"`), strings.Index(raw, `id="matrix"`), "claims before the matrix")
			assert.Less(t, strings.Index(raw, `id="matrix"`), strings.Index(raw, `id="stack"`), "matrix before the layers")
			assert.Less(t, strings.Index(raw, `id="stack"`), strings.Index(raw, `id="environment"`))
			assert.Less(t, strings.Index(raw, `id="environment"`), strings.Index(raw, `id="results"`))

			// Every result is there, with its evidence, behind a details.
			n := 0
			for _, cr := range rep.Claims {
				for _, r := range cr.Results {
					n++
					d := ids["r-"+r.ID]
					require.NotNil(t, d, "result %s", r.ID)
					assert.Equal(t, "details", d.Data)
					body := text(d)
					assert.Contains(t, body, r.Evidence, r.ID)
					assert.Contains(t, body, r.AtTarget, r.ID)
					assert.Contains(t, body, strings.ToUpper(string(r.Verdict)), r.ID)
				}
			}
			assert.Len(t, elements(doc, "details"), n, "one details per result")

			// The matrix: a row per source, a column per target, every mark a
			// letter whose title says the same verdict in words.
			grid := ids["grid"]
			require.NotNil(t, grid)
			sources, targets := map[string]bool{}, map[string]bool{}
			for _, r := range results(rep) {
				sources[string(r.From)] = true
				targets[r.TargetKey] = true
			}
			var heads, srcs []string
			walk(grid, func(n *html.Node) {
				switch {
				case n.Type == html.ElementNode && n.Data == "th" && hasClass(n, "tgt"):
					heads = append(heads, text(n))
				case n.Type == html.ElementNode && n.Data == "th" && hasClass(n, "src"):
					srcs = append(srcs, text(n))
				}
			})
			assert.Len(t, srcs, len(sources))
			assert.Len(t, heads, len(targets))
			for s := range sources {
				assert.Contains(t, srcs, s)
			}
			for tg := range targets {
				assert.Contains(t, heads, tg)
			}
			word := map[string]string{"P": "PASS", "F": "FAIL", "I": "INCONCLUSIVE"}
			marks := 0
			walk(grid, func(n *html.Node) {
				if n.Type != html.ElementNode || n.Data != "a" || !hasClass(n, "m") {
					return
				}
				marks++
				title, _ := attr(n, "title")
				letter := text(n)
				require.Contains(t, word, letter, "a mark is a letter, not colour alone")
				assert.Contains(t, title, ": "+word[letter]+" (", "mark %q", title)
			})
			assert.Positive(t, marks)
			assert.LessOrEqual(t, marks, n)

			// Plain ASCII labels.
			walk(doc, func(n *html.Node) {
				if n.Type == html.ElementNode && hasClass(n, "v") {
					assert.Contains(t, []string{"PASS", "FAIL", "INCONCLUSIVE", "SKIPPED", "PRESENT", "ABSENT", "UNKNOWN", "HOLDS", "VIOLATED", "ERROR"}, text(n))
				}
			})
		})
	}
}

// A cell holds one mark per claim and channel, however many probes it
// stands for: C-NAMES asks a score of names of the same resolver.
func TestHTMLMarksAggregate(t *testing.T) {
	rep := fullReport(t)
	_, doc := renderHTML(t, rep)
	var titles []string
	walk(byID(doc)["grid"], func(n *html.Node) {
		if n.Type == html.ElementNode && n.Data == "a" && hasClass(n, "m") {
			v, _ := attr(n, "title")
			titles = append(titles, v)
		}
	})
	names := 0
	for _, r := range results(rep) {
		if r.Claim == "C-NAMES" {
			names++
		}
	}
	var nameMarks []string
	for _, ti := range titles {
		if strings.HasPrefix(ti, "C-NAMES dns, box-a -> gateway") {
			nameMarks = append(nameMarks, ti)
		}
	}
	require.Len(t, nameMarks, 1)
	assert.Contains(t, nameMarks[0], "PASS (")
	assert.Regexp(t, `\(\d+ probes: \d+ passed\)`, nameMarks[0])
	assert.Greater(t, names, 20)

	// The violated probe's mark says FAIL and leads to it.
	var fail *html.Node
	walk(byID(doc)["grid"], func(n *html.Node) {
		if n.Type == html.ElementNode && n.Data == "a" && text(n) == "F" {
			fail = n
		}
	})
	require.NotNil(t, fail)
	title, _ := attr(fail, "title")
	assert.Contains(t, title, "C-HOST tcp, box-a -> host-uplink: FAIL (")
	href, _ := attr(fail, "href")
	for _, r := range results(rep) {
		if "#r-"+r.ID == href {
			assert.Equal(t, drill.Fail, r.Verdict)
		}
	}
}

// Whatever a report carries is shown as text: no markup of its own gets
// into the page.
func TestHTMLEscapes(t *testing.T) {
	rep := withInbound(t, sampleReport(t))
	rep.RunID = hostile
	rep.Version = hostile
	rep.Environment.Hostname = hostile
	rep.Environment.Kernel = hostile
	rep.Stack.Layers["L-ACL"] = "absent: " + hostile
	rep.Stack.Findings = append(rep.Stack.Findings, stackFinding(hostile))
	rep.Notes = append(rep.Notes, hostile)
	rep.Problems = append(rep.Problems, hostile)
	for i := range rep.Claims {
		cr := &rep.Claims[i]
		cr.Reason += hostile
		for j := range cr.Results {
			r := &cr.Results[j]
			r.Evidence += hostile
			r.AtTarget += hostile
			r.Target += hostile
			r.Observed += hostile
		}
	}
	// A hostile id and column too: ids go into href and id attributes.
	rep.Claims[0].Results[0].ID = `p1" onmouseover="alert(1)`
	rep.Claims[0].Results[0].TargetKey = hostile

	raw, doc := renderHTML(t, rep)
	assert.NotContains(t, raw, "<script>console")
	assert.NotContains(t, raw, "<img")
	assert.NotContains(t, raw, `" onmouseover`)
	assert.Contains(t, raw, "&lt;script&gt;")
	assert.Len(t, elements(doc, "script"), 1, "only the page's own")
	assert.Empty(t, elements(doc, "img"))
	walk(doc, func(n *html.Node) {
		if n.Type != html.ElementNode {
			return
		}
		for _, a := range n.Attr {
			assert.False(t, strings.HasPrefix(a.Key, "on"), "<%s %s=%q>", n.Data, a.Key, a.Val)
		}
	})
	// And it is all there, as text.
	body := text(doc)
	assert.GreaterOrEqual(t, strings.Count(body, hostile), 10)
}

func stackFinding(s string) model.Finding {
	return model.Finding{Layer: "L-ACL", Object: s, Problem: s, Fix: s}
}

// A recorded report draws the same page as the run that wrote it: what
// the page shows is all in the JSON (target_key included).
func TestHTMLFromJSON(t *testing.T) {
	for name, rep := range map[string]*drill.Report{"sample": withInbound(t, sampleReport(t)), "full": fullReport(t)} {
		t.Run(name, func(t *testing.T) {
			var back drill.Report
			require.NoError(t, json.Unmarshal(reportJSON(t, rep), &back))
			var want, got bytes.Buffer
			require.NoError(t, report.HTML(&want, rep))
			require.NoError(t, report.HTML(&got, &back))
			assert.Equal(t, want.String(), got.String())
			want.Reset()
			got.Reset()
			require.NoError(t, report.Matrix(&want, rep))
			require.NoError(t, report.Matrix(&got, &back))
			assert.Equal(t, want.String(), got.String())
		})
	}
}

// A report from before target_key: the first word of a target is its
// column.
func TestHTMLWithoutTargetKey(t *testing.T) {
	rep := withInbound(t, sampleReport(t))
	for i := range rep.Claims {
		for j := range rep.Claims[i].Results {
			rep.Claims[i].Results[j].TargetKey = ""
		}
	}
	_, doc := renderHTML(t, rep)
	var heads []string
	walk(byID(doc)["grid"], func(n *html.Node) {
		if n.Type == html.ElementNode && n.Data == "th" && hasClass(n, "tgt") {
			heads = append(heads, text(n))
		}
	})
	require.GreaterOrEqual(t, len(heads), 3)
	assert.Equal(t, []string{"canary", "gateway", "lease"}, heads[:3])
	assert.Contains(t, heads, "host", `"host gateway 10.88.0.1" and "host uplink 198.51.100.2" share a column`)
}
