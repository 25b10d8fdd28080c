package probes

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The wire protocol between probes and listeners. A prober sends one line,
// ProbePrefix followed by its nonce; a TCP greeter answers with one line,
// GreetPrefix, its name, a space and the line it got; a UDP echo answers with
// EchoPrefix, its name, a space and the datagram it got. A probe calls the
// target reached only when its nonce comes back, which proves the answer
// came from something that read this probe's packet.
const (
	ProbePrefix = "BOXPROBE "
	GreetPrefix = "BOXGREET "
	EchoPrefix  = "BOXECHO "
)

// NewNonce returns a fresh random nonce: 32 hex digits.
func NewNonce() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on Linux
	return hex.EncodeToString(b[:])
}

// RunProbe runs one probe and returns its observation. It never panics on a
// bad spec and never outlives min(ctx, delay+deadline): every socket it
// opens has a deadline. Sockets are created on the calling goroutine, so a
// caller that has locked its OS thread into a network namespace probes from
// there.
func RunProbe(ctx context.Context, spec ProbeSpec) Observation {
	obs := Observation{ID: spec.ID, Kind: spec.Kind, Target: targetString(&spec), Nonce: spec.Nonce}
	if err := spec.Validate(); err != nil {
		obs.StartedAt = time.Now()
		return fail(obs, "invalid probe: "+err.Error())
	}
	if spec.DelayMS > 0 {
		t := time.NewTimer(ms(spec.DelayMS))
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			obs.StartedAt = time.Now()
			return fail(obs, "cancelled before the probe started: "+ctx.Err().Error())
		}
	}
	if obs.Nonce == "" && (spec.Kind == KindICMP || spec.Kind == KindTCP || spec.Kind == KindUDP || spec.Kind == KindBroadcast ||
		spec.Kind == KindForgedUDP) {
		obs.Nonce = NewNonce()
		spec.Nonce = obs.Nonce
	}
	obs.StartedAt = time.Now()
	full := obs.StartedAt.Add(spec.Deadline())
	pctx, cancel := context.WithDeadline(ctx, full)
	defer cancel()
	if spec.Kind == KindTCP && spec.Name != "" {
		var ok bool
		if spec, obs, ok = resolveFirst(pctx, spec, obs); !ok {
			obs.ElapsedMS = time.Since(obs.StartedAt).Milliseconds()
			return obs
		}
	}
	switch spec.Kind {
	case KindARP:
		obs = probeARP(pctx, spec, obs)
	case KindICMP:
		obs = probeICMP(pctx, spec, obs)
	case KindTCP:
		obs = probeTCP(pctx, spec, obs)
	case KindUDP:
		obs = probeUDP(pctx, spec, obs)
	case KindBroadcast:
		obs = probeBroadcast(pctx, spec, obs)
	case KindDNS:
		obs = probeDNS(pctx, spec, obs)
	case KindIPv6State:
		obs = probeIPv6State(pctx, spec, obs)
	case KindNDPRS:
		obs = probeNDPRS(pctx, spec, obs)
	case KindDHCPLease:
		obs = probeDHCPLease(pctx, spec, obs)
	case KindControl:
		obs = probeControl(pctx, spec, obs)
	case KindARPSpoof:
		obs = probeARPSpoof(pctx, spec, obs)
	case KindForgedUDP:
		obs = probeForgedUDP(pctx, spec, obs)
	case KindDHCPForge:
		obs = probeDHCPForge(pctx, spec, obs)
	case KindDHCPFlood:
		obs = probeDHCPFlood(pctx, spec, obs)
	default:
		obs = runKernel(pctx, spec, obs)
	}
	end := time.Now()
	obs.ElapsedMS = end.Sub(obs.StartedAt).Milliseconds()
	// A silence that ended before the probe's own deadline was cut short by
	// the caller; calling it silent would claim more waiting than happened.
	if obs.Outcome == Silent && ctx.Err() != nil && end.Before(full.Add(-time.Millisecond)) {
		return fail(obs, "cut short before the probe's deadline: "+ctx.Err().Error())
	}
	return obs
}

func targetString(s *ProbeSpec) string {
	switch s.Kind {
	case KindTCP, KindUDP, KindDNS, KindForgedUDP:
		port := s.Port
		if s.Kind == KindDNS && port == 0 {
			port = 53
		}
		if s.Target.IsValid() {
			return netip.AddrPortFrom(s.Target, uint16(port)).String()
		}
	case KindARPSpoof:
		if !s.Target.IsValid() && s.ARPSenderIP.IsValid() {
			return s.ARPSenderIP.String() // a gratuitous ARP asks for the claim
		}
	case KindBroadcast:
		if s.Target.IsValid() {
			return netip.AddrPortFrom(s.Target, uint16(s.Port)).String()
		}
		if s.Via.IsValid() && s.Via.Addr().Is4() {
			return netip.AddrPortFrom(broadcastOf(s.Via), uint16(s.Port)).String()
		}
	case KindDHCPFlood:
		return fmt.Sprintf("%d made-up clients", s.Count)
	case KindUnixHTTP:
		return s.Socket
	case KindWriteOpen, KindReadFiles, KindLoadDisk:
		if len(s.Paths) > 0 {
			return strings.Join(s.Paths, " ")
		}
	case KindIPv6State, KindNDPRS, KindDHCPLease, KindControl:
		if s.Via.IsValid() {
			return s.Via.Masked().String()
		}
		return ""
	}
	if s.Target.IsValid() {
		return s.Target.String()
	}
	return ""
}

func fail(obs Observation, reason string) Observation {
	obs.Outcome = Error
	obs.Reason = reason
	return obs
}

func done(obs Observation, o Outcome, reason string) Observation {
	obs.Outcome = o
	obs.Reason = reason
	return obs
}

// probeLine is what a prober sends.
func probeLine(nonce string) []byte { return []byte(ProbePrefix + nonce + "\n") }

// printable keeps the first n bytes of b as plain ASCII for evidence.
func printable(b []byte, n int) string {
	if len(b) > n {
		b = b[:n]
	}
	var sb strings.Builder
	for _, c := range b {
		switch {
		case c == '\n':
			sb.WriteString(`\n`)
		case c >= 0x20 && c < 0x7f:
			sb.WriteByte(c)
		default:
			sb.WriteByte('.')
		}
	}
	return sb.String()
}

func peerIP(a net.Addr) string {
	switch v := a.(type) {
	case *net.IPAddr:
		return v.IP.String()
	case *net.UDPAddr:
		return v.IP.String()
	case *net.TCPAddr:
		return v.IP.String()
	}
	if a == nil {
		return ""
	}
	return a.String()
}

func addrOf(ip net.IP) netip.Addr {
	a, _ := netip.AddrFromSlice(ip)
	return a.Unmap()
}

// errnoOf digs the errno out of a net error.
func errnoOf(err error) (unix.Errno, bool) {
	var e syscall.Errno
	if errors.As(err, &e) {
		return unix.Errno(e), true
	}
	return 0, false
}

func errnoName(e unix.Errno) string {
	if n := unix.ErrnoName(e); n != "" {
		return n
	}
	return "errno " + strconv.Itoa(int(e))
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout() || errors.Is(err, context.DeadlineExceeded)
}

func family(a netip.Addr) int {
	if a.Is4() || a.Is4In6() {
		return 4
	}
	return 6
}

// sockaddrOf builds a sockaddr for binding.
func sockaddrOf(a netip.Addr, port int, ifindex int) unix.Sockaddr {
	if a.Is4() {
		return &unix.SockaddrInet4{Port: port, Addr: a.As4()}
	}
	sa := &unix.SockaddrInet6{Port: port, Addr: a.As16()}
	if a.Zone() != "" {
		sa.ZoneId = uint32(ifindex)
	}
	return sa
}

// setRecvErr asks the kernel to report ICMP errors on the socket at once
// (not as soft errors after retries) and, for datagram sockets, to queue
// them with the ICMP type, code and offender on the error queue.
func setRecvErr(fd uintptr, fam int) error {
	if fam == 4 {
		return unix.SetsockoptInt(int(fd), unix.SOL_IP, unix.IP_RECVERR, 1)
	}
	return unix.SetsockoptInt(int(fd), unix.SOL_IPV6, unix.IPV6_RECVERR, 1)
}

// wakeOnCancel makes a blocked read return when ctx is cancelled (its
// deadline is already the socket's). The returned func releases it.
func wakeOnCancel(ctx context.Context, setReadDeadline func(time.Time) error) func() bool {
	return context.AfterFunc(ctx, func() { _ = setReadDeadline(time.Now()) })
}

// deadlineOf returns ctx's deadline (RunProbe always sets one).
func deadlineOf(ctx context.Context) time.Time {
	if d, ok := ctx.Deadline(); ok {
		return d
	}
	return time.Now().Add(MinProbeDeadline)
}

// resolveFirst turns a tcp probe by name into one by address: it asks the
// probe's resolver for the name's A record and aims at the first address.
// A name that does not resolve fails the probe (an error: nothing was
// sent, so nothing was blocked).
func resolveFirst(ctx context.Context, spec ProbeSpec, obs Observation) (ProbeSpec, Observation, bool) {
	q := ProbeSpec{ID: spec.ID, Kind: KindDNS, Target: spec.Resolver, Port: 53, Name: spec.Name, QType: "A", Via: spec.Via, DeadlineMS: spec.DeadlineMS}
	// Half the deadline at most: the connection needs the rest.
	dctx, cancel := context.WithTimeout(ctx, spec.Deadline()/2)
	defer cancel()
	r := probeDNS(dctx, q, Observation{ID: spec.ID, Kind: KindDNS, Target: targetString(&q)})
	obs.Evidence.DNS = r.Evidence.DNS
	if r.Outcome != Reached || r.Evidence.DNS == nil || len(r.Evidence.DNS.Addresses) == 0 {
		return spec, fail(obs, fmt.Sprintf("%s did not resolve at %s (%s: %s): nothing was sent", spec.Name, spec.Resolver, r.Outcome, r.Reason)), false
	}
	a, err := netip.ParseAddr(r.Evidence.DNS.Addresses[0])
	if err != nil {
		return spec, fail(obs, "the resolver's answer is not an address: "+r.Evidence.DNS.Addresses[0]), false
	}
	if spec.Speak != "" && spec.ServerName == "" {
		spec.ServerName = spec.Name
	}
	spec.Target, spec.Name = a, ""
	obs.Target = targetString(&spec)
	return spec, obs, true
}
