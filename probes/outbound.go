package probes

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// outTap is an outbound witness's capture on one interface.
type outTap struct {
	ifi  *net.Interface
	sock *pktSock
}

// outboundFilter passes, on a SOCK_RAW packet socket, the frames this host
// sends (PACKET_OUTGOING) that are IPv4 or control frames: nothing else
// is ever queued to an outbound witness.
func outboundFilter() []bpf.Instruction {
	return append(outgoingOnly(),
		bpf.LoadExtension{Num: bpf.ExtProto},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: unix.ETH_P_IP, SkipTrue: 2},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: ControlEtherType, SkipTrue: 1},
		bpf.RetConstant{Val: 0},
		bpf.RetConstant{Val: 1 << 18})
}

// startOutbound arms an outbound witness (spec.Ifaces): one packet socket
// per named interface, opened on the calling goroutine so they capture in
// its network namespace.
func startOutbound(spec WitnessSpec) (*Witness, error) {
	w := newWitness(spec)
	w.name = strings.Join(spec.Ifaces, ",")
	closeAll := func() {
		for _, t := range w.taps {
			t.sock.close()
		}
	}
	for _, name := range spec.Ifaces {
		ifi, err := net.InterfaceByName(name)
		if err != nil {
			closeAll()
			return nil, fmt.Errorf("witness %s: interface %s: %w", spec.ID, name, err)
		}
		s, err := openPktSock(unix.SOCK_RAW, ifi.Index, outboundFilter())
		if err != nil {
			closeAll()
			return nil, fmt.Errorf("witness %s: on %s: %w", spec.ID, name, err)
		}
		w.taps = append(w.taps, &outTap{ifi: ifi, sock: s})
	}
	w.armedAt = time.Now()
	w.untilNS.Store(w.armedAt.Add(MaxStartWait + ms(spec.WindowMS)).UnixNano())
	for _, t := range w.taps {
		// Stop moves it to now to wake the reader; begin moves it on.
		if err := t.sock.setReadDeadline(w.until()); err != nil {
			closeAll()
			return nil, fmt.Errorf("witness %s: deadline on %s: %w", spec.ID, t.ifi.Name, err)
		}
	}
	var wg sync.WaitGroup
	for _, t := range w.taps {
		wg.Add(1)
		go func() { defer wg.Done(); t.read(w) }()
	}
	go func() { wg.Wait(); close(w.finished) }()
	return w, nil
}

func (t *outTap) read(w *Witness) {
	w.readLoop(func(buf []byte) error {
		n, from, err := t.sock.recv(buf)
		if err != nil {
			return fmt.Errorf("%s: %w", t.ifi.Name, err)
		}
		w.recordOut(buf[:n], from, t.ifi.Name)
		return nil
	})
}

func (t *outTap) drain(w *Witness) {
	buf := make([]byte, 65536)
	t.sock.drain(buf, func(n int, from *unix.SockaddrLinklayer) { w.recordOut(buf[:n], from, t.ifi.Name) })
}

// ethernetFrame gives a captured frame an Ethernet header if its link has
// none (a tunnel, WireGuard, PPP), with zero addresses and the protocol
// the kernel reported, so every frame is parsed the same way.
func ethernetFrame(f []byte, from *unix.SockaddrLinklayer) []byte {
	switch from.Hatype {
	case unix.ARPHRD_ETHER, unix.ARPHRD_LOOPBACK:
		return f
	}
	g := make([]byte, 14, 14+len(f))
	binary.BigEndian.PutUint16(g[12:14], htons(from.Protocol))
	return append(g, f...)
}

// recordOut handles one frame an outbound witness captured leaving ifname.
func (w *Witness) recordOut(f []byte, from *unix.SockaddrLinklayer, ifname string) {
	at := time.Now()
	if from.Pkttype != unix.PACKET_OUTGOING {
		return // the filter passes only outgoing frames; never count others
	}
	f = ethernetFrame(f, from)
	if w.countControl(f, at) {
		return
	}
	rec, ok := w.outRecord(f)
	if !ok {
		w.mu.Lock()
		w.captured++
		w.mu.Unlock()
		return
	}
	rec.At, rec.Iface = at, ifname
	for _, n := range w.nonces {
		if bytes.Contains(f, n) {
			rec.Nonce = string(n)
			break
		}
	}
	sum, matched := w.match(f)
	if len(w.nonces)+len(w.ips)+len(w.macs) == 0 {
		matched = true
		sum.MatchedBy = "dst_prefixes " + rec.DstIP
	}
	rec.Matched = matched
	w.mu.Lock()
	defer w.mu.Unlock()
	w.captured++
	w.recorded++
	w.keep(rec)
	if matched {
		w.count++
		if w.first == nil {
			sum.At = at
			w.first = &sum
		}
	}
}

// outRecord decodes an outgoing Ethernet frame into a record if it is an
// IPv4 packet the witness records: toward one of its prefixes and within
// its proto, port and dst_ip.
func (w *Witness) outRecord(f []byte) (PacketRecord, bool) {
	var r PacketRecord
	if len(f) < 14+20 {
		return r, false
	}
	et := binary.BigEndian.Uint16(f[12:14])
	l3 := f[14:]
	for (et == 0x8100 || et == 0x88a8) && len(l3) >= 4 {
		et = binary.BigEndian.Uint16(l3[2:4])
		l3 = l3[4:]
	}
	if et != unix.ETH_P_IP || len(l3) < 20 || l3[0]>>4 != 4 {
		return r, false
	}
	dst := netip.AddrFrom4([4]byte(l3[16:20]))
	in := false
	for _, p := range w.spec.DstPrefixes {
		if p.Contains(dst) {
			in = true
			break
		}
	}
	if !in || (w.spec.DstIP.IsValid() && w.spec.DstIP != dst) {
		return r, false
	}
	r.SrcIP = netip.AddrFrom4([4]byte(l3[12:16])).String()
	r.DstIP = dst.String()
	ihl := int(l3[0]&0x0f) * 4
	proto := int(l3[9])
	r.Proto, _ = l4Info(proto, l3, ihl)
	firstFragment := binary.BigEndian.Uint16(l3[6:8])&0x1fff == 0
	if l4 := l3[min(ihl, len(l3)):]; firstFragment && (proto == unix.IPPROTO_TCP || proto == unix.IPPROTO_UDP) && len(l4) >= 4 {
		r.SrcPort = int(binary.BigEndian.Uint16(l4[0:2]))
		r.DstPort = int(binary.BigEndian.Uint16(l4[2:4]))
		if proto == unix.IPPROTO_TCP && len(l4) >= 14 {
			r.Seq = binary.BigEndian.Uint32(l4[4:8])
			r.TCPFlags = tcpFlagNames(l4[13])
		}
	}
	if w.spec.Proto != "" && w.spec.Proto != r.Proto {
		return r, false
	}
	if w.spec.Port != 0 && w.spec.Port != r.DstPort {
		return r, false
	}
	return r, true
}

// keep lists a record: the first MaxWitnessRecords, except that once the
// list is full a record worth more (a nonce, a match, a TCP SYN: what a
// drill looks for) displaces the oldest plain one. Callers hold w.mu.
func (w *Witness) keep(r PacketRecord) {
	if len(w.records) < MaxWitnessRecords {
		w.records = append(w.records, r)
		return
	}
	if !worth(r) {
		return
	}
	for i, old := range w.records {
		if !worth(old) {
			w.records = append(append(w.records[:i:i], w.records[i+1:]...), r)
			return
		}
	}
}

// worth says whether a record is worth keeping over another when the
// list is full: one that matched, carried a nonce, or a SYN.
func worth(r PacketRecord) bool {
	return r.Nonce != "" || r.Matched || r.Proto == "tcp" && strings.HasPrefix(r.TCPFlags, "S") && !strings.Contains(r.TCPFlags, ".")
}
