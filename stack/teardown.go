package stack

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/box-isolation/box/stack/egress"
	"github.com/box-isolation/box/stack/guard"
	"github.com/box-isolation/box/stack/hostns"
	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/model"
	"github.com/box-isolation/box/stack/nft"
)

// Teardown removes both generations of the stack: profiles, bridges, ACLs,
// nft tables and the boot units. On a cluster it also removes the nft
// tables of every other member whose namespace it knows (MemberNetNS). While boxes of either tag exist it refuses
// and names them, unless removeBoxes is set, in which case they are
// deleted (with their snapshots) first. A second Teardown finds nothing and
// changes nothing.
func (host *Host) Teardown(ctx context.Context, removeBoxes bool) ([]model.Change, error) {
	unlock, err := host.Lock.take(ctx, host.NetNS)
	if err != nil {
		return nil, err
	}
	defer unlock()
	boxes, err := Boxes(ctx, host.Incus)
	if err != nil {
		return nil, err
	}
	// The healer must not put back what this removes (heal.go).
	unmark, err := hostns.MarkTeardown(host.NetNS)
	if err != nil {
		return nil, err
	}
	defer unmark()
	changes := []model.Change{}
	if len(boxes) > 0 {
		if !removeBoxes {
			return nil, fmt.Errorf("%d boxes still exist (%s): remove them with `box rm`, or pass --force to delete them with the stack", len(boxes), strings.Join(names(boxes), ", "))
		}
		for i, b := range boxes {
			host.Progressf("removing box %d of %d: %s", i+1, len(boxes), b.Name)
			if err := RemoveInstance(ctx, host.Incus, b.Name); err != nil {
				return changes, err
			}
			changes = append(changes, model.Change{Object: "box " + b.Name, Action: "removed"})
		}
	}

	g, err := host.OpenNS()
	if err != nil {
		return changes, err
	}
	defer g.Close()
	var errs []error
	unguarded, err := guard.Remove(g)
	changes = append(changes, unguarded...)
	if err != nil {
		errs = append(errs, err)
	}
	for _, gen := range []model.Generation{model.Current, model.Legacy} {
		removed, err := removeObjects(ctx, host.Incus, gen)
		changes = append(changes, removed...)
		if err != nil {
			errs = append(errs, err)
		}
		if gen.NFTTable != "" {
			removed, err := nft.Delete(g.NFTConfig(gen))
			if err != nil {
				errs = append(errs, fmt.Errorf("removing nft tables: %w", err))
			}
			for _, r := range removed {
				changes = append(changes, model.Change{Object: "nft " + r, Action: "removed"})
			}
		}
	}
	// The egress design's host objects and the egress service's files.
	did, err := g.DeleteEgressNet()
	for _, d := range did {
		changes = append(changes, model.Change{Object: "egress routing", Action: "removed", Detail: d})
	}
	if err != nil {
		errs = append(errs, err)
	}
	if err := egress.RemoveState(g.Inode); err != nil {
		errs = append(errs, err)
	}
	ci, err := host.Cluster(ctx)
	if err == nil {
		var removed []model.Change
		removed, err = host.Members.teardown(ci)
		changes = append(changes, removed...)
	}
	if err != nil {
		errs = append(errs, err)
	}
	removed, err := host.BootFiles().removeUnits()
	changes = append(changes, removed...)
	if err != nil {
		errs = append(errs, err)
	}
	removed, err = host.BootFiles().removeSavedFirewall()
	changes = append(changes, removed...)
	if err != nil {
		errs = append(errs, err)
	}
	return changes, errors.Join(errs...)
}

// removeObjects deletes a generation's Incus objects: the profile before
// the network (it refers to it), the network before the ACL (it uses it).
// Objects already gone are skipped.
func removeObjects(ctx context.Context, c *incus.Client, gen model.Generation) ([]model.Change, error) {
	changes := []model.Change{}
	var errs []error
	for _, s := range []struct {
		kind, name string
		del        func(context.Context, string) error
	}{
		{"profile", gen.Profile, c.DeleteProfile},
		{"network", gen.Network, c.Networks().Delete},
		{"acl", gen.ACL, c.Networks().DeleteACL},
	} {
		err := s.del(ctx, s.name)
		switch {
		case err == nil:
			changes = append(changes, model.Change{Object: s.kind + " " + s.name, Action: "removed"})
		case !incus.IsNotFound(err):
			errs = append(errs, fmt.Errorf("removing %s %s: %w (is something box did not mint still using it? `incus %s show %s` lists its users)", s.kind, s.name, err, s.kind, s.name))
		}
	}
	return changes, errors.Join(errs...)
}

// ProbeImagePrefix starts the description of the probe image that box's
// drill builds and imports (drill/image): what PurgeIncus removes.
const ProbeImagePrefix = "box probe image"

// PurgeIncus removes what box and its drill put into Incus beyond the
// stack: the probe images they imported. box installs no Incus package and
// initialises nothing in Incus (no storage pool, no default profile), so
// that is all; the Incus package itself is the operator's to remove.
func PurgeIncus(ctx context.Context, c *incus.Client) ([]model.Change, error) {
	imgs, err := c.Images().List(ctx)
	if err != nil {
		return nil, fmt.Errorf("listing images: %w", err)
	}
	var changes []model.Change
	for _, img := range imgs {
		if !strings.HasPrefix(img.Properties["description"], ProbeImagePrefix) {
			continue
		}
		if err := c.Images().Delete(ctx, img.Fingerprint); err != nil && !incus.IsNotFound(err) {
			return changes, fmt.Errorf("removing the probe image %.12s: %w", img.Fingerprint, err)
		}
		changes = append(changes, model.Change{Object: "image " + img.Fingerprint[:12], Action: "removed", Detail: img.Properties["description"]})
	}
	return changes, nil
}
