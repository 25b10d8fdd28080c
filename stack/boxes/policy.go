package boxes

import (
	"context"
	"fmt"
	"strings"

	"github.com/box-isolation/box/stack"
	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/model"
)

// PolicyNote is what a verb says of the policy a box has after it
// (restore, new --from, import): the policy, whose it is, and how what
// the other side held (the snapshot, the box before, the file) differs.
type PolicyNote struct {
	Policy model.Policy `json:"policy"`
	// Source is whose policy the box has: "current" (its own, kept),
	// "snapshot" (restore --with-policy), "source" (a clone's: its
	// source's current one), "file" (an import's).
	Source string `json:"source"`
	// Other names what Differs compares with; Differs lists, as "KEY:
	// OTHER'S -> NOW", what it held that the box does not have now.
	Other   string   `json:"other"`
	Differs []string `json:"differs,omitempty"`
}

// recordPolicy records a box's current policy (currentPolicy) as it
// stands now in the policy store (stack.Policies.Record), changed by edit
// first when edit is not nil (the egress verb's new allowlist).
func recordPolicy(ctx context.Context, host *stack.Host, name string, edit func(*model.Policy)) error {
	inst, _, err := host.Incus.Instances().Get(ctx, name)
	if err != nil {
		return fmt.Errorf("recording the policy of %s: %w", name, err)
	}
	p, err := currentPolicy(ctx, host, inst)
	if err != nil {
		return err
	}
	if edit != nil {
		edit(&p)
	}
	return host.Policies().Record(ctx, inst.Project, name, p)
}

// currentPolicy is a box's current policy: its own config and devices,
// with the allowlist box enforces for it (model.EnforcedEgress: its
// record's, where box keeps one), so a box restored or edited through
// Incus alone does not hand the rolled-back allowlist on.
func currentPolicy(ctx context.Context, host *stack.Host, inst *incus.Instance) (model.Policy, error) {
	p := model.PolicyOf(inst.Config, inst.Devices)
	if host.Tier.Granted {
		return p, nil // a granted user's boxes have no record
	}
	n, _, err := host.Incus.Networks().Get(ctx, model.Current.Network)
	if err != nil {
		return p, fmt.Errorf("reading the recorded policy of %s: %w", inst.Name, err)
	}
	p.Egress = model.EnforcedEgress(inst, model.PoliciesRecorded(n.Config)).Names
	return p, nil
}

// Line is the note in one line, or "" when nothing differs.
func (n PolicyNote) Line(box string) string {
	if len(n.Differs) == 0 {
		return ""
	}
	verb := map[string]string{
		"current":  "kept its current policy",
		"snapshot": "took the snapshot's policy",
		"source":   "took its source's current policy",
		"file":     "took the file's policy",
	}[n.Source]
	return fmt.Sprintf("%s %s (%s); %s held otherwise (then -> now): %s", box, verb, n.Policy.Summary(), n.Other, strings.Join(n.Differs, "; "))
}
