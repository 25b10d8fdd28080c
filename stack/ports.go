package stack

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/box-isolation/box/stack/hostns"
	"github.com/box-isolation/box/stack/model"
	"github.com/box-isolation/box/stack/nft"
)

// Port and pin sync: after a box changes (minted, started, moved, leased),
// every port of the bridge is isolated, the bridge drop's port set is exact
// where the kernel has no bridge meta, and the pin table pins each port to
// its instance's MAC and fixed address. Box commands call RefreshPorts; the port
// daemon (stack/daemon) calls SyncPorts and RefreshPins apart.

// PortsRefresh is what one RefreshPorts changed.
type PortsRefresh struct {
	Isolated []string // ports whose isolated flag it turned on
	Added    []string // ports it put in the bridge drop's port set
	Removed  []string // names it took out of the set
	// isolatedAt and addedAt are when the flags were set and when the
	// additions were committed (zero when there were none).
	IsolatedAt, AddedAt time.Time
	// pinned says the pin table's sets changed; unresolved are ports no
	// instance claims yet, left unpinned (planPins); addressless are boxes
	// Incus was still starting, given no fixed address yet.
	Pinned      bool
	Unresolved  []string
	Addressless []string
}

func (r PortsRefresh) empty() bool { return len(r.Isolated)+len(r.Added)+len(r.Removed) == 0 }

// RefreshPorts isolates every port of the bridge and, where the kernel has
// no nft bridge meta, refreshes the bridge drop's port set (SyncPorts),
// then the pins (RefreshPins): a box's port name is only known once it has
// started, its lease once it has asked. It is the one refresh box commands
// call after changing a box; `box guard-and-serve` (WatchPorts) calls the two
// halves apart, so a new port never waits for Incus's answers.
//
// On a cluster it refreshes every member it can reach (its own, and those
// Members.NetNS names): a box minted, started or moved from here may live on
// any of them. Another machine's member is its port watcher's to refresh.
func (host *Host) RefreshPorts(ctx context.Context) (PortsRefresh, error) {
	if host.NoKernel || host.Remote != "" {
		// A remote's ports are its host's port watcher's.
		return PortsRefresh{}, nil
	}
	if host.Tier.Granted || host.member != "" {
		return host.refreshPortsHere(ctx)
	}
	ci, err := host.Cluster(ctx)
	if err != nil {
		return PortsRefresh{}, err
	}
	r, err := host.refreshPortsHere(ctx)
	if err != nil || !ci.Clustered() {
		return r, err
	}
	for _, m := range ci.Names() {
		if mh, ok := host.ForMember(m); ok && m != ci.Local {
			if _, err := mh.refreshPortsHere(ctx); err != nil {
				return r, fmt.Errorf("member %s: %w", m, err)
			}
		}
	}
	return r, nil
}

// refreshPortsHere is RefreshPorts on this host's member only.
func (host *Host) refreshPortsHere(ctx context.Context) (PortsRefresh, error) {
	if host.Tier.Granted {
		// A granted user cannot touch the kernel: the port watcher (root)
		// puts the port in the set, pins it and applies its allowlist, as
		// it does for any box, at once when asked.
		if err := RequireWatcher(host.NetNS); err != nil {
			return PortsRefresh{}, err
		}
		return PortsRefresh{}, hostns.AskRefresh(ctx, host.NetNS, 30*time.Second)
	}
	r, err := host.SyncPorts(ctx)
	if err != nil {
		return r, err
	}
	return r, host.RefreshPins(ctx, &r)
}

// SyncPorts is the kernel-only half of a refresh: every port isolated, the
// port set exact. Refreshes are serialised across processes, so two box
// commands at once cannot drop each other's ports.
func (host *Host) SyncPorts(ctx context.Context) (PortsRefresh, error) {
	var r PortsRefresh
	unlock, err := hostns.LockFile(ctx, hostns.PortsLock, "the port set")
	if err != nil {
		return r, err
	}
	defer unlock()
	g, err := host.OpenNS()
	if err != nil {
		return r, err
	}
	defer g.Close()
	ports, isolated, err := g.IsolatePorts(model.Current.Network)
	if len(isolated) > 0 {
		r.Isolated, r.IsolatedAt = isolated, time.Now()
	}
	if err != nil {
		return r, err
	}
	ncfg := g.NFTConfig(model.Current)
	_, bridge, err := nft.Present(ncfg)
	if err != nil || !bridge {
		return r, err // no bridge table: nothing to refresh (doctor reports it)
	}
	ch, err := nft.SyncPorts(ncfg, hostns.PortNames(ports))
	r.Added, r.Removed, r.AddedAt = ch.Added, ch.Removed, ch.AddedAt
	return r, err
}

// RefreshPins makes the pin table pin the bridge's ports as they are now,
// with the fixed addresses as they are now: it asks Incus whose each port
// is and what its NIC's address is. A box up without a fixed address gets
// one first, table or none (the bridge's DHCP answers it only then).
func (host *Host) RefreshPins(ctx context.Context, r *PortsRefresh) error {
	return pinRefresh{host}.run(ctx, r, nil)
}

// RefreshStarted is RefreshPorts after a box's start on this host's
// kernel, the pins' half skipped when, under their lock, the kernel pins
// the box as it is now: the port watcher's refresh on its new port, from
// a reading of the fleet after the start, got there first.
func (addrs *Addresses) RefreshStarted(ctx context.Context, name string) error {
	host := addrs.host
	standalone := false
	if addrs.readsKernel() && host.Incus != nil {
		ci, err := host.Cluster(ctx)
		standalone = err == nil && !ci.Clustered()
	}
	if !standalone {
		_, err := host.RefreshPorts(ctx)
		return err
	}
	r, err := host.SyncPorts(ctx)
	if err != nil {
		return err
	}
	inst, _, err := host.Incus.Instances().Get(ctx, name)
	if err != nil {
		return err
	}
	return pinRefresh{host}.run(ctx, &r, func() bool { return addrs.pinnedAsItIs(inst) })
}

// pinRefresh is one refresh of the pins and the egress sets.
type pinRefresh struct{ host *Host }

// run is RefreshPins, skipped when settled, asked under the pins' lock,
// says the refresh has nothing to do.
func (p pinRefresh) run(ctx context.Context, r *PortsRefresh, settled func() bool) error {
	host := p.host
	if host.Incus == nil {
		return nil
	}
	unlock, err := hostns.LockFile(ctx, hostns.PinsLock, "the pins")
	if err != nil {
		return err
	}
	defer unlock()
	if settled != nil && settled() {
		return nil
	}
	g, err := host.OpenNS()
	if err != nil {
		return err
	}
	defer g.Close()
	ncfg := g.NFTConfig(model.Current)
	present, err := nft.PinsPresent(ncfg)
	if err != nil {
		return err
	}
	egress, err := nft.EgressPresent(ncfg)
	if err != nil {
		return err
	}
	if !present && !egress {
		// With the pin table gone (a drill's mutation), a box still needs
		// its address; with no table of box's at all, there is no stack.
		inet, bridge, err := nft.Present(ncfg)
		if err != nil || (!inet && !bridge) {
			return err
		}
	}
	f, err := host.ReadFleet(ctx)
	if err != nil {
		return err
	}
	// A box whose port is up with no fixed address gets one first: a
	// granted user's, whose user could pick none (the port watcher runs
	// this as its port comes up), or one started by hand.
	fixed, busy, err := host.Addresses().fixMissingAddresses(ctx, f)
	r.Addressless = busy
	if err != nil {
		return err
	}
	if fixed {
		if f, err = host.ReadFleet(ctx); err != nil {
			return err
		}
	}
	if !present && !egress {
		return nil
	}
	// A box's egress policy follows its lease (also where the pin table
	// is gone).
	if _, err := applyEgress(ctx, host.Incus, g, f, host.BootFiles()); err != nil {
		return err
	}
	if !present {
		return nil
	}
	ports, err := g.BridgePorts(model.Current.Network)
	if err != nil {
		return err
	}
	plan := f.PlanPins(hostns.PortNames(ports))
	r.Unresolved = plan.unresolved
	r.Pinned, err = nft.SetPins(ncfg, plan.Scope, plan.Pins)
	if err != nil {
		return fmt.Errorf("refreshing the pins: %w", err)
	}
	return nil
}

// RequireWatcher refuses, on a granted user's behalf, when no port watcher
// runs: without one a new box's port stays outside the bridge drop and the
// pins.
func RequireWatcher(netns string) error {
	_, running, err := hostns.DaemonRunning(netns)
	if err != nil {
		return err
	}
	if !running {
		return errors.New("no port watcher (box guard-and-serve) runs on this host, so a new box's bridge port would stay outside the bridge drop and the pins: ask the host's admin to start box-guard-and-serve.service")
	}
	return nil
}
