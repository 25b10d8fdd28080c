package stack

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"syscall"

	"github.com/box-isolation/box/stack/hostns"
	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/model"
)

// The policy store: box's own copy of each box's policy (model.Policy),
// outside the instance, as a user key of the bridge's
// (user.box.policy.<project>.<box> = the policy as JSON). The bridge is
// the stack's, one per host or cluster, never snapshotted, exported or
// copied with a box, readable by every client of the host's Incus (a
// --remote one too) and writable only by its admins: a granted user's
// boxes have no record (for them the rule is a convenience; their boxes'
// policy is read from the box itself). Where a box has a record, its
// allowlist is the record's (model.EnforcedEgress). Incus changes a bridge's user keys
// without restarting its dnsmasq (measured: 33 ms, the same dnsmasq).
// docs/design.md, "A box's policy is the operator's".

// policyWrites is how often a store write is tried when another writer
// changed the bridge in between (its etag).
const policyWrites = 5

// Policies is the policy store of a host.
type Policies struct {
	host *Host
}

// Policies is this host's policy store.
func (host *Host) Policies() *Policies { return &Policies{host: host} }

// Recorded is the policy box last recorded for a box; false when it
// recorded none (a box minted before the store, a granted user's).
func (ps *Policies) Recorded(ctx context.Context, project, box string) (model.Policy, bool, error) {
	n, _, err := ps.host.Incus.Networks().Get(ctx, model.Current.Network)
	if err != nil {
		return model.Policy{}, false, fmt.Errorf("reading the recorded policy of %s: %w", box, err)
	}
	p, ok := model.PoliciesRecorded(n.Config)[model.ProjectOf(project)+"."+box]
	return p, ok, nil
}

// Record records a box's policy (nothing for a granted user, who cannot
// write the bridge, nor for a box in a granted user's project, whose own
// changes box could not record: its config is its policy).
func (ps *Policies) Record(ctx context.Context, project, box string, p model.Policy) error {
	return ps.RecordOn(ctx, BridgeRead{}, project, box, p)
}

// BridgeRead is the bridge as a caller read it, with its etag: a store
// write tries it before it reads the bridge again ("" ETag: none read).
type BridgeRead struct {
	Network *incus.Network
	ETag    string
}

// RecordOn is Record starting from the bridge as read: unchanged since,
// it is written without another read; changed, it is read again.
func (ps *Policies) RecordOn(ctx context.Context, read BridgeRead, project, box string, p model.Policy) error {
	if TierProjectRE.MatchString(project) {
		return nil
	}
	return ps.edit(ctx, read, func(cfg map[string]string) {
		cfg[model.PolicyKey(project, box)] = model.MarshalPolicy(p)
	})
}

// Forget drops removed boxes' records, in one write.
func (ps *Policies) Forget(ctx context.Context, project string, boxes ...string) error {
	return ps.edit(ctx, BridgeRead{}, func(cfg map[string]string) {
		for _, b := range boxes {
			delete(cfg, model.PolicyKey(project, b))
		}
	})
}

// Rename moves a box's record to its new name.
func (ps *Policies) Rename(ctx context.Context, project, from, to string) error {
	return ps.edit(ctx, BridgeRead{}, func(cfg map[string]string) {
		if v, ok := cfg[model.PolicyKey(project, from)]; ok {
			cfg[model.PolicyKey(project, to)] = v
			delete(cfg, model.PolicyKey(project, from))
		}
	})
}

// edit changes the bridge's config through edit, starting from read when
// it has one, again when another writer got there first; a change that
// changes nothing writes nothing.
func (ps *Policies) edit(ctx context.Context, read BridgeRead, edit func(map[string]string)) error {
	host := ps.host
	if host.Tier.Granted {
		return nil
	}
	unlock, err := hostns.LockFile(ctx, hostns.PolicyLock, "the policy store")
	if err != nil {
		return fmt.Errorf("recording a box's policy: %w", err)
	}
	defer unlock()
	for try := 1; ; try++ {
		n, etag := read.Network, read.ETag
		fromRead := try == 1 && n != nil && etag != ""
		if !fromRead {
			var err error
			if n, etag, err = host.Incus.Networks().Get(ctx, model.Current.Network); err != nil {
				return fmt.Errorf("recording a box's policy: %w", err)
			}
		}
		cfg := maps.Clone(n.Config)
		edit(cfg)
		if maps.Equal(cfg, n.Config) {
			if fromRead {
				continue // the caller's read may be stale: make sure
			}
			return nil
		}
		err = host.Incus.Networks().Update(ctx, model.Current.Network, incus.NetworkPut{Description: n.Description, Config: cfg}, etag)
		if err == nil {
			return nil
		}
		if fromRead {
			continue // read the bridge and try again (staleWrite)
		}
		if !staleWrite(err) || try == policyWrites {
			return fmt.Errorf("recording a box's policy on %s: %w", model.Current.Network, err)
		}
	}
}

// staleWrite: a write of the bridge refused for its etag. incusd refuses
// a stale one on the header and closes the connection, so a large body
// (beside a full bridge) fails to send, "broken pipe", not a 412.
func staleWrite(err error) bool {
	return incus.IsPreconditionFailed(err) || errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET)
}
