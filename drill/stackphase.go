package drill

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/box-isolation/box/internal/nsrun"
	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/model"
)

// ensureStack ensures the stack (or only verifies it, --no-setup), checks
// the host is fit to judge on, and applies the mutations that must come
// before any box exists.
func (r *run) ensureStack(ctx context.Context) error {
	cfg, rep := &r.cfg, r.rep
	sctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	if cfg.NoSetup {
		cfg.logf("stack: verifying only (--no-setup)")
	} else {
		cfg.logf("stack: ensuring")
		er, err := cfg.Host.Ensure(sctx)
		if err != nil {
			return fmt.Errorf("stack: %w", err)
		}
		rep.Stack.Ensured = true
		rep.Stack.Changes = er.Changes
		// On a cluster, every other member's host layers too (what
		// setup-host --member-only does there).
		mrs, err := cfg.Host.EnsureMembers(sctx)
		if err != nil {
			return fmt.Errorf("stack: %w", err)
		}
		for _, mr := range mrs {
			for _, ch := range mr.Report.Changes {
				ch.Object += " (member " + mr.Member + ")"
				rep.Stack.Changes = append(rep.Stack.Changes, ch)
			}
		}
	}
	members, notes, err := readCluster(sctx, cfg.Host)
	if err != nil {
		return fmt.Errorf("stack: reading the cluster: %w", err)
	}
	r.members = members
	rep.Notes = append(rep.Notes, notes...)
	for _, m := range members {
		rep.Environment.Members = append(rep.Environment.Members, m.Name)
	}
	if _, _, err := cfg.Host.Incus.Networks().Get(sctx, model.Current.Network); incus.IsNotFound(err) {
		return fmt.Errorf("stack: there is no isolation stack to drill (no network %s): run box setup-host, or drop --no-setup", model.Current.Network)
	}
	// Is the host fit to judge on? A bridge with no dnsmasq, or a gateway
	// address someone else holds, gives confident wrong answers.
	before, err := cfg.Host.Verify(sctx)
	if err != nil {
		return fmt.Errorf("stack: %w", err)
	}
	r.before = before
	if before.DnsmasqPID == 0 {
		return fmt.Errorf("preflight: no dnsmasq serves %s (Incus may still call it Created): restart incusd, then box doctor", model.Current.Network)
	}
	for _, f := range before.Findings {
		if strings.HasPrefix(f.Object, "gateway ") {
			return fmt.Errorf("preflight: %s: %s: %s", f.Object, f.Problem, f.Fix)
		}
	}
	if len(cfg.Mutations) == 0 {
		return nil
	}
	// Registered before the boxes' removal, so it runs after it: the stack
	// is reconfigured only once no box is left on it.
	r.later(func(ctx context.Context) error { return restoreStack(ctx, cfg, before.Findings) })
	return applyMutations(sctx, cfg, false, nil)
}

// verifyForProbes reads the stack as the probes will find it: which layers
// are in the path.
func (r *run) verifyForProbes(ctx context.Context) error {
	v, err := r.cfg.Host.Verify(ctx)
	if err != nil {
		return fmt.Errorf("stack: %w", err)
	}
	if !v.Subnet.IsValid() {
		return fmt.Errorf("stack: there is no isolation stack to drill (%v): run box setup-host, or drop --no-setup", v.Findings)
	}
	r.v = v
	rep := r.rep
	rep.Stack.Subnet, rep.Stack.Gateway, rep.Stack.BridgeMode = v.Subnet.String(), v.Gateway.String(), string(v.BridgeMode)
	r.findings = mergeFindings(r.before.Findings, v.Findings)
	// What the drill caused on purpose for a claim (box-t's port
	// isolation, off) is that claim's evidence, nobody else's finding.
	for _, c := range r.cfg.Claims {
		if c.keepFindings == nil {
			continue
		}
		kept, why := c.keepFindings(r.state, r.findings)
		if len(kept) == 0 {
			continue
		}
		r.findings = slices.DeleteFunc(slices.Clone(r.findings), func(f model.Finding) bool { return slices.Contains(kept, f) })
		rep.Notes = append(rep.Notes, fmt.Sprintf("%s: %s; that finding is %[1]s's evidence and fails no other claim", c.ID, why))
	}
	for _, n := range v.Notes {
		rep.Notes = append(rep.Notes, "stack: "+n)
	}
	rep.Stack.Findings = r.findings
	rep.Stack.Layers = layerState(r.findings)
	if v.GuardAbsent != "" {
		rep.Stack.Layers[model.LayerGuard] = "absent: " + v.GuardAbsent
	}
	if bnf, ok := bridgeNetfilter(r.cfg.Host.NetNS); ok {
		rep.Environment.BridgeNetfilter = bnf
	}
	return nil
}

// bridgeNetfilter reads whether bridged IPv4 passes the inet hooks in the
// host's namespace (docs/world.md, "These machines"): a layer not in the path proves nothing.
func bridgeNetfilter(ns string) (bool, bool) {
	var on, ok bool
	_ = nsrun.Do(ns, func() error {
		b, err := os.ReadFile("/proc/sys/net/bridge/bridge-nf-call-iptables")
		if err != nil {
			return err
		}
		ok, on = true, strings.TrimSpace(string(b)) == "1"
		return nil
	})
	return on, ok
}

func hostname() string {
	h, _ := os.Hostname()
	return h
}
