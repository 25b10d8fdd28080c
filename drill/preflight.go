package drill

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/box-isolation/box/stack/model"
	"github.com/box-isolation/box/stack/nft"
)

// preflight checks incusd answers, notes the environment and removes the
// boxes of earlier runs that were aborted.
func (r *run) preflight(ctx context.Context) error {
	r.cfg.logf("preflight: incusd, leftovers of aborted runs")
	pctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	srv, err := r.cfg.Host.Incus.Server(pctx)
	if err != nil {
		return fmt.Errorf("preflight: %w", err)
	}
	// The probe boxes' type is read once they are minted; what box new
	// would make is decided now, as box new decides it.
	if r.boxNew, err = model.DecideType(srv, ""); err != nil {
		return fmt.Errorf("preflight: %w", err)
	}
	r.rep.Environment = Environment{Mode: r.cfg.Topology.Source, Hostname: hostname(), Kernel: srv.Environment.KernelVersion,
		IncusVersion: srv.Environment.ServerVersion, Image: r.cfg.Image}
	if t := r.cfg.Template; t != nil {
		r.rep.Environment.Template = t.Name
	}
	if err := cleanLeftovers(pctx, r.cfg.Host, ""); err != nil {
		return fmt.Errorf("preflight: cleaning an earlier run's boxes: %w", err)
	}
	// What an aborted run of any claim left (a user, a namespace).
	for _, c := range Catalogue {
		if c.clean == nil {
			continue
		}
		if err := c.clean(pctx, &r.cfg); err != nil {
			return fmt.Errorf("preflight: %w", err)
		}
	}
	if err := withNetNS(r.cfg.Host.NetNS, func(fd int) error {
		removed, err := nft.DeleteCounters(fd, "")
		if len(removed) > 0 {
			r.cfg.logf("preflight: removed an earlier run's %s", strings.Join(removed, ", "))
		}
		return err
	}); err != nil {
		return fmt.Errorf("preflight: removing an earlier run's counting tables: %w", err)
	}
	return nil
}
