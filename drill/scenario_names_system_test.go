package drill_test

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/drill"
	"github.com/box-isolation/box/fixtures/world"
)

// TestSystemNamesLANUpstream: a stack whose resolver forwards to the LAN's
// (an operator's BOX_DNS pointing at the office resolver) answers the LAN's
// internal names to every box, and C-NAMES says so.
func TestSystemNamesLANUpstream(t *testing.T) {
	cfg := config(t)
	restoreAfter(t, cfg)
	host := *cfg.Host
	host.Options.DNS = []netip.Addr{world.LANResolver}
	cfg.Host = &host
	cfg.Claims = []drill.Claim{claimOf(t, "C-NAMES")}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	rep, err := drill.Run(ctx, cfg)
	require.NoError(t, err)
	leaked := map[string]bool{}
	for _, r := range probeFailures(claim(t, rep, "C-NAMES")) {
		leaked[r.Target] = true
	}
	assert.True(t, leaked[world.InternalNames[0].Name], "an internal name of the LAN zone leaks: %v", leaked)
	assert.Equal(t, drill.Pass, claim(t, rep, "C-DNS").Verdict, "the public name still resolves (the LAN resolver answers it)")
	assert.Equal(t, drill.ExitViolated, rep.ExitCode)
}
