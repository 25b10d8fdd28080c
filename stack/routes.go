package stack

import (
	"fmt"
	"strings"

	"github.com/box-isolation/box/stack/hostns"
	"github.com/box-isolation/box/stack/model"
)

// L-ROUTE: a box's forwarded traffic leaves the host only by the
// interfaces of its default routes (stack/nft/route.go has the table).
// The set of those interfaces follows the kernel: Ensure writes it, the
// port watcher keeps it current from route events (watchRoutes), Verify
// compares it with the routes of the moment. docs/egress.md says what
// that means with several default routes, a VPN, roaming and a cluster.

// EnsureRoute converges the route table to the host's default routes.
func EnsureRoute(g *hostns.NS) ([]model.Change, error) {
	rt, err := g.RouteView(model.Current.Network)
	if err != nil {
		return nil, fmt.Errorf("reading the routes for %s: %w", model.LayerRoute, err)
	}
	applied, err := rt.Apply(g.NFTConfig(model.Current))
	if err != nil {
		return nil, fmt.Errorf("applying the route table: %w", err)
	}
	var out []model.Change
	for _, a := range applied {
		out = append(out, model.Change{Object: "nft", Action: "updated", Detail: a})
	}
	return out, nil
}

// VerifyRoute compares the route table with the default routes of the
// moment; notes say what a box may leave by.
func VerifyRoute(g *hostns.NS) (findings []model.Finding, notes []string, err error) {
	rt, err := g.RouteView(model.Current.Network)
	if err != nil {
		return nil, nil, fmt.Errorf("reading the routes for %s: %w", model.LayerRoute, err)
	}
	up := rt.Uplinks
	rf, err := rt.Verify(g.NFTConfig(model.Current))
	if err != nil {
		return nil, nil, fmt.Errorf("reading the route table: %w", err)
	}
	for _, f := range rf {
		// A routed prefix's drop that is missing or stale is advisory: the
		// out-interface check and the ACL stand in front of it, and routes
		// come and go between converges where no watcher runs (the
		// drill's own LAN stand-in adds host routes by its veth for the
		// run). The uplink set and the table's shape are not.
		advisory := strings.Contains(f.Problem, "ip daddr ")
		findings = append(findings, model.Finding{Layer: model.LayerRoute, Object: "nft " + f.Object, Problem: f.Problem, Fix: model.FixEnsure, Advisory: advisory})
	}
	if len(up) == 0 {
		notes = append(notes, "the host has no default route: boxes reach nothing outside the host until it has one ("+string(model.LayerRoute)+")")
	}
	return findings, notes, nil
}
