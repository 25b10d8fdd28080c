package probes

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// blockedPlan is n probes (TCP, UDP and ICMP in turn) at a target behind
// a drop rule, each with a 1 s deadline, under one 1.5 s plan deadline.
func blockedPlan(w *routedWorld, n int) string {
	var items []string
	for i := range n {
		switch i % 3 {
		case 0:
			items = append(items, fmt.Sprintf(`{"id":"p%d","kind":"tcp","target":"%s","port":%d,"deadline_ms":1000}`, i, w.tgtIP, greetPort))
		case 1:
			items = append(items, fmt.Sprintf(`{"id":"p%d","kind":"udp","target":"%s","port":%d,"deadline_ms":1000}`, i, w.tgtIP, echoPort))
		default:
			items = append(items, fmt.Sprintf(`{"id":"p%d","kind":"icmp","target":"%s","deadline_ms":1000}`, i, w.tgtIP))
		}
	}
	return `{"version":1,"deadline_ms":1500,"probes":[` + strings.Join(items, ",") + `]}`
}

// TestPrivilegedBlockedPlanWallTime: 100 blocked probes run concurrently,
// so the agent (a process in the sender namespace) takes about one probe
// deadline, not a hundred, and every probe reports silent.
func TestPrivilegedBlockedPlanWallTime(t *testing.T) {
	w := newRoutedWorld(t)
	w.setRule(t, w.tgtIP, ruleDrop)
	rep, wall, _ := startAgentIn(t, w.snd, blockedPlan(w, 100))()
	t.Logf("100 blocked probes, 1 s deadline each: %s wall", wall)
	require.Less(t, wall, 2*time.Second)
	require.Len(t, rep.Observations, 100)
	for _, o := range rep.Observations {
		require.Equal(t, Silent, o.Outcome, "%s: %s", o.ID, o.Reason)
	}
}

func BenchmarkBlockedPlan(b *testing.B) {
	w := newRoutedWorld(b)
	w.setRule(b, w.tgtIP, ruleDrop)
	plan := blockedPlan(w, 100)
	var worst time.Duration
	for b.Loop() {
		rep, wall, _ := startAgentIn(b, w.snd, plan)()
		if len(rep.Observations) != 100 {
			b.Fatalf("%d observations", len(rep.Observations))
		}
		for _, o := range rep.Observations {
			if o.Outcome != Silent {
				b.Fatalf("%s: %s %s", o.ID, o.Outcome, o.Reason)
			}
		}
		worst = max(worst, wall)
	}
	b.ReportMetric(worst.Seconds(), "worst-wall-s")
	if worst >= 2*time.Second {
		b.Fatalf("100 blocked probes took %s, want under 2s", worst)
	}
}
