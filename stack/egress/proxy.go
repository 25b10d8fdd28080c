package egress

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/miekg/dns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/box-isolation/box/internal/nsrun"
)

// The egress proxy takes an allowlisted box's TCP 443 and 80 (TPROXY: the
// box's packets keep their addresses, and the connection it accepts is the
// box's own, to the address the box chose). It reads the first thing the
// box sends, a TLS ClientHello or an HTTP request head, and goes on only
// when the name in it (the server name, the Host, and an absolute URL's
// host besides) is one the box's policy allows: it then dials that name
// at an address box's resolver answered for it (the box's own choice when
// it is one of them), and relays the bytes both ways. Its dials leave from
// the host, beyond the ACL's reach, so it dials only public addresses the
// host routes by its default route: never a private, LAN, host or
// metadata address, nor a public resolver's.
//
// A refusal is said in the protocol's terms (a TLS alert access_denied; an
// HTTP 403 whose body gives the reason, with the header X-Box-Egress:
// refused) and logged. What it does not see: a TLS connection's later
// names (domain fronting: an allowed server name with another Host inside
// the encrypted stream), and later requests on a kept-alive HTTP
// connection (they go to the same server as the first).

// Proxy bounds.
const (
	proxyPeekTimeout = 10 * time.Second
	proxyPeekMax     = 16 << 10
	proxyDialTimeout = 10 * time.Second
	proxyPerBox      = 512 // connections at once
)

// The refusals, on the wire.
var (
	tlsAccessDenied = []byte{0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x31}
	// HTTPRefusedHeader marks the proxy's 403.
	HTTPRefusedHeader = "X-Box-Egress"
)

func (s *egressService) acceptLoop(ctx context.Context) {
	for {
		c, err := s.proxy.Accept()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(10 * time.Millisecond)
			continue
		}
		pc, ok := c.(proxyConn)
		if !ok {
			c.Close()
			continue
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.serveConn(ctx, pc)
		}()
	}
}

// proxyConn is a box's connection as the proxy accepted it.
type proxyConn interface {
	net.Conn
	SetLinger(sec int) error
	SyscallConn() (syscall.RawConn, error)
}

// serveConn decides one connection and relays it.
func (s *egressService) serveConn(ctx context.Context, c proxyConn) {
	defer c.Close()
	from, to := addrPortOf(c.RemoteAddr()), addrPortOf(c.LocalAddr())
	st, matchers, _ := s.state.getWith()
	box, ok := st.Boxes[from.Addr()]
	refusal := Refusal{Box: box.Name, Project: box.Project, Policy: box.Policy, From: from.Addr().String(), Kind: "tcp", To: to.String()}
	if !ok {
		refusal.Reason = "this address is under no allowlist box's proxy knows"
		s.reset(c)
		s.log.add(refusal)
		return
	}
	if !s.conns.take(from.Addr()) {
		refusal.Reason = fmt.Sprintf("more than %d connections at once", proxyPerBox)
		s.reset(c)
		s.log.add(refusal)
		return
	}
	defer s.conns.give(from.Addr())

	_ = c.SetReadDeadline(time.Now().Add(proxyPeekTimeout))
	var names []string
	var head []byte
	var err error
	refuse := func(why string) {
		refusal.Reason = why
		switch refusal.Kind {
		case "tls":
			c.Write(tlsAccessDenied)
		case "http":
			body := "box egress: " + why + "\n"
			fmt.Fprintf(c, "HTTP/1.1 403 Forbidden\r\n%s: refused\r\nContent-Type: text/plain\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", HTTPRefusedHeader, len(body), body)
		default:
			s.reset(c)
		}
		s.log.add(refusal)
	}
	switch peekKind(c) {
	case "tls":
		refusal.Kind = "tls"
		var sni string
		sni, head, err = peekServerName(c)
		if err == nil && sni == "" {
			refusal.Name = "(none)"
			refuse("a TLS connection without a server name (an address alone)")
			return
		}
		names = []string{sni}
	case "http":
		refusal.Kind = "http"
		names, head, err = peekHTTPNames(c)
	default:
		refuse(fmt.Sprintf("neither TLS nor HTTP on port %d: only those are allowed on 80 and 443, with a name", to.Port()))
		return
	}
	if err != nil {
		refuse("could not read a name: " + err.Error())
		return
	}
	refusal.Name = strings.Join(names, " ")
	policy := st.Policies[box.Policy]
	for _, n := range names {
		switch {
		case !allows(matchers, box.Policy, n):
			refuse(fmt.Sprintf("%s is not on the allowlist %s of box %s (%s)", n, box.Policy, box.Name, strings.Join(policy, " ")))
			return
		case IsDoHName(n):
			refuse(n + " is a public DNS-over-HTTPS resolver: it would answer any name")
			return
		}
	}
	at, why := s.pick(box.Policy, names[0], to.Addr(), st)
	if why != "" {
		refuse(why)
		return
	}
	dctx, cancel := context.WithTimeout(ctx, proxyDialTimeout)
	up, err := s.dial(dctx, netip.AddrPortFrom(at, to.Port()))
	cancel()
	if err != nil {
		refuse(fmt.Sprintf("%s (%s) did not answer: %v", names[0], at, err))
		return
	}
	defer up.Close()
	// A service that stops ends its connections: a relay to a box that is
	// gone would otherwise wait for ever.
	defer context.AfterFunc(ctx, func() { c.Close(); up.Close() })()
	_ = c.SetReadDeadline(time.Time{})
	if _, err := up.Write(head); err != nil {
		return
	}
	relay(c, up)
}

// reset ends a connection with a RST.
func (s *egressService) reset(c proxyConn) { _ = c.SetLinger(0) }

// pick is the address the proxy dials for name: the box's own choice when
// the resolver answered it for the name, else the resolver's first
// answer (asked now when it has none); a refusal's reason otherwise.
func (s *egressService) pick(policy, name string, chosen netip.Addr, st State) (netip.Addr, string) {
	addrs := s.answers.get(policy, name)
	if !slices.Contains(addrs, chosen) {
		q := new(dns.Msg)
		q.SetQuestion(dns.Fqdn(name), dns.TypeA)
		if r, err := s.resolve(q, st.Upstream); err == nil {
			if fresh := answerAddrs(r, q.Question[0].Name); len(fresh) > 0 {
				s.answers.add(policy, name, fresh)
				addrs = s.answers.get(policy, name)
			}
		}
	}
	var cands []netip.Addr
	if slices.Contains(addrs, chosen) {
		cands = append(cands, chosen)
	}
	cands = append(cands, addrs...)
	var last string
	for _, a := range cands {
		if why := s.dialable(a, st); why != "" {
			last = why
			continue
		}
		return a, ""
	}
	if last == "" {
		return netip.Addr{}, name + " has no address (the resolver found none)"
	}
	return netip.Addr{}, name + ": " + last
}

// routable says why the proxy may not dial a: it is not public, it is a
// resolver no allowlisted box reaches, or the host routes it otherwise
// than by its default route (a LAN, a VPN: not the internet).
func (s *egressService) routable(a netip.Addr, st State) string {
	if !publicAddr(a) || st.Subnet.Contains(a) {
		return a.String() + " is a private or special address"
	}
	if slices.Contains(Resolvers(st.Upstream), a) {
		return a.String() + " is a public resolver's address (DNS over HTTPS)"
	}
	var why string
	err := nsrun.Do(s.netns, func() error {
		rs, err := netlink.RouteGet(a.AsSlice())
		if err != nil || len(rs) == 0 {
			why = a.String() + " has no route"
			return nil
		}
		r := rs[0]
		if r.Type == unix.RTN_LOCAL {
			why = a.String() + " is the host's own address"
			return nil
		}
		defs, err := netlink.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
		if err != nil {
			return err
		}
		for _, d := range defs {
			if (d.Dst == nil || d.Dst.IP.IsUnspecified() && bits(d.Dst) == 0) && d.LinkIndex == r.LinkIndex && d.Gw.Equal(r.Gw) {
				return nil
			}
		}
		why = a.String() + " is routed by a route of the host's other than its default (a LAN or a VPN, not the internet)"
		return nil
	})
	if err != nil {
		return "reading the host's routes: " + err.Error()
	}
	return why
}

func bits(n *net.IPNet) int { o, _ := n.Mask.Size(); return o }

// dialOut opens the proxy's connection from the host's namespace.
func (s *egressService) dialOut(ctx context.Context, to netip.AddrPort) (net.Conn, error) {
	var c net.Conn
	err := nsrun.Do(s.netns, func() error {
		var err error
		c, err = (&net.Dialer{}).DialContext(ctx, "tcp4", to.String())
		return err
	})
	return c, err
}

// relay copies both ways until both sides are done, passing on each
// side's end of writing. TCP to TCP, the kernel splices: ReadFrom is
// called on the connections themselves, since io.Copy would take the
// source's WriteTo, which copies through a buffer for a TCP destination.
func relay(a, b net.Conn) {
	var wg sync.WaitGroup
	cp := func(dst, src net.Conn) {
		defer wg.Done()
		dt, sok := dst.(*net.TCPConn)
		st, dok := src.(*net.TCPConn)
		if sok && dok {
			dt.ReadFrom(st)
		} else {
			io.Copy(dst, src)
		}
		if dt != nil {
			dt.CloseWrite()
		} else {
			dst.Close()
		}
	}
	wg.Add(2)
	go cp(a, b)
	go cp(b, a)
	wg.Wait()
}

func addrPortOf(a net.Addr) netip.AddrPort {
	if t, ok := a.(*net.TCPAddr); ok {
		ap := t.AddrPort()
		return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	}
	ap, _ := netip.ParseAddrPort(a.String())
	return ap
}

// peekKind looks at the first byte without taking it: a TLS handshake
// record starts 0x16, an HTTP request with a method's capital letter.
func peekKind(c proxyConn) string {
	var b [1]byte
	raw, err := c.SyscallConn()
	if err != nil {
		return ""
	}
	var n int
	var rerr error
	// Waits for the first byte (the read deadline holds), takes none.
	cerr := raw.Read(func(fd uintptr) bool {
		n, _, rerr = unix.Recvfrom(int(fd), b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		return !errors.Is(rerr, unix.EAGAIN)
	})
	if cerr != nil || rerr != nil {
		return ""
	}
	switch {
	case n == 1 && b[0] == 0x16:
		return "tls"
	case n == 1 && b[0] >= 'A' && b[0] <= 'Z':
		return "http"
	}
	return ""
}

// recorder reads through to a connection and keeps what it read; it
// writes nothing (crypto/tls's alert on the aborted handshake is
// dropped: the proxy says its own).
type recorder struct {
	net.Conn
	buf bytes.Buffer
}

func (r *recorder) Read(p []byte) (int, error) {
	n, err := r.Conn.Read(p)
	r.buf.Write(p[:n])
	if r.buf.Len() > proxyPeekMax {
		return n, errors.New("a ClientHello larger than the proxy reads")
	}
	return n, err
}

func (r *recorder) Write(p []byte) (int, error) { return 0, errPeekOnly }

var errPeekOnly = errors.New("peeking only")

// peekServerName reads a TLS ClientHello and gives its server name and
// the bytes read.
func peekServerName(c net.Conn) (string, []byte, error) {
	rec := &recorder{Conn: c}
	var sni string
	got := false
	err := tls.Server(rec, &tls.Config{GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
		sni, got = h.ServerName, true
		return nil, errPeekOnly
	}}).Handshake()
	if !got {
		return "", rec.buf.Bytes(), fmt.Errorf("not a TLS ClientHello: %v", err)
	}
	return strings.ToLower(sni), rec.buf.Bytes(), nil
}

// peekHTTPNames reads an HTTP request head and gives the names it asks
// for: its Host, and an absolute URL's host (a server may route by
// either).
func peekHTTPNames(c net.Conn) ([]string, []byte, error) {
	rec := &recorder{Conn: c}
	br := bufio.NewReaderSize(rec, 4096)
	line, err := br.ReadString('\n')
	if err != nil {
		return nil, rec.buf.Bytes(), fmt.Errorf("no request line: %v", err)
	}
	f := strings.Fields(line)
	if len(f) != 3 || !strings.HasPrefix(f[2], "HTTP/") {
		return nil, rec.buf.Bytes(), fmt.Errorf("not an HTTP request line: %q", strings.TrimSpace(line))
	}
	var names []string
	if u, ok := strings.CutPrefix(strings.ToLower(f[1]), "http://"); ok {
		names = append(names, hostOnly(strings.SplitN(u, "/", 2)[0]))
	} else if f[0] == "CONNECT" {
		names = append(names, hostOnly(strings.ToLower(f[1])))
	}
	host := ""
	for {
		l, err := br.ReadString('\n')
		if err != nil {
			return nil, rec.buf.Bytes(), fmt.Errorf("the request head did not end: %v", err)
		}
		l = strings.TrimRight(l, "\r\n")
		if l == "" {
			break
		}
		k, v, ok := strings.Cut(l, ":")
		if ok && strings.EqualFold(strings.TrimSpace(k), "host") {
			if host != "" {
				return nil, rec.buf.Bytes(), errors.New("two Host headers")
			}
			host = hostOnly(strings.ToLower(strings.TrimSpace(v)))
		}
	}
	if host == "" {
		return nil, rec.buf.Bytes(), errors.New("a request without a Host")
	}
	names = append(names, host)
	return slices.Compact(names), rec.buf.Bytes(), nil
}

// hostOnly drops a port.
func hostOnly(hp string) string {
	if h, _, err := net.SplitHostPort(hp); err == nil {
		return h
	}
	return hp
}

// connCounts counts each box's connections through the proxy.
type connCounts struct {
	mu sync.Mutex
	m  map[netip.Addr]int
}

func newConnCounts() *connCounts { return &connCounts{m: map[netip.Addr]int{}} }

func (c *connCounts) take(a netip.Addr) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m[a] >= proxyPerBox {
		return false
	}
	c.m[a]++
	return true
}

func (c *connCounts) give(a netip.Addr) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m[a]--; c.m[a] <= 0 {
		delete(c.m, a)
	}
}
