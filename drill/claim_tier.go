package drill

import (
	"cmp"
	"context"
	"fmt"
	"os/exec"
	"strings"
	"sync"

	"github.com/box-isolation/box/internal/accounts"
	"github.com/box-isolation/box/probes"
	"github.com/box-isolation/box/stack"
	"github.com/box-isolation/box/stack/access"
	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/model"
)

// C-TIER lives in claim_tier*.go: the claim, box-t and its judging (this
// file), the granted user (_user) and its attempts to leave boxnet
// (_escape).

// TierID is C-TIER: a granted user's box is isolated like any other, and
// the user cannot take it off boxnet.
const TierID ClaimID = "C-TIER"

var claimTier = Claim{
	ID: TierID, From: "box-t, minted by a granted local user through incus-user with port isolation turned off in its own NIC, and that user",
	To:       "peer boxes, the host, the LAN, the resolver; Incus (other networks, host paths, proxies, privilege)",
	Channels: []Channel{ChannelARP, ChannelICMP, ChannelTCP, ChannelUDP, ChannelBroadcast, ChannelV6LinkLocal, ChannelV6AllNodes, ChannelMDNS, ChannelLLMNR, ChannelSSDP, ChannelDNS, ChannelIsolOff, ChannelRestriction, ChannelCensus},
	Expect:   "isolated like box-a (the host's layers hold though the user may turn port isolation off, and the census names that box); every attempt to leave boxnet refused by Incus for the restriction",
	Layers:   []model.LayerID{model.LayerTier},
	Why:      "a granted user holds an Incus socket: the grant's narrowing to boxnet and the host-owned layers are all that stand between their agent and the host's networks",
	Modes:    Modes{World: Runs, Host: OptIn, Why: "it makes (and deletes) a local user account on the host"},
	Evidence: []Evidence{EvidenceProbes, EvidenceRequests, EvidenceCensus},
	setup:    grantTierUser,
	mint:     mintTierBox,
	build:    buildTier,
	requests: tryEscapes,
	judge:    judgeTier,
	// box-t's port isolation is off by the drill's own doing: the census
	// naming it is C-TIER's evidence, no other claim's failure.
	keepFindings: keepTierFindings,
	clean:        cleanTier,
}

// buildTier: box-t's own controls (the canary, DNS at the gateway), then
// from box-t what box-a fires for C-SIBLING, C-HOST, C-LAN and C-NAMES.
func buildTier(b *builder) {
	t := b.t
	if !t.T.IP.IsValid() {
		return
	}
	// box-t's blocks prove something only if it can reach what a box may
	// (box-a's baselines say nothing about it).
	b.probe(Action{Claim: TierID, Channel: ChannelTCP, From: PlaceT, Target: "canary " + t.Canary.String(), TargetKey: "internet", Expect: ExpectReach},
		probes.ProbeSpec{Kind: probes.KindTCP, Target: t.Canary, Port: t.CanaryTCP, Via: t.Subnet}).Greeting = t.CanaryGreeting
	b.probe(Action{Claim: TierID, Channel: ChannelDNS, From: PlaceT, Target: "gateway " + t.Gateway.String() + " " + t.PublicName, TargetKey: "gateway", Expect: ExpectResolve},
		probes.ProbeSpec{Kind: probes.KindDNS, Target: t.Gateway, Port: 53, Name: t.PublicName, QType: "A", Via: t.Subnet})
	b.siblingFrom(TierID, t.T)
	b.hostFrom(TierID, t.T)
	b.lanFrom(TierID, t.T)
	b.namesFrom(TierID, t.T)
}

// C-TIER: a granted user's box is isolated as every box is, and the user
// cannot take it off boxnet. The drill makes a throwaway local user,
// grants them (box grant's code), and as that user, through incus-user,
// mints box-t with port isolation turned off in its own NIC: Incus's
// project restrictions do not cover that key, so Incus must allow it, and
// the host's layers (the bridge drop, the ports' flag the watcher keeps)
// must still keep box-t from its siblings; the census must name it. Then,
// still as the user, it tries to leave boxnet: each attempt must be
// refused by Incus for the restriction, and a refusal for another reason
// proves nothing. At teardown the user is purged and deleted.

// tierRun is the granted user's side of a run: C-TIER's state.
type tierRun struct {
	user    accounts.User
	gid     uint32
	project string
	decoy   string // a managed network the user must not reach
	client  *incus.Client
	// box is box-t's instance, once minted; findings are the census's
	// findings on its port isolation, which the drill turned off: C-TIER's
	// evidence, kept out of the run's findings (keepTierFindings).
	box      string
	findings []model.Finding
	// results are the non-packet actions, judged as they ran.
	results []Result
	// stopWatcher stops the port watcher the drill ran for the grant and
	// box-t, if it ran one.
	stopWatcher func()
}

// grantTierUser makes the run's tier user, grants them and makes the
// decoy network, before any box is minted: incusd's network create lists
// the host's links, and failed when a starting box's went away under it
// ("failed to delete bridge children interfaces"). A host without what
// C-TIER needs skips it, saying what is missing.
func grantTierUser(ctx context.Context, r *run) error {
	cfg := &r.cfg
	if why := tierPrereqs(cfg.Host); why != "" {
		r.skip(TierID, why)
		return nil
	}
	t := keep(r.state, TierID, &tierRun{})
	name := "bxd" + r.rep.RunID
	cfg.logf("tier: making local user %s, granting it, minting box-t as it through incus-user", name)
	out, err := exec.CommandContext(ctx, "useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", "--comment", tierUserComment+" "+r.rep.RunID+tierUserHost(cfg.Host), name).CombinedOutput()
	if err != nil {
		return fmt.Errorf("tier: useradd %s: %w: %s", name, err, strings.TrimSpace(string(out)))
	}
	r.later(func(ctx context.Context) error { return removeTierUser(ctx, cfg.Host, name) })
	u, err := accounts.Lookup(name)
	if err != nil {
		return fmt.Errorf("tier: %w", err)
	}
	t.user, t.project = u, stack.TierProject(u.UID)
	r.projects[PlaceT] = t.project
	group := cmp.Or(cfg.Host.Tier.Group, stack.DefaultTierGroup)
	if t.gid, err = accounts.GroupGID(group); err != nil {
		return fmt.Errorf("tier: %w", err)
	}

	// A granted user's boxes join the port set through the watcher; run
	// one for the grant and box-t, as box-guard-and-serve.service does on a host,
	// and stop it before the mutations (its resync would undo them).
	stop, err := ensureWatcher(ctx, cfg.Host, cfg.logf)
	if err != nil {
		return fmt.Errorf("tier: %w", err)
	}
	t.stopWatcher = sync.OnceFunc(stop)
	r.later(func(context.Context) error { t.stopWatcher(); return nil })
	if _, err := access.NewManager(cfg.Host).Grant(ctx, access.GrantRequest{User: u, Group: group}); err != nil {
		return fmt.Errorf("tier: %w", err)
	}
	t.client = cfg.Host.AsUser(u, t.gid)

	t.decoy = name
	err = cfg.Host.CreateNetwork(ctx, incus.NetworksPost{Name: t.decoy, Type: "bridge", Description: "box drill decoy " + r.rep.RunID,
		Config: map[string]string{"ipv4.address": "none", "ipv6.address": "none"}})
	if err != nil {
		return fmt.Errorf("tier: the decoy network: %w", err)
	}
	r.later(func(ctx context.Context) error { return deleteNetworkEventually(ctx, cfg.Host.Incus, t.decoy) })
	return nil
}

// mintTierBox mints box-t as the granted user. A box-t Incus refuses
// makes C-TIER inconclusive, not the run fail.
func mintTierBox(ctx context.Context, r *run) error {
	cfg := &r.cfg
	var t *tierRun
	r.locked(func() { t = stateOf[tierRun](r.state, TierID) })
	if t == nil {
		return nil // skipped
	}
	defer t.stopWatcher()
	box := r.name(PlaceT, r.boxName("t"))

	// box-t, with port isolation off in its own NIC: the one key of the
	// NIC the project's restrictions leave to the user.
	a := Action{ID: "t-isolation-off", Claim: TierID, Channel: ChannelIsolOff, From: placeUser, Target: "create " + box + " with security.port_isolation=false",
		TargetKey: "incus", Expect: ExpectReach}
	conf := map[string]string{model.Current.Tag: "1", TagDrill: "1", TagRun: r.rep.RunID, model.StampTemplate: "drill-probe", model.StampVersion: cfg.Version}
	// In a template run, the user's box is the template's, as theirs would be.
	req, err := r.mintRequest(box, "", true)
	if err != nil {
		return fmt.Errorf("tier: %w", err)
	}
	if req.UserData != "" {
		conf["cloud-init.user-data"] = req.UserData
	}
	err = t.client.Instances().Create(ctx, incus.InstancesPost{Name: box, Type: probeType,
		Config:   conf,
		Devices:  map[string]map[string]string{"eth0": {"type": "nic", "name": "eth0", "network": model.Current.Network, "security.port_isolation": "false"}},
		Profiles: []string{model.Current.Profile}, Source: r.localImage(), Start: true})
	if err != nil {
		// Not the premise C-TIER tests: the escape attempts still run.
		t.results = append(t.results, Result{Action: a, Verdict: Inconclusive, Observed: "refused",
			Evidence: "Incus refused the user a box with port isolation off (" + err.Error() + "): the claim that it would not help is untested"})
		return nil
	}
	t.results = append(t.results, Result{Action: a, Verdict: Pass, Observed: "allowed",
		Evidence: "Incus let the granted user mint " + box + " with port isolation off; the probes from it show whether that helped"})
	th := *cfg.Host
	th.Incus = cfg.Host.Incus.Project(t.project)
	if err := placeTierBox(ctx, th.Incus, box, r.members.local(), cfg.logf); err != nil {
		return fmt.Errorf("tier: %w", err)
	}
	// boxEnd waits for its lease, which pins it: until then it could not
	// reach its package mirror.
	e, err := boxEnd(ctx, &th, PlaceT, box)
	if err != nil {
		return fmt.Errorf("tier: %w", err)
	}
	if err := r.waitProvisioned(ctx, th.Incus, box); err != nil {
		return fmt.Errorf("tier: %w", err)
	}
	t.box = e.Instance
	r.addBox(e)
	return nil
}

// judgeTier judges C-TIER: its probes from box-t (rs), the non-packet
// actions, the census naming box-t, and the stack channel.
func judgeTier(r *run, c Claim, rs []Result) []Result {
	t := stateOf[tierRun](r.state, TierID)
	a := Action{ID: "t-census", Claim: c.ID, Channel: ChannelCensus, From: PlaceVerify, Target: "box-t named by the census", TargetKey: string(ChannelCensus), Expect: ExpectPresent}
	if t == nil {
		return rs
	}
	rs = placeControlled(rs, PlaceT)
	rs = append(rs, t.results...)
	if e, ok := r.ends[PlaceT]; ok {
		named := t.findings
		if len(named) > 0 {
			rs = append(rs, Result{Action: a, Verdict: Pass, Observed: "named", Evidence: "the census names it: " + named[0].Problem})
		} else {
			rs = append(rs, Result{Action: a, Verdict: Fail, Observed: "not named",
				Evidence: "the census did not name " + e.Instance + ", whose NIC has port isolation off: doctor is blind to a granted user's box"})
		}
	}
	return append(rs, stackResults(c, r.findings)...)
}

// tierBoxFindings are the census findings on box-t's port isolation: the
// drill turned it off on purpose, so they are C-TIER's evidence, not
// C-FLEET's failure.
func tierBoxFindings(fs []model.Finding, project, box string) []model.Finding {
	var out []model.Finding
	for _, f := range fs {
		if f.Layer == model.LayerFleet && strings.Contains(f.Object, box) && strings.Contains(f.Object, project) && strings.Contains(f.Problem, "port isolation off") {
			out = append(out, f)
		}
	}
	return out
}

// boxFindings picks those findings for this run's box-t (none when there
// is no box-t).
func (t *tierRun) boxFindings(fs []model.Finding) []model.Finding {
	if t == nil || t.box == "" {
		return nil
	}
	return tierBoxFindings(fs, t.project, t.box)
}

// keepTierFindings keeps the census findings on box-t's port isolation as
// C-TIER's evidence (keepFindings).
func keepTierFindings(s claimStates, fs []model.Finding) ([]model.Finding, string) {
	t := stateOf[tierRun](s, TierID)
	if t == nil {
		return nil, ""
	}
	if t.findings = t.boxFindings(fs); len(t.findings) == 0 {
		return nil, ""
	}
	return t.findings, fmt.Sprintf("box-t's NIC has port isolation off, as the drill made it (the census named it: %s)", t.findings[0].Object)
}

// placeTierBox moves box-t, on a cluster, to the member the drill talks
// to: Incus placed it for its user (whose project may not pick a
// member), and its probes are judged by that member's witnesses; from
// another member some of them could not fail (that member's uplink is not
// the local one's).
func placeTierBox(ctx context.Context, c *incus.Client, box, local string, logf func(string, ...any)) error {
	if local == "" {
		return nil
	}
	inst, _, err := c.Instances().Get(ctx, box)
	if err != nil {
		return err
	}
	if inst.Location == local {
		return nil
	}
	logf("tier: Incus placed %s on %s; moving it to %s, where the drill's witnesses are", box, inst.Location, local)
	if err := c.Instances().SetState(ctx, box, "stop", 0, true); err != nil {
		return err
	}
	if err := c.Instances().Move(ctx, box, local); err != nil {
		return err
	}
	return c.Instances().SetState(ctx, box, "start", 0, false)
}
