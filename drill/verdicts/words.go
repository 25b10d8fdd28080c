package verdicts

// The words a report is written in: typed, so a claim's ID is never taken
// for a place's name or a channel's. The engine (package drill) lists
// their values once: its claims, channels, places and expectations.

// ClaimID names a claim (docs/claims.md): "C-" and a word. The IDs are
// constants in the claims' own files (drill/claim_*.go), and nowhere else.
type ClaimID string

// Channel is what an action probes over (a protocol, or a kind of
// evidence that is not a packet: the stack, the census, a request).
type Channel string

// Place is where a plan runs or a result comes from: a probe box, a
// namespace of the world, the host, or a source that is no agent
// ("verify", the granted user).
type Place string

// PlaceVerify is the source of the stack's Verify and census results: no
// agent's.
const PlaceVerify Place = "verify"

// Expectation is what an action must observe to pass.
type Expectation string

// Evidence is where a claim's verdict comes from. Every claim has Verify's
// findings besides (the stack channel).
type Evidence string

const (
	EvidenceProbes   Evidence = "probes"   // packets the agents sent, judged at their targets
	EvidenceCensus   Evidence = "census"   // the stack's census of every instance and port on the bridge
	EvidenceRequests Evidence = "requests" // requests to Incus, and whether it refused them
)

// Verdict is the outcome of an action or a claim.
type Verdict string

const (
	Pass         Verdict = "pass"
	Fail         Verdict = "fail"
	Inconclusive Verdict = "inconclusive"
	Skipped      Verdict = "skipped"
)

// Strings turns typed words (claim IDs, channels, places, layers) into
// plain strings, for output.
func Strings[T ~string](ws []T) []string {
	out := make([]string, len(ws))
	for i, w := range ws {
		out[i] = string(w)
	}
	return out
}
