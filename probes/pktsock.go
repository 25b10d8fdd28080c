package probes

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"syscall"
	"time"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// pktSock is an AF_PACKET socket read through the runtime's poller, so a
// read honours a deadline and Close wakes it. Unlike mdlayher/packet's
// Conn it reports each frame's sockaddr: the packet type (outgoing or
// not), the protocol and the link type.
type pktSock struct {
	f  *os.File
	rc syscall.RawConn
}

// openPktSock opens an AF_PACKET socket of type typ (SOCK_RAW: frames with
// their link-layer header; SOCK_DGRAM: from the network header on) on
// ifindex (0: every interface), with filter attached before the socket is
// bound, so no frame the filter refuses is ever queued. The socket is
// created on the calling goroutine's thread, in its network namespace.
func openPktSock(typ, ifindex int, filter []bpf.Instruction) (*pktSock, error) {
	prog, err := bpf.Assemble(filter)
	if err != nil {
		return nil, fmt.Errorf("assemble packet filter: %w", err)
	}
	// Protocol 0: nothing is queued until bind names one.
	fd, err := unix.Socket(unix.AF_PACKET, typ|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("packet socket (needs CAP_NET_RAW): %w", err)
	}
	raw := make([]unix.SockFilter, len(prog))
	for i, ins := range prog {
		raw[i] = unix.SockFilter{Code: ins.Op, Jt: ins.Jt, Jf: ins.Jf, K: ins.K}
	}
	if err := unix.SetsockoptSockFprog(fd, unix.SOL_SOCKET, unix.SO_ATTACH_FILTER,
		&unix.SockFprog{Len: uint16(len(raw)), Filter: &raw[0]}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("attach packet filter: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: ifindex}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("bind packet socket to interface %d: %w", ifindex, err)
	}
	f := os.NewFile(uintptr(fd), "packet")
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("packet socket: %w", err)
	}
	return &pktSock{f: f, rc: rc}, nil
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// recv reads one frame, waiting until the read deadline.
func (s *pktSock) recv(buf []byte) (int, *unix.SockaddrLinklayer, error) {
	var n int
	var from unix.Sockaddr
	var rerr error
	err := s.rc.Read(func(fd uintptr) bool {
		n, from, rerr = unix.Recvfrom(int(fd), buf, 0)
		return !errors.Is(rerr, unix.EAGAIN)
	})
	if err != nil {
		return 0, nil, err
	}
	if rerr != nil {
		return 0, nil, rerr
	}
	sll, _ := from.(*unix.SockaddrLinklayer)
	if sll == nil {
		sll = &unix.SockaddrLinklayer{}
	}
	return n, sll, nil
}

// drain hands every frame already queued to fn, without waiting.
func (s *pktSock) drain(buf []byte, fn func(n int, from *unix.SockaddrLinklayer)) {
	_ = s.rc.Control(func(fd uintptr) {
		for range 100000 {
			n, from, err := unix.Recvfrom(int(fd), buf, unix.MSG_DONTWAIT)
			if err != nil {
				return
			}
			sll, _ := from.(*unix.SockaddrLinklayer)
			if sll == nil {
				sll = &unix.SockaddrLinklayer{}
			}
			fn(n, sll)
		}
	})
}

func (s *pktSock) setReadDeadline(t time.Time) error { return s.f.SetReadDeadline(t) }

func (s *pktSock) close() error { return s.f.Close() }

// dropUnless is "if A == v go on, else refuse the frame".
func dropUnless(v uint32) []bpf.Instruction {
	return []bpf.Instruction{bpf.JumpIf{Cond: bpf.JumpEqual, Val: v, SkipTrue: 1}, bpf.RetConstant{Val: 0}}
}

// outgoingOnly starts a filter: only frames this host sends
// (PACKET_OUTGOING) go on.
func outgoingOnly() []bpf.Instruction {
	return append([]bpf.Instruction{bpf.LoadExtension{Num: bpf.ExtType}}, dropUnless(unix.PACKET_OUTGOING)...)
}

// synFilter passes, on a SOCK_DGRAM packet socket, the outgoing TCP SYNs
// (SYN set, ACK clear) from sport to dport, IPv4 (unfragmented) or IPv6
// (TCP as the first header), truncated to 128 bytes.
func synFilter(sport, dport int) []bpf.Instruction {
	v4 := []bpf.Instruction{bpf.LoadAbsolute{Off: 9, Size: 1}}
	v4 = append(v4, dropUnless(unix.IPPROTO_TCP)...)
	v4 = append(v4,
		bpf.LoadAbsolute{Off: 6, Size: 2},
		bpf.JumpIf{Cond: bpf.JumpBitsSet, Val: 0x1fff, SkipFalse: 1}, // a later fragment
		bpf.RetConstant{Val: 0},
		bpf.LoadMemShift{Off: 0}, // X = IPv4 header length
		bpf.LoadIndirect{Off: 0, Size: 2})
	v4 = append(v4, dropUnless(uint32(sport))...)
	v4 = append(v4, bpf.LoadIndirect{Off: 2, Size: 2})
	v4 = append(v4, dropUnless(uint32(dport))...)
	v4 = append(v4, bpf.LoadIndirect{Off: 13, Size: 1}, bpf.ALUOpConstant{Op: bpf.ALUOpAnd, Val: 0x12})
	v4 = append(v4, dropUnless(0x02)...)
	v4 = append(v4, bpf.RetConstant{Val: 128})

	v6 := []bpf.Instruction{bpf.LoadAbsolute{Off: 6, Size: 1}}
	v6 = append(v6, dropUnless(unix.IPPROTO_TCP)...)
	v6 = append(v6, bpf.LoadAbsolute{Off: 40, Size: 2})
	v6 = append(v6, dropUnless(uint32(sport))...)
	v6 = append(v6, bpf.LoadAbsolute{Off: 42, Size: 2})
	v6 = append(v6, dropUnless(uint32(dport))...)
	v6 = append(v6, bpf.LoadAbsolute{Off: 53, Size: 1}, bpf.ALUOpConstant{Op: bpf.ALUOpAnd, Val: 0x12})
	v6 = append(v6, dropUnless(0x02)...)
	v6 = append(v6, bpf.RetConstant{Val: 128})

	p := outgoingOnly()
	p = append(p,
		bpf.LoadExtension{Num: bpf.ExtProto},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: unix.ETH_P_IPV6, SkipTrue: uint8(len(v4) + 2)},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: unix.ETH_P_IP, SkipTrue: 1},
		bpf.RetConstant{Val: 0})
	p = append(p, v4...)
	return append(p, v6...)
}

// tcpSegment is what a TCP packet's headers say.
type tcpSegment struct {
	src, dst     netip.Addr
	sport, dport int
	seq          uint32
	flags        byte
}

// parseTCP reads an IPv4 or IPv6 packet (from its network header) holding
// a TCP segment; IPv6 extension headers are not walked.
func parseTCP(p []byte) (tcpSegment, bool) {
	var s tcpSegment
	var l4 []byte
	switch {
	case len(p) >= 20 && p[0]>>4 == 4:
		ihl := int(p[0]&0x0f) * 4
		if p[9] != unix.IPPROTO_TCP || ihl < 20 || len(p) < ihl+14 || binary.BigEndian.Uint16(p[6:8])&0x1fff != 0 {
			return s, false
		}
		s.src, s.dst = netip.AddrFrom4([4]byte(p[12:16])), netip.AddrFrom4([4]byte(p[16:20]))
		l4 = p[ihl:]
	case len(p) >= 54 && p[0]>>4 == 6:
		if p[6] != unix.IPPROTO_TCP {
			return s, false
		}
		s.src, s.dst = netip.AddrFrom16([16]byte(p[8:24])), netip.AddrFrom16([16]byte(p[24:40]))
		l4 = p[40:]
	default:
		return s, false
	}
	s.sport = int(binary.BigEndian.Uint16(l4[0:2]))
	s.dport = int(binary.BigEndian.Uint16(l4[2:4]))
	s.seq = binary.BigEndian.Uint32(l4[4:8])
	s.flags = l4[13]
	return s, true
}

// tcpFlagNames spells TCP flags the way tcpdump does: "S", "S." (SYN-ACK),
// "R", "F.", "P.".
func tcpFlagNames(f byte) string {
	var b []byte
	for _, x := range []struct {
		bit byte
		c   byte
	}{{0x02, 'S'}, {0x01, 'F'}, {0x04, 'R'}, {0x08, 'P'}, {0x20, 'U'}, {0x40, 'E'}, {0x80, 'W'}, {0x10, '.'}} {
		if f&x.bit != 0 {
			b = append(b, x.c)
		}
	}
	if len(b) == 0 {
		return "none"
	}
	return string(b)
}

// synGrace is how long a tcp probe, once it has its verdict, still waits
// for the capture of its own SYN. The SYN is queued to the capture as it
// leaves, before any answer can come back, so this matters only when the
// SYN never left (then the ISN is unknown and says so).
const synGrace = 50 * time.Millisecond

// synCapture watches this host's outgoing frames, on every interface, for
// one TCP SYN: from sport to dst:dport. It learns the SYN's initial
// sequence number, which a witness past a NAT can match (the SYN carries
// no nonce, and a NAT changes the source address but not the ISN).
type synCapture struct {
	sock *pktSock
	dst  netip.Addr
	res  chan uint32
	done chan struct{}
}

// startSYNCapture arms the capture on the calling goroutine's thread (its
// network namespace) before the SYN is sent; it reads until stop or until.
func startSYNCapture(dst netip.Addr, sport, dport int, until time.Time) (*synCapture, error) {
	s, err := openPktSock(unix.SOCK_DGRAM, 0, synFilter(sport, dport))
	if err != nil {
		return nil, err
	}
	if err := s.setReadDeadline(until); err != nil {
		s.close()
		return nil, fmt.Errorf("packet socket deadline: %w", err)
	}
	c := &synCapture{sock: s, dst: dst.WithZone("").Unmap(), res: make(chan uint32, 1), done: make(chan struct{})}
	go c.read(sport, dport)
	return c, nil
}

func (c *synCapture) read(sport, dport int) {
	defer close(c.done)
	buf := make([]byte, 256)
	for {
		n, from, err := c.sock.recv(buf)
		if err != nil {
			return
		}
		seg, ok := parseTCP(buf[:n])
		if from.Pkttype != unix.PACKET_OUTGOING || !ok || seg.dst.Unmap() != c.dst || seg.sport != sport ||
			seg.dport != dport || seg.flags&0x12 != 0x02 {
			continue
		}
		c.res <- seg.seq
		return
	}
}

// stop waits at most wait for the SYN, ends the capture and returns the
// ISN if the SYN was seen.
func (c *synCapture) stop(wait time.Duration) (uint32, bool) {
	var isn uint32
	ok := false
	if wait > 0 {
		t := time.NewTimer(wait)
		select {
		case isn = <-c.res:
			ok = true
		case <-c.done:
		case <-t.C:
		}
		t.Stop()
	}
	c.sock.close()
	<-c.done
	if !ok {
		select {
		case isn = <-c.res:
			ok = true
		default:
		}
	}
	return isn, ok
}
