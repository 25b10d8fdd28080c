package report_test

import (
	"bytes"
	"fmt"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/box-isolation/box/drill"
	"github.com/box-isolation/box/drill/report"
	"github.com/box-isolation/box/drill/verdicts"
)

func TestText(t *testing.T) {
	for name, rep := range map[string]*drill.Report{"sample": sampleReport(t), "with inbound": withInbound(t, sampleReport(t))} {
		t.Run(name, func(t *testing.T) {
			var b bytes.Buffer
			report.Text(&b, rep)
			out := b.String()
			for _, c := range rep.Claims {
				assert.Contains(t, out, c.ID)
			}
			s := rep.Summary
			line := fmt.Sprintf("%d passed, %d failed, %d inconclusive, %d skipped", s.Passed, s.Failed, s.Inconclusive, s.Skipped)
			assert.Contains(t, out, line)
			assert.Regexp(t, regexp.MustCompile(`(?m)^\d+ passed, \d+ failed, \d+ inconclusive, \d+ skipped;`), out)
			for _, p := range rep.Problems {
				assert.Contains(t, out, "problem: "+p)
			}
			for _, c := range rep.Claims {
				if c.Verdict == drill.Skipped {
					assert.Regexp(t, `(?m)^`+string(c.ID)+` +- .*SKIPPED +`+regexp.QuoteMeta(c.Reason), out, "a skipped claim says so in words, with its reason")
				}
			}
			assert.Contains(t, out, "FAIL")
			assert.Contains(t, out, "mutation host-fw (L-HOSTFW): detected by probes: C-HOST flipped from pass to fail", "a mutation says what showed it")
			for _, r := range out {
				assert.Less(t, r, rune(0x80), "plain ASCII")
				if r >= 0x80 {
					break
				}
			}
			assert.NotContains(t, out, "\x1b[", "no colour")
		})
	}
}

// The header says which kind of box the run proved, and that it is not the
// kind box new makes where the two differ.
func TestTextInstanceType(t *testing.T) {
	header := func(rep *drill.Report) string {
		var b bytes.Buffer
		report.Text(&b, rep)
		first, _, _ := strings.Cut(b.String(), "\n")
		return first
	}
	same := sampleReport(t)
	same.Environment.BoxNewType = "container"
	for name, rep := range map[string]*drill.Report{"box new makes containers": same, "from before box_new_type": sampleReport(t)} {
		h := header(rep)
		assert.Contains(t, h, ", container, bridge netfilter", name)
		assert.NotContains(t, h, "box new makes", name)
	}
	assert.Contains(t, header(vmHost(t)), ", container (box new makes virtual-machine here: not drilled), bridge netfilter")
}

// TestMembers: a cluster run's table and page group the results by
// member, each member's failures under it.
func TestMembers(t *testing.T) {
	rep := fullReport(t)
	rep.Environment.Members = []string{"m1", "m2"}
	cr := &rep.Claims[0]
	bad := verdicts.Result{ID: "p900", Claim: cr.ID, Channel: "tcp", From: "box@m2", Member: "m2",
		Target: "member m2 uplink 192.0.2.2 tcp/22", Expect: drill.ExpectBlocked, Verdict: drill.Fail, Evidence: "unexpected success: the ssh banner"}
	cr.Results = append(cr.Results, bad)
	rep.Members = []drill.MemberResult{{Member: "m1", Boxes: []drill.Place{"box-a"}, Passed: 3}, {Member: "m2", Boxes: []drill.Place{"box@m2"}, Failed: 1}}
	var b strings.Builder
	report.Text(&b, rep)
	out := b.String()
	assert.Contains(t, out, "member m1               3 passed, 0 failed, 0 inconclusive; probe boxes there: box-a")
	assert.Contains(t, out, "member m2               0 passed, 1 failed, 0 inconclusive; probe boxes there: box@m2\n  FAIL "+cr.ID+" box@m2 -> member m2 uplink 192.0.2.2 tcp/22: unexpected success")
	raw, _ := renderHTML(t, rep)
	assert.Contains(t, raw, `<h2 id="members">Cluster members</h2>`)
	assert.Contains(t, raw, `<td class="mono">box@m2</td>`)

	rep.Members = nil
	b.Reset()
	report.Text(&b, rep)
	assert.NotContains(t, b.String(), "member m1", "off a cluster there is no member section")
}
