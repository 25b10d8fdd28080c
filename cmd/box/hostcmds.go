package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/box-isolation/box/internal/rootonly"
	"github.com/box-isolation/box/stack"
	"github.com/box-isolation/box/stack/bootunits"
	"github.com/box-isolation/box/stack/boxes"
	"github.com/box-isolation/box/stack/daemon"
	"github.com/box-isolation/box/stack/guard"
	"github.com/box-isolation/box/stack/hostns"
	"github.com/box-isolation/box/stack/model"
	"github.com/box-isolation/box/stack/nft"
)

// The host verbs: they act on the isolation stack itself, through stack's
// Ensure, Verify, Teardown and Migrate.

func setupSetupHost(fs *flag.FlagSet) action {
	asJSON := fs.Bool("json", false, "print the report as JSON")
	// The nft tables and the ports' isolated flag do not survive a reboot,
	// Incus's objects do. The boot unit Ensure installs runs `box
	// setup-host --boot`, before Incus starts: the tables from the file
	// setup-host saved, with no Incus call.
	firewallOnly := fs.Bool("firewall-only", false, "converge only the nft tables and the bridge ports' isolation, asking Incus for the bridge's address")
	boot := fs.Bool("boot", false, "load the firewall setup-host saved, with no Incus call (what the boot unit runs, before Incus starts)")
	memberOnly := fs.Bool("member-only", false, "on an Incus cluster: converge only this member's host layers (nft tables, ports, boot unit), after setup-host ran on any member")
	return func(c *call) error {
		h, err := c.host()
		if err != nil {
			return err
		}
		picked := 0
		for _, on := range []bool{*memberOnly, *firewallOnly, *boot} {
			if on {
				picked++
			}
		}
		if picked > 1 {
			return usagef("--member-only, --firewall-only and --boot: pick one (--member-only also installs the boot unit; --boot is the boot unit's)")
		}
		h.Members.Only = *memberOnly
		ensure := h.Ensure
		switch {
		case *firewallOnly:
			ensure = h.EnsureFirewall
		case *boot:
			ensure = h.EnsureBoot
		}
		rep, err := ensure(c.ctx)
		if rootonly.IsNotRootOnly(err) {
			return fmt.Errorf("setting up the host: %w", err) // refused before any change
		}
		if err != nil {
			return fmt.Errorf("setting up the host: %w (the Incus objects this run created or changed were backed out; box doctor shows where the host stands)", err)
		}
		if *asJSON {
			return c.printJSON(rep)
		}
		printReport(c, rep)
		if !*firewallOnly && !*boot {
			if pc, err := c.images(h).ims.PoolCost(c.ctx); err == nil {
				fmt.Fprintln(c.out, pc.String())
			}
		}
		return nil
	}
}

// setupGuardAndServe runs box's daemon (package daemon): it guards the
// stack (ports, pins, tables, routes) and serves the allowlisted boxes
// (their resolver and proxy). The signal that stops it ends c.ctx (run),
// so it exits 0.
func setupGuardAndServe(fs *flag.FlagSet) action {
	takeOver := fs.Bool("take-over", false, "wait for a daemon already serving this host (its unit's old name during an upgrade) to stop, then serve")
	return func(c *call) error {
		return guardAndServe(c, *takeOver)
	}
}

// takeOverWait is how long --take-over waits for the daemon before it.
const takeOverWait = time.Minute

func guardAndServe(c *call, takeOver bool) error {
	h, err := c.host()
	if err != nil {
		return err
	}
	wait := time.Duration(0)
	if takeOver {
		wait = takeOverWait
	}
	if err := daemon.Run(c.ctx, h, c.err, wait); err != nil {
		return fmt.Errorf("guarding the stack: %w", err)
	}
	return nil
}

// setupWatchPorts is guard-and-serve under its old name, for the units a
// box of before the rename wrote: it says so, then runs the daemon.
func setupWatchPorts(fs *flag.FlagSet) action {
	return func(c *call) error {
		fmt.Fprintf(c.err, "box: watch-ports was renamed guard-and-serve (unit %s); running that (box setup-host replaces the old unit)\n", bootunits.DaemonUnitName)
		return guardAndServe(c, false)
	}
}

func printReport(c *call, rep *stack.Report) {
	if len(rep.Changes) == 0 {
		fmt.Fprintln(c.out, "nothing to change: the host already matches")
	}
	for _, ch := range rep.Changes {
		fmt.Fprintln(c.out, ch.String())
	}
	why := ""
	if rep.Subnet.Reason != "" {
		why = " (" + rep.Subnet.Reason + ")"
	}
	if rep.Subnet.Subnet.IsValid() {
		fmt.Fprintf(c.out, "subnet %s%s, gateway %s, bridge drop: %s\n", rep.Subnet.Subnet, why, rep.Gateway, rep.BridgeMode)
	} else {
		fmt.Fprintf(c.out, "bridge drop: %s\n", rep.BridgeMode)
	}
	printMembers(c, rep.Members)
	for _, n := range rep.Notes {
		fmt.Fprintln(c.err, n)
	}
}

// printMembers says, on a cluster, where each member's host layers stand.
func printMembers(c *call, ms []stack.MemberLayers) {
	for _, m := range ms {
		var state string
		switch m.State {
		case stack.MemberConverged:
			state = "host layers converged by this run"
		case stack.MemberClean:
			state = "host layers present (read from here)"
		case stack.MemberFindings:
			state = fmt.Sprintf("host layers NOT in place (%d findings): run box setup-host --member-only on %s", len(m.Findings), m.Member)
		default:
			state = fmt.Sprintf("host layers not read from here (another machine): run box setup-host --member-only on %s", m.Member)
		}
		slice := ""
		if m.Slice != "" {
			slice = ", addresses " + m.Slice
		}
		fmt.Fprintf(c.out, "member %s%s: %s\n", m.Member, slice, state)
	}
}

// doctorResult is what `box doctor --json` prints.
type doctorResult struct {
	Fixed        *stack.Report       `json:"fixed,omitempty"`
	Verification *stack.Verification `json:"verification"`
	// Storage is what a mint costs on the pool (nil when it could not be
	// read: a note says why).
	Storage *boxes.PoolCost `json:"storage,omitempty"`
}

func setupDoctor(fs *flag.FlagSet) action {
	fix := fs.Bool("fix", false, "converge the host (setup-host), then check again")
	asJSON := fs.Bool("json", false, "print the findings as JSON")
	return func(c *call) error {
		h, err := c.host()
		if err != nil {
			return err
		}
		var r doctorResult
		if *fix {
			if r.Fixed, err = h.Ensure(c.ctx); err != nil {
				return fmt.Errorf("fixing the host: %w", err)
			}
			if !*asJSON {
				printReport(c, r.Fixed)
			}
		}
		if r.Verification, err = h.Verify(c.ctx); err != nil {
			return fmt.Errorf("checking the host: %w", err)
		}
		if *fix && h.Boot.SysctlFile != "" {
			// The host's limits are global: raised only when asked, here,
			// on a real host; then checked again.
			raised, err := hostns.RaiseLimits(h.Boot.SysctlFile, r.Verification.Instances)
			r.Fixed.Changes = append(r.Fixed.Changes, raised...)
			if !*asJSON {
				for _, ch := range raised {
					fmt.Fprintln(c.out, ch.String())
				}
			}
			if err != nil {
				return fmt.Errorf("fixing the host's limits: %w", err)
			}
			if len(raised) > 0 {
				if r.Verification, err = h.Verify(c.ctx); err != nil {
					return fmt.Errorf("checking the host: %w", err)
				}
			}
		}
		v := r.Verification
		if h.Remote == "" {
			ic := c.images(h)
			ims := ic.ims
			notes, err := ims.Notes(c.ctx, ic.maxAge())
			if err != nil {
				notes = append(notes, "template images: not read: "+err.Error())
			}
			v.Notes = append(v.Notes, notes...)
			if r.Storage, err = ims.PoolCost(c.ctx); err != nil {
				v.Notes = append(v.Notes, "storage pool: not read: "+err.Error())
			}
		}
		if *asJSON {
			if err := c.printJSON(r); err != nil {
				return err
			}
		} else {
			for _, n := range v.Notes {
				fmt.Fprintln(c.err, "box: note: "+n)
			}
			for _, f := range v.Findings {
				obj := f.Object
				if f.Member != "" {
					obj += " (member " + f.Member + ")"
				}
				fmt.Fprintf(c.out, "%-12s %s: %s\n%-12s fix: %s\n", f.Layer, obj, f.Problem, "", f.Fix)
			}
			printDaemon(c, v.Daemon)
			printGuard(c.out, v.GuardCounters)
			printMembers(c, v.Members)
			printTiers(c, v.Tiers)
			if v.Pool != nil {
				fmt.Fprintln(c.out, v.Pool.String())
			}
			if r.Storage != nil {
				fmt.Fprintln(c.out, r.Storage.String())
			}
			if v.Clean() {
				fmt.Fprintf(c.out, "ok: the host matches the isolation stack (subnet %s, bridge drop: %s, %d bridge ports isolated)\n", v.Subnet, v.BridgeMode, len(v.Ports))
			}
		}
		if !v.Clean() {
			switch {
			case *asJSON:
			case *fix:
				fmt.Fprintf(c.err, "box: %d findings left that box does not own (it never changes or deletes a user's box): run the fix each names\n", len(v.Findings))
			default:
				fmt.Fprintf(c.err, "box: %d findings; box doctor --fix converges what box owns\n", len(v.Findings))
			}
			return exitError{exitFailed}
		}
		return nil
	}
}

func setupTeardownHost(fs *flag.FlagSet) action {
	force := fs.Bool("force", false, "delete every box (with its snapshots) along with the stack")
	yes := fs.Bool("yes", false, "do not ask (needed where there is no terminal)")
	purge := fs.Bool("purge-incus", false, "then remove what box and drill put into Incus (the probe images they imported; box installs and initialises nothing else)")
	asJSON := fs.Bool("json", false, "print what was removed as JSON")
	return func(c *call) error {
		h, err := c.host()
		if err != nil {
			return err
		}
		if !*yes {
			q := "remove the isolation stack (boxnet, box-net, box-isolate, the nft tables) from this host?"
			if *force {
				q = "remove the isolation stack AND every box with its snapshots?"
			}
			if *purge {
				q = strings.TrimSuffix(q, "?") + ", and the probe images box and drill imported into Incus?"
			}
			if err := c.confirm(q, "--yes"); err != nil {
				return err
			}
		}
		changes, err := h.Teardown(c.ctx, *force)
		c.progressDone()
		if err == nil && *purge {
			var more []model.Change
			more, err = stack.PurgeIncus(c.ctx, h.Incus)
			changes = append(changes, more...)
			if err == nil {
				more, err = c.images(h).ims.Purge(c.ctx)
				changes = append(changes, more...)
			}
		}
		if *asJSON && changes != nil {
			if jerr := c.printJSON(changes); jerr != nil {
				return errors.Join(err, jerr)
			}
		} else {
			for _, ch := range changes {
				fmt.Fprintln(c.out, ch.String())
			}
		}
		if err != nil {
			return fmt.Errorf("tearing down the host: %w", err)
		}
		if len(changes) == 0 && !*asJSON {
			fmt.Fprintln(c.out, "nothing to remove: no stack on this host")
		}
		return nil
	}
}

func setupMigrateHost(fs *flag.FlagSet) action {
	box := fs.String("box", "", "move this one box onto the current stack")
	all := fs.Bool("all-boxes", false, "move every box still on the legacy stack")
	retire := fs.Bool("retire-legacy", false, "remove the legacy profile, bridge and ACL (refused while anything uses them)")
	asJSON := fs.Bool("json", false, "print the changes as JSON")
	return func(c *call) error {
		n := 0
		for _, set := range []bool{*box != "", *all, *retire} {
			if set {
				n++
			}
		}
		if n != 1 {
			return usagef("migrate-host: name exactly one of --box N, --all-boxes, --retire-legacy")
		}
		h, err := c.host()
		if err != nil {
			return err
		}
		changes, err := h.Migrate(c.ctx, stack.MigrateRequest{Box: *box, AllBoxes: *all, RetireLegacy: *retire})
		if *asJSON && changes != nil {
			if jerr := c.printJSON(changes); jerr != nil {
				return errors.Join(err, jerr)
			}
		} else {
			for _, ch := range changes {
				fmt.Fprintln(c.out, ch.String())
			}
		}
		if err != nil {
			return err
		}
		if len(changes) == 0 && !*asJSON {
			fmt.Fprintln(c.out, "nothing to migrate")
		}
		return nil
	}
}

// statusResult is what `box status --json` prints.
type statusResult struct {
	Stack stackStatus `json:"stack"`
	Boxes []stack.Box `json:"boxes"`
}

// stackStatus is the stack's health in one line.
type stackStatus struct {
	OK       bool   `json:"ok"`
	Line     string `json:"line"`
	Findings int    `json:"findings"`
}

// statusOf sums Verify up in one line.
func statusOf(v *stack.Verification, err error) stackStatus {
	switch {
	case err != nil:
		return stackStatus{Line: fmt.Sprintf("stack: unknown: %v", err)}
	case !v.Subnet.IsValid():
		return stackStatus{Line: "stack: not set up: run box setup-host", Findings: len(v.Findings)}
	}
	n := 0
	for _, f := range v.Findings {
		if !f.Advisory {
			n++
		}
	}
	if n > 0 {
		return stackStatus{Line: fmt.Sprintf("stack: %d finding(s): box doctor names them, box doctor --fix converges what box owns", n), Findings: n}
	}
	watcher := "no port watcher"
	if v.WatcherPID > 0 {
		watcher = fmt.Sprintf("port watcher pid %d", v.WatcherPID)
	}
	if v.BridgeMode != nft.ModePortSet {
		watcher = "no port watcher needed"
	}
	return stackStatus{OK: true, Line: fmt.Sprintf("stack: ok: subnet %s, bridge drop %s, %d port(s) isolated, %s", v.Subnet, v.BridgeMode, len(v.Ports), watcher)}
}

func setupStatus(fs *flag.FlagSet) action {
	asJSON := fs.Bool("json", false, "print JSON")
	return func(c *call) error {
		h, err := c.host()
		if err != nil {
			return err
		}
		st := statusOf(h.Verify(c.ctx))
		boxes, cerr, err := h.BoxesOnStack(c.ctx)
		if err != nil {
			return err
		}
		if *asJSON {
			if err := c.printJSON(statusResult{Stack: st, Boxes: boxes}); err != nil {
				return err
			}
		} else {
			fmt.Fprintln(c.out, st.Line)
			if err := c.printBoxes(boxes, cerr); err != nil {
				return err
			}
		}
		if !st.OK {
			return exitError{exitFailed}
		}
		return nil
	}
}

// printTiers lists the access tiers, one line each.
func printTiers(c *call, tiers []stack.Tier) {
	if len(tiers) == 0 {
		return
	}
	fmt.Fprintln(c.out, "access tiers:")
	for _, t := range tiers {
		who := t.User
		if who == "" {
			who = "(no account)"
		}
		group := "not in the group"
		if t.InGroup {
			group = "in the group"
		}
		state := t.State
		if len(t.Findings) > 0 {
			state += fmt.Sprintf(", %d findings", len(t.Findings))
		}
		fmt.Fprintf(c.out, "  %-12s uid %-7d %-12s %s, %d boxes, %s\n", who, t.UID, t.Project, state, t.Boxes, group)
	}
}

// printDaemon names box's daemon and each service it runs, up or down.
// printGuard says what the guard (L-GUARD) passed and dropped on each
// hook since it was attached, the reasons with a count in counter order.
func printGuard(w io.Writer, counters map[string]map[string]uint64) {
	for _, hook := range slices.Sorted(maps.Keys(counters)) {
		var passed, dropped uint64
		var parts []string
		for _, r := range guard.Reasons() {
			n := counters[hook][r.String()]
			if n == 0 {
				continue
			}
			if strings.HasPrefix(r.String(), "pass_") {
				passed += n
			} else {
				dropped += n
			}
			parts = append(parts, fmt.Sprintf("%s %d", r, n))
		}
		fmt.Fprintf(w, "guard: %s: passed %d, dropped %d packets since attached (%s)\n", hook, passed, dropped, strings.Join(parts, ", "))
	}
}

func printDaemon(c *call, d *hostns.DaemonStatus) {
	if d == nil {
		fmt.Fprintf(c.out, "daemon: not running (%s)\n", bootunits.DaemonUnitName)
		return
	}
	fmt.Fprintf(c.out, "daemon: pid %d (%s)\n", d.PID, bootunits.DaemonUnitName)
	for _, s := range d.Services {
		state := "up"
		if !s.Up {
			state = "DOWN: " + s.Problem
		}
		fmt.Fprintf(c.out, "  %-7s %s (%s)\n", s.Name, state, s.Does)
	}
}
