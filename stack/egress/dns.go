package egress

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/miekg/dns"

	"github.com/box-isolation/box/internal/nsrun"
	"github.com/box-isolation/box/stack/model"
)

// The egress resolver answers the allowlisted boxes' DNS (their questions
// to the gateway reach it by destination NAT: stack/nft/egress.go). A
// question for a name the box's policy allows is asked of the bridge's
// pinned upstream (or answered from a short cache), and the addresses of
// the answer go into the policy's allow set before the box hears them, so
// its first connection finds them there. Any other question is answered
// REFUSED at once, with an Extended DNS Error (15, Blocked) whose text
// names the box and its policy, and never leaves the host: a box cannot
// carry data out in the names it asks (a DNS tunnel). Each box may ask
// dnsRate questions a second (dnsBurst at once); past that its questions
// are dropped, as a rate-limited server does.

// The per-box question rate.
const (
	dnsRate  = 100
	dnsBurst = 200
)

// EDE codes the resolver gives (RFC 8914).
const (
	edeBlocked      = 15
	edeNotReachable = 22 // no reachable authority
)

// ServeDNS answers one question.
func (s *egressService) ServeDNS(w dns.ResponseWriter, q *dns.Msg) {
	from := addrOf(w.RemoteAddr())
	st, matchers, stErr := s.state.getWith()
	box, ok := st.Boxes[from]
	if !s.limits.allow(from) {
		s.log.add(Refusal{Box: box.Name, Project: box.Project, Policy: box.Policy, From: from.String(), Kind: "dns",
			Reason: fmt.Sprintf("more than %d questions a second: dropped", dnsRate)})
		return
	}
	if len(q.Question) != 1 {
		m := new(dns.Msg)
		m.SetRcode(q, dns.RcodeFormatError)
		w.WriteMsg(m)
		return
	}
	qq := q.Question[0]
	name, qtype := strings.ToLower(qq.Name), dns.TypeToString[qq.Qtype]
	if !ok {
		why := "this address is under no allowlist box's resolver knows"
		if stErr != nil {
			why = "box's resolver knows no policy yet (" + stErr.Error() + ")"
		}
		s.refuse(w, q, Refusal{From: from.String(), Kind: "dns", Name: name, QType: qtype, Reason: why})
		return
	}
	names := st.Policies[box.Policy]
	refusal := Refusal{Box: box.Name, Project: box.Project, Policy: box.Policy, From: from.String(), Kind: "dns", Name: name, QType: qtype}
	switch {
	case !allows(matchers, box.Policy, name):
		refusal.Reason = fmt.Sprintf("not on the allowlist %s of box %s (%s)", box.Policy, box.Name, strings.Join(names, " "))
		s.refuse(w, q, refusal)
		return
	case IsDoHName(name):
		refusal.Reason = "a public DNS-over-HTTPS resolver: it would answer any name"
		s.refuse(w, q, refusal)
		return
	}
	r, err := s.resolve(q, st.Upstream)
	if err != nil {
		m := new(dns.Msg)
		m.SetRcode(q, dns.RcodeServerFailure)
		withEDE(m, q, edeNotReachable, "box egress: the upstream resolver did not answer: "+err.Error())
		w.WriteMsg(m)
		return
	}
	if addrs := answerAddrs(r, qq.Name); len(addrs) > 0 {
		s.answers.add(box.Policy, name, addrs)
		if err := s.allow(box.Policy, publicOnly(addrs)); err != nil {
			// Answering would send the box to an address its rule drops.
			m := new(dns.Msg)
			m.SetRcode(q, dns.RcodeServerFailure)
			withEDE(m, q, edeBlocked, "box egress: could not allow the answer: "+err.Error())
			w.WriteMsg(m)
			refusal.Reason = "the answer could not be allowed: " + err.Error()
			s.log.add(refusal)
			return
		}
	}
	r.Id = q.Id
	if _, udp := w.RemoteAddr().(*net.UDPAddr); udp {
		// What the upstream answered over TCP may not fit the asker's
		// datagram: it gets the truncated answer, and asks again over TCP.
		size := dns.MinMsgSize
		if o := q.IsEdns0(); o != nil {
			size = max(int(o.UDPSize()), size)
		}
		r.Truncate(size)
	}
	w.WriteMsg(r)
}

// allow puts addresses into a policy's allow set, but not those it put
// there within allowFresh: a commit to the kernel costs more than the
// rest of an answer (docs/measurements.md, "Egress allowlists"), and the
// set keeps an element an hour.
func (s *egressService) allow(policy string, addrs []netip.Addr) error {
	now := time.Now()
	var due []netip.Addr
	s.allowedMu.Lock()
	for _, a := range addrs {
		k := policy + "/" + a.String()
		if at, ok := s.allowed[k]; !ok || now.Sub(at) > allowFresh {
			due = append(due, a)
		}
	}
	s.allowedMu.Unlock()
	if len(due) == 0 {
		return nil
	}
	if err := s.allower.Allow(policy, due); err != nil {
		return err
	}
	s.allowedMu.Lock()
	defer s.allowedMu.Unlock()
	if len(s.allowed) > 65536 {
		clear(s.allowed)
	}
	for _, a := range due {
		s.allowed[policy+"/"+a.String()] = now
	}
	return nil
}

// allowFresh is how long an address the resolver allowed is not allowed
// again: short, so that a set rebuilt meanwhile (its elements lost) is
// refilled by the next answers.
const allowFresh = 10 * time.Second

// refuse answers REFUSED with the reason, and logs it.
func (s *egressService) refuse(w dns.ResponseWriter, q *dns.Msg, r Refusal) {
	m := new(dns.Msg)
	m.SetRcode(q, dns.RcodeRefused)
	m.RecursionAvailable = true
	withEDE(m, q, edeBlocked, "box egress: "+r.Name+" "+r.Reason)
	w.WriteMsg(m)
	s.log.add(r)
}

// withEDE adds an Extended DNS Error. The answer carries an OPT record
// even when the question had none: a stub that does not know EDNS ignores
// it, and one that does shows the reason.
func withEDE(m, q *dns.Msg, code uint16, text string) {
	size := uint16(dns.MinMsgSize)
	if o := q.IsEdns0(); o != nil {
		size = max(o.UDPSize(), size)
	}
	if len(text) > 300 {
		text = text[:300]
	}
	m.SetEdns0(size, false)
	o := m.IsEdns0()
	o.Option = append(o.Option, &dns.EDNS0_EDE{InfoCode: code, ExtraText: text})
}

// addrOf is a socket address's IP.
func addrOf(a net.Addr) netip.Addr {
	switch v := a.(type) {
	case *net.UDPAddr:
		ip, _ := netip.AddrFromSlice(v.IP)
		return ip.Unmap()
	case *net.TCPAddr:
		ip, _ := netip.AddrFromSlice(v.IP)
		return ip.Unmap()
	}
	ap, _ := netip.ParseAddrPort(a.String())
	return ap.Addr().Unmap()
}

// answerAddrs are the IPv4 addresses an answer gives for name, following
// its CNAME chain.
func answerAddrs(r *dns.Msg, name string) []netip.Addr {
	owners := map[string]bool{strings.ToLower(name): true}
	for range 8 {
		grew := false
		for _, rr := range r.Answer {
			if c, ok := rr.(*dns.CNAME); ok && owners[strings.ToLower(c.Hdr.Name)] && !owners[strings.ToLower(c.Target)] {
				owners[strings.ToLower(c.Target)] = true
				grew = true
			}
		}
		if !grew {
			break
		}
	}
	var out []netip.Addr
	for _, rr := range r.Answer {
		if a, ok := rr.(*dns.A); ok && owners[strings.ToLower(a.Hdr.Name)] {
			if ip, ok := netip.AddrFromSlice(a.A.To4()); ok && !slices.Contains(out, ip) {
				out = append(out, ip)
			}
		}
	}
	return out
}

// publicOnly keeps the addresses worth allowing: an allowed name that
// answers a private or special address stays unreachable (the ACL drops
// it anyway; the set need not hold it).
func publicOnly(addrs []netip.Addr) []netip.Addr {
	var out []netip.Addr
	for _, a := range addrs {
		if publicAddr(a) {
			out = append(out, a)
		}
	}
	return out
}

// publicAddr reports whether an IPv4 address may be on the internet: not
// private (PrivateRanges), loopback, link-local, multicast, broadcast,
// unspecified, "this network", shared or reserved.
func publicAddr(a netip.Addr) bool {
	if !a.Is4() || a.IsLoopback() || a.IsMulticast() || a.IsUnspecified() || a.IsLinkLocalUnicast() || a.IsPrivate() {
		return false
	}
	for _, p := range append(slices.Clone(model.PrivateRanges), specialRanges...) {
		if p.Contains(a) {
			return false
		}
	}
	return true
}

var specialRanges = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),
	netip.MustParsePrefix("192.0.0.0/24"),
	netip.MustParsePrefix("198.18.0.0/15"),
	netip.MustParsePrefix("240.0.0.0/4"),
}

// dohNames are the public DNS-over-HTTPS services' names: asked for by an
// allowlisted box, they are refused whatever its allowlist says (such a
// resolver answers any name, over a channel no one reads).
var dohNames = []string{
	"dns.google", "dns.google.com", "cloudflare-dns.com", "*.cloudflare-dns.com", "one.one.one.one", "1dot1dot1dot1.cloudflare-dns.com",
	"dns.quad9.net", "*.quad9.net", "doh.opendns.com", "*.opendns.com", "dns.adguard-dns.com", "*.adguard-dns.com", "dns.adguard.com",
	"dns.nextdns.io", "*.nextdns.io", "doh.cleanbrowsing.org", "*.cleanbrowsing.org", "freedns.controld.com", "*.controld.com",
	"doh.dns.sb", "*.dns.sb", "dns.mullvad.net", "*.mullvad.net", "doh.mullvad.net", "mozilla.cloudflare-dns.com",
}

func IsDoHName(name string) bool { return model.Allows(dohNames, name) }

// resolve answers a question from the cache or the upstream.
func (s *egressService) resolve(q *dns.Msg, upstream []netip.Addr) (*dns.Msg, error) {
	qq := q.Question[0]
	key := cacheKey(qq, q.IsEdns0() != nil && q.IsEdns0().Do())
	if r := s.cache.get(key, q); r != nil {
		return r, nil
	}
	if len(upstream) == 0 {
		return nil, errors.New("the bridge's dnsmasq settings pin no upstream (server=)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
	defer cancel()
	r, err := s.exchange(ctx, q, upstream)
	if err != nil {
		return nil, err
	}
	s.cache.put(key, r)
	return r, nil
}

// upstreamExchange asks each upstream in turn, over UDP (TCP when the
// answer is truncated), from a socket opened in the host's namespace.
func (s *egressService) upstreamExchange(ctx context.Context, q *dns.Msg, upstream []netip.Addr) (*dns.Msg, error) {
	out := q.Copy()
	out.Id = dns.Id()
	out.RecursionDesired = true
	var errs []error
	for _, u := range upstream {
		per, cancel := context.WithTimeout(ctx, 1500*time.Millisecond)
		r, err := s.exchangeOne(per, out, netip.AddrPortFrom(u, 53))
		cancel()
		if err == nil {
			return r, nil
		}
		errs = append(errs, fmt.Errorf("%s: %w", u, err))
	}
	return nil, errors.Join(errs...)
}

func (s *egressService) exchangeOne(ctx context.Context, q *dns.Msg, to netip.AddrPort) (*dns.Msg, error) {
	for _, proto := range []string{"udp", "tcp"} {
		var conn net.Conn
		err := nsrun.Do(s.netns, func() error {
			var err error
			conn, err = (&net.Dialer{}).DialContext(ctx, proto+"4", to.String())
			return err
		})
		if err != nil {
			return nil, err
		}
		c := &dns.Conn{Conn: conn, UDPSize: 4096}
		if d, ok := ctx.Deadline(); ok {
			c.SetDeadline(d)
		}
		err = c.WriteMsg(q)
		var r *dns.Msg
		for err == nil {
			r, err = c.ReadMsg()
			if err == nil && r.Id == q.Id && len(r.Question) == 1 && strings.EqualFold(r.Question[0].Name, q.Question[0].Name) {
				break
			}
		}
		c.Close()
		if err != nil {
			return nil, err
		}
		if !r.Truncated || proto == "tcp" {
			return r, nil
		}
	}
	return nil, errors.New("unreachable")
}

// dnsCache keeps answers for their TTL (at most five minutes, negative
// ones thirty seconds).
type dnsCache struct {
	mu sync.Mutex
	m  map[string]cached
}

type cached struct {
	msg     *dns.Msg
	at, exp time.Time
}

const (
	cacheMax    = 10000
	cacheMaxTTL = 5 * time.Minute
	cacheNegTTL = 30 * time.Second
)

func newDNSCache() *dnsCache { return &dnsCache{m: map[string]cached{}} }

func cacheKey(q dns.Question, do bool) string {
	return fmt.Sprintf("%s/%d/%d/%t", strings.ToLower(q.Name), q.Qtype, q.Qclass, do)
}

// get is a copy of a live entry for q, its TTLs counted down.
func (c *dnsCache) get(key string, q *dns.Msg) *dns.Msg {
	c.mu.Lock()
	e, ok := c.m[key]
	c.mu.Unlock()
	now := time.Now()
	if !ok || now.After(e.exp) {
		return nil
	}
	r := e.msg.Copy()
	r.Id = q.Id
	r.Question = q.Question // the asker's spelling
	elapsed := uint32(now.Sub(e.at) / time.Second)
	for _, sec := range [][]dns.RR{r.Answer, r.Ns, r.Extra} {
		for _, rr := range sec {
			if h := rr.Header(); h.Rrtype != dns.TypeOPT {
				h.Ttl = max(h.Ttl, elapsed) - elapsed
			}
		}
	}
	return r
}

func (c *dnsCache) put(key string, r *dns.Msg) {
	var ttl time.Duration
	switch {
	case r.Rcode == dns.RcodeSuccess && len(r.Answer) > 0:
		ttl = cacheMaxTTL
		for _, rr := range r.Answer {
			ttl = min(ttl, time.Duration(rr.Header().Ttl)*time.Second)
		}
	case r.Rcode == dns.RcodeSuccess || r.Rcode == dns.RcodeNameError:
		ttl = cacheNegTTL
	default:
		return
	}
	if ttl <= 0 {
		return
	}
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.m) >= cacheMax {
		for k, e := range c.m {
			if now.After(e.exp) || len(c.m) >= cacheMax {
				delete(c.m, k)
			}
		}
	}
	c.m[key] = cached{msg: r.Copy(), at: now, exp: now.Add(ttl)}
}

// answerBook remembers, per policy and name, the addresses the resolver
// answered, for EgressTimeout: the proxy dials a name only at one of them.
type answerBook struct {
	mu sync.Mutex
	m  map[string]map[netip.Addr]time.Time // policy/name -> address -> expiry
}

func newAnswerBook() *answerBook { return &answerBook{m: map[string]map[netip.Addr]time.Time{}} }

func (b *answerBook) add(policy, name string, addrs []netip.Addr) {
	key := policy + "/" + strings.TrimSuffix(strings.ToLower(name), ".")
	exp := time.Now().Add(answerKeep)
	b.mu.Lock()
	defer b.mu.Unlock()
	m := b.m[key]
	if m == nil {
		m = map[netip.Addr]time.Time{}
		b.m[key] = m
	}
	for _, a := range addrs {
		m[a] = exp
	}
}

// get is the live addresses answered for a policy's name.
func (b *answerBook) get(policy, name string) []netip.Addr {
	key := policy + "/" + strings.TrimSuffix(strings.ToLower(name), ".")
	now := time.Now()
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []netip.Addr
	for a, exp := range b.m[key] {
		if now.Before(exp) {
			out = append(out, a)
		} else {
			delete(b.m[key], a)
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out
}

// answerKeep is how long an answer is good for the proxy: as long as the
// allow set keeps it.
const answerKeep = time.Hour

// rateLimits is a token bucket per box address.
type rateLimits struct {
	mu sync.Mutex
	m  map[netip.Addr]*bucket
}

type bucket struct {
	tokens float64
	at     time.Time
}

func newRateLimits() *rateLimits { return &rateLimits{m: map[netip.Addr]*bucket{}} }

func (l *rateLimits) allow(a netip.Addr) bool {
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.m[a]
	if b == nil {
		if len(l.m) > 4096 {
			clear(l.m)
		}
		b = &bucket{tokens: dnsBurst, at: now}
		l.m[a] = b
	}
	b.tokens = min(dnsBurst, b.tokens+now.Sub(b.at).Seconds()*dnsRate)
	b.at = now
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

// Resolvers are what no allowlisted box reaches straight, on any
// port: the bridge's own upstream and the well-known public resolvers
// that answer DNS over HTTPS or TLS (a resolver there would answer any
// name, and over TLS its questions cannot be read).
func Resolvers(upstream []netip.Addr) []netip.Addr {
	out := slices.Clone(upstream)
	for _, a := range knownResolvers {
		if !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	return out
}

// knownResolvers are the public DNS-over-HTTPS and -TLS services' IPv4
// addresses (Cloudflare, Google, Quad9, OpenDNS, AdGuard, CleanBrowsing,
// NextDNS, Control D, DNS.SB, Mullvad).
var knownResolvers = func() []netip.Addr {
	var out []netip.Addr
	for _, s := range []string{
		"1.1.1.1", "1.0.0.1", "1.1.1.2", "1.0.0.2", "1.1.1.3", "1.0.0.3",
		"8.8.8.8", "8.8.4.4",
		"9.9.9.9", "149.112.112.112", "9.9.9.10", "149.112.112.10", "9.9.9.11", "149.112.112.11",
		"208.67.222.222", "208.67.220.220", "208.67.222.123", "208.67.220.123",
		"94.140.14.14", "94.140.15.15", "94.140.14.140", "94.140.14.141",
		"185.228.168.9", "185.228.169.9", "185.228.168.168", "185.228.169.168",
		"45.90.28.0", "45.90.30.0",
		"76.76.2.0", "76.76.10.0",
		"185.222.222.222", "45.11.45.11",
		"194.242.2.2",
	} {
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}()
