package egress

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"sync"
	"syscall"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/sys/unix"

	"github.com/box-isolation/box/internal/atomicfile"
	"github.com/box-isolation/box/internal/nsrun"
	"github.com/box-isolation/box/stack/hostns"
	"github.com/box-isolation/box/stack/model"
	"github.com/box-isolation/box/stack/nft"
)

// The egress service: box's resolver (dns.go) and proxy
// (proxy.go) for the allowlisted boxes, in one process per network
// namespace. It runs in the port watcher (box guard-and-serve, which systemd
// runs as box-guard-and-serve.service) and knows the policies from a state file that
// every refresh of the egress table rewrites (applyEgress), so a change a
// box command makes is in force at the next question, without a message
// to the service. Its sockets are opened in the host's namespace: the
// resolver on nft.EgressDNSAddr (udp and tcp 53), the proxy on
// nft.EgressProxyAddr:nft.EgressProxyPort (IP_TRANSPARENT, for TPROXY).

// State is what the egress service needs to know.
type State struct {
	Bridge   string              `json:"bridge"`
	Table    string              `json:"table"`
	Gateway  netip.Addr          `json:"gateway"`
	Subnet   netip.Prefix        `json:"subnet"`
	Upstream []netip.Addr        `json:"upstream"`
	Policies map[string][]string `json:"policies"`
	Boxes    map[netip.Addr]Box  `json:"boxes"`
}

// StatePath is the state file of the namespace with inode ino.
func StatePath(ino uint64) string {
	return filepath.Join(hostns.RunDir, fmt.Sprintf("egress-%d.json", ino))
}

// WriteState replaces the state file in one rename, so the service
// never reads half of it.
func WriteState(ino uint64, st State) error {
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	path := StatePath(ino)
	if old, err := os.ReadFile(path); err == nil && string(old) == string(b) {
		return nil
	}
	if err := os.MkdirAll(hostns.RunDir, 0o755); err != nil {
		return fmt.Errorf("writing the egress state: %w", err)
	}
	if err := atomicfile.Write(path, b, 0o644); err != nil {
		return fmt.Errorf("writing the egress state: %w", err)
	}
	return nil
}

func RemoveState(ino uint64) error {
	if err := os.Remove(StatePath(ino)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("removing the egress state: %w", err)
	}
	return nil
}

// readEgressState reads a state file.
// ReadState reads the egress service's state in the namespace with inode
// ino (every user may: it is how a granted user, from whom Incus hides
// the bridge's config, learns the host's allowlists).
func ReadState(ino uint64) (State, error) { return readEgressState(StatePath(ino)) }

func readEgressState(path string) (State, error) {
	var st State
	b, err := os.ReadFile(path)
	if err != nil {
		return st, err
	}
	if err := json.Unmarshal(b, &st); err != nil {
		return st, fmt.Errorf("reading %s: %w", path, err)
	}
	return st, nil
}

// StateProblem says how the state file differs from want.
func StateProblem(ino uint64, want State) string {
	have, err := readEgressState(StatePath(ino))
	switch {
	case errors.Is(err, os.ErrNotExist):
		return "missing: the egress service knows no policy, and refuses every allowlisted box's question"
	case err != nil:
		return err.Error()
	}
	// Through JSON both ways, so nil and empty compare alike.
	b, _ := json.Marshal(want)
	var w State
	_ = json.Unmarshal(b, &w)
	if !reflect.DeepEqual(have, w) {
		return "stale: it does not hold the policies and boxes as they are"
	}
	return ""
}

// egressStateFile is the state as the service holds it, read again when
// the file changes (a stat a question: the state is a few KB).
type egressStateFile struct {
	path     string
	mu       sync.Mutex
	st       State
	matchers map[string]*model.NameMatcher // by policy
	id       [4]int64                      // inode, size, mtime seconds and nanoseconds
	err      error
}

func (f *egressStateFile) get() (State, error) {
	st, _, err := f.getWith()
	return st, err
}

// getWith is the state and each policy's matcher.
func (f *egressStateFile) getWith() (State, map[string]*model.NameMatcher, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var fi syscall.Stat_t
	if err := syscall.Stat(f.path, &fi); err != nil {
		f.st, f.matchers, f.id, f.err = State{}, nil, [4]int64{}, err
		return f.st, nil, err
	}
	id := [4]int64{int64(fi.Ino), fi.Size, fi.Mtim.Sec, fi.Mtim.Nsec}
	if id != f.id {
		f.st, f.err = readEgressState(f.path)
		f.id = id
		f.matchers = map[string]*model.NameMatcher{}
		for p, names := range f.st.Policies {
			f.matchers[p] = model.NewNameMatcher(names)
		}
	}
	return f.st, f.matchers, f.err
}

// allows says whether a policy of the state allows name.
func allows(m map[string]*model.NameMatcher, policy, name string) bool {
	pm := m[policy]
	return pm != nil && pm.Allows(name)
}

// ErrServing is returned by ServeEgress when another egress service
// holds the namespace's sockets.
var ErrServing = errors.New("another egress service (box guard-and-serve) serves this namespace")

// Serve runs box's egress resolver and proxy in the host's
// namespace until ctx ends, logging what it does (every refusal among
// it) to log. One runs per namespace: the sockets are its lock.
func Serve(ctx context.Context, netns string, log io.Writer) error {
	return serve(ctx, netns, log, nil)
}

// serve is Serve, calling up (when set) once its sockets are open.
func serve(ctx context.Context, netns string, log io.Writer, up func()) error {
	g, err := hostns.Open(netns)
	if err != nil {
		return fmt.Errorf("egress service: %w", err)
	}
	ino := g.Inode
	ncfg := g.NFTConfig(model.Current)
	allower, err := nft.NewEgressAllower(ncfg)
	g.Close()
	if err != nil {
		return fmt.Errorf("egress service: %w", err)
	}
	defer allower.Close()
	s := newEgressService(netns, &egressStateFile{path: StatePath(ino)}, allower, newRefusalLog(LogPath(ino), log))
	if err := s.listen(); err != nil {
		return err
	}
	defer s.close()
	// Locked once its sockets are open: a service said to run serves.
	unlock, err := lockEgress(ino)
	if err != nil {
		return err
	}
	defer unlock()
	logf(log, "egress service: resolver on %s:53, proxy on %s:%d, state %s", nft.EgressDNSAddr, nft.EgressProxyAddr, nft.EgressProxyPort, StatePath(ino))
	if up != nil {
		up()
	}
	s.serve(ctx)
	return nil
}

// egressLockPath is the lock the egress service of the namespace with
// inode ino holds while it runs.
func egressLockPath(ino uint64) string {
	return filepath.Join(hostns.RunDir, fmt.Sprintf("egress-%d.lock", ino))
}

// lockEgress takes the namespace's egress lock, or says another service
// holds it.
func lockEgress(ino uint64) (func(), error) {
	if err := os.MkdirAll(hostns.RunDir, 0o755); err != nil {
		return nil, fmt.Errorf("egress service: %w", err)
	}
	path := egressLockPath(ino)
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("egress service: %w", err)
	}
	// EgressServing holds the lock shared for an instant: try for a while.
	deadline := time.Now().Add(250 * time.Millisecond)
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		switch {
		case err == nil:
			return func() { f.Close() }, nil
		case !errors.Is(err, syscall.EWOULDBLOCK):
			f.Close()
			return nil, fmt.Errorf("egress service: locking %s: %w", path, err)
		case time.Now().After(deadline):
			f.Close()
			return nil, fmt.Errorf("%w (it holds %s)", ErrServing, path)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Serving says whether an egress service runs for the host's
// namespace (it holds the namespace's egress lock while it does). It
// takes the lock shared and at once lets go, so it never waits, and it
// sends nothing.
func Serving(netns string) bool {
	ino, err := hostns.Inode(netns)
	if err != nil {
		return false
	}
	f, err := os.Open(egressLockPath(ino))
	if err != nil {
		return false
	}
	defer f.Close()
	return errors.Is(syscall.Flock(int(f.Fd()), syscall.LOCK_SH|syscall.LOCK_NB), syscall.EWOULDBLOCK)
}

func logf(w io.Writer, format string, args ...any) { fmt.Fprintf(w, format+"\n", args...) }

// Run keeps an egress service running beside the daemon's other
// services: when another holds the sockets (the drill's, say) it tries
// again every few seconds, and takes over when that one stops. state hears
// whether the service is up, and why not.
func Run(ctx context.Context, netns string, logfn func(string, ...any), state func(up bool, why string)) {
	said := ""
	wait := egressFirstRetry
	for ctx.Err() == nil {
		err := serve(ctx, netns, writerFunc(func(b []byte) { logfn("%s", trimNL(b)) }), func() {
			wait = egressFirstRetry
			state(true, "")
		})
		if ctx.Err() != nil {
			return
		}
		msg := "the egress service stopped"
		if err != nil {
			msg = err.Error()
		}
		state(false, msg)
		if msg != said {
			logfn("%s; trying again (soon, then every %s)", msg, egressRetry)
			said = msg
		}
		// Soon at first: a daemon taking over from another binds the
		// sockets the other has just let go of.
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
		wait = min(2*wait, egressRetry)
	}
}

const egressRetry = 3 * time.Second

// egressFirstRetry is how soon the first try again comes (doubling up to
// egressRetry).
const egressFirstRetry = 20 * time.Millisecond

type writerFunc func([]byte)

func (f writerFunc) Write(b []byte) (int, error) { f(b); return len(b), nil }

func trimNL(b []byte) string {
	for len(b) > 0 && b[len(b)-1] == '\n' {
		b = b[:len(b)-1]
	}
	return string(b)
}

// egressService is the resolver and the proxy, sharing the state, the
// answers and the log.
type egressService struct {
	netns   string
	state   *egressStateFile
	allower interface {
		Allow(id string, addrs []netip.Addr) error
	}
	log *refusalLog

	udp   net.PacketConn
	tcp   net.Listener
	proxy net.Listener
	dnsU  *dns.Server
	dnsT  *dns.Server

	cache   *dnsCache
	answers *answerBook
	// allowed is when each policy/address was last put into its set.
	allowedMu sync.Mutex
	allowed   map[string]time.Time
	limits    *rateLimits
	conns     *connCounts
	wg        sync.WaitGroup
	// exchange asks the upstream (a test gives its own).
	exchange func(ctx context.Context, q *dns.Msg, upstream []netip.Addr) (*dns.Msg, error)
	// dial opens the proxy's connection out (a test gives its own).
	dial func(ctx context.Context, to netip.AddrPort) (net.Conn, error)
	// dialable says whether the proxy may dial an address (public, and
	// the host routes it by its default route).
	dialable func(a netip.Addr, st State) string
}

func newEgressService(netns string, st *egressStateFile, allower interface {
	Allow(string, []netip.Addr) error
}, log *refusalLog) *egressService {
	s := &egressService{netns: netns, state: st, allower: allower, log: log,
		cache: newDNSCache(), answers: newAnswerBook(), limits: newRateLimits(), conns: newConnCounts(), allowed: map[string]time.Time{}}
	s.exchange = s.upstreamExchange
	s.dial = s.dialOut
	s.dialable = s.routable
	return s
}

// listen opens the service's sockets in the host's namespace: the
// resolver's with IP_FREEBIND (its address comes and goes with the
// policies), the proxy's with IP_TRANSPARENT.
func (s *egressService) listen() error {
	freebind := func(_, _ string, c syscall.RawConn) error {
		var serr error
		if err := c.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_FREEBIND, 1) }); err != nil {
			return err
		}
		return serr
	}
	transparent := func(_, _ string, c syscall.RawConn) error {
		var serr error
		if err := c.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_TRANSPARENT, 1) }); err != nil {
			return err
		}
		return serr
	}
	dnsAt := netip.AddrPortFrom(nft.EgressDNSAddr, 53).String()
	proxyAt := netip.AddrPortFrom(nft.EgressProxyAddr, nft.EgressProxyPort).String()
	err := nsrun.Do(s.netns, func() error {
		var err error
		lc := net.ListenConfig{Control: freebind}
		if s.udp, err = lc.ListenPacket(context.Background(), "udp4", dnsAt); err != nil {
			return err
		}
		if s.tcp, err = lc.Listen(context.Background(), "tcp4", dnsAt); err != nil {
			return err
		}
		tl := net.ListenConfig{Control: transparent}
		s.proxy, err = tl.Listen(context.Background(), "tcp4", proxyAt)
		return err
	})
	if err != nil {
		s.close()
		if errors.Is(err, unix.EADDRINUSE) {
			return fmt.Errorf("%w (%s:53 or %s taken)", ErrServing, nft.EgressDNSAddr, proxyAt)
		}
		return fmt.Errorf("egress service: %w", err)
	}
	return nil
}

func (s *egressService) close() {
	if s.udp != nil {
		s.udp.Close()
	}
	for _, l := range []net.Listener{s.tcp, s.proxy} {
		if l != nil {
			l.Close()
		}
	}
}

// serve answers and proxies until ctx ends.
func (s *egressService) serve(ctx context.Context) {
	s.dnsU = &dns.Server{PacketConn: s.udp, Handler: s}
	s.dnsT = &dns.Server{Listener: s.tcp, Handler: s, ReadTimeout: 5 * time.Second}
	for _, srv := range []*dns.Server{s.dnsU, s.dnsT} {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			_ = srv.ActivateAndServe()
		}()
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.acceptLoop(ctx)
	}()
	<-ctx.Done()
	// Shutdown does nothing to a server that has not started yet (a
	// context that ended at once): closing the sockets ends it either way.
	_ = s.dnsU.Shutdown()
	_ = s.dnsT.Shutdown()
	s.close()
	s.wg.Wait()
}

// Box is an allowlisted box as the egress service knows it, by its
// address.
type Box struct {
	Name    string `json:"name"`
	Project string `json:"project,omitempty"`
	Policy  string `json:"policy"`
}
