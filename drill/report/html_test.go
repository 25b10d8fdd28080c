package report_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/html"

	"github.com/box-isolation/box/drill"
	"github.com/box-isolation/box/drill/report"
	"github.com/box-isolation/box/drill/topo"
	"github.com/box-isolation/box/drill/verdicts"
	"github.com/box-isolation/box/internal/hostscan"
	"github.com/box-isolation/box/probes"
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

// hostile is markup a report might carry in any string (a hostname, a DNS
// answer, a reply's first bytes): every page must show it as text. Run as
// script, it would log to the console, which the browser test watches.
const hostile = `<script>console.error("injected")</script><img src=x onerror="console.error('injected')">"'&`

// worldScene is a hermetic-world run's scene, written out by hand: the
// world's places and addresses, the host's listeners (an ssh stand-in, a
// developer's server, its resolver and DHCP server).
func worldScene() drill.Scene {
	subnet := netip.MustParsePrefix("10.88.0.0/24")
	gw := netip.MustParseAddr("10.88.0.1")
	any4 := netip.MustParseAddr("0.0.0.0")
	s := drill.Scene{
		Subnet: subnet, Gateway: gw, GatewayMAC: net.HardwareAddr{0, 0x16, 0x3e, 0, 0, 1},
		Topology: topo.Topology{
			Source: topo.SourceWorld, Canary: netip.MustParseAddr("203.0.113.10"), CanaryTCP: 80, CanaryUDP: 7,
			CanaryGreeting: "hello from canary 5f3e", PublicName: "canary.example.net.", PublicNameAddr: netip.MustParseAddr("203.0.113.10"),
			LANVia: netip.MustParsePrefix("192.168.20.0/24"), LANNAT: netip.MustParseAddr("192.168.20.1"),
			LANSources: []netip.Addr{netip.MustParseAddr("192.168.20.2")},
		},
		DNSDomain: "incus",
		HostAddrs: []drill.HostAddr{
			{Name: "gateway", Addr: gw, Via: subnet},
			{Name: "uplink", Addr: netip.MustParseAddr("198.51.100.2"), Via: netip.MustParsePrefix("198.51.100.0/24")},
			{Name: "lan-side", Addr: netip.MustParseAddr("192.168.20.1"), Via: netip.MustParsePrefix("192.168.20.0/24")},
		},
		Listeners: []hostscan.Listener{
			{Proto: "tcp", Family: 4, Addr: any4, Port: 22},
			{Proto: "tcp", Family: 4, Addr: any4, Port: 3000},
			{Proto: "udp", Family: 4, Addr: any4, Port: 123},
			{Proto: "udp", Family: 4, Addr: any4, Port: 67},
			{Proto: "udp", Family: 4, Addr: gw, Port: 53},
			{Proto: "tcp", Family: 4, Addr: gw, Port: 53},
		},
	}
	for i, e := range []*drill.BoxEnd{&s.A, &s.B, &s.C} {
		place := []drill.Place{drill.PlaceA, drill.PlaceB, drill.PlaceC}[i]
		*e = drill.BoxEnd{Place: place, Instance: "drill-0a1b2c-" + string(rune('a'+i)), IP: netip.AddrFrom4([4]byte{10, 88, 0, byte(11 + i)}),
			MAC: net.HardwareAddr{0, 0x16, 0x3e, 0, 0, byte(0xa + i)}, LinkLocal: netip.MustParseAddr(fmt.Sprintf("fe80::b0c5:16:3e00:%x", 0xa+i))}
	}
	for _, h := range []struct{ name, addr string }{
		{"lan-10", "10.20.0.10"}, {"lan-172", "172.16.20.10"}, {"lan-192", "192.168.20.10"},
		{"lan-cgnat", "100.64.20.10"}, {"lan-metadata", "169.254.169.254"},
	} {
		s.LANHosts = append(s.LANHosts, drill.Target{Name: h.name, Addr: netip.MustParseAddr(h.addr), TCPPort: 80, UDPPort: 7})
	}
	return s
}

// fullReport is a whole run in the hermetic world, as big as a real one:
// the actions of the real scenario (drill.BuildScenario over the world's
// places and targets) plus the names C-NAMES asks there, judged mostly
// pass, with one probe violated, one inconclusive, Verify's stack channel
// for every claim, the census, and hostile markup in some strings.
func fullReport(t testing.TB) *drill.Report {
	t.Helper()
	sc := drill.BuildScenario(worldScene(), drill.Catalogue)
	actions := sc.Actions
	n := len(actions)
	for _, q := range []string{"git.corp.internal.", "wiki.corp.internal.", "nas.corp.internal.", "boxw-host.corp.internal.", "boxw-host.",
		"PTR 192.168.20.1", "printer.corp.internal.", "printer.", "PTR 192.168.20.30", "intranet.corp.internal.", "mail.corp.internal.",
		"vpn.corp.internal.", "PTR 10.88.0.1", "PTR 10.20.0.10", "PTR 172.16.20.10", "PTR 192.168.20.10", "PTR 100.64.20.10", "PTR 169.254.169.254"} {
		n++
		actions = append(actions, drill.Action{ID: fmt.Sprintf("p%03d", n), Claim: "C-NAMES", Channel: "dns", From: drill.PlaceA, Target: q,
			TargetKey: "gateway", Expect: drill.ExpectNoName, Provenance: topo.FromLANZone})
	}
	byClaim := map[drill.ClaimID][]drill.Result{}
	for _, a := range actions {
		r := drill.Result{Action: a, Verdict: drill.Pass}
		switch a.Expect {
		case drill.ExpectBlocked:
			r.Observed, r.Evidence = "silent", "dropped: nothing came back before the deadline"
			r.AtTarget = "the witness saw nothing (18 frames read; alive: 17 control frame(s), the last at 09:41:44.966)"
		case drill.ExpectNoName:
			r.Observed, r.Evidence = "refused", "the resolver answered NXDOMAIN with no record"
			name := strings.TrimPrefix(a.Target, "PTR ")
			r.Obs = &probes.Observation{ID: a.ID, Kind: probes.KindDNS, Target: "10.88.0.1:53", Outcome: probes.Refused,
				Reason:   "the resolver answered NXDOMAIN: the name did not resolve",
				Evidence: probes.Evidence{DNS: &probes.DNSEvidence{Name: name, QType: "A", Rcode: "NXDOMAIN"}}, StartedAt: started, ElapsedMS: 12}
		case drill.ExpectNone:
			r.Observed, r.Evidence = "silent", "no global IPv6 address, default route or router advertisement"
		default:
			r.Observed, r.Evidence = "reached", "reached: the target proved who it is"
		}
		switch {
		case a.Claim == "C-HOST" && strings.Contains(a.Target, "tcp/3000") && strings.HasPrefix(a.TargetKey, "host-uplink"):
			r.Verdict, r.Observed = drill.Fail, "refused"
			r.Evidence = "unexpected answer: a TCP RST from 198.51.100.2, so the packet arrived"
			r.AtTarget = "the listener served 10.88.0.11:40112 " + hostile
		case a.Claim == "C-LAN" && a.TargetKey == "lan-metadata" && a.Channel == "udp":
			r.Verdict, r.Observed = drill.Inconclusive, "error"
			r.Evidence = "the probe could not run: sendto: network is unreachable"
		case a.Claim == "C-NAMES" && a.Target == "printer.":
			r.Evidence = "the resolver answered NXDOMAIN with no record; the name on the LAN is " + hostile
		}
		byClaim[a.Claim] = append(byClaim[a.Claim], r)
	}
	rep := &drill.Report{
		SchemaVersion: drill.SchemaVersion, RunID: "5d0c2e", Version: "e51ae38", Started: started, DurationMS: 10412,
		Environment: drill.Environment{Mode: "world", Hostname: "boxw-host", Kernel: "6.12.57+deb13-amd64", IncusVersion: "6.0.4",
			InstanceType: "container", BoxNewType: "container"},
		Stack: drill.StackFacts{Ensured: true, Changes: []model.Change{}, Subnet: "10.88.0.0/24", Gateway: "10.88.0.1", BridgeMode: "bridge-meta",
			Layers: map[model.LayerID]string{}, Findings: []model.Finding{}},
		Mutations: []string{}, MutationResults: []drill.MutationResult{}, Problems: []string{},
		Notes: []string{"C-NAMES: the hosts file was read; names from it: " + hostile},
	}
	for _, l := range drill.Layers() {
		rep.Stack.Layers[l] = "present"
	}
	for _, e := range []drill.BoxEnd{worldScene().A, worldScene().B, worldScene().C} {
		rep.Boxes = append(rep.Boxes, drill.BoxEnd{Place: e.Place, Instance: e.Instance, IP: e.IP, LinkLocal: e.LinkLocal})
	}
	for _, c := range drill.Catalogue {
		rs := byClaim[c.ID]
		if c.ID == "C-FLEET" {
			rs = append(rs, drill.Result{Action: drill.Action{ID: "f-C-FLEET", Claim: c.ID, Channel: drill.ChannelCensus, From: "verify",
				Target: "every instance and port on boxnet", TargetKey: string(drill.ChannelCensus), Expect: drill.ExpectPresent},
				Verdict: drill.Pass, Observed: "met the drill's own boxes", Evidence: "the census met box-a, box-b and clone-a on their ports"})
		}
		rs = append(rs, drill.Result{Action: drill.Action{ID: "s-" + string(c.ID), Claim: c.ID, Channel: drill.ChannelStack, From: "verify",
			Target: strings.Join(drill.Strings(c.Layers), ", "), TargetKey: string(drill.ChannelStack), Expect: drill.ExpectPresent},
			Verdict: drill.Pass, Observed: "present", Evidence: "Verify found " + strings.Join(drill.Strings(c.Layers), ", ") + " as desired"})
		cr := drill.ClaimResult{Claim: c.Reported(), Verdict: drill.Pass}
		for _, r := range rs {
			cr.Results = append(cr.Results, r.Reported())
		}
		for _, r := range rs {
			if r.Verdict == drill.Fail || (r.Verdict == drill.Inconclusive && cr.Verdict == drill.Pass) {
				cr.Verdict = r.Verdict
			}
		}
		switch cr.Verdict {
		case drill.Pass:
			rep.Summary.Passed++
		case drill.Fail:
			rep.Summary.Failed++
		case drill.Inconclusive:
			rep.Summary.Inconclusive++
		}
		rep.Claims = append(rep.Claims, cr)
	}
	rep.Summary.Probes = len(actions)
	rep.Summary.ProbePhaseMS = 4805
	rep.Summary.MSPerProbe = float64(rep.Summary.ProbePhaseMS) / float64(len(actions))
	rep.ExitCode = drill.ExitViolated
	return rep
}

// results is every result of a report.
func results(rep *drill.Report) []verdicts.Result {
	var out []verdicts.Result
	for _, cr := range rep.Claims {
		out = append(out, cr.Results...)
	}
	return out
}

func TestFullReportIsRealistic(t *testing.T) {
	rep := fullReport(t)
	rs := results(rep)
	assert := func(ok bool, format string, args ...any) {
		t.Helper()
		if !ok {
			t.Errorf(format, args...)
		}
	}
	// A world run on e51ae38: 138 probes with their controls and the
	// upstream's questions, about 120 results.
	assert(len(rs) >= 110 && len(rs) <= 170, "%d results, want as many as a world run's", len(rs))
	from, keys := map[drill.Place]bool{}, map[string]bool{}
	for _, r := range rs {
		from[r.From] = true
		keys[r.TargetKey] = true
	}
	for _, p := range []drill.Place{drill.PlaceA, drill.PlaceB, drill.PlaceC, drill.PlaceHost, drill.PlaceLAN, drill.PlaceVerify} {
		assert(from[p], "no result from %s", p)
	}
	for _, k := range []string{"box-b", "clone-a", "host-gateway", "host-uplink", "host-lan-side", "host-bridge", "internet", "gateway", "lease", "lan-10", "ipv6", "stack"} {
		assert(keys[k], "no result aimed at %s", k)
	}
	assert(len(rep.Claims) == len(drill.Catalogue), "every claim")
}
