package probes

import (
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// synTap records every TCP SYN (SYN without ACK) crossing any interface of
// ns, in either direction, until stopped.
type synTap struct {
	sock *pktSock
	mu   sync.Mutex
	syns []tcpSegment
	done chan struct{}
}

func startSYNTap(t *testing.T, ns *testNS) *synTap {
	t.Helper()
	var s *pktSock
	require.NoError(t, ns.Run(func() (err error) {
		s, err = openPktSock(unix.SOCK_DGRAM, 0, []bpf.Instruction{bpf.RetConstant{Val: 256}})
		return err
	}))
	tap := &synTap{sock: s, done: make(chan struct{})}
	go func() {
		defer close(tap.done)
		buf := make([]byte, 256)
		for {
			n, _, err := s.recv(buf)
			if err != nil {
				return
			}
			if seg, ok := parseTCP(buf[:n]); ok && seg.flags&0x12 == 0x02 {
				tap.mu.Lock()
				tap.syns = append(tap.syns, seg)
				tap.mu.Unlock()
			}
		}
	}()
	t.Cleanup(func() { tap.stop() })
	return tap
}

func (tap *synTap) stop() []tcpSegment {
	tap.sock.close()
	<-tap.done
	tap.mu.Lock()
	defer tap.mu.Unlock()
	return append([]tcpSegment(nil), tap.syns...)
}

// TestPrivilegedTCPReportsISN: a tcp probe reports its source port and its
// SYN's initial sequence number, and they are exactly what the router and
// the target see, whatever the outcome; a SYN that never left (no ARP
// answer for an on-link target) leaves the ISN unknown, said so, with the
// outcome unchanged.
func TestPrivilegedTCPReportsISN(t *testing.T) {
	w := newRoutedWorld(t)
	startListener(t, w.tgt, ListenerSpec{ID: "greet", Kind: KindTCPGreeter, Name: "target", Port: greetPort})
	tests := []struct {
		name    string
		target  netip.Addr
		port    int
		rule    rule
		want    Outcome
		arrives bool
	}{
		{"reached", w.tgtIP, greetPort, ruleAccept, Reached, true},
		{"reached v6", w.tgtIP6, greetPort, ruleAccept, Reached, true},
		{"closed port", w.tgtIP, closedPort, ruleAccept, Refused, true},
		{"dropped", w.tgtIP, greetPort, ruleDrop, Silent, false},
		{"rejected v6", w.tgtIP6, greetPort, ruleReject, Rejected, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w.setRule(t, tt.target, tt.rule)
			atRouter, atTarget := startSYNTap(t, w.rtr), startSYNTap(t, w.tgt)
			o := probeIn(t, w.snd, ProbeSpec{ID: "t", Kind: KindTCP, Target: tt.target, Port: tt.port, DeadlineMS: probeDeadlineMS})
			t.Logf("%s %s src_port=%d isn=%d captured=%v err=%q", o.Outcome, o.Reason, o.Evidence.SrcPort, o.Evidence.ISN,
				o.Evidence.ISNCaptured, o.Evidence.ISNError)
			require.Equal(t, tt.want, o.Outcome, o.Reason)
			require.NotZero(t, o.Evidence.SrcPort)
			require.True(t, o.Evidence.ISNCaptured, o.Evidence.ISNError)
			require.Empty(t, o.Evidence.ISNError)
			check := func(where string, syns []tcpSegment) {
				require.NotEmpty(t, syns, "%s saw the SYN", where)
				for _, s := range syns {
					require.Equal(t, tt.target, s.dst, where)
					require.Equal(t, o.Evidence.SrcPort, s.sport, "%s: the source port reported is the SYN's", where)
					require.Equal(t, o.Evidence.ISN, s.seq, "%s: the ISN reported is the SYN's", where)
				}
			}
			check("the router", atRouter.stop())
			if tt.arrives {
				check("the target", atTarget.stop())
			} else {
				require.Empty(t, atTarget.stop())
			}
		})
	}
	t.Run("the SYN never left", func(t *testing.T) {
		start := time.Now()
		o := probeIn(t, w.snd, ProbeSpec{ID: "t", Kind: KindTCP, Target: netip.MustParseAddr("10.201.1.99"), Port: greetPort, DeadlineMS: 300})
		t.Logf("%s %s src_port=%d err=%q (%s)", o.Outcome, o.Reason, o.Evidence.SrcPort, o.Evidence.ISNError, time.Since(start))
		require.Equal(t, Silent, o.Outcome, "no ARP answer within the deadline: as before, %s", o.Reason)
		require.NotZero(t, o.Evidence.SrcPort)
		require.False(t, o.Evidence.ISNCaptured)
		require.Contains(t, o.Evidence.ISNError, "not seen leaving")
		// A bound with slack for a loaded machine (it was 100 ms): it
		// catches a capture that waits on its own clock for a SYN that
		// never left, not a few milliseconds late.
		require.Less(t, time.Since(start), 300*time.Millisecond+2*time.Second, "learning the ISN never holds the probe past its deadline")
	})
}
