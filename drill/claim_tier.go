package drill

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"os/user"
	"slices"
	"strings"
	"time"

	"github.com/box-isolation/box/internal/accounts"
	"github.com/box-isolation/box/probes"
	"github.com/box-isolation/box/stack"
	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/model"
)

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
	prepare:  mintTierBox,
	build:    buildTier,
	requests: tryEscapes,
	judge:    judgeTier,
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

// tierUserComment marks the accounts the drill makes, so a later run finds
// an aborted run's and removes them, and nothing else; tierUserHost
// names the host (a world's namespace) whose run made it, so a run in one
// world never removes the user of a run in another.
const tierUserComment = "box drill C-TIER throwaway"

// tierUserHost is the part of a tier user's comment naming its host.
func tierUserHost(h *stack.Host) string {
	if h.NetNS != "" {
		return " on " + h.NetNS
	}
	return " on the host"
}

// tierRun is the granted user's side of a run.
type tierRun struct {
	user    accounts.User
	gid     uint32
	project string
	decoy   string // a managed network the user must not reach
	client  *incus.Client
	// results are the non-packet actions, judged as they ran.
	results []Result
}

// tierPrereqs says what this machine lacks for C-TIER ("" when nothing).
func tierPrereqs(h *stack.Host) string {
	if _, err := os.Stat(h.UserSocket()); err != nil {
		return "no incus-user socket at " + h.UserSocket() + " (enable incus-user.socket; the world runs one)"
	}
	if _, err := accounts.GroupGID(stack.DefaultTierGroup); h.TierGroup == "" && err != nil {
		return err.Error()
	}
	for _, bin := range []string{"useradd", "userdel", "gpasswd"} {
		if _, err := exec.LookPath(bin); err != nil {
			return bin + " is not installed (the passwd package)"
		}
	}
	return ""
}

// mintTierBox makes the run's tier user, grants them and mints box-t as
// them. A host without what C-TIER needs skips it, saying what is missing;
// a box-t Incus refuses makes C-TIER inconclusive, not the run fail.
func mintTierBox(ctx context.Context, r *run) error {
	cfg := &r.cfg
	if why := tierPrereqs(cfg.Host); why != "" {
		r.skip(TierID, why)
		return nil
	}
	r.tier = &tierRun{}
	r.names[PlaceT] = r.boxName("t")
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
	t := r.tier
	t.user, t.project = u, stack.TierProject(u.UID)
	group := cmp.Or(cfg.Host.TierGroup, stack.DefaultTierGroup)
	if t.gid, err = accounts.GroupGID(group); err != nil {
		return fmt.Errorf("tier: %w", err)
	}

	// A granted user's boxes join the port set through the watcher; run
	// one for the grant and box-t, as box-ports.service does on a host,
	// and stop it before the mutations (its resync would undo them).
	stopWatcher, err := ensureWatcher(ctx, cfg.Host, cfg.logf)
	if err != nil {
		return fmt.Errorf("tier: %w", err)
	}
	defer stopWatcher()
	if _, err := cfg.Host.Grant(ctx, stack.GrantRequest{User: u, Group: group}); err != nil {
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

	// box-t, with port isolation off in its own NIC: the one key of the
	// NIC the project's restrictions leave to the user.
	box := r.names[PlaceT]
	a := Action{ID: "t-isolation-off", Claim: TierID, Channel: ChannelIsolOff, From: placeUser, Target: "create " + box + " with security.port_isolation=false",
		TargetKey: "incus", Expect: ExpectReach}
	conf := map[string]string{model.Current.Tag: "1", TagDrill: "1", TagRun: r.rep.RunID, stack.StampTemplate: "drill-probe", stack.StampVersion: cfg.Version}
	// In a template run, the user's box is the template's, as theirs would be.
	req, err := r.mintRequest(box, "", true)
	if err != nil {
		return fmt.Errorf("tier: %w", err)
	}
	if req.UserData != "" {
		conf["cloud-init.user-data"] = req.UserData
	}
	err = t.client.CreateInstance(ctx, incus.InstancesPost{Name: box, Type: probeType,
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
	if err := r.placeTierBox(ctx, th.Incus, box); err != nil {
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
	r.ends[PlaceT] = e
	r.rep.Boxes = append(r.rep.Boxes, *e)
	return nil
}

// ensureWatcher starts a port watcher in this process when none runs; the
// returned function stops it (and does nothing when one ran already).
func ensureWatcher(ctx context.Context, h *stack.Host, logf func(string, ...any)) (func(), error) {
	if _, running, err := h.WatcherRunning(); err != nil {
		return nil, err
	} else if running {
		return func() {}, nil
	}
	wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan error, 1)
	go func() { done <- h.WatchPorts(wctx, discard{}) }()
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, running, _ := h.WatcherRunning(); running {
			logf("tier: no port watcher ran; the drill runs one while it grants and mints box-t")
			return func() { cancel(); <-done }, nil
		}
		select {
		case err := <-done:
			cancel()
			return nil, fmt.Errorf("starting a port watcher: %w", err)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			cancel()
			<-done
			return nil, errors.New("the port watcher did not start within 5 s")
		}
	}
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

// escape is one attempt to leave boxnet and the refusal it must meet.
type escape struct {
	id, what, reason string
	// try makes the attempt as the user; undo takes a success back (as
	// the admin).
	try func(ctx context.Context) error
}

// tryEscapes makes the granted user's attempts to leave boxnet, after the
// mutations (a lifted restriction must show here).
func tryEscapes(ctx context.Context, r *run) {
	t := r.tier
	if t == nil || t.client == nil {
		return
	}
	box := r.names[PlaceT]
	if _, ok := r.ends[PlaceT]; !ok {
		// Without box-t the device attempts have no instance: the network
		// creation still runs.
		box = ""
	}
	withDevice := func(dev string, d map[string]string) func(context.Context) error {
		return func(ctx context.Context) error {
			inst, etag, err := t.client.Instance(ctx, box)
			if err != nil {
				return err
			}
			put := inst.Writable()
			if put.Devices == nil {
				put.Devices = map[string]map[string]string{}
			}
			put.Devices[dev] = d
			return t.client.UpdateInstance(ctx, box, put, etag)
		}
	}
	var escapes []escape
	if box != "" {
		escapes = append(escapes,
			escape{"t-nic-decoy", "a NIC on managed network " + t.decoy, "Network not allowed in project",
				withDevice("eth1", map[string]string{"type": "nic", "network": t.decoy, "name": "eth1"})},
			escape{"t-nic-bridged", "a NIC bridged straight onto " + model.Current.Network, "Only managed network devices are allowed",
				withDevice("eth1", map[string]string{"type": "nic", "nictype": "bridged", "parent": model.Current.Network, "name": "eth1"})},
			escape{"t-disk-host", "the host's / as a disk", "Attaching disks not backed by a pool is forbidden",
				withDevice("hostroot", map[string]string{"type": "disk", "source": "/", "path": "/mnt/host"})},
			escape{"t-proxy", "a proxy device to the host's loopback", "Proxy devices are forbidden",
				withDevice("door", map[string]string{"type": "proxy", "listen": "tcp:127.0.0.1:9", "connect": "tcp:127.0.0.1:22"})},
			escape{"t-privileged", "security.privileged=true", "Privileged containers are forbidden", func(ctx context.Context) error {
				inst, etag, err := t.client.Instance(ctx, box)
				if err != nil {
					return err
				}
				put := inst.Writable()
				put.Config = maps.Clone(put.Config)
				put.Config["security.privileged"] = "true"
				return t.client.UpdateInstance(ctx, box, put, etag)
			}},
		)
	}
	escapes = append(escapes, escape{"t-net-create", "a network of its own (" + t.decoy + "x)", "Network not allowed in project", func(ctx context.Context) error {
		return t.client.CreateNetwork(ctx, incus.NetworksPost{Name: t.decoy + "x", Type: "bridge", Config: map[string]string{"ipv4.address": "none", "ipv6.address": "none"}})
	}})
	for _, e := range escapes {
		a := Action{ID: e.id, Claim: TierID, Channel: ChannelRestriction, From: placeUser, Target: e.what, TargetKey: "incus", Expect: ExpectRefused}
		actx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err := e.try(actx)
		cancel()
		t.results = append(t.results, judgeEscape(a, e.reason, err))
		if err == nil {
			r.undoEscape(ctx, box)
		}
	}
}

// judgeEscape: refused for the restriction passes, allowed fails, refused
// for anything else proves nothing.
func judgeEscape(a Action, reason string, err error) Result {
	switch {
	case err == nil:
		return Result{Action: a, Verdict: Fail, Observed: "allowed", Evidence: "Incus did what the granted user asked (through incus-user): " + a.Target}
	case strings.Contains(strings.ToLower(err.Error()), strings.ToLower(reason)):
		return Result{Action: a, Verdict: Pass, Observed: "refused", Evidence: "Incus refused: " + err.Error()}
	default:
		return Result{Action: a, Verdict: Inconclusive, Observed: "refused for another reason",
			Evidence: fmt.Sprintf("Incus refused, but not with %q: %v; a refusal for another reason says nothing about the restriction", reason, err)}
	}
}

// undoEscape takes back what an attempt that should have been refused did.
func (r *run) undoEscape(ctx context.Context, box string) {
	t, c := r.tier, r.cfg.Host.Incus
	_ = deleteNetworkEventually(ctx, c, t.decoy+"x")
	if box == "" {
		return
	}
	pc := c.Project(t.project)
	inst, etag, err := pc.Instance(ctx, box)
	if err != nil {
		return
	}
	put := inst.Writable()
	for _, dev := range []string{"eth1", "hostroot", "door"} {
		delete(put.Devices, dev)
	}
	delete(put.Config, "security.privileged")
	if err := pc.UpdateInstance(ctx, box, put, etag); err != nil {
		r.rep.Problems = append(r.rep.Problems, string(TierID)+": taking back what the granted user was allowed to do: "+err.Error())
	}
}

// judgeTier judges C-TIER: its probes from box-t (rs), the non-packet
// actions, the census naming box-t, and the stack channel.
func judgeTier(r *run, c Claim, rs []Result) []Result {
	t := r.tier
	a := Action{ID: "t-census", Claim: c.ID, Channel: ChannelCensus, From: PlaceVerify, Target: "box-t named by the census", TargetKey: string(ChannelCensus), Expect: ExpectPresent}
	if t == nil {
		return rs
	}
	rs = placeControlled(rs, PlaceT)
	rs = append(rs, t.results...)
	if e, ok := r.ends[PlaceT]; ok {
		named := r.tierFindings
		if len(named) > 0 {
			rs = append(rs, Result{Action: a, Verdict: Pass, Observed: "named", Evidence: "the census names it: " + named[0].Problem})
		} else {
			rs = append(rs, Result{Action: a, Verdict: Fail, Observed: "not named",
				Evidence: "the census did not name " + e.Instance + ", whose NIC has port isolation off: doctor is blind to a granted user's box"})
		}
	}
	return append(rs, stackResults(c, r.findings)...)
}

// placeControlled makes the blocks of the probes from place inconclusive
// unless place's own controls (its probes that expect to reach or
// resolve) all passed: a box that reaches nothing "blocks" everything.
func placeControlled(rs []Result, place Place) []Result { return controlledBy(rs, rs, place) }

// controlledBy is placeControlled with place's controls taken from all
// (another claim's results, for a member's box: its controls are C-EGRESS's
// and C-DNS's).
func controlledBy(rs, all []Result, place Place) []Result {
	var failed []string
	controls := 0
	for _, r := range all {
		if r.From == place && (r.Expect == ExpectReach || r.Expect == ExpectResolve) {
			controls++
			if r.Verdict != Pass {
				failed = append(failed, r.Target+": "+r.Evidence)
			}
		}
	}
	if controls == 0 {
		failed = append(failed, string(place)+" ran no control")
	}
	if len(failed) == 0 {
		return rs
	}
	out := slices.Clone(rs)
	for i, r := range out {
		if r.From == place && r.Verdict == Pass && (r.Expect == ExpectBlocked || r.Expect == ExpectNoName || r.Expect == ExpectNotForwarded) {
			out[i].Verdict = Inconclusive
			out[i].Evidence = "looked blocked, but " + string(place) + "'s own control failed (" + strings.Join(failed, "; ") + "), so the block proves nothing"
		}
	}
	return out
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

// tierBoxFindings picks those findings for this run's box-t.
func (r *run) tierBoxFindings(fs []model.Finding) []model.Finding {
	e, ok := r.ends[PlaceT]
	if r.tier == nil || !ok {
		return nil
	}
	return tierBoxFindings(fs, r.tier.project, e.Instance)
}

// removeTierUser purges a drill tier user and deletes the account.
func removeTierUser(ctx context.Context, h *stack.Host, name string) error {
	u, err := accounts.Lookup(name)
	if err != nil {
		return nil // gone already
	}
	if _, err := h.Revoke(ctx, u, "", true); err != nil {
		return fmt.Errorf("teardown: purging tier user %s: %w", name, err)
	}
	// The purge leaves a tombstone for the uid; the account goes, so does it.
	_ = os.Remove(h.UserStatePath(u.UID))
	if out, err := exec.CommandContext(ctx, "userdel", name).CombinedOutput(); err != nil {
		return fmt.Errorf("teardown: userdel %s: %w: %s", name, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// tierUserOf reports whether an account's comment marks a drill tier user
// of a run on this host. A comment naming no host is an older build's,
// taken as this host's.
func tierUserOf(comment string, h *stack.Host) bool {
	return strings.HasPrefix(comment, tierUserComment) && (!strings.Contains(comment, " on ") || strings.HasSuffix(comment, tierUserHost(h)))
}

// cleanTierLeftovers removes an aborted run's tier users and decoys.
func cleanTierLeftovers(ctx context.Context, h *stack.Host, logf func(string, ...any)) error {
	b, err := os.ReadFile("/etc/passwd")
	if err != nil {
		return nil
	}
	var errs []error
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Split(line, ":")
		if len(f) < 5 || !tierUserOf(f[4], h) {
			continue
		}
		if _, err := user.Lookup(f[0]); err != nil {
			continue
		}
		logf("preflight: removing an earlier run's tier user %s", f[0])
		errs = append(errs, removeTierUser(ctx, h, f[0]))
		errs = append(errs, deleteNetworkEventually(ctx, h.Incus, f[0]))
	}
	return errors.Join(errs...)
}

// deleteNetworkEventually deletes a network if it exists.
func deleteNetworkEventually(ctx context.Context, c *incus.Client, name string) error {
	if _, _, err := c.Network(ctx, name); incus.IsNotFound(err) {
		return nil
	}
	if err := c.DeleteNetwork(ctx, name); err != nil && !incus.IsNotFound(err) {
		return fmt.Errorf("deleting network %s: %w", name, err)
	}
	return nil
}

// liftTierRestriction is the mutation "tier": the run's tier project may
// use every network.
func liftTierRestriction(ctx context.Context, h *stack.Host, _ []string) error {
	ps, err := h.Incus.Projects(ctx)
	if err != nil {
		return err
	}
	for _, p := range ps {
		if p.Config[stack.KeyTier] != stack.TierGranted || !strings.HasPrefix(p.Config[stack.KeyTierUser], "bxd") {
			continue
		}
		np := p
		np.Config = maps.Clone(p.Config)
		delete(np.Config, "restricted.networks.access")
		return h.Incus.UpdateProject(ctx, p.Name, np, "")
	}
	return errors.New("no drill tier project to lift the restriction of (C-TIER must be selected)")
}

// placeTierBox moves box-t, on a cluster, to the member the drill talks
// to: Incus placed it for its user (whose project may not pick a
// member), and its probes are judged by that member's witnesses; from
// another member some of them could not fail (that member's uplink is not
// the local one's).
func (r *run) placeTierBox(ctx context.Context, c *incus.Client, box string) error {
	local := r.localMember()
	if local == "" {
		return nil
	}
	inst, _, err := c.Instance(ctx, box)
	if err != nil {
		return err
	}
	if inst.Location == local {
		return nil
	}
	r.cfg.logf("tier: Incus placed %s on %s; moving it to %s, where the drill's witnesses are", box, inst.Location, local)
	if err := c.SetInstanceState(ctx, box, "stop", 0, true); err != nil {
		return err
	}
	if err := c.MoveInstance(ctx, box, local); err != nil {
		return err
	}
	return c.SetInstanceState(ctx, box, "start", 0, false)
}
