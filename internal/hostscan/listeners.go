package hostscan

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
)

// Listener is a socket that accepts traffic from others: a TCP socket in
// state LISTEN, or a bound UDP socket with no connected peer.
type Listener struct {
	Proto string // "tcp" or "udp"
	// Family is the socket's address family, 4 or 6. An IPv6 socket bound
	// to "::" may also accept IPv4 (unless it set IPV6_V6ONLY, which
	// /proc does not show), so aim both families at it.
	Family int
	// Addr is the local address. An unspecified one (0.0.0.0 or ::, kept
	// apart) means every address of the namespace; a v4-mapped IPv6
	// address (::ffff:a.b.c.d) is given as the IPv4 address it maps, with
	// Family still 6.
	Addr  netip.Addr
	Port  uint16
	Inode uint64 // the socket's inode: socket:[Inode] in /proc/<pid>/fd
	UID   uint32 // the socket owner's uid
	// Loopback marks an address in 127.0.0.0/8 or ::1: only the namespace
	// itself reaches it, never a box.
	Loopback bool
	// PID and Process name the lowest-numbered process holding the socket,
	// when the /proc scan found it; zero and "" otherwise.
	PID     int
	Process string
}

// AddrPort is the listener's local address and port.
func (l Listener) AddrPort() netip.AddrPort { return netip.AddrPortFrom(l.Addr, l.Port) }

// Wildcard reports whether the listener accepts on every address.
func (l Listener) Wildcard() bool { return l.Addr.IsUnspecified() }

func (l Listener) String() string {
	s := l.Proto + " " + l.AddrPort().String()
	if l.Process != "" {
		s += fmt.Sprintf(" (%s[%d])", l.Process, l.PID)
	}
	if l.Loopback {
		s += " loopback-only"
	}
	return s
}

// Socket states as /proc/net/{tcp,udp} print them (include/net/tcp_states.h).
const (
	stateClose  = 0x07 // an unconnected UDP socket
	stateListen = 0x0A
)

// procNetFiles are read by Listeners, under /proc/thread-self/net.
var procNetFiles = []struct {
	name   string
	proto  string
	family int
}{
	{"tcp", "tcp", 4},
	{"tcp6", "tcp", 6},
	{"udp", "udp", 4},
	{"udp6", "udp", 6},
}

// Listeners returns the listening TCP and bound unconnected UDP sockets,
// IPv4 and IPv6, of the calling thread's network namespace (wrap it in
// nsrun.Do for another one), with their owning processes where a bounded
// /proc scan finds them. Sockets bound to a device (SO_BINDTODEVICE) are
// listed without the device: /proc does not show it.
func Listeners() ([]Listener, error) {
	var all []Listener
	for _, f := range procNetFiles {
		path := "/proc/thread-self/net/" + f.name
		b, err := os.ReadFile(path)
		if f.family == 6 && errors.Is(err, fs.ErrNotExist) {
			continue // IPv6 disabled in the kernel
		}
		if err != nil {
			return nil, fmt.Errorf("reading listeners: %w", err)
		}
		ls, err := ParseProcNet(bytes.NewReader(b), f.proto, f.family)
		if err != nil {
			return nil, fmt.Errorf("parsing %s: %w", path, err)
		}
		all = append(all, ls...)
	}
	inodes := make([]uint64, 0, len(all))
	for _, l := range all {
		inodes = append(inodes, l.Inode)
	}
	owners := SocketOwners("/proc", inodes, DefaultOwnerScan)
	for i := range all {
		if o, ok := owners[all[i].Inode]; ok {
			all[i].PID, all[i].Process = o.PID, o.Name
		}
	}
	sortListeners(all)
	return all, nil
}

// ParseProcNet parses a /proc/net/{tcp,tcp6,udp,udp6} table (proto "tcp"
// or "udp", family 4 or 6) and returns its listeners: TCP sockets in
// LISTEN, UDP sockets in CLOSE (bound, no connected peer) with a non-zero
// local port. Addresses are decoded in this machine's byte order, as the
// kernel prints them.
func ParseProcNet(r io.Reader, proto string, family int) ([]Listener, error) {
	if proto != "tcp" && proto != "udp" {
		return nil, fmt.Errorf("unknown protocol %q", proto)
	}
	if family != 4 && family != 6 {
		return nil, fmt.Errorf("unknown family %d", family)
	}
	want := stateListen
	if proto == "udp" {
		want = stateClose
	}
	var out []Listener
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	header := true
	for n := 1; sc.Scan(); n++ {
		f := strings.Fields(sc.Text())
		if header {
			header = false
			if len(f) > 0 && f[0] == "sl" {
				continue
			}
		}
		if len(f) == 0 {
			continue
		}
		// sl local rem st tx:rx tr:when retrnsmt uid timeout inode ...
		if len(f) < 10 {
			return nil, fmt.Errorf("line %d: %d fields, want at least 10", n, len(f))
		}
		st, err := strconv.ParseUint(f[3], 16, 8)
		if err != nil {
			return nil, fmt.Errorf("line %d: state %q: %w", n, f[3], err)
		}
		if int(st) != want {
			continue
		}
		addr, port, err := parseHexAddrPort(f[1], family)
		if err != nil {
			return nil, fmt.Errorf("line %d: local address: %w", n, err)
		}
		if port == 0 {
			continue // not bound to a port: nothing reaches it
		}
		if proto == "udp" {
			if _, rport, err := parseHexAddrPort(f[2], family); err != nil || rport != 0 {
				continue
			}
		}
		uid, err := strconv.ParseUint(f[7], 10, 32)
		if err != nil {
			return nil, fmt.Errorf("line %d: uid %q: %w", n, f[7], err)
		}
		inode, err := strconv.ParseUint(f[9], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("line %d: inode %q: %w", n, f[9], err)
		}
		out = append(out, Listener{
			Proto:    proto,
			Family:   family,
			Addr:     addr,
			Port:     port,
			Inode:    inode,
			UID:      uint32(uid),
			Loopback: addr.IsLoopback(),
		})
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return out, nil
}

// parseHexAddrPort decodes "0100007F:0016": the address as the kernel's
// 32-bit words printed in host byte order, the port in plain hex.
func parseHexAddrPort(s string, family int) (netip.Addr, uint16, error) {
	a, p, ok := strings.Cut(s, ":")
	if !ok {
		return netip.Addr{}, 0, fmt.Errorf("%q: no port", s)
	}
	port, err := strconv.ParseUint(p, 16, 16)
	if err != nil {
		return netip.Addr{}, 0, fmt.Errorf("%q: port: %w", s, err)
	}
	size := 4
	if family == 6 {
		size = 16
	}
	raw, err := hex.DecodeString(a)
	if err != nil || len(raw) != size {
		return netip.Addr{}, 0, fmt.Errorf("%q: not an IPv%d address", s, family)
	}
	// Each 32-bit word was printed as a host-order integer: undo that.
	b := make([]byte, len(raw))
	for i := 0; i < len(raw); i += 4 {
		binary.NativeEndian.PutUint32(b[i:], binary.BigEndian.Uint32(raw[i:]))
	}
	addr, _ := netip.AddrFromSlice(b)
	return addr.Unmap(), uint16(port), nil
}

// sortListeners orders listeners by protocol, address, then port.
func sortListeners(ls []Listener) {
	slices.SortFunc(ls, func(a, b Listener) int {
		if c := strings.Compare(a.Proto, b.Proto); c != 0 {
			return c
		}
		if c := a.Addr.Compare(b.Addr); c != 0 {
			return c
		}
		return int(a.Port) - int(b.Port)
	})
}
