package drill_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/drill"
	"github.com/box-isolation/box/stack/model"
)

// TestSystemKernel: C-KERNEL holds on the stack (its clean run first),
// and each of its mutations on clone-a flips it to fail through the
// agent's own evidence in clone-a, on the channel that break shows; a
// unix-char device added to the box-net profile by hand, which no
// mutation makes, fails it in every box.
func TestSystemKernel(t *testing.T) {
	kernelOnly := func(t *testing.T, mutations ...string) drill.Config {
		cfg := config(t, mutations...)
		cfg.Claims = []drill.Claim{claimOf(t, drill.KernelID)}
		return cfg
	}
	base := baseline(t, kernelOnly(t))
	for _, tc := range []struct {
		mutation string
		channels []drill.Channel // each must fail from clone-a
	}{
		{"privileged", []drill.Channel{drill.ChannelIDMap, drill.ChannelCapabilities}},
		{"host-path", []drill.Channel{drill.ChannelMounts}},
		{"raw-lxc", []drill.Channel{drill.ChannelMounts}},
		{"idmap-root", []drill.Channel{drill.ChannelIDMap, drill.ChannelCorePattern, drill.ChannelProcSys}},
		{"unix-char", []drill.Channel{drill.ChannelDevices, drill.ChannelMounts}},
		{"guest-api", []drill.Channel{drill.ChannelGuestAPI}},
	} {
		t.Run(tc.mutation, func(t *testing.T) {
			cfg := kernelOnly(t, tc.mutation)
			cfg.Baseline = base
			rep := run(t, cfg)
			assertProvenByProbes(t, rep, drill.KernelID)
			failed := map[drill.Channel]bool{}
			for _, r := range probeFailures(claim(t, rep, drill.KernelID)) {
				assert.Equal(t, drill.PlaceC, r.From, "only the mutated clone-a fails: %s %s", r.Channel, r.Evidence)
				failed[r.Channel] = true
				t.Logf("%s %s: %s", r.From, r.Channel, r.Evidence)
			}
			for _, ch := range tc.channels {
				assert.True(t, failed[ch], "%s fails on %s: %v", tc.mutation, ch, failed)
			}
		})
	}
	t.Run("a unix-char device added to the profile by hand", func(t *testing.T) {
		cfg := config(t)
		restoreAfter(t, cfg)
		ensured(t, cfg)
		inHost(t, cfg, "incus", "profile", "device", "add", model.Current.Profile, "handkmsg", "unix-char", "source=/dev/kmsg", "path=/dev/kmsg")
		t.Cleanup(func() {
			inHost(t, cfg, "incus", "profile", "device", "remove", model.Current.Profile, "handkmsg")
		})
		cfg.NoSetup = true
		cfg.Claims = []drill.Claim{claimOf(t, drill.KernelID)}
		rep := run(t, cfg)
		kernel := claim(t, rep, drill.KernelID)
		require.Equal(t, drill.Fail, kernel.Verdict)
		boxes := map[drill.Place]bool{}
		for _, r := range probeFailures(kernel) {
			if r.Channel == drill.ChannelDevices {
				assert.Contains(t, r.Evidence, "c 1:11 /dev/kmsg")
				boxes[r.From] = true
			}
		}
		for _, p := range []drill.Place{drill.PlaceA, drill.PlaceB, drill.PlaceC, drill.PlaceL, drill.PlaceK} {
			assert.True(t, boxes[p], "the node is seen in %s", p)
		}
	})
}
