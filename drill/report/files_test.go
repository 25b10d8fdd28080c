package report_test

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/drill"
	"github.com/box-isolation/box/drill/gate/gatetest"
	"github.com/box-isolation/box/drill/report"
	"github.com/box-isolation/box/drill/verdicts"
	"github.com/box-isolation/box/probes"
	"github.com/box-isolation/box/stack/model"
)

var started = time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)

func claim(t *testing.T, id drill.ClaimID) verdicts.Claim {
	t.Helper()
	c, ok := drill.ClaimByID(id)
	require.True(t, ok, id)
	return c.Reported()
}

// res is a judged action. The observation is optional.
func res[K ~string](id string, claim drill.ClaimID, channel drill.Channel, from drill.Place, target string, key K, expect drill.Expectation, v drill.Verdict, observed, evidence, atTarget string, o *probes.Observation) verdicts.Result {
	return verdicts.Result{
		ID: id, Claim: claim, Channel: channel, From: from, Target: target, TargetKey: string(key), Expect: expect,
		Verdict:  v,
		Observed: observed,
		Evidence: evidence,
		AtTarget: atTarget,
		Obs:      o,
	}
}

func obs(id string, kind probes.Kind, target string, o probes.Outcome, reason string, ev probes.Evidence) *probes.Observation {
	return &probes.Observation{ID: id, Kind: kind, Target: target, Outcome: o, Reason: reason, Nonce: "", Evidence: ev,
		StartedAt: started.Add(40*time.Second + time.Second), ElapsedMS: 1500}
}

// sampleReport is a run as drill.Run would return it: every claim kind,
// one claim violated, one inconclusive, one skipped, with problems and a
// mutation.
func sampleReport(t *testing.T) *drill.Report {
	t.Helper()
	cr := func(id drill.ClaimID, v drill.Verdict, rs ...verdicts.Result) drill.ClaimResult {
		if rs == nil {
			rs = []verdicts.Result{}
		}
		return drill.ClaimResult{Claim: claim(t, id), Verdict: v, Results: rs}
	}
	A, B, C := drill.PlaceA, drill.PlaceB, drill.PlaceC
	skipped := cr("C-INBOUND", drill.Skipped)
	skipped.Reason = "not selected (--claim/--skip); run without them to include it"
	return &drill.Report{
		SchemaVersion: drill.SchemaVersion,
		RunID:         "0a1b2c",
		Version:       "2ce2ced",
		Started:       started,
		DurationMS:    93412,
		Environment: drill.Environment{Mode: "world", Hostname: "ci-7", Kernel: "6.18.2-arch1-1", IncusVersion: "6.0.4",
			InstanceType: "container", BridgeNetfilter: false},
		Stack: drill.StackFacts{
			Ensured: true,
			Changes: []model.Change{{Object: "network boxnet", Action: "created", Detail: "10.88.0.0/24"}, {Object: "acl box-isolate", Action: "created"}},
			Subnet:  "10.88.0.0/24", Gateway: "10.88.0.1", BridgeMode: "bridge-meta",
			Layers: map[model.LayerID]string{"L-NAT": "present", "L-DNS": "present", "L-V6": "present", "L-ACL": "present",
				"L-HOSTFW": "absent: nft table inet box: missing", "L-PORTISO": "present", "L-BRIDGEDROP": "present"},
			Findings: []model.Finding{{Layer: "L-HOSTFW", Object: "nft table inet box", Problem: "missing", Fix: "box setup-host"}},
		},
		Boxes: []drill.BoxEnd{
			{Place: A, Instance: "drill-0a1b2c-a", IP: netip.MustParseAddr("10.88.0.11"), LinkLocal: netip.MustParseAddr("fe80::b0c5:16:3e00:a")},
			{Place: B, Instance: "drill-0a1b2c-b", IP: netip.MustParseAddr("10.88.0.12"), LinkLocal: netip.MustParseAddr("fe80::b0c5:16:3e00:b")},
			{Place: C, Instance: "drill-0a1b2c-c", IP: netip.MustParseAddr("10.88.0.13")},
		},
		Claims: []drill.ClaimResult{
			cr("C-EGRESS", drill.Pass,
				res("p001", "C-EGRESS", "tcp", A, "canary 203.0.113.10", "internet", drill.ExpectReach, drill.Pass, "reached", `reached 203.0.113.10:80: "hello from canary"`, "",
					obs("p001", probes.KindTCP, "203.0.113.10:80", probes.Reached, "connected and the peer echoed the nonce",
						probes.Evidence{Interface: "eth0", Source: "10.88.0.11", From: "203.0.113.10", Reply: "hello from canary"})),
				res("p002", "C-EGRESS", "udp", A, "canary 203.0.113.10", "internet", drill.ExpectReach, drill.Pass, "reached", "reached", "", nil),
				res("p003", "C-EGRESS", "icmp", A, "canary 203.0.113.10", "internet", drill.ExpectReach, drill.Pass, "reached", "reached", "",
					obs("p003", probes.KindICMP, "203.0.113.10", probes.Reached, "echo reply", probes.Evidence{Sent: 1, From: "203.0.113.10"}))),
			cr("C-DNS", drill.Pass,
				res("p004", "C-DNS", "dns", A, "gateway 10.88.0.1 canary.example.net.", "gateway", drill.ExpectResolve, drill.Pass, "reached", "resolved", "",
					obs("p004", probes.KindDNS, "10.88.0.1:53", probes.Reached, "the resolver answered with records for the name",
						probes.Evidence{DNS: &probes.DNSEvidence{Name: "canary.example.net.", QType: "A", Rcode: "NOERROR", Resolved: true, Answers: []string{"canary.example.net.\t60\tIN\tA\t203.0.113.10"}}}))),
			cr("C-DHCP", drill.Pass,
				res("p005", "C-DHCP", "dhcp", A, "lease on 10.88.0.0/24", "lease", drill.ExpectLease, drill.Pass, "reached", "holds 10.88.0.11/24", "",
					obs("p005", probes.KindDHCPLease, "", probes.Reached, "eth0 holds 10.88.0.11/24",
						probes.Evidence{Lease: &probes.LeaseEvidence{Address: "10.88.0.11/24", Dynamic: true, ValidLftSec: 3541, MAC: "00:16:3e:00:00:0a", MachineID: "0123456789abcdef", Hostname: "drill-0a1b2c-a", DefaultRoute: "10.88.0.1"}}))),
			cr("C-SIBLING", drill.Fail,
				res("p006", "C-SIBLING", "arp", A, "box-b 10.88.0.12", B, drill.ExpectBlocked, drill.Pass, "silent", "dropped: no ARP reply", "the witness saw nothing (12 frames read)",
					obs("p006", probes.KindARP, "10.88.0.12", probes.Silent, "no ARP reply", probes.Evidence{Sent: 3})),
				res("p007", "C-SIBLING", "tcp", A, "box-b 10.88.0.12", B, drill.ExpectBlocked, drill.Fail, "silent", "the sender heard nothing back, but the target saw the traffic arrive",
					"the witness saw 1 frame(s): ipv4 00:16:3e:00:00:0a -> 00:16:3e:00:00:0b 10.88.0.11 -> 10.88.0.12 tcp port 9100 (matched by src_ip 10.88.0.11)",
					obs("p007", probes.KindTCP, "10.88.0.12:9100", probes.Silent, "no SYN-ACK, RST or ICMP error before the deadline", probes.Evidence{})),
				res("p008", "C-SIBLING", "tcp", A, "clone-a 10.88.0.13", C, drill.ExpectBlocked, drill.Pass, "silent", "dropped", "the witness saw nothing (3 frames read)", nil),
				res("p009", "C-SIBLING", "broadcast", A, "every peer on 10.88.0.0/24", B, drill.ExpectBlocked, drill.Fail, "reached", "unexpected success: 1 host(s) echoed the broadcast nonce (responders 10.88.0.12)", "",
					obs("p009", probes.KindBroadcast, "10.88.0.255:9101", probes.Reached, "1 host(s) echoed the broadcast nonce", probes.Evidence{Responders: []string{"10.88.0.12"}, Sent: 3}))),
			cr("C-HOST", drill.Inconclusive,
				res("p010", "C-HOST", "tcp", A, "host gateway 10.88.0.1", "host-gateway", drill.ExpectBlocked, drill.Inconclusive, "silent", "no listener report from host", "", nil),
				res("p011", "C-HOST", "icmp", A, "host uplink 198.51.100.2", "host-uplink", drill.ExpectBlocked, drill.Pass, "rejected by 10.88.0.1", "blocked by policy: rejected by 10.88.0.1 (admin-prohibited)", "",
					obs("p011", probes.KindICMP, "198.51.100.2", probes.Rejected, "ICMP admin-prohibited from 10.88.0.1",
						probes.Evidence{ICMP: &probes.ICMPEvidence{Family: 4, Type: 3, Code: 13, Name: "admin-prohibited", Offender: "10.88.0.1"}}))),
			cr("C-LAN", drill.Pass,
				res("p012", "C-LAN", "tcp", A, "lan-metadata 169.254.169.254", "lan-metadata", drill.ExpectBlocked, drill.Pass, "silent", "dropped", "the witness saw nothing (0 frames read)", nil),
				res("p013", "C-LAN", "udp", A, "lan-10 10.20.0.10", "lan-10", drill.ExpectBlocked, drill.Pass, "silent", "dropped", "the witness saw nothing (0 frames read)", nil)),
			cr("C-NAMES", drill.Pass,
				res("p014", "C-NAMES", "dns", A, "drill-0a1b2c-b. (box-b)", "gateway", drill.ExpectNoName, drill.Pass, "refused", "the resolver answered NXDOMAIN with no record", "",
					obs("p014", probes.KindDNS, "10.88.0.1:53", probes.Refused, "the resolver answered NXDOMAIN: the name did not resolve",
						probes.Evidence{DNS: &probes.DNSEvidence{Name: "drill-0a1b2c-b.", QType: "A", Rcode: "NXDOMAIN"}}))),
			cr("C-V6", drill.Pass,
				res("p015", "C-V6", "global-address+default-route", A, "box-a", "ipv6", drill.ExpectNone, drill.Pass, "silent", "no global IPv6 address and no IPv6 default route", "",
					obs("p015", probes.KindIPv6State, "", probes.Silent, "no global IPv6 address and no IPv6 default route",
						probes.Evidence{IPv6: &probes.IPv6Evidence{LinkLocal: []string{"fe80::b0c5:16:3e00:a/64"}}})),
				res("p016", "C-V6", "router-advertisement", A, "routers on 10.88.0.0/24", "ipv6", drill.ExpectNone, drill.Pass, "silent", "no router advertisement", "", nil)),
			skipped,
			cr("C-CLONE", drill.Pass,
				res("p017", "C-CLONE", "address+mac+machine-id", C, "clone-a vs box-a", A, drill.ExpectDistinct, drill.Pass, "reached", "address 10.88.0.13/24 vs 10.88.0.11/24", "",
					obs("p017", probes.KindDHCPLease, "", probes.Reached, "eth0 holds 10.88.0.13/24",
						probes.Evidence{Lease: &probes.LeaseEvidence{Address: "10.88.0.13/24", Dynamic: true, MAC: "00:16:3e:00:00:0c", MachineID: "fedcba9876543210"}}))),
		},
		Summary:   drill.Summary{Passed: 7, Failed: 1, Inconclusive: 1, Skipped: 1, Probes: 92, ProbePhaseMS: 3712, MSPerProbe: 40.35},
		Mutations: []string{"host-fw"},
		MutationResults: []drill.MutationResult{{Name: "host-fw", Layers: []model.LayerID{"L-HOSTFW"}, Flipped: []drill.ClaimID{"C-HOST"}, Detected: true, DetectedBy: drill.EvidenceProbes,
			Changed: []drill.ProbeChange{{ID: "p020", Claim: "C-HOST", Channel: "tcp", From: drill.PlaceA, Target: "host uplink 198.51.100.2", Clean: drill.Pass, Mutated: drill.Fail}}}},
		Clean:    &drill.CleanRun{RunID: "0a1b2d", ExitCode: drill.ExitOK, Summary: drill.Summary{Passed: 10, Probes: 70}, DurationMS: 8000},
		ExitCode: drill.ExitViolated,
		Problems: []string{"agent at host: exec: deadline exceeded", "teardown: 1 drill boxes are still there after removal"},
		Notes:    []string{"C-NAMES: the hosts file /etc/hosts was not read (permission denied): its names were not asked"},
	}
}

// vmHost is the sample run on a host where box new makes virtual machines:
// its probe boxes are containers all the same.
func vmHost(t *testing.T) *drill.Report {
	t.Helper()
	rep := sampleReport(t)
	rep.Environment.BoxNewType = "virtual-machine"
	rep.Notes = append(rep.Notes, "instance type: the probe boxes are container, but box new makes virtual-machine on this host (this host can run VMs): ...")
	return rep
}

// withInbound judges C-INBOUND (skipped in sampleReport), from the host and
// the LAN, so the matrix has those sources too.
func withInbound(t *testing.T, rep *drill.Report) *drill.Report {
	t.Helper()
	for i, cr := range rep.Claims {
		if cr.ID == "C-INBOUND" {
			rep.Claims[i] = drill.ClaimResult{Claim: cr.Claim, Verdict: drill.Inconclusive, Results: []verdicts.Result{
				res("p018", "C-INBOUND", "tcp", drill.PlaceHost, "box-a 10.88.0.11", drill.PlaceA, drill.ExpectBlocked, drill.Pass, "silent", "dropped", "the witness saw nothing (0 frames read)", nil),
				res("p019", "C-INBOUND", "icmp", drill.PlaceLAN, "box-a 10.88.0.11", drill.PlaceA, drill.ExpectBlocked, drill.Inconclusive, "error", "the probe could not run", "", nil),
			}}
			rep.Summary.Skipped--
			rep.Summary.Inconclusive++
		}
	}
	return rep
}

func compileSchema(t *testing.T) *jsonschema.Schema {
	t.Helper()
	f, err := os.Open("schema.json")
	require.NoError(t, err)
	defer f.Close()
	doc, err := jsonschema.UnmarshalJSON(f)
	require.NoError(t, err)
	c := jsonschema.NewCompiler()
	c.AssertFormat()
	require.NoError(t, c.AddResource("schema.json", doc))
	sch, err := c.Compile("schema.json")
	require.NoError(t, err)
	return sch
}

func instance(t *testing.T, data []byte) any {
	t.Helper()
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(data))
	require.NoError(t, err)
	return v
}

func reportJSON(t *testing.T, rep *drill.Report) []byte {
	t.Helper()
	var b bytes.Buffer
	require.NoError(t, report.JSON(&b, rep))
	return b.Bytes()
}

func TestJSONMatchesSchema(t *testing.T) {
	sch := compileSchema(t)
	reports := map[string]*drill.Report{
		"sample":       sampleReport(t),
		"with inbound": withInbound(t, sampleReport(t)),
		"no setup": func() *drill.Report {
			// --no-setup: nothing ensured, no change list.
			r := sampleReport(t)
			r.Stack.Ensured, r.Stack.Changes = false, nil
			r.Mutations, r.Problems = []string{}, []string{}
			return r
		}(),
		"box new makes VMs": vmHost(t),
		// The release gate's tests fabricate this one: it has the shape
		// of a real report.
		"passing host run (gatetest)": gatetest.HostPass("0f0f0f", "2ce2ced"),
	}
	for name, rep := range reports {
		t.Run(name, func(t *testing.T) {
			data := reportJSON(t, rep)
			assert.NoError(t, sch.Validate(instance(t, data)), "%s", data)
			// The stable interface round-trips.
			var back drill.Report
			require.NoError(t, json.Unmarshal(data, &back))
			assert.Equal(t, rep.SchemaVersion, back.SchemaVersion)
			assert.Len(t, back.Claims, len(rep.Claims))
		})
	}
}

func TestSchemaRejects(t *testing.T) {
	sch := compileSchema(t)
	tests := []struct {
		name   string
		mutate func(m map[string]any)
		where  string // in the validation error
	}{
		{"an unknown claim verdict", func(m map[string]any) { claimAt(m, 3)["verdict"] = "mostly" }, "/claims/3/verdict"},
		{"an unknown probe verdict", func(m map[string]any) { resultAt(m, 3, 0)["verdict"] = "skipped-ish" }, "/claims/3/results/0/verdict"},
		{"an unknown expectation", func(m map[string]any) { resultAt(m, 3, 0)["expect"] = "maybe" }, "/claims/3/results/0/expect"},
		{"an unknown outcome", func(m map[string]any) {
			resultAt(m, 3, 0)["observation"].(map[string]any)["outcome"] = "teleported"
		}, "/claims/3/results/0/observation/outcome"},
		{"missing schema_version", func(m map[string]any) { delete(m, "schema_version") }, "schema_version"},
		{"schema_version 1", func(m map[string]any) { m["schema_version"] = 1 }, "/schema_version"},
		{"an unknown top-level field", func(m map[string]any) { m["verdicts"] = []any{} }, "verdicts"},
		{"an unknown result field", func(m map[string]any) { resultAt(m, 3, 0)["witness_at"] = "box-b" }, "witness_at"},
		{"missing claims", func(m map[string]any) { delete(m, "claims") }, "claims"},
		{"a result without evidence", func(m map[string]any) { delete(resultAt(m, 3, 1), "evidence") }, "evidence"},
		{"exit code 4", func(m map[string]any) { m["exit_code"] = 4 }, "/exit_code"},
		{"an unknown mode", func(m map[string]any) { m["environment"].(map[string]any)["mode"] = "cloud" }, "/environment/mode"},
		{"an unknown box_new_type", func(m map[string]any) { m["environment"].(map[string]any)["box_new_type"] = "vm" }, "/environment/box_new_type"},
		{"a layer state that is neither", func(m map[string]any) { m["stack"].(map[string]any)["layers"].(map[string]any)["L-ACL"] = "maybe" }, "/stack/layers/L-ACL"},
		{"a started that is not a time", func(m map[string]any) { m["started"] = "yesterday" }, "/started"},
	}
	base := reportJSON(t, sampleReport(t))
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var m map[string]any
			require.NoError(t, json.Unmarshal(base, &m))
			tt.mutate(m)
			data, err := json.Marshal(m)
			require.NoError(t, err)
			err = sch.Validate(instance(t, data))
			require.Error(t, err)
			assert.Contains(t, fmt.Sprintf("%#v", err), tt.where)
		})
	}
}

func claimAt(m map[string]any, i int) map[string]any {
	return m["claims"].([]any)[i].(map[string]any)
}

func resultAt(m map[string]any, c, r int) map[string]any {
	return claimAt(m, c)["results"].([]any)[r].(map[string]any)
}

// jsonFields is what encoding/json writes for a struct type: every field
// name, and those always written (no omitempty or omitzero).
func jsonFields(t reflect.Type) (all, always map[string]bool) {
	all, always = map[string]bool{}, map[string]bool{}
	for i := range t.NumField() {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		if tag == "-" || (!f.IsExported() && !f.Anonymous) {
			continue
		}
		name, opts, _ := strings.Cut(tag, ",")
		if f.Anonymous && name == "" {
			a, w := jsonFields(f.Type)
			for k := range a {
				all[k] = true
			}
			for k := range w {
				always[k] = true
			}
			continue
		}
		if name == "" {
			name = f.Name
		}
		all[name] = true
		if !strings.Contains(opts, "omitempty") && !strings.Contains(opts, "omitzero") {
			always[name] = true
		}
	}
	return all, always
}

// The schema names exactly the fields the Go types encode, and requires
// exactly those always written: a field added to a type without the schema
// (or the other way round) fails here.
func TestSchemaMatchesGoTypes(t *testing.T) {
	raw, err := os.ReadFile("schema.json")
	require.NoError(t, err)
	var s struct {
		Properties map[string]any            `json:"properties"`
		Required   []string                  `json:"required"`
		Defs       map[string]map[string]any `json:"$defs"`
	}
	require.NoError(t, json.Unmarshal(raw, &s))
	types := map[string]any{
		"":             drill.Report{},
		"environment":  drill.Environment{},
		"stack":        drill.StackFacts{},
		"change":       model.Change{},
		"finding":      model.Finding{},
		"box":          drill.BoxEnd{},
		"claim_result": drill.ClaimResult{},
		"result":       verdicts.Result{},
		"summary":      drill.Summary{},
		"observation":  probes.Observation{},
		"evidence":     probes.Evidence{},
		"icmp":         probes.ICMPEvidence{},
		"dns":          probes.DNSEvidence{},
		"ipv6":         probes.IPv6Evidence{},
		"lease":        probes.LeaseEvidence{},
		"witness":      probes.WitnessEvidence{},
		"frame":        probes.FrameSummary{},
		"listener":     probes.ListenerEvidence{},
	}
	for def, v := range types {
		t.Run(reflect.TypeOf(v).String(), func(t *testing.T) {
			props, required := s.Properties, s.Required
			if def != "" {
				d, ok := s.Defs[def]
				require.True(t, ok, "no $defs/%s", def)
				props, _ = d["properties"].(map[string]any)
				required = nil
				if r, ok := d["required"].([]any); ok {
					for _, x := range r {
						required = append(required, x.(string))
					}
				}
				assert.Equal(t, false, d["additionalProperties"], "$defs/%s is closed", def)
			}
			all, always := jsonFields(reflect.TypeOf(v))
			inSchema := map[string]bool{}
			for k := range props {
				inSchema[k] = true
			}
			assert.Equal(t, all, inSchema, "fields")
			req := map[string]bool{}
			for _, k := range required {
				req[k] = true
			}
			assert.Equal(t, always, req, "required")
		})
	}
}

type junitXML struct {
	XMLName  xml.Name `xml:"testsuites"`
	Tests    int      `xml:"tests,attr"`
	Failures int      `xml:"failures,attr"`
	Errors   int      `xml:"errors,attr"`
	Skipped  int      `xml:"skipped,attr"`
	Suites   []struct {
		Name     string `xml:"name,attr"`
		Tests    int    `xml:"tests,attr"`
		Failures int    `xml:"failures,attr"`
		Errors   int    `xml:"errors,attr"`
		Skipped  int    `xml:"skipped,attr"`
		Cases    []struct {
			Name    string    `xml:"name,attr"`
			Class   string    `xml:"classname,attr"`
			Failure *struct{} `xml:"failure"`
			Error   *struct{} `xml:"error"`
			Skipped *struct{} `xml:"skipped"`
			Out     string    `xml:"system-out"`
		} `xml:"testcase"`
	} `xml:"testsuite"`
}

func TestJUnit(t *testing.T) {
	rep := withInbound(t, sampleReport(t))
	// The skipped claim is C-V6 this time.
	for i, cr := range rep.Claims {
		if cr.ID == "C-V6" {
			rep.Claims[i] = drill.ClaimResult{Claim: cr.Claim, Verdict: drill.Skipped, Reason: "not selected", Results: []verdicts.Result{}}
		}
	}
	var b bytes.Buffer
	require.NoError(t, report.JUnit(&b, rep))
	require.True(t, wellFormed(t, b.Bytes()))
	var got junitXML
	require.NoError(t, xml.Unmarshal(b.Bytes(), &got), b.String())

	// Expected cases: one per (claim, channel) present, one per skipped claim.
	want := map[string]string{} // case name -> failure, error, skipped or pass
	for _, cr := range rep.Claims {
		if cr.Verdict == drill.Skipped {
			want[string(cr.ID)] = "skipped"
		}
		for _, r := range cr.Results {
			name := string(cr.ID) + "/" + string(r.Channel)
			switch {
			case r.Verdict == drill.Fail:
				want[name] = "failure"
			case r.Verdict == drill.Inconclusive && want[name] != "failure":
				want[name] = "error"
			case want[name] == "":
				want[name] = "pass"
			}
		}
	}
	have := map[string]string{}
	var fails, errs, skips, tests int
	require.Len(t, got.Suites, len(rep.Claims), "one suite per claim")
	for i, s := range got.Suites {
		assert.Equal(t, string(rep.Claims[i].ID), s.Name)
		var sf, se, ss int
		for _, c := range s.Cases {
			assert.NotContains(t, have, c.Name, "duplicate test case")
			assert.Equal(t, "drill."+s.Name, c.Class)
			state := "pass"
			switch {
			case c.Failure != nil:
				state = "failure"
				sf++
			case c.Error != nil:
				state = "error"
				se++
			case c.Skipped != nil:
				state = "skipped"
				ss++
			}
			have[c.Name] = state
		}
		assert.Equal(t, len(s.Cases), s.Tests, s.Name)
		assert.Equal(t, sf, s.Failures, s.Name)
		assert.Equal(t, se, s.Errors, s.Name)
		assert.Equal(t, ss, s.Skipped, s.Name)
		tests += s.Tests
		fails += s.Failures
		errs += s.Errors
		skips += s.Skipped
	}
	assert.Equal(t, want, have)
	assert.Equal(t, tests, got.Tests)
	assert.Equal(t, fails, got.Failures)
	assert.Equal(t, errs, got.Errors)
	assert.Equal(t, skips, got.Skipped)
	assert.Equal(t, 2, got.Failures, "C-SIBLING/tcp and C-SIBLING/broadcast")
	assert.Equal(t, 2, got.Errors, "C-HOST/tcp and C-INBOUND/icmp")
	assert.Equal(t, 3+1+1+3+2+2+1+1+2+1, got.Tests, "every (claim, channel) and the skipped claim")
	assert.Equal(t, 1, got.Skipped, "C-V6")
}

// wellFormed reads every token, so a stray character fails.
func wellFormed(t *testing.T, data []byte) bool {
	t.Helper()
	d := xml.NewDecoder(bytes.NewReader(data))
	for {
		_, err := d.Token()
		if err == io.EOF {
			return true
		}
		if !assert.NoError(t, err) {
			return false
		}
	}
}

// The example in docs/drill-report.md is a valid report.
func TestDocExampleMatchesSchema(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "drill-report.md"))
	require.NoError(t, err)
	m := regexp.MustCompile("(?s)```json\n(.*?)```").FindSubmatch(doc)
	require.NotNil(t, m, "no json example in the doc")
	assert.NoError(t, compileSchema(t).Validate(instance(t, m[1])))
}
