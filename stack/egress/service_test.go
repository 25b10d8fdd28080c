package egress

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/internal/syncbuf"
)

// fakeAllower records what the resolver allows.
type fakeAllower struct {
	mu   sync.Mutex
	got  map[string][]netip.Addr
	fail error
}

func (f *fakeAllower) Allow(id string, addrs []netip.Addr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail != nil {
		return f.fail
	}
	if f.got == nil {
		f.got = map[string][]netip.Addr{}
	}
	f.got[id] = append(f.got[id], addrs...)
	return nil
}

// svcWorld is an egress service with fakes around it: box-w (10.88.0.5)
// under pw, allowed canary.example.net and *.pkg.example; box-x
// (10.88.0.6) under px.
type svcWorld struct {
	s       *egressService
	allower *fakeAllower
	log     *syncbuf.Buffer
	logPath string
	asked   []string // questions that reached the upstream
	mu      sync.Mutex
	upAt    net.Listener // the "internet" the proxy dials
	upGot   chan []byte
}

var (
	boxW = netip.MustParseAddr("10.88.0.5")
	boxX = netip.MustParseAddr("10.88.0.6")
)

func newSvcWorld(t *testing.T) *svcWorld {
	t.Helper()
	dir := t.TempDir()
	st := State{Bridge: "boxnet", Table: "box_egress", Gateway: netip.MustParseAddr("10.88.0.1"), Subnet: netip.MustParsePrefix("10.88.0.0/24"),
		Upstream: []netip.Addr{netip.MustParseAddr("203.0.113.53")},
		Policies: map[string][]string{"pw": {"*.pkg.example", "canary.example.net"}, "px": {"other.example.net"}},
		Boxes:    map[netip.Addr]Box{boxW: {Name: "box-w", Project: "default", Policy: "pw"}, boxX: {Name: "box-x", Policy: "px"}}}
	b, err := json.Marshal(st)
	require.NoError(t, err)
	statePath := filepath.Join(dir, "state.json")
	require.NoError(t, os.WriteFile(statePath, b, 0o644))
	w := &svcWorld{allower: &fakeAllower{}, log: &syncbuf.Buffer{}, logPath: filepath.Join(dir, "refusals.log"), upGot: make(chan []byte, 8)}
	w.s = newEgressService("", &egressStateFile{path: statePath}, w.allower, newRefusalLog(w.logPath, w.log))
	w.s.exchange = func(_ context.Context, q *dns.Msg, _ []netip.Addr) (*dns.Msg, error) {
		w.mu.Lock()
		w.asked = append(w.asked, q.Question[0].Name)
		w.mu.Unlock()
		r := new(dns.Msg)
		r.SetReply(q)
		switch strings.ToLower(q.Question[0].Name) {
		case "canary.example.net.":
			r.Answer = append(r.Answer, &dns.A{Hdr: dns.RR_Header{Name: q.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60}, A: net.ParseIP("203.0.113.10")})
		case "a.pkg.example.":
			r.Answer = append(r.Answer,
				&dns.CNAME{Hdr: dns.RR_Header{Name: "a.pkg.example.", Rrtype: dns.TypeCNAME, Class: dns.ClassINET, Ttl: 60}, Target: "cdn.example.org."},
				&dns.A{Hdr: dns.RR_Header{Name: "cdn.example.org.", Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60}, A: net.ParseIP("203.0.113.30")},
				&dns.A{Hdr: dns.RR_Header{Name: "cdn.example.org.", Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60}, A: net.ParseIP("192.168.1.9")})
		case "big.pkg.example.":
			for i := range 60 {
				r.Answer = append(r.Answer, &dns.A{Hdr: dns.RR_Header{Name: "big.pkg.example.", Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60}, A: net.IPv4(203, 0, 113, byte(100+i))})
			}
		default:
			r.Rcode = dns.RcodeNameError
		}
		return r, nil
	}
	return w
}

// dnsRecorder is a dns.ResponseWriter from one box.
type dnsRecorder struct {
	from netip.Addr
	msg  *dns.Msg
}

func (r *dnsRecorder) LocalAddr() net.Addr {
	return &net.UDPAddr{IP: net.ParseIP("192.0.0.8"), Port: 53}
}
func (r *dnsRecorder) RemoteAddr() net.Addr {
	return &net.UDPAddr{IP: r.from.AsSlice(), Port: 40000}
}
func (r *dnsRecorder) WriteMsg(m *dns.Msg) error { r.msg = m; return nil }
func (r *dnsRecorder) Write([]byte) (int, error) { return 0, errors.New("no") }
func (r *dnsRecorder) Close() error              { return nil }
func (r *dnsRecorder) TsigStatus() error         { return nil }
func (r *dnsRecorder) TsigTimersOnly(bool)       {}
func (r *dnsRecorder) Hijack()                   {}
func (r *dnsRecorder) Network() string           { return "udp" }

func (w *svcWorld) ask(from netip.Addr, name string, qtype uint16) *dns.Msg {
	q := new(dns.Msg)
	q.SetQuestion(dns.Fqdn(name), qtype)
	rec := &dnsRecorder{from: from}
	w.s.ServeDNS(rec, q)
	return rec.msg
}

func ede(m *dns.Msg) (uint16, string) {
	if o := m.IsEdns0(); o != nil {
		for _, opt := range o.Option {
			if e, ok := opt.(*dns.EDNS0_EDE); ok {
				return e.InfoCode, e.ExtraText
			}
		}
	}
	return 0, ""
}

func TestEgressResolver(t *testing.T) {
	w := newSvcWorld(t)

	// An allowed name: asked upstream, its address allowed before the
	// answer goes out.
	r := w.ask(boxW, "Canary.Example.NET", dns.TypeA)
	require.NotNil(t, r)
	assert.Equal(t, dns.RcodeSuccess, r.Rcode)
	assert.Len(t, r.Answer, 1)
	assert.Equal(t, []netip.Addr{netip.MustParseAddr("203.0.113.10")}, w.allower.got["pw"])
	assert.Equal(t, []string{"Canary.Example.NET."}, w.asked)

	// Asked again: from the cache, and not allowed again so soon (the
	// element is there for an hour).
	r = w.ask(boxW, "canary.example.net", dns.TypeA)
	assert.Equal(t, dns.RcodeSuccess, r.Rcode)
	assert.Len(t, w.asked, 1, "the second answer came from the cache")
	assert.Len(t, w.allower.got["pw"], 1)
	// Later on it is (the element's timeout starts afresh).
	w.s.allowed["pw/203.0.113.10"] = time.Now().Add(-allowFresh - time.Second)
	w.ask(boxW, "canary.example.net", dns.TypeA)
	assert.Len(t, w.allower.got["pw"], 2)

	// Under a wildcard, through a CNAME: the chain's public addresses.
	r = w.ask(boxW, "a.pkg.example", dns.TypeA)
	assert.Equal(t, dns.RcodeSuccess, r.Rcode)
	assert.Equal(t, []netip.Addr{netip.MustParseAddr("203.0.113.30")}, w.allower.got["pw"][2:], "the private answer is not allowed (the ACL drops it anyway)")
	assert.ElementsMatch(t, []netip.Addr{netip.MustParseAddr("203.0.113.30"), netip.MustParseAddr("192.168.1.9")}, w.s.answers.get("pw", "a.pkg.example"))

	// An answer larger than the asker's datagram is truncated (it asks
	// again over TCP); its addresses are allowed all the same.
	r = w.ask(boxW, "big.pkg.example", dns.TypeA)
	assert.True(t, r.Truncated)
	b, err := r.Pack()
	require.NoError(t, err)
	assert.LessOrEqual(t, len(b), dns.MinMsgSize)
	assert.Len(t, w.s.answers.get("pw", "big.pkg.example"), 60)

	// Anything else is refused at once, with the reason, and never asked.
	for _, name := range []string{"d41d8cd98f00b204.attacker.example", "x.canary.example.net", "other.example.net", "pkg.example", "dns.google"} {
		r = w.ask(boxW, name, dns.TypeTXT)
		require.NotNil(t, r, name)
		assert.Equal(t, dns.RcodeRefused, r.Rcode, name)
		code, text := ede(r)
		assert.Equal(t, uint16(edeBlocked), code, name)
		assert.Contains(t, text, "box egress", name)
		if name != "dns.google" {
			assert.Contains(t, text, "pw", "the text names the policy")
		}
	}
	assert.Len(t, w.asked, 3, "no refused question reached the upstream: %v", w.asked)

	// Another policy, another answer; an address under no policy gets
	// nothing.
	assert.Equal(t, dns.RcodeRefused, w.ask(boxX, "canary.example.net", dns.TypeA).Rcode)
	assert.Equal(t, dns.RcodeRefused, w.ask(netip.MustParseAddr("10.88.0.99"), "canary.example.net", dns.TypeA).Rcode)

	// Every refusal is logged with the box and the name.
	rs, err := ReadRefusals(w.logPath, func(Refusal) bool { return true })
	require.NoError(t, err)
	require.Len(t, rs, 7)
	assert.Equal(t, "box-w", rs[0].Box)
	assert.Equal(t, "d41d8cd98f00b204.attacker.example.", rs[0].Name)
	assert.Equal(t, "TXT", rs[0].QType)
	assert.Contains(t, w.log.String(), "box-w: dns d41d8cd98f00b204.attacker.example. TXT refused: not on the allowlist pw")

	// The set could not take the answer: no answer either.
	w.allower.fail = errors.New("no such table")
	clear(w.s.allowed)
	r = w.ask(boxW, "a.pkg.example", dns.TypeA)
	assert.Equal(t, dns.RcodeServerFailure, r.Rcode, "an answer whose address the box's rule drops is not given")
}

func TestEgressResolverRate(t *testing.T) {
	w := newSvcWorld(t)
	answered := 0
	for i := 0; i < dnsBurst+50; i++ {
		if r := w.ask(boxW, "x.attacker.example", dns.TypeA); r != nil {
			answered++
		}
	}
	assert.GreaterOrEqual(t, answered, dnsBurst)
	assert.Less(t, answered, dnsBurst+50, "past the burst, questions are dropped")
	rs, err := ReadRefusals(w.logPath, func(Refusal) bool { return true })
	require.NoError(t, err)
	assert.LessOrEqual(t, len(rs), refusalBurst+2, "a flood of refusals is not a flood of lines")
}

// proxied runs one connection through serveConn: the "box" side is a
// loopback client, the proxy's dial goes to w's upstream.
func (w *svcWorld) proxied(t *testing.T, from netip.Addr, client func(c net.Conn)) {
	t.Helper()
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		c, err := l.Accept()
		if err != nil {
			return
		}
		// The box's address, as TPROXY would show it.
		w.s.serveConn(context.Background(), &fromConn{TCPConn: c.(*net.TCPConn), from: from})
	}()
	c, err := net.Dial("tcp4", l.Addr().String())
	if errors.Is(err, syscall.ECONNRESET) {
		<-done // reset before connect returned: what the client reads is nothing
		return
	}
	require.NoError(t, err)
	c.SetDeadline(time.Now().Add(5 * time.Second))
	client(c)
	c.Close()
	<-done
}

func TestEgressProxy(t *testing.T) {
	w := newSvcWorld(t)
	up, err := net.Listen("tcp4", "127.0.0.1:0")
	require.NoError(t, err)
	defer up.Close()
	go func() {
		for {
			c, err := up.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				c.SetDeadline(time.Now().Add(5 * time.Second))
				buf := make([]byte, 4096)
				n, _ := c.Read(buf)
				w.upGot <- buf[:n]
				io.WriteString(c, "UPSTREAM")
			}()
		}
	}()
	var dialed []netip.AddrPort
	w.s.dial = func(ctx context.Context, to netip.AddrPort) (net.Conn, error) {
		dialed = append(dialed, to)
		return net.Dial("tcp4", up.Addr().String())
	}
	w.s.dialable = func(a netip.Addr, _ State) string {
		if !publicAddr(a) {
			return a.String() + " is a private or special address"
		}
		return ""
	}
	w.s.answers.add("pw", "canary.example.net", []netip.Addr{netip.MustParseAddr("203.0.113.10")})

	tlsHello := func(sni string) func(c net.Conn) error {
		var herr error
		return func(c net.Conn) error {
			herr = tls.Client(c, &tls.Config{ServerName: sni, InsecureSkipVerify: true}).Handshake()
			return herr
		}
	}
	t.Run("tls, an allowed name", func(t *testing.T) {
		w.proxied(t, boxW, func(c net.Conn) { _ = tlsHello("canary.example.net")(c) })
		got := <-w.upGot
		require.NotEmpty(t, got)
		assert.Equal(t, byte(0x16), got[0], "the ClientHello went on as it was")
		sni, _, err := peekServerName(&bytesConn{Reader: bytes.NewReader(got)})
		require.NoError(t, err)
		assert.Equal(t, "canary.example.net", sni)
	})
	t.Run("tls, another name", func(t *testing.T) {
		var herr error
		w.proxied(t, boxW, func(c net.Conn) { herr = tlsHello("other.example.net")(c) })
		require.Error(t, herr)
		assert.Contains(t, herr.Error(), "access denied", "a TLS alert says it")
	})
	t.Run("tls, no name", func(t *testing.T) {
		var herr error
		w.proxied(t, boxW, func(c net.Conn) { herr = tlsHello("")(c) })
		require.Error(t, herr)
		assert.Contains(t, herr.Error(), "access denied")
	})
	httpGet := func(req string) func(c net.Conn) {
		return func(c net.Conn) {
			io.WriteString(c, req)
		}
	}
	read := func(c net.Conn) string { b, _ := io.ReadAll(bufio.NewReader(c)); return string(b) }
	t.Run("http, an allowed Host", func(t *testing.T) {
		var resp string
		req := "GET /x HTTP/1.1\r\nHost: canary.example.net\r\nUser-Agent: t\r\n\r\n"
		w.proxied(t, boxW, func(c net.Conn) { httpGet(req)(c); resp = read(c) })
		assert.Equal(t, "UPSTREAM", resp)
		assert.Equal(t, req, string(<-w.upGot), "the request went on as it was")
	})
	for name, req := range map[string]string{
		"another Host":               "GET / HTTP/1.1\r\nHost: other.example.net\r\n\r\n",
		"an allowed Host, a URL not": "GET http://other.example.net/ HTTP/1.1\r\nHost: canary.example.net\r\n\r\n",
		"no Host":                    "GET / HTTP/1.0\r\n\r\n",
		"a DoH name":                 "POST /dns-query HTTP/1.1\r\nHost: dns.google\r\n\r\n",
	} {
		t.Run("http, "+name, func(t *testing.T) {
			var resp string
			w.proxied(t, boxW, func(c net.Conn) { httpGet(req)(c); resp = read(c) })
			assert.True(t, strings.HasPrefix(resp, "HTTP/1.1 403 Forbidden\r\n"), resp)
			assert.Contains(t, resp, HTTPRefusedHeader+": refused")
			assert.Contains(t, resp, "box egress: ")
		})
	}
	t.Run("neither", func(t *testing.T) {
		var resp string
		w.proxied(t, boxW, func(c net.Conn) { io.WriteString(c, "\x00\x01nonsense\n"); resp = read(c) })
		assert.Empty(t, resp, "reset")
	})
	t.Run("no policy", func(t *testing.T) {
		var resp string
		w.proxied(t, netip.MustParseAddr("10.88.0.99"), func(c net.Conn) { httpGet("GET / HTTP/1.1\r\nHost: canary.example.net\r\n\r\n")(c); resp = read(c) })
		assert.Empty(t, resp, "reset")
	})
	t.Run("a name with only a private address", func(t *testing.T) {
		w.s.answers = newAnswerBook()
		w.s.answers.add("pw", "b.pkg.example", []netip.Addr{netip.MustParseAddr("192.168.20.10")})
		var resp string
		w.proxied(t, boxW, func(c net.Conn) { httpGet("GET / HTTP/1.1\r\nHost: b.pkg.example\r\n\r\n")(c); resp = read(c) })
		assert.Contains(t, resp, "403")
		assert.Contains(t, resp, "private")
	})
	assert.Len(t, dialed, 2, "only the allowed names were dialed: %v", dialed)
	rs, err := ReadRefusals(w.logPath, func(r Refusal) bool { return r.Kind != "dns" })
	require.NoError(t, err)
	assert.Len(t, rs, 9)
	assert.Contains(t, w.log.String(), "box-w: tls other.example.net to ")
}

func TestEgressPick(t *testing.T) {
	w := newSvcWorld(t)
	w.s.dialable = func(a netip.Addr, _ State) string {
		if !publicAddr(a) {
			return a.String() + " is private"
		}
		return ""
	}
	st, _ := w.s.state.get()
	one, two := netip.MustParseAddr("203.0.113.10"), netip.MustParseAddr("203.0.113.11")
	w.s.answers.add("pw", "canary.example.net", []netip.Addr{one, two})
	at, why := w.s.pick("pw", "canary.example.net", two, st)
	assert.Equal(t, two, at, "the box's own choice, when the resolver answered it")
	assert.Empty(t, why)
	at, _ = w.s.pick("pw", "canary.example.net", netip.MustParseAddr("198.51.100.66"), st)
	assert.Equal(t, one, at, "another address: the name's own")
	_, why = w.s.pick("pw", "nothing.pkg.example", one, st)
	assert.Contains(t, why, "no address")

	for a, want := range map[string]bool{"203.0.113.10": true, "8.8.8.8": true, "10.1.2.3": false, "169.254.169.254": false, "127.0.0.1": false,
		"100.64.0.1": false, "192.168.0.1": false, "0.1.2.3": false, "255.255.255.255": false, "224.0.0.1": false, "198.18.0.1": false} {
		assert.Equal(t, want, publicAddr(netip.MustParseAddr(a)), a)
	}
}

// fromConn is a loopback connection that says it comes from a box.
type fromConn struct {
	*net.TCPConn
	from netip.Addr
}

func (c *fromConn) RemoteAddr() net.Addr { return &net.TCPAddr{IP: c.from.AsSlice(), Port: 40000} }

// bytesConn reads from a buffer.
type bytesConn struct {
	net.Conn
	io.Reader
}

func (c *bytesConn) Read(p []byte) (int, error)  { return c.Reader.Read(p) }
func (c *bytesConn) Write(p []byte) (int, error) { return len(p), nil }

// TestEgressServiceStops: a service told to stop ends the connections it
// relays (one to a box that is gone would wait for ever) and returns.
func TestEgressServiceStops(t *testing.T) {
	w := newSvcWorld(t)
	up, err := net.Listen("tcp4", "127.0.0.1:0")
	require.NoError(t, err)
	defer up.Close()
	go func() {
		c, err := up.Accept()
		if err == nil {
			io.WriteString(c, "UPSTREAM\n") // and never closes
		}
	}()
	w.s.dial = func(ctx context.Context, _ netip.AddrPort) (net.Conn, error) {
		return net.Dial("tcp4", up.Addr().String())
	}
	w.s.dialable = func(netip.Addr, State) string { return "" }
	w.s.answers.add("pw", "canary.example.net", []netip.Addr{netip.MustParseAddr("203.0.113.10")})
	w.s.udp, err = net.ListenPacket("udp4", "127.0.0.1:0")
	require.NoError(t, err)
	w.s.tcp, err = net.Listen("tcp4", "127.0.0.1:0")
	require.NoError(t, err)
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	require.NoError(t, err)
	w.s.proxy = &fromListener{Listener: l, from: boxW}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { w.s.serve(ctx); close(done) }()
	c, err := net.Dial("tcp4", l.Addr().String())
	require.NoError(t, err)
	defer c.Close()
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: canary.example.net\r\n\r\n")
	line, err := bufio.NewReader(c).ReadString('\n')
	require.NoError(t, err)
	assert.Equal(t, "UPSTREAM\n", line, "relaying")
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the service did not stop within 5 s of being told to: a relay held it")
	}
}

// fromListener accepts connections that say they come from a box.
type fromListener struct {
	net.Listener
	from netip.Addr
}

func (l *fromListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &fromConn{TCPConn: c.(*net.TCPConn), from: l.from}, nil
}
