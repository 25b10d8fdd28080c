package boxes

import (
	"net/netip"

	"github.com/box-isolation/box/stack"

	"context"
	"fmt"
	"maps"
	"strings"
	"time"

	"github.com/box-isolation/box/stack/egress"
	"github.com/box-isolation/box/stack/hostns"
	"github.com/box-isolation/box/stack/model"
	"github.com/box-isolation/box/stack/nft"
)

// EgressChange is what SetEgress did.
type EgressChange struct {
	Box    string   `json:"box"`
	Policy string   `json:"policy"` // the id, or "open"
	Names  []string `json:"names,omitempty"`
	// NewPolicy: the allowlist was stored on the bridge by this change.
	NewPolicy bool `json:"new_policy"`
}

// EgressState is a box's policy as it stands.
type EgressState struct {
	Box     string
	Policy  string // the id, or EgressOpen
	Names   []string
	Allowed []netip.Addr
}

// SetEgress puts a box under an allowlist (names) or opens it (names nil).
// It takes effect at the next refresh, which it makes at once.
func (mgr *Manager) SetEgress(ctx context.Context, box string, names []string) (*EgressChange, error) {
	host := mgr.host
	inst, etag, err := stack.Resolve(ctx, host.Incus, box)
	if err != nil {
		return nil, err
	}
	ch := &EgressChange{Box: box, Policy: model.EgressOpen}
	id := ""
	if names != nil {
		if names, err = model.NormalizeNames(names); err != nil {
			return nil, err
		}
		id = model.PolicyID(names)
		ch.Policy, ch.Names = id, names
		if ch.NewPolicy, err = host.Policies().EnsureAllowlist(ctx, id, names); err != nil {
			return nil, fmt.Errorf("egress of %s: %w", box, err)
		}
	}
	if inst.Config[model.KeyEgress] != id {
		put := inst.Writable()
		put.Config = maps.Clone(put.Config)
		if id == "" {
			delete(put.Config, model.KeyEgress)
			delete(put.Config, model.KeyEgressNames)
		} else {
			put.Config[model.KeyEgress] = id
			put.Config[model.KeyEgressNames] = strings.Join(names, ",")
		}
		if err := host.Incus.Instances().Update(ctx, box, put, etag); err != nil {
			return nil, fmt.Errorf("egress of %s: %w", box, err)
		}
	}
	if err := recordPolicy(ctx, host, box, func(p *model.Policy) { p.Egress = names }); err != nil {
		return nil, fmt.Errorf("egress of %s set, but: %w (run the command again)", box, err)
	}
	if _, err := host.RefreshPorts(ctx); err != nil {
		return nil, fmt.Errorf("egress of %s: %w", box, err)
	}
	return ch, nil
}

// Egress reads a box's policy and what its allow set holds now.
func (mgr *Manager) Egress(ctx context.Context, box string) (*EgressState, error) {
	host := mgr.host
	inst, _, err := stack.Resolve(ctx, host.Incus, box)
	if err != nil {
		return nil, err
	}
	st := &EgressState{Box: box, Policy: model.EgressOpen}
	n, _, err := host.Incus.Networks().Get(ctx, model.Current.Network)
	if err != nil {
		return nil, err
	}
	// What box enforces: its record's allowlist, where it keeps one.
	e := model.EnforcedEgress(inst, model.PoliciesRecorded(n.Config))
	id := e.ID
	if id == "" {
		return st, nil
	}
	st.Policy = id
	if st.Names = model.PoliciesOf(n.Config)[id]; st.Names == nil {
		st.Names = e.Names
	}
	if host.Tier.Granted {
		return st, nil // the kernel's sets are the admin's to read
	}
	g, err := host.OpenNS()
	if err != nil {
		return nil, err
	}
	defer g.Close()
	if st.Allowed, err = nft.EgressAllowed(g.NFTConfig(model.Current), id); err != nil {
		return nil, err
	}
	return st, nil
}

// EgressRefusals reads a box's refusals since since (all with a zero
// since), oldest first.
func (mgr *Manager) EgressRefusals(ctx context.Context, box string, since time.Time) ([]egress.Refusal, error) {
	host := mgr.host
	inst, _, err := stack.Resolve(ctx, host.Incus, box)
	if err != nil {
		return nil, err
	}
	ino, err := hostns.Inode(host.NetNS)
	if err != nil {
		return nil, err
	}
	project := inst.Project
	return egress.ReadRefusals(egress.LogPath(ino), func(r egress.Refusal) bool {
		return r.Box == box && (project == "" || r.Project == "" || r.Project == project) && !r.At.Before(since)
	})
}
