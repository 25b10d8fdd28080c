package drill

import "github.com/box-isolation/box/stack/model"

// NamesID is C-NAMES: a box's resolver tells it no private name.
const NamesID ClaimID = "C-NAMES"

var claimNames = Claim{
	ID: NamesID, From: "box",
	To:       "its resolver: sibling names, the host's hosts file, hostname and search domains, PTRs of host and LAN addresses, a LAN resolver's names",
	Channels: []Channel{ChannelDNS},
	Expect:   "no private name resolves (a name the pinned public upstream answers the same is public)",
	Layers:   []model.LayerID{model.LayerDNS},
	Why:      "a name is the first step to a target, and a resolver that answers private names tells a box what the host knows",
	Modes:    everywhere, Evidence: []Evidence{EvidenceProbes},
	// box-a asks every question, each compared with the public upstream
	// asked from the host (scenario_names.go, judged by judgeNoName).
	build: func(b *builder) { b.namesFrom(NamesID, b.t.A) },
	// The names it asks: a hosts file not read, or names left out, are
	// names not asked (the note says so).
	inputs: map[sceneInput]string{inputNames: ""},
}
