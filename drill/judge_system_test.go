package drill_test

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/box-isolation/box/drill"
)

// TestSystemWitnessControlSuppressed: with the host's control frames
// dropped on the bridge, the boxes' witnesses cannot prove they were
// capturing, and their probes are inconclusive, never passed.
func TestSystemWitnessControlSuppressed(t *testing.T) {
	cfg := config(t)
	cfg.Claims = []drill.Claim{claimOf(t, "C-SIBLING")}
	table := "drilltest"
	inHost(t, cfg, "nft", "add", "table", "bridge", table)
	t.Cleanup(func() { inHost(t, cfg, "nft", "delete", "table", "bridge", table) })
	inHost(t, cfg, "nft", "add", "chain", "bridge", table, "out", "{ type filter hook output priority 0 ; }")
	inHost(t, cfg, "nft", "add", "rule", "bridge", table, "out", "ether", "type", "0x88b5", "drop")

	rep := run(t, cfg)
	assert.Equal(t, drill.ExitInconclusive, rep.ExitCode)
	sib := claim(t, rep, "C-SIBLING")
	assert.Equal(t, drill.Inconclusive, sib.Verdict)
	n := 0
	for _, r := range sib.Results {
		if r.Channel == drill.ChannelStack {
			continue
		}
		n++
		assert.Equal(t, drill.Inconclusive, r.Verdict, "%s %s", r.Channel, r.Target)
		assert.Contains(t, r.Evidence, "positive control", "%s %s", r.Channel, r.Target)
	}
	assert.Greater(t, n, 8)
}
