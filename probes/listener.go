package probes

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/netip"
	"sort"
	"sync"
	"time"
)

// connTimeout bounds one greeter conversation, so a peer that connects and
// says nothing cannot hold a goroutine past it.
const connTimeout = 2 * time.Second

// Listener answers probes from peers: a TCP greeter that reads one line
// and answers GreetPrefix+name+" "+line, or a UDP echo that answers
// EchoPrefix+name+" "+datagram. Its observation is reached when it served
// at least one peer (named in the evidence) and silent when nobody came.
type Listener struct {
	spec ListenerSpec
	addr string
	tcp  net.Listener
	udp  net.PacketConn

	mu       sync.Mutex
	served   int
	peers    map[string]bool
	start    time.Time
	stopOnce sync.Once
	done     chan struct{}
	wg       sync.WaitGroup
}

// StartListener opens the listener on the calling goroutine (so it lives in
// the caller's network namespace) and serves until Stop, ctx's end or the
// spec's window, whichever is first.
func StartListener(ctx context.Context, spec ListenerSpec) (*Listener, error) {
	l, err := armListener(ctx, spec)
	if err != nil {
		return nil, err
	}
	l.begin(ctx, time.Now())
	return l, nil
}

// armListener opens the listener and serves, with no window yet: begin
// starts it.
func armListener(ctx context.Context, spec ListenerSpec) (*Listener, error) {
	if err := spec.validate(MaxPlanDeadline); err != nil {
		return nil, fmt.Errorf("listener %s: %w", spec.ID, err)
	}
	// No host means every address of both families.
	addr := fmt.Sprintf(":%d", spec.Port)
	if spec.Via.IsValid() {
		_, p, err := InterfaceForSubnet(spec.Via)
		if err != nil {
			return nil, fmt.Errorf("listener %s: %w", spec.ID, err)
		}
		addr = netip.AddrPortFrom(p.Addr(), uint16(spec.Port)).String()
	}
	l := &Listener{spec: spec, peers: map[string]bool{}, done: make(chan struct{}), start: time.Now()}
	var lc net.ListenConfig
	var err error
	if spec.Kind == KindTCPGreeter {
		l.tcp, err = lc.Listen(ctx, "tcp", addr)
	} else {
		l.udp, err = lc.ListenPacket(ctx, "udp", addr)
	}
	if err != nil {
		return nil, fmt.Errorf("listener %s: %w", spec.ID, err)
	}
	l.addr = addr
	if l.tcp != nil {
		l.addr = l.tcp.Addr().String()
	} else {
		l.addr = l.udp.LocalAddr().String()
	}
	l.wg.Add(1)
	if l.tcp != nil {
		go l.serveTCP()
	} else {
		go l.serveUDP()
	}
	return l, nil
}

// begin counts the listener's window from start (the plan's common start,
// at or after its arming): it serves until then and for the window after.
func (l *Listener) begin(ctx context.Context, start time.Time) {
	window := MaxPlanDeadline
	if l.spec.WindowMS > 0 {
		window = ms(l.spec.WindowMS)
	}
	go func() {
		t := time.NewTimer(time.Until(start.Add(window)))
		defer t.Stop()
		select {
		case <-ctx.Done():
		case <-t.C:
		case <-l.done:
		}
		l.close()
	}()
}

// Addr is the address the listener is bound to.
func (l *Listener) Addr() string { return l.addr }

func (l *Listener) close() {
	l.stopOnce.Do(func() {
		close(l.done)
		if l.tcp != nil {
			l.tcp.Close()
		} else {
			l.udp.Close()
		}
	})
}

func (l *Listener) note(peer net.Addr) {
	l.mu.Lock()
	l.served++
	if len(l.peers) < MaxMatchEntries {
		l.peers[peerIP(peer)] = true
	}
	l.mu.Unlock()
}

func (l *Listener) serveTCP() {
	defer l.wg.Done()
	for {
		c, err := l.tcp.Accept()
		if err != nil {
			select {
			case <-l.done:
				return
			default:
			}
			time.Sleep(10 * time.Millisecond) // e.g. EMFILE: do not spin
			continue
		}
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(connTimeout))
			line, err := bufio.NewReaderSize(c, 512).ReadSlice('\n')
			if err != nil && len(line) == 0 {
				return
			}
			if len(line) > 256 {
				line = line[:256]
			}
			_, _ = fmt.Fprintf(c, "%s%s %s\n", GreetPrefix, l.spec.Name, printable(trimNL(line), 256))
			l.note(c.RemoteAddr())
		}()
	}
}

func (l *Listener) serveUDP() {
	defer l.wg.Done()
	buf := make([]byte, 2048)
	for {
		n, from, err := l.udp.ReadFrom(buf)
		if err != nil {
			select {
			case <-l.done:
				return
			default:
			}
			time.Sleep(10 * time.Millisecond)
			continue
		}
		msg := trimNL(buf[:n])
		if len(msg) > 512 {
			msg = msg[:512]
		}
		reply := fmt.Sprintf("%s%s %s\n", EchoPrefix, l.spec.Name, printable(msg, 512))
		_, _ = l.udp.WriteTo([]byte(reply), from)
		l.note(from)
	}
}

func trimNL(b []byte) []byte {
	for len(b) > 0 && (b[len(b)-1] == '\n' || b[len(b)-1] == '\r') {
		b = b[:len(b)-1]
	}
	return b
}

// Stop closes the listener, waits for its conversations to end and returns
// the observation.
func (l *Listener) Stop() Observation {
	l.close()
	l.wg.Wait()
	l.mu.Lock()
	defer l.mu.Unlock()
	obs := Observation{ID: l.spec.ID, Kind: l.spec.Kind, Target: l.addr, StartedAt: l.start,
		ElapsedMS: time.Since(l.start).Milliseconds()}
	ev := &ListenerEvidence{Address: l.addr, Served: l.served}
	for p := range l.peers {
		ev.Peers = append(ev.Peers, p)
	}
	sort.Strings(ev.Peers)
	obs.Evidence.Listener = ev
	if l.served == 0 {
		return done(obs, Silent, "nobody was served")
	}
	return done(obs, Reached, fmt.Sprintf("served %d probe(s)", l.served))
}

// Wait blocks until the listener's window or ctx ends, then stops it.
func (l *Listener) Wait(ctx context.Context) Observation {
	select {
	case <-l.done:
	case <-ctx.Done():
	}
	return l.Stop()
}
