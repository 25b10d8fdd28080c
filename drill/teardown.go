package drill

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/box-isolation/box/stack"
	"github.com/box-isolation/box/stack/boxes"
	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/model"
)

// teardown runs the phases' undos, last first, each with its own time
// and never cancelled by the caller (a run interrupted must still remove
// its boxes), and returns what failed: the host may carry its leftovers.
func (r *run) teardown(ctx context.Context) []string {
	var dirty []string
	for i := len(r.undo) - 1; i >= 0; i-- {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
		if err := r.undo[i](cctx); err != nil {
			r.rep.Problems = append(r.rep.Problems, err.Error())
			dirty = append(dirty, err.Error())
		}
		cancel()
	}
	return dirty
}

// cleanLeftovers removes the drill's own boxes: those of one run, or (run
// empty) of every run. Only instances that carry both the box tag and the
// drill tag are touched.
func cleanLeftovers(ctx context.Context, h *stack.Host, run string) error {
	filter := map[string]string{TagDrill: "1"}
	if run != "" {
		filter[TagRun] = run
	}
	insts, err := h.Incus.Instances().List(ctx, filter)
	if err != nil {
		return err
	}
	// All at once: on a cluster the boxes are on several members, and one
	// after the other their removal grew with the members; beside a full
	// bridge, with the records' writes and the refreshes too.
	if err := boxes.NewManager(h).RemoveAll(ctx, boxNames(insts), busyWait); err != nil {
		return err
	}
	left, err := h.Incus.Instances().List(ctx, filter)
	if err != nil {
		return err
	}
	if names := boxNames(left); len(names) > 0 {
		return fmt.Errorf("drill boxes still there after removal: %s (remove them with box rm --force NAME)", strings.Join(names, ", "))
	}
	return nil
}

// boxNames names the instances that carry the box tag.
func boxNames(insts []incus.Instance) []string {
	var out []string
	for _, i := range insts {
		if i.Config[model.Current.Tag] == "1" {
			out = append(out, i.Name)
		}
	}
	return out
}

// busyWait is how long a removal waits out an operation a killed run left
// in flight ("Instance is busy running a create operation").
const busyWait = time.Minute

// releaseRunLeases releases the leases dnsmasq holds now that it did not
// hold before the run (before) and that belong to no instance on the
// bridge: the run's, its boxes being gone.
func releaseRunLeases(ctx context.Context, cfg *Config, before stack.DHCPPool) error {
	h := cfg.Host
	pool, err := h.Addresses().DHCPLeases()
	if err != nil {
		return nil // nothing to read it with now: doctor names what is left
	}
	insts, err := h.Incus.Instances().All(ctx)
	if err != nil {
		return fmt.Errorf("teardown: listing the instances whose leases stay: %w", err)
	}
	macs := map[string]bool{}
	for i := range insts {
		for _, d := range insts[i].ExpandedDevices {
			if d["type"] == "nic" && (d["network"] == model.Current.Network || d["parent"] == model.Current.Network) {
				for k, v := range insts[i].Config {
					if strings.HasPrefix(k, "volatile.") && strings.HasSuffix(k, ".hwaddr") {
						macs[strings.ToLower(v)] = true
					}
				}
			}
		}
	}
	var ours []stack.DHCPLease
	for _, l := range pool.Leases {
		if !slices.ContainsFunc(before.Leases, func(b stack.DHCPLease) bool { return b.Hwaddr == l.Hwaddr && b.Address == l.Address }) && !macs[l.Hwaddr] {
			ours = append(ours, l)
		}
	}
	if len(ours) == 0 {
		return nil
	}
	cfg.logf("teardown: releasing %d lease(s) the run left in dnsmasq's lease file", len(ours))
	left, err := h.Addresses().ReleaseLeases(ctx, ours)
	if err != nil {
		return fmt.Errorf("teardown: releasing the run's leases: %w", err)
	}
	if len(left) > 0 {
		return fmt.Errorf("teardown: %d lease(s) the run left are still in dnsmasq's lease file (they go at their expiry)", len(left))
	}
	return nil
}
