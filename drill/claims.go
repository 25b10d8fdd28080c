// Package drill proves box's isolation claims with raw packets fired from
// inside boxes. It is modelled on cilium-cli's connectivity checks: a Claim
// (docs/claims.md) is one value in its own file (claim_<name>.go) that says
// what it states, the layers it rests on, the modes it runs in and how it
// gathers its evidence; its probes are Actions, one probe each from a
// source to a target over one channel, each carrying its expected result;
// judging turns an action's observations into a Verdict. An unexpected
// success is a failure with its evidence; an empty or ambiguous answer is
// inconclusive, never a pass; and a blocked verdict rests on two sides: the
// sender saw nothing and a witness (or listener, or counter) at the target
// saw nothing.
//
// Run goes through the phases of docs/claims.md, "A run": preflight (clean the
// drill's own leftovers), stack (ensure, or only verify), mint probe boxes
// (two peers and a clone, and what each claim prepares for itself), push
// the agent, all probes concurrently under one deadline, verdicts, and
// teardown of its own boxes, also when the caller's context is cancelled.
//
// The claims are listed once, in Catalogue; drill list, the build order,
// the judging order and --claim selection all read that table. The engine
// (the phases, the builder, judging, the report) names no claim: a claim
// declares what it needs of it (Claim's hooks) and keeps what it learns
// over a run under its own ID (claimStates). A claim with several
// concerns spreads over claim_<name>_<concern>.go.
package drill

import (
	"context"
	"fmt"
	"path"
	"slices"
	"strings"

	"github.com/box-isolation/box/drill/verdicts"
	"github.com/box-isolation/box/probes"
	"github.com/box-isolation/box/stack/model"
)

// Claim is one isolation claim of docs/claims.md, with what it does in a
// run. The exported fields are the claim as people read it (drill list,
// the report); the phases are how it gathers and judges its evidence.
type Claim struct {
	ID       ClaimID         `json:"id"`
	From     string          `json:"from"`
	To       string          `json:"to"`
	Channels []Channel       `json:"channels"`
	Expect   string          `json:"expect"`
	Layers   []model.LayerID `json:"layers"`
	Why      string          `json:"why"`
	// Baseline claims are positive controls: if one of their probes fails,
	// every blocked claim of the run is inconclusive (a failure of their
	// stack channel alone fails them, and leaves the rest to their probes).
	Baseline bool `json:"baseline"`
	// Modes says where the claim runs (Resolve applies it).
	Modes Modes `json:"-"`
	// Evidence is where its verdict comes from besides Verify's findings.
	Evidence []Evidence `json:"-"`

	// The phases a claim may take part in, each optional.
	//
	// setup runs before any box is minted, one claim after another: what
	// must not overlap the mints (a user, a network). Its skips and
	// errors are as mint's.
	setup func(ctx context.Context, r *run) error
	// mint mints the claim's own box (and what it needs: a user, a
	// service), side by side with the common probe boxes and the other
	// claims' mints: it adds to the run only through r's locked methods
	// (name, addBox, locked, skip, later) and reads none of the others'
	// boxes. What the host cannot offer it records as the claim's skip
	// reason (r.skip); an error stops the run.
	mint func(ctx context.Context, r *run) error
	// prepare runs once every probe box exists: it opens a door, reads
	// the boxes' config, starts a stand-in. Its skips and errors are as
	// mint's.
	prepare func(ctx context.Context, r *run) error
	// watch starts what runs beside the probes (the neighbour table), and
	// returns what stops it.
	watch func(r *run) (stop func())
	// build adds the claim's actions to the scenario.
	build func(b *builder)
	// requests runs after the mutations: attempts through Incus.
	requests func(ctx context.Context, r *run)
	// after runs once the probes ended, before judging: what is read or
	// done at a target once they are over (C-SPOOF's DHCP server's lease
	// file, and a box minted after the lies).
	after func(ctx context.Context, r *run)
	// refine adds to one judged action what the claim knows beyond its
	// observations (the host's neighbour table over the probe phase).
	refine func(r *run, res Result) Result
	// judge turns the claim's judged actions into its results; nil means
	// judgeProbes: the actions and the stack channel.
	judge func(r *run, c Claim, rs []Result) []Result

	// What the engine asks of a claim besides its phases, each optional.
	//
	// clean removes what an aborted run of the claim left on the host (a
	// user, a namespace): at every run's preflight, whatever is selected.
	clean func(ctx context.Context, cfg *Config) error
	// inputs are what the claim needs the drill to read off the host for
	// the scene, each with what the claim loses when the drill could not
	// ("" when the note about it says all): such a note is the claim's,
	// under its ID.
	inputs map[sceneInput]string
	// apart takes the probes the claim needs run one box at a time, after
	// the others, out of the plans into plans of their own.
	apart func(plans map[Place]*probes.Plan) (rest, apart map[Place]*probes.Plan)
	// keepFindings takes, from Verify's findings, those the drill caused
	// on purpose for the claim (box-t's port isolation, off), keeps them
	// as its evidence, and says why for the report: they fail no other
	// claim.
	keepFindings func(s claimStates, fs []model.Finding) (kept []model.Finding, why string)
}

// claimStates is what each claim keeps over a run (its user and box, its
// door, what it read at a target), under its ID: the engine holds it for
// the claims and never looks inside.
type claimStates map[ClaimID]any

// stateOf is what claim id keeps in s, nil until it kept something (keep).
func stateOf[T any](s claimStates, id ClaimID) *T {
	v, _ := s[id].(*T)
	return v
}

// keep has claim id keep v in s, and returns v.
func keep[T any](s claimStates, id ClaimID, v *T) *T {
	s[id] = v
	return v
}

// Reported is the claim as a report shows it.
func (c Claim) Reported() verdicts.Claim {
	return verdicts.Claim{ID: c.ID, From: c.From, To: c.To, Channels: c.Channels, Expect: c.Expect, Layers: c.Layers, Why: c.Why, Baseline: c.Baseline}
}

// Catalogue is every claim, in report order: the order they are built,
// judged and listed in.
var Catalogue = []Claim{
	claimEgress, claimDNS, claimDHCP,
	claimSibling, claimHost, claimLAN, claimNames, claimV6, claimInbound,
	claimClone, claimSpoof, claimFleet, claimTier, claimAllow, claimExpose,
	claimNested, claimKernel,
}

// ClaimByID finds a claim.
func ClaimByID(id ClaimID) (Claim, bool) {
	i := slices.IndexFunc(Catalogue, func(c Claim) bool { return c.ID == id })
	if i < 0 {
		return Claim{}, false
	}
	return Catalogue[i], true
}

// judgeProbes is a claim's default judging: its actions, and the stack
// channel beside them when there are any.
func judgeProbes(r *run, c Claim, rs []Result) []Result {
	if len(rs) == 0 {
		return rs
	}
	return append(rs, stackResults(c, r.findings)...)
}

// Mode is where a run happens.
type Mode string

// The modes: the hermetic world (the default) and a real host (--host).
const (
	ModeWorld Mode = "world"
	ModeHost  Mode = "host"
)

func (c Claim) availability(m Mode) Availability {
	if m == ModeHost {
		return c.Modes.Host
	}
	return c.Modes.World
}

// ModeNote says, for people, how mode m takes the claim when it is not
// simply run: "" when it is.
func (c Claim) ModeNote(m Mode) string {
	switch c.availability(m) {
	case OptIn:
		return fmt.Sprintf("in %s mode only when named (--claim %s) or recorded (--record): %s", m, c.ID, c.Modes.Why)
	case Never:
		return fmt.Sprintf("never in %s mode: %s", m, c.Modes.Why)
	}
	return ""
}

// Selection is the claims a run tests and those it leaves out, with why.
type Selection struct {
	Claims []Claim
	// Left says, for every claim of the catalogue not in Claims, why.
	Left map[ClaimID]string
	// Whole says no pattern narrowed the selection: every claim the mode
	// runs is in Claims.
	Whole bool
}

// Resolve picks the claims of a run in mode m from --claim patterns
// (include; "!ID" excludes) and --skip patterns: IDs or globs (path.Match
// syntax), case-insensitive. No include pattern selects every claim the
// mode runs. A claim the mode runs only on request (OptIn) is selected
// only when a pattern names it (matches it and no other claim), or with
// optIn (a run recorded for a release: every claim the mode can run). A claim the
// mode cannot run (Never) that a pattern names is an error saying why; one
// a wider pattern matches is left out, with the reason. A pattern that
// matches no claim is an error, so a typo never silently drops a claim.
func Resolve(m Mode, include, skip []string, optIn bool) (Selection, error) {
	var incl, excl []string
	for _, p := range include {
		if strings.HasPrefix(p, "!") {
			excl = append(excl, p[1:])
		} else {
			incl = append(incl, p)
		}
	}
	excl = append(excl, skip...)
	for _, p := range append(slices.Clone(incl), excl...) {
		if len(matching(p)) == 0 {
			return Selection{}, fmt.Errorf("claim pattern %q matches no claim (drill list shows them)", p)
		}
	}
	s := Selection{Left: map[ClaimID]string{}, Whole: len(incl) == 0 && len(excl) == 0}
	for _, c := range Catalogue {
		named := slices.ContainsFunc(incl, func(p string) bool { return names(p, c.ID) })
		switch {
		case len(incl) > 0 && !match(incl, c.ID):
			s.Left[c.ID] = "not selected (--claim); run without it to include it"
			continue
		case match(excl, c.ID):
			s.Left[c.ID] = "left out (--skip or --claim !ID); run without it to include it"
			continue
		}
		switch c.availability(m) {
		case Never:
			if named {
				return Selection{}, fmt.Errorf("%s does not run in %s mode: %s; drop it from --claim", c.ID, m, c.Modes.Why)
			}
			s.Left[c.ID] = fmt.Sprintf("not run in %s mode: %s", m, c.Modes.Why)
			continue
		case OptIn:
			if !named && !optIn {
				s.Left[c.ID] = fmt.Sprintf("in %s mode only when named (--claim %s): %s", m, c.ID, c.Modes.Why)
				continue
			}
		}
		s.Claims = append(s.Claims, c)
	}
	if len(s.Claims) == 0 {
		return Selection{}, fmt.Errorf("the selection leaves no claim to test in %s mode (drill list shows them)", m)
	}
	return s, nil
}

// NeverIn is the claims mode m cannot run, with why: a host-mode run
// skips them, and the world (make test) proves them.
func NeverIn(m Mode) map[ClaimID]string {
	never := map[ClaimID]string{}
	for _, c := range Catalogue {
		if c.availability(m) == Never {
			never[c.ID] = c.Modes.Why
		}
	}
	return never
}

// Selected reports whether the selection runs a claim.
func (s Selection) Selected(id ClaimID) bool {
	return slices.ContainsFunc(s.Claims, func(c Claim) bool { return c.ID == id })
}

// match reports whether one of the patterns matches id.
func match(patterns []string, id ClaimID) bool {
	for _, p := range patterns {
		if ok, _ := path.Match(strings.ToUpper(p), string(id)); ok {
			return true
		}
	}
	return false
}

// matching is every claim a pattern matches.
func matching(p string) []ClaimID {
	var out []ClaimID
	for _, c := range Catalogue {
		if match([]string{p}, c.ID) {
			out = append(out, c.ID)
		}
	}
	return out
}

// names reports whether a pattern names one claim: it matches that claim
// and no other.
func names(p string, id ClaimID) bool {
	m := matching(p)
	return len(m) == 1 && m[0] == id
}
