package report

import (
	"encoding/json"
	"encoding/xml"
	"fmt"
	"io"
	"strings"

	"github.com/box-isolation/box/drill/verdicts"
)

// JSON writes the versioned report (schema.json beside this file).
func JSON(w io.Writer, rep *verdicts.Report) error {
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
func JUnit(w io.Writer, rep *verdicts.Report) error {
	out := junitSuites{Name: "drill " + rep.RunID, Time: fmt.Sprintf("%.3f", float64(rep.DurationMS)/1000)}
	for _, cr := range rep.Claims {
		id := string(cr.ID)
		s := junitSuite{Name: id}
		if cr.Verdict == verdicts.Skipped {
			s.Cases = append(s.Cases, junitCase{Name: id, Classname: "drill." + id, Skipped: &junitMessage{Message: cr.Reason}})
		}
		var channels []verdicts.Channel
		byChannel := map[verdicts.Channel][]verdicts.Result{}
		for _, r := range cr.Results {
			if _, ok := byChannel[r.Channel]; !ok {
				channels = append(channels, r.Channel)
			}
			byChannel[r.Channel] = append(byChannel[r.Channel], r)
		}
		for _, ch := range channels {
			tc := junitCase{Name: id + "/" + string(ch), Classname: "drill." + id}
			var lines, failed, inconclusive []string
			for _, r := range byChannel[ch] {
				line := fmt.Sprintf("%s %s -> %s: expected %s, observed %s: %s", strings.ToUpper(string(r.Verdict)), r.From, r.Target, r.Expect, r.Observed, r.Evidence)
				if r.AtTarget != "" {
					line += "; at the target: " + r.AtTarget
				}
				lines = append(lines, line)
				switch r.Verdict {
				case verdicts.Fail:
					failed = append(failed, line)
				case verdicts.Inconclusive:
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
