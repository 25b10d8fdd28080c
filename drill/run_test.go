package drill

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/drill/verdicts"
	"github.com/box-isolation/box/stack/model"
)

func TestCompareRuns(t *testing.T) {
	res := func(id string, claim ClaimID, ch Channel, v Verdict) verdicts.Result {
		return verdicts.Result{ID: id, Claim: claim, Channel: ch, From: PlaceA, TargetKey: string(PlaceB), Target: "box-b", Verdict: v}
	}
	rep := func(rs ...verdicts.Result) *Report {
		byClaim := map[ClaimID][]verdicts.Result{}
		var order []ClaimID
		for _, r := range rs {
			if _, ok := byClaim[r.Claim]; !ok {
				order = append(order, r.Claim)
			}
			byClaim[r.Claim] = append(byClaim[r.Claim], r)
		}
		out := &Report{}
		for _, c := range order {
			out.Claims = append(out.Claims, ClaimResult{Claim: verdicts.Claim{ID: c}, Results: byClaim[c]})
		}
		return out
	}
	clean := rep(res("p010", "C-SIBLING", "tcp", Pass), res("p011", "C-SIBLING", "arp", Pass),
		res("s-C-SIBLING", "C-SIBLING", ChannelStack, Pass), res("p020", "C-HOST", "tcp", Inconclusive))
	ms := []Mutation{{Name: "bridge-drop", Layers: []model.LayerID{"L-BRIDGEDROP"}}, {Name: "port-isolation", Layers: []model.LayerID{"L-PORTISO"}}}

	t.Run("a probe flipped", func(t *testing.T) {
		mutated := rep(res("p010", "C-SIBLING", "tcp", Fail), res("p011", "C-SIBLING", "arp", Pass),
			res("s-C-SIBLING-1", "C-SIBLING", ChannelStack, Fail), res("p020", "C-HOST", "tcp", Pass))
		out, unmatched := compareRuns(ms, clean, mutated)
		assert.Zero(t, unmatched)
		require.Len(t, out, 2, "one result per mutation")
		for _, m := range out {
			assert.True(t, m.Detected, m.Name)
			assert.Equal(t, []ClaimID{"C-SIBLING"}, m.Flipped)
			require.Len(t, m.Changed, 2, "the tcp probe, and C-HOST's inconclusive turned pass; never the stack channel")
			assert.Equal(t, ProbeChange{ID: "p010", Claim: "C-SIBLING", Channel: "tcp", From: PlaceA, Target: "box-b", Clean: Pass, Mutated: Fail}, m.Changed[0])
		}
	})
	t.Run("only the stack channel failed", func(t *testing.T) {
		mutated := rep(res("p010", "C-SIBLING", "tcp", Pass), res("p011", "C-SIBLING", "arp", Pass),
			res("s-C-SIBLING-1", "C-SIBLING", ChannelStack, Fail), res("p020", "C-HOST", "tcp", Inconclusive))
		out, _ := compareRuns(ms[:1], clean, mutated)
		require.Len(t, out, 1)
		assert.False(t, out[0].Detected, "Verify's finding is no proof that the drill can fail")
		assert.Empty(t, out[0].Flipped)
		assert.Empty(t, out[0].Changed)
		assert.NotNil(t, out[0].Changed, "an empty list, never null")
	})
	t.Run("a probe that was not passing in the clean run proves nothing", func(t *testing.T) {
		mutated := rep(res("p010", "C-SIBLING", "tcp", Pass), res("p020", "C-HOST", "tcp", Fail))
		out, _ := compareRuns(ms[:1], clean, mutated)
		assert.False(t, out[0].Detected)
		require.Len(t, out[0].Changed, 1, "the change is listed")
	})
	t.Run("matched by what a probe is, not by its id", func(t *testing.T) {
		// A host address more in the mutated run shifts every later id.
		mutated := rep(res("p009", "C-HOST", "tcp", Pass), res("p011", "C-SIBLING", "tcp", Fail), res("p012", "C-SIBLING", "arp", Pass))
		out, unmatched := compareRuns(ms[:1], clean, mutated)
		assert.True(t, out[0].Detected)
		assert.Equal(t, []ClaimID{"C-SIBLING"}, out[0].Flipped)
		assert.Zero(t, unmatched)
		extra := rep(res("p010", "C-SIBLING", "tcp", Pass), res("p099", "C-SIBLING", "tcp", Fail))
		_, unmatched = compareRuns(ms[:1], clean, extra)
		assert.Equal(t, 1, unmatched, "a second C-SIBLING tcp probe to box-b has no counterpart")
	})
	// Detection is tied to the mutation's layers and to packets: a probe
	// of a claim resting elsewhere, or a census or request result, flipping
	// proves nothing about the layer.
	t.Run("a flip of a claim that does not rest on the layer", func(t *testing.T) {
		clean := rep(res("p010", "C-SIBLING", "tcp", Pass), res("p020", "C-HOST", "tcp", Pass))
		mutated := rep(res("p010", "C-SIBLING", "tcp", Pass), res("p020", "C-HOST", "tcp", Fail))
		out, _ := compareRuns(ms[:1], clean, mutated) // bridge-drop: C-SIBLING's layer, not C-HOST's
		assert.False(t, out[0].Detected, "C-HOST rests on L-HOSTFW and L-ACL, not L-BRIDGEDROP")
		assert.Empty(t, out[0].Flipped)
		require.Len(t, out[0].Changed, 1, "the change is still listed")
	})
	t.Run("a census flip is no probe", func(t *testing.T) {
		fleet := []Mutation{{Name: "door-wide", Layers: []model.LayerID{model.LayerFleet}}}
		clean := rep(res("t-census", "C-TIER", ChannelCensus, Pass), res("f-C-FLEET", "C-FLEET", ChannelCensus, Pass))
		mutated := rep(res("t-census", "C-TIER", ChannelCensus, Fail), res("f-C-FLEET", "C-FLEET", ChannelCensus, Fail))
		out, _ := compareRuns(fleet, clean, mutated)
		assert.False(t, out[0].Detected, "the census is its own channel, not a probe")
		assert.Len(t, out[0].Changed, 2)
	})
	t.Run("a layer only Incus's answers show", func(t *testing.T) {
		tier, ok := func() (Mutation, bool) {
			ms, err := SelectMutations([]string{"tier"})
			return ms[0], err == nil
		}()
		require.True(t, ok)
		clean := rep(res("t-net-create", "C-TIER", ChannelRestriction, Pass), res("p050", "C-TIER", "tcp", Pass))
		mutated := rep(res("t-net-create", "C-TIER", ChannelRestriction, Fail), res("p050", "C-TIER", "tcp", Pass))
		out, _ := compareRuns([]Mutation{tier}, clean, mutated)
		assert.True(t, out[0].Detected)
		assert.Equal(t, EvidenceRequests, out[0].DetectedBy)
		assert.Equal(t, []ClaimID{"C-TIER"}, out[0].Flipped)
		// A request flip shows no layer a packet path holds.
		out, _ = compareRuns([]Mutation{{Name: "tier-as-probes", Layers: []model.LayerID{model.LayerTier}}}, clean, mutated)
		assert.False(t, out[0].Detected)
	})
}

// A baseline stands in for the clean run only when it is one: a mutated
// run is refused as a baseline before anything is minted.
func TestBaselineMustBeClean(t *testing.T) {
	ms := []Mutation{{Name: "bridge-drop", Layers: []model.LayerID{"L-BRIDGEDROP"}}}
	_, err := Run(context.Background(), Config{Mutations: ms, Baseline: &Report{RunID: "abc123", Mutations: []string{"route"}}})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "the baseline run abc123 had mutations (route)")
}
