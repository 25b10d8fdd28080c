package probes

import (
	"context"
	"fmt"
	"net/netip"
	"strings"

	"github.com/miekg/dns"
)

// probeDNS asks one resolver one question over UDP (connected socket with
// IP_RECVERR, as for UDP probes). The DNS query id and the echoed question
// are the nonce: a reply that does not carry both is ignored.
//
// Outcomes, with evidence.dns always holding the question and, when the
// resolver replied, its rcode and every answer record:
//
//   - reached: the resolver replied NOERROR with at least one record of the
//     asked type (or a CNAME chain) for the name. The name resolved.
//   - refused: the resolver replied but the name did not resolve:
//     NXDOMAIN, NODATA (NOERROR with no such record), REFUSED, SERVFAIL or
//     any other rcode (evidence.dns.rcode says which); or the resolver's
//     host answered ICMP port-unreachable (evidence.icmp set, no rcode).
//   - rejected: an ICMP error from anything but the resolver, or
//     admin-prohibited from anyone.
//   - silent: no reply and no ICMP error before the deadline.
//
// So "did the name resolve" is exactly outcome == reached, and "did the
// resolver answer at all" is evidence.dns.rcode != "".
func probeDNS(ctx context.Context, spec ProbeSpec, obs Observation) Observation {
	q, err := dnsQuestion(spec.Name, spec.QType)
	if err != nil {
		return fail(obs, fmt.Sprintf("dns probe %s: %v", obs.Target, err))
	}
	ev := &DNSEvidence{Name: q.Name, QType: dns.TypeToString[q.Qtype]}
	obs.Evidence.DNS = ev
	src, err := resolveSource(&spec)
	if err != nil {
		return fail(obs, fmt.Sprintf("dns probe %s: %v", obs.Target, err))
	}
	fillSource(&obs, src)
	m := new(dns.Msg)
	m.Id = dns.Id()
	m.RecursionDesired = true
	m.Question = []dns.Question{q}
	wire, err := m.Pack()
	if err != nil {
		return fail(obs, fmt.Sprintf("dns probe %s: pack: %v", obs.Target, err))
	}
	var reply *dns.Msg
	port := spec.Port
	if port == 0 {
		port = 53
	}
	r := exchangeUDP(ctx, src, port, wire, func(b []byte) bool {
		var in dns.Msg
		if in.Unpack(b) != nil || in.Id != m.Id || !in.Response || len(in.Question) != 1 {
			return false
		}
		got := in.Question[0]
		if !strings.EqualFold(got.Name, q.Name) || got.Qtype != q.Qtype || got.Qclass != q.Qclass {
			return false
		}
		reply = &in
		return true
	})
	if r.reply != nil && !r.accepted {
		// A datagram from the resolver's address that is not an answer to
		// this question: the query arrived, the answer proves nothing.
		obs.Evidence.Reply = printable(r.reply, 64)
		return done(obs, Refused, "a reply from the resolver's address that does not answer this query (id or question differs)")
	}
	if reply == nil {
		return classifyDgram(ctx, obs, src, r, "", "")
	}
	obs.Evidence.Sent = r.sent
	obs.Evidence.From = src.target.WithZone("").String()
	ev.Rcode = dns.RcodeToString[reply.Rcode]
	if ev.Rcode == "" {
		ev.Rcode = fmt.Sprintf("RCODE%d", reply.Rcode)
	}
	if o := reply.IsEdns0(); o != nil {
		for _, opt := range o.Option {
			if e, ok := opt.(*dns.EDNS0_EDE); ok {
				ev.EDE = printable([]byte(fmt.Sprintf("%d %s", e.InfoCode, e.ExtraText)), 300)
			}
		}
	}
	for _, rr := range reply.Answer {
		if a, ok := rr.(*dns.A); ok {
			ev.Addresses = append(ev.Addresses, a.A.String())
		}
		// Fields apart by spaces (miekg/dns uses tabs, which printable
		// would turn into dots): "name. 60 IN A 203.0.113.10".
		ev.Answers = append(ev.Answers, printable([]byte(strings.ReplaceAll(rr.String(), "\t", " ")), 300))
	}
	if reply.Rcode != dns.RcodeSuccess {
		return done(obs, Refused, "the resolver answered "+ev.Rcode+": the name did not resolve")
	}
	if !answers(reply, q) {
		return done(obs, Refused, "the resolver answered NOERROR with no "+ev.QType+" record (NODATA): the name did not resolve")
	}
	ev.Resolved = true
	return done(obs, Reached, "the resolver answered with records for the name")
}

// answers reports whether reply holds a record of the asked type for the
// asked name, following CNAMEs.
func answers(reply *dns.Msg, q dns.Question) bool {
	name := q.Name
	for range 8 {
		next := ""
		for _, rr := range reply.Answer {
			h := rr.Header()
			if !strings.EqualFold(h.Name, name) {
				continue
			}
			if q.Qtype == dns.TypeANY || h.Rrtype == q.Qtype {
				return true
			}
			if c, ok := rr.(*dns.CNAME); ok {
				next = c.Target
			}
		}
		if next == "" {
			return false
		}
		name = next
	}
	return false
}

// DNSNameForms lists every name under which a resolver might know a host:
// the bare name, name.incus, name.lxd and name under each extra domain (a
// bridge's dns.domain), all fully qualified, without duplicates.
func DNSNameForms(host string, domains ...string) []string {
	host = strings.TrimSuffix(host, ".")
	seen := map[string]bool{}
	var out []string
	add := func(n string) {
		n = dns.Fqdn(strings.ToLower(n))
		if !seen[n] {
			seen[n] = true
			out = append(out, n)
		}
	}
	add(host)
	for _, d := range append([]string{"incus", "lxd"}, domains...) {
		d = strings.Trim(d, ".")
		if d != "" {
			add(host + "." + d)
		}
	}
	return out
}

// ReverseName is the PTR name of an address (in-addr.arpa or ip6.arpa).
func ReverseName(a netip.Addr) (string, error) {
	n, err := dns.ReverseAddr(a.WithZone("").String())
	if err != nil {
		return "", fmt.Errorf("reverse name of %s: %w", a, err)
	}
	return n, nil
}
