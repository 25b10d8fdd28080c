package drill

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"

	"github.com/box-isolation/box/drill/topo"
	"github.com/box-isolation/box/internal/hostscan"
	"github.com/box-isolation/box/probes"
)

// maxNames bounds the names one run asks (a host's hosts file can be long);
// the report says when some were left out.
const maxNames = 96

// searchLabels are asked under each of the host's search domains: the
// host's own name, and the names an internal zone most often holds.
var searchLabels = []string{"git", "wiki", "intranet", "mail", "vpn", "nas"}

// upstreamID is the id of the host's direct question to the public
// upstream that a box's question is compared with: one a question, whoever
// asks it (box-a, box-t, a nested workload).
func upstreamID(qtype, name string) string {
	h := sha256.Sum256([]byte(qtype + " " + strings.ToLower(name)))
	return "up-" + hex.EncodeToString(h[:8])
}

// nameQuestions is every question C-NAMES asks beyond the siblings'
// names: the topology's, the hosts file's, the host's names, names under
// its search domains and the PTRs of private addresses the host knows.
// localhost is never asked: it is everyone's.
func nameQuestions(s Scene, hosts []hostscan.HostsEntry) (out []topo.Name, dropped int) {
	seen := map[string]bool{}
	add := func(name, qtype string, why topo.Provenance) {
		if name == "" {
			return
		}
		if qtype == "A" && !strings.HasSuffix(name, ".") {
			name += "."
		}
		low := strings.ToLower(name)
		if low == "localhost." || strings.HasSuffix(low, ".localhost.") || strings.HasPrefix(low, "ip6-") || seen[qtype+" "+low] {
			return
		}
		seen[qtype+" "+low] = true
		if len(out) >= maxNames {
			dropped++
			return
		}
		out = append(out, topo.Name{Name: name, QType: qtype, Provenance: why})
	}
	for _, n := range s.Names {
		add(n.Name, n.QType, n.Provenance)
	}
	for _, h := range hosts {
		if h.Addr.IsLoopback() || h.Addr.Is6() {
			continue
		}
		for _, n := range append([]string{h.Name}, h.Aliases...) {
			add(n, "A", topo.FromHostsFile)
		}
		add(h.Addr.String(), "PTR", topo.FromHostsFile)
	}
	add(s.Hostname, "A", topo.FromHostname)
	add(s.FQDN, "A", topo.FromHostname)
	for _, d := range s.SearchDomains {
		d = strings.TrimSuffix(d, ".")
		if s.Hostname != "" {
			add(strings.SplitN(s.Hostname, ".", 2)[0]+"."+d, "A", topo.FromSearch)
		}
		for _, l := range searchLabels {
			add(l+"."+d, "A", topo.FromSearch)
		}
	}
	for _, h := range s.HostAddrs {
		if topo.Private(h.Addr) && h.Addr != s.Gateway {
			add(h.Addr.String(), "PTR", topo.FromPTR)
		}
	}
	add(s.Gateway.String(), "PTR", topo.FromPTR)
	for _, t := range s.LANHosts {
		add(t.Addr.String(), "PTR", topo.FromPTR)
	}
	return out, dropped
}

// namesFrom asks one box's resolver, for a claim (C-NAMES from box-a,
// C-TIER from box-t), the siblings' names (never public: any answer is a
// leak) and every question of the scene, each compared with the pinned
// public upstream asked directly from the host: a name the box is told
// about and the upstream is not (or differently) is leaked (judgeNoName).
func (b *builder) namesFrom(claim ClaimID, from BoxEnd) {
	t := b.t
	if !from.IP.IsValid() {
		return
	}
	ask := func(name, qtype, label string, why topo.Provenance) *Action {
		return b.probe(Action{Claim: claim, Channel: ChannelDNS, From: from.Place, Target: label, TargetKey: "gateway", Expect: ExpectNoName, Provenance: why},
			probes.ProbeSpec{Kind: probes.KindDNS, Target: t.Gateway, Port: 53, Name: name, QType: qtype, Via: b.via(from)})
	}
	for _, peer := range []BoxEnd{t.B, t.C} {
		if !peer.IP.IsValid() {
			continue
		}
		for _, n := range probes.DNSNameForms(peer.Instance, t.DNSDomain) {
			ask(n, "A", n+" ("+string(peer.Place)+")", topo.FromSibling)
		}
		ask(peer.IP.String(), "PTR", "PTR "+peer.IP.String()+" ("+string(peer.Place)+")", topo.FromSibling)
	}
	for _, q := range t.questions {
		label := q.Name
		if q.QType != "A" {
			label = q.QType + " " + q.Name
		}
		a := ask(q.Name, q.QType, label, q.Provenance)
		if !t.Upstream.IsValid() {
			continue
		}
		a.Reference = b.reference(PlaceHost, probes.ProbeSpec{ID: upstreamID(q.QType, q.Name), Kind: probes.KindDNS, Target: t.Upstream, Port: 53, Name: q.Name, QType: q.QType,
			DelayMS: int(probeDelay.Milliseconds()), DeadlineMS: int(probeDeadline.Milliseconds())})
	}
}

// judgeNoName judges one question to the box's resolver. No record is a
// pass; records are a leak unless the public upstream, asked the same
// from the host, answers with the same records.
func judgeNoName(r Result, o probes.Observation, obs observations, baselineOK bool) Result {
	d := o.Evidence.DNS
	switch {
	case o.Outcome == probes.Reached:
		answers := o.Reason
		if d != nil {
			answers = strings.Join(d.Answers, ", ")
		}
		if !r.Reference.Valid() {
			return verdict(r, Fail, "the box's resolver answered a private name: "+answers)
		}
		up, ok := obs.get(r.Reference.At, r.Reference.ID)
		switch {
		case ok && up.Outcome == probes.Reached && up.Evidence.DNS != nil && sameAnswers(d, up.Evidence.DNS):
			r.AtTarget = "the public upstream answers the same: " + strings.Join(up.Evidence.DNS.Answers, ", ")
			return verdict(r, Pass, "a public name: "+answers)
		case ok && up.Outcome == probes.Reached && up.Evidence.DNS != nil:
			r.AtTarget = "the public upstream answers " + strings.Join(up.Evidence.DNS.Answers, ", ")
			return verdict(r, Fail, "leaked: the box's resolver answers "+answers+", the public upstream differently")
		case ok && up.Outcome == probes.Refused && up.Evidence.DNS != nil && (up.Evidence.DNS.Rcode == "NXDOMAIN" || up.Evidence.DNS.Rcode == "NOERROR"):
			r.AtTarget = "the public upstream answers " + up.Evidence.DNS.Rcode + " with no record"
			return verdict(r, Fail, "leaked: the box's resolver answers "+answers+", the public upstream knows no such record")
		}
		return verdict(r, Inconclusive, "the box's resolver answers "+answers+", and the public upstream gave nothing to compare with ("+reportOf(up, ok)+")")
	case o.Outcome == probes.Refused && d != nil && (d.Rcode == "NXDOMAIN" || d.Rcode == "NOERROR"):
		if !baselineOK {
			return verdict(r, Inconclusive, "answered "+d.Rcode+", but a baseline failed")
		}
		return verdict(r, Pass, "the resolver answered "+d.Rcode+" with no record")
	case o.Outcome == probes.Refused && d != nil && d.Rcode != "":
		// REFUSED or SERVFAIL says the resolver would not look, not that
		// it knows no such name.
		return verdict(r, Inconclusive, "the resolver answered "+d.Rcode+", which says nothing about the name")
	}
	return verdict(r, Inconclusive, "no DNS answer to judge by: "+o.Reason)
}

// sameAnswers compares two answers' records as sets: order, TTLs and the
// case of names do not matter.
func sameAnswers(a, b *probes.DNSEvidence) bool {
	if a == nil || b == nil {
		return false
	}
	norm := func(rrs []string) []string {
		out := make([]string, 0, len(rrs))
		for _, rr := range rrs {
			f := strings.Fields(strings.ToLower(rr))
			// "name TTL class type data": the TTL ticks down in a cache.
			if len(f) > 2 {
				f = append(f[:1], f[2:]...)
			}
			out = append(out, strings.Join(f, " "))
		}
		slices.Sort(out)
		return slices.Compact(out)
	}
	return len(a.Answers) > 0 && slices.Equal(norm(a.Answers), norm(b.Answers))
}

// readHosts reads the hosts file the bridge's dnsmasq would read; one that
// cannot be read leaves its names out, and the report says so.
func readHosts(path string) ([]hostscan.HostsEntry, string) {
	if path == "" {
		return nil, ""
	}
	h, err := hostscan.ReadHosts(path)
	if err != nil {
		return nil, fmt.Sprintf("the hosts file %s was not read (%v): its names were not asked", path, err)
	}
	return h, ""
}
