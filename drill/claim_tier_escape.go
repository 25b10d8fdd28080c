package drill

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"time"

	"github.com/box-isolation/box/stack"
	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/model"
)

// C-TIER's requests: the granted user's attempts, through incus-user, to
// take box-t off boxnet, each judged by Incus's answer, and the mutation
// that lifts the restriction they must meet.

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
	t := stateOf[tierRun](r.state, TierID)
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
			inst, etag, err := t.client.Instances().Get(ctx, box)
			if err != nil {
				return err
			}
			put := inst.Writable()
			if put.Devices == nil {
				put.Devices = map[string]map[string]string{}
			}
			put.Devices[dev] = d
			return t.client.Instances().Update(ctx, box, put, etag)
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
				inst, etag, err := t.client.Instances().Get(ctx, box)
				if err != nil {
					return err
				}
				put := inst.Writable()
				put.Config = maps.Clone(put.Config)
				put.Config["security.privileged"] = "true"
				return t.client.Instances().Update(ctx, box, put, etag)
			}},
		)
	}
	escapes = append(escapes, escape{"t-net-create", "a network of its own (" + t.decoy + "x)", "Network not allowed in project", func(ctx context.Context) error {
		return t.client.Networks().Create(ctx, incus.NetworksPost{Name: t.decoy + "x", Type: "bridge", Config: map[string]string{"ipv4.address": "none", "ipv6.address": "none"}})
	}})
	for _, e := range escapes {
		a := Action{ID: e.id, Claim: TierID, Channel: ChannelRestriction, From: placeUser, Target: e.what, TargetKey: "incus", Expect: ExpectRefused}
		actx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err := e.try(actx)
		cancel()
		t.results = append(t.results, judgeEscape(a, e.reason, err))
		if err == nil {
			if err := t.undoEscape(ctx, r.cfg.Host.Incus, box); err != nil {
				r.rep.Problems = append(r.rep.Problems, string(TierID)+": taking back what the granted user was allowed to do: "+err.Error())
			}
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

// undoEscape takes back, as the admin (c), what an attempt that should
// have been refused did; the error is a change it could not take back.
func (t *tierRun) undoEscape(ctx context.Context, c *incus.Client, box string) error {
	_ = deleteNetworkEventually(ctx, c, t.decoy+"x")
	if box == "" {
		return nil
	}
	pc := c.Project(t.project)
	inst, etag, err := pc.Instances().Get(ctx, box)
	if err != nil {
		return nil
	}
	put := inst.Writable()
	for _, dev := range []string{"eth1", "hostroot", "door"} {
		delete(put.Devices, dev)
	}
	delete(put.Config, "security.privileged")
	return pc.Instances().Update(ctx, box, put, etag)
}

// liftTierRestriction is the mutation "tier": the run's tier project may
// use every network.
func liftTierRestriction(ctx context.Context, h *stack.Host, _ []string) error {
	ps, err := h.Incus.Projects().List(ctx)
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
		return h.Incus.Projects().Update(ctx, p.Name, np, "")
	}
	return errors.New("no drill tier project to lift the restriction of (C-TIER must be selected)")
}
