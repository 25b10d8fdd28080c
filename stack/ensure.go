package stack

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/box-isolation/box/internal/converge"
	"github.com/box-isolation/box/stack/guard"
	"github.com/box-isolation/box/stack/hostns"
	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/model"
	"github.com/box-isolation/box/stack/nft"
)

// Report is what Ensure did.
type Report struct {
	Subnet     model.SubnetChoice `json:"subnet"`
	Gateway    netip.Addr         `json:"gateway"`
	BridgeMode nft.BridgeMode     `json:"bridge_mode"`
	Changes    []model.Change     `json:"changes"`
	// Notes are things the operator should know that are not changes
	// (an auto-picked subnet, no systemd to re-apply rules at boot).
	Notes []string `json:"notes"`
	// Members says, on a cluster, whether each member's host layers are
	// in place (this member's were converged by this run).
	Members []MemberLayers `json:"members,omitempty"`
}

// Ensure converges the host to the desired stack. Each object it creates
// or changes is reported; on a host that already matches, it changes
// nothing and says so (an empty Changes). If a step fails, what this run
// created is removed again and what it changed is put back.
func (host *Host) Ensure(ctx context.Context) (*Report, error) {
	if err := host.BootFiles().refuseExe(); err != nil {
		return nil, err
	}
	unlock, err := host.Lock.take(ctx, host.NetNS)
	if err != nil {
		return nil, err
	}
	defer unlock()
	rep, err := host.ensure(ctx)
	if rep != nil && err == nil && host.Remote == "" && !host.Tier.Granted && !host.NoKernel {
		// The host's limits, named (docs/design.md): doctor --fix raises them.
		if insts, ierr := host.Incus.Instances().All(ctx); ierr == nil {
			if ci, cerr := host.Cluster(ctx); cerr == nil {
				rep.Notes = append(rep.Notes, hostns.LimitNotes(len(onMember(insts, ci.Local)))...)
			}
		}
	}
	return rep, err
}

// ensure is Ensure under the setup lock.
func (host *Host) ensure(ctx context.Context) (rep *Report, err error) {
	g, err := host.OpenNS()
	if err != nil {
		return nil, err
	}
	defer g.Close()
	c := host.Incus
	rep = &Report{Changes: []model.Change{}, Notes: []string{}}

	var undos converge.Undos
	defer func() {
		if err == nil {
			return
		}
		if uerr := undos.Run(context.WithoutCancel(ctx)); uerr != nil {
			err = errors.Join(err, uerr)
		}
	}()
	changed := func(obj, action, detail string) {
		rep.Changes = append(rep.Changes, model.Change{Object: obj, Action: action, Detail: detail})
	}

	ci, err := host.Cluster(ctx)
	if err != nil {
		return nil, err
	}
	if host.Members.Only && !ci.Clustered() {
		return nil, errors.New("--member-only is for a member of an Incus cluster, and this incusd is standalone: run box setup-host")
	}

	// The subnet: an existing bridge is converged on as it is.
	gen := model.Current
	net, netETag, err := c.Networks().Get(ctx, gen.Network)
	if err != nil && !incus.IsNotFound(err) {
		return nil, fmt.Errorf("reading network %s: %w", gen.Network, err)
	}
	if host.Members.Only {
		if net == nil {
			return nil, fmt.Errorf("the cluster has no network %s yet: run box setup-host on any one member first, then box setup-host --member-only here", gen.Network)
		}
		return rep, host.ensureMember(ctx, g, net, rep)
	}
	// A bridge Incus left Pending with no instance on it is removed here
	// and made again below, on its subnet and with the options it stored
	// (pending.go); with instances on it, the error names the fix.
	var stored map[string]string
	if net != nil && net.Status == networkPending && !ci.Clustered() {
		if err := repairPending(ctx, host.Incus, g, net, host.NoKernel, changed); err != nil {
			return nil, err
		}
		stored, net, netETag = net.Config, nil, ""
	}
	if rep.Subnet, err = chooseSubnet(g, ci, net, stored, host.Options.Subnet, host.Members, rep); err != nil {
		return nil, err
	}
	opts, err := desiredOptions(ctx, c, ci, host.Options, rep.Subnet.Subnet, net, stored)
	if err != nil {
		return nil, err
	}
	d := model.BuildDesired(rep.Subnet.Subnet, opts)
	rep.Gateway = d.Gateway

	// Every box gets a fixed address before the bridge's DHCP answers no
	// one else (L-DHCP): one minted before box stored addresses keeps the
	// one it leases, and so its lease at its next renewal.
	if net != nil {
		chs, err := host.Addresses().fixAllAddresses(ctx, ci)
		rep.Changes = append(rep.Changes, chs...)
		if err != nil {
			return rep, fmt.Errorf("giving the boxes fixed addresses: %w", err)
		}
	}

	if err := convergeObjects(ctx, c, ci, d, net, netETag, &undos, changed); err != nil {
		return rep, err
	}

	if err := host.ensureHostLayers(ctx, g, d, rep, &undos); err != nil {
		return rep, err
	}
	// Incus's own chains, once its objects are converged (incusfw.go).
	if err := ensureIncusFirewall(ctx, host.Incus, g, d, rep); err != nil {
		return rep, err
	}
	if ci.Clustered() {
		rep.Members = host.memberLayers(ctx, ci, d)
	}
	return rep, nil
}

func waitDnsmasq(ctx context.Context, g *hostns.NS, bridge string, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for g.DnsmasqFor(bridge) == 0 {
		if time.Now().After(deadline) {
			return fmt.Errorf("no dnsmasq serves %s after %s although Incus has the network: restart incusd, then run `box doctor`", bridge, limit)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return nil
}

// configDiff names the desired keys whose live value differs.
func configDiff(live, want map[string]string) []string {
	var out []string
	for _, k := range slices.Sorted(maps.Keys(want)) {
		if live[k] != want[k] {
			out = append(out, fmt.Sprintf("%s=%s (was %s)", k, shortQuote(want[k]), shortQuote(live[k])))
		}
	}
	return out
}

// shortQuote quotes a config value, cut short when it is long (a bridge's
// dnsmasq settings with a long allowlist run to hundreds of kilobytes).
func shortQuote(v string) string {
	const most = 160
	if len(v) <= most {
		return strconv.Quote(v)
	}
	return fmt.Sprintf("%s... (%d bytes)", strconv.Quote(v[:most]), len(v))
}

// ProfileDiff names how a live profile differs from the desired one: a
// device missing, changed or extra, or config present.
func ProfileDiff(live *incus.Profile, want incus.Profile) []string {
	var out []string
	for _, name := range slices.Sorted(maps.Keys(want.Devices)) {
		if d := configDiff(live.Devices[name], want.Devices[name]); len(d) > 0 {
			out = append(out, "device "+name+": "+strings.Join(d, ", "))
		} else if len(live.Devices[name]) != len(want.Devices[name]) {
			out = append(out, "device "+name+" has extra keys")
		}
	}
	for _, name := range slices.Sorted(maps.Keys(live.Devices)) {
		if _, ok := want.Devices[name]; !ok {
			out = append(out, "extra device "+name)
		}
	}
	if d := configDiff(live.Config, want.Config); len(d) > 0 {
		out = append(out, "config: "+strings.Join(d, ", "))
	}
	for _, k := range slices.Sorted(maps.Keys(live.Config)) {
		if _, ok := want.Config[k]; !ok {
			out = append(out, "extra config "+k)
		}
	}
	return out
}

// FirewallResult is what ApplyFirewall did.
type FirewallResult struct {
	Changes       []model.Change
	mode          nft.BridgeMode
	notes         []string
	createdTables bool
}

// ApplyFirewall isolates every port of the bridge, whatever attached it,
// and converges box's nft tables, the route layer and the guard.
//
// It holds the port set's lock only while it lists the ports and writes
// the set, and the pins' lock only while it plans and writes the pins
// (Incus's answers included): the leak sweep asks Incus and may wait its
// grace, and a port that joins meanwhile must not wait behind it for the
// port watcher to take it in (measured at a machine's boot under load: a
// new box's port 1.06 s outside the bridge drop's set while a sweep held
// the lock).
func (host *Host) ApplyFirewall(ctx context.Context, g *hostns.NS, gw netip.Addr) (FirewallResult, error) {
	var res FirewallResult
	bridge := model.Current.Network
	leaked, err := sweepLeaks(ctx, host.Incus, g)
	for _, name := range leaked {
		res.Changes = append(res.Changes, model.Change{Object: "bridge port " + name, Action: "removed", Detail: "a veth pair an instance's NIC left behind (both ends in the host's namespace, claimed by no instance)"})
	}
	if err != nil {
		return res, err
	}
	ncfg := g.NFTConfig(model.Current)
	ncfg.Gateway = gw
	caps, err := nft.Probe(ncfg)
	if err != nil {
		return res, fmt.Errorf("probing nftables: %w", err)
	}
	if err := applyPortSet(ctx, g, ncfg, caps, &res); err != nil {
		return res, err
	}
	f, err := host.applyPinsAndEgress(ctx, g, ncfg, caps, &res)
	if err != nil {
		return res, err
	}
	if err := host.Addresses().repairLeases(ctx, g, f, &res); err != nil {
		return res, err
	}
	routed, err := EnsureRoute(g)
	if err != nil {
		return res, err
	}
	res.Changes = append(res.Changes, routed...)
	guarded, notes, err := guard.EnsureNoted(g)
	res.Changes = append(res.Changes, guarded...)
	res.notes = append(res.notes, notes...)
	if err != nil {
		return res, err
	}
	res.mode = nft.Desired(ncfg, caps).Mode
	if res.mode != nft.ModeBridgeMeta {
		res.notes = append(res.notes, fmt.Sprintf("this kernel has no nft bridge meta (%s): the bridge drop matches a set of %s's ports, refreshed whenever box starts a box and, while `box guard-and-serve` runs, whenever a port comes or goes; `box doctor` reports a stale set", caps.Detail, bridge))
	}
	return res, nil
}

// applyPortSet isolates the bridge's ports and converges box's tables
// with the set of the ports there now, under the port set's lock (the
// kernel's only: no Incus call while it is held).
func applyPortSet(ctx context.Context, g *hostns.NS, ncfg nft.Config, caps nft.Capabilities, res *FirewallResult) error {
	unlock, err := hostns.LockPorts(ctx)
	if err != nil {
		return err
	}
	defer unlock()
	ports, isolated, err := g.IsolatePorts(model.Current.Network)
	if err != nil {
		return err
	}
	for _, name := range isolated {
		res.Changes = append(res.Changes, model.Change{Object: "bridge port " + name, Action: "updated", Detail: "isolated on"})
	}
	inetBefore, bridgeBefore, err := nft.Present(ncfg)
	if err != nil {
		return fmt.Errorf("reading nft tables: %w", err)
	}
	applied, err := nft.Apply(ncfg, caps, hostns.PortNames(ports))
	if err != nil {
		return fmt.Errorf("applying nft tables: %w", err)
	}
	res.noteApplied(applied)
	res.createdTables = len(applied) > 0 && !inetBefore && !bridgeBefore
	return nil
}

// applyPinsAndEgress converges the pin table and the egress table with
// what Incus says of the fleet, under the pins' lock, as RefreshPins does:
// the ports are listed after Incus answered, so a port that came or went
// while it was asked is pinned (or let go) by the port watcher's refresh,
// which waits for this one.
func (host *Host) applyPinsAndEgress(ctx context.Context, g *hostns.NS, ncfg nft.Config, caps nft.Capabilities, res *FirewallResult) (Fleet, error) {
	unlock, err := hostns.LockFile(ctx, hostns.PinsLock, "the pins")
	if err != nil {
		return Fleet{}, err
	}
	defer unlock()
	f, err := host.ReadFleet(ctx)
	if err != nil {
		return f, fmt.Errorf("reading what to pin: %w", err)
	}
	ports, err := g.BridgePorts(model.Current.Network)
	if err != nil {
		return f, err
	}
	plan := f.PlanPins(hostns.PortNames(ports))
	pinned, err := nft.ApplyPins(ncfg, caps, plan.Scope, plan.Pins)
	if err != nil {
		return f, fmt.Errorf("applying the pin table: %w", err)
	}
	res.noteApplied(pinned)
	egress, err := applyEgress(ctx, host.Incus, g, f, host.BootFiles())
	res.noteApplied(egress)
	return f, err
}

// repairLeases repairs what poolFindings names of the bridge's DHCP: a
// dnsmasq writing its leases to a file deleted from disk is restarted by
// Incus (which then reads the file on disk), and a box's lease for an
// address other than its fixed one is released (the box takes its fixed
// address at its next renewal). Nothing of box's writes the lease file.
func (addrs *Addresses) repairLeases(ctx context.Context, g *hostns.NS, f Fleet, res *FirewallResult) error {
	host := addrs.host
	pool, err := poolOf(g, f.insts)
	if err != nil {
		return nil // no dnsmasq here (yet): the pool is Verify's to name
	}
	if pool.LeaseFileGone {
		detail, err := ReapplyIncusFirewall(ctx, host.Incus)
		if err != nil {
			return fmt.Errorf("restarting the bridge's dnsmasq, whose lease file was deleted from disk: %w", err)
		}
		res.Changes = append(res.Changes, model.Change{Object: fmt.Sprintf("dnsmasq (pid %d)", pool.PID), Action: "restarted",
			Detail: "its lease file " + pool.LeaseFile + " was deleted from disk while it ran: " + detail})
		if pool, err = poolOf(g, f.insts); err != nil {
			return nil
		}
	}
	if len(pool.Astray) == 0 {
		return nil
	}
	var leases []DHCPLease
	for _, a := range pool.Astray {
		leases = append(leases, a.Lease)
	}
	left, err := addrs.ReleaseLeases(ctx, leases)
	for _, a := range pool.Astray {
		if !slices.Contains(left, a.Lease) {
			res.Changes = append(res.Changes, model.Change{Object: "lease " + a.Lease.Address.String(), Action: "released",
				Detail: fmt.Sprintf("box %s's, not its fixed address %s", a.Box, a.Fixed)})
		}
	}
	return err
}

func (res *FirewallResult) noteApplied(applied []string) {
	for _, a := range applied {
		res.Changes = append(res.Changes, model.Change{Object: "nft", Action: "updated", Detail: a})
	}
}

// EnsureFirewall converges only the firewall part of the stack (the bridge
// ports' isolated flag and the nft tables), which is what does not survive
// a reboot; it is what the boot unit runs (`box setup-host
// --firewall-only`). The bridge must exist.
func (host *Host) EnsureFirewall(ctx context.Context) (*Report, error) {
	unlock, err := host.Lock.take(ctx, host.NetNS)
	if err != nil {
		return nil, err
	}
	defer unlock()
	n, _, err := host.Incus.Networks().Get(ctx, model.Current.Network)
	if err != nil {
		return nil, fmt.Errorf("firewall only: network %s: %w (run box setup-host without --firewall-only)", model.Current.Network, err)
	}
	p, err := netip.ParsePrefix(n.Config["ipv4.address"])
	if err != nil || !p.Addr().Is4() {
		return nil, fmt.Errorf("firewall only: network %s has ipv4.address=%q, not an address box can use (run box setup-host without --firewall-only)", model.Current.Network, n.Config["ipv4.address"])
	}
	g, err := host.OpenNS()
	if err != nil {
		return nil, err
	}
	defer g.Close()
	fw, err := host.ApplyFirewall(ctx, g, p.Addr())
	rep := &Report{Changes: append([]model.Change{}, fw.Changes...), BridgeMode: fw.mode, Notes: append([]string{}, fw.notes...)}
	if err == nil {
		err = host.BootFiles().SaveFirewall(func(s *SavedFirewall) { s.Gateway = p.Addr() })
	}
	return rep, err
}

// ensureHostLayers converges this host's (this member's) own layers: IPv6
// off on the bridge, the ports' isolated flags and the nft tables, the
// forward-policy warnings, dnsmasq serving, and the boot unit.
func (host *Host) ensureHostLayers(ctx context.Context, g *hostns.NS, d model.Desired, rep *Report, undos *converge.Undos) error {
	gen := model.Current
	changed := func(obj, action, detail string) {
		rep.Changes = append(rep.Changes, model.Change{Object: obj, Action: action, Detail: detail})
	}
	// IPv6 must be off on the bridge in fact, not only in its config.
	if disabled, ok, err := g.IPv6Disabled(d.Network.Name); err != nil {
		return fmt.Errorf("reading IPv6 state of %s: %w", d.Network.Name, err)
	} else if ok && !disabled {
		if err := g.DisableIPv6(d.Network.Name); err != nil {
			return fmt.Errorf("turning IPv6 off on %s: %w", d.Network.Name, err)
		}
		changed("bridge "+d.Network.Name, "updated", "IPv6 turned off (disable_ipv6=1)")
	}
	v6, err := g.GlobalV6(d.Network.Name)
	if err != nil {
		return fmt.Errorf("reading IPv6 addresses of %s: %w", d.Network.Name, err)
	}
	if len(v6) > 0 {
		br, err := g.Netlink.LinkByName(d.Network.Name)
		if err != nil {
			return err
		}
		for _, a := range v6 {
			if err := g.Netlink.AddrDel(br, &a); err != nil {
				return fmt.Errorf("removing IPv6 address %s from %s: %w", a.IPNet, d.Network.Name, err)
			}
			changed("bridge "+d.Network.Name, "updated", "removed IPv6 address "+a.IPNet.String())
		}
	}

	// The firewall: live ports isolated and the nft tables.
	fw, err := host.ApplyFirewall(ctx, g, d.Gateway)
	rep.Changes = append(rep.Changes, fw.Changes...)
	rep.BridgeMode = fw.mode
	rep.Notes = append(rep.Notes, fw.notes...)
	if fw.createdTables {
		undos.Push("delete nft tables", func(context.Context) error { _, err := nft.Delete(g.NFTConfig(gen)); return err })
	}
	if err != nil {
		return err
	}

	// Docker, UFW or another firewall may drop all forwarded traffic: say
	// so, and what to run; their rules are not box's to rewrite.
	blockers, err := forwardBlockers(g, d.Network.Name)
	if err != nil {
		return err
	}
	for _, b := range blockers {
		rep.Notes = append(rep.Notes, fmt.Sprintf("WARNING: %s %s. Nothing was changed there; to let boxes out, run: %s", b.Object, b.Problem, b.Fix))
	}

	// dnsmasq restarts when the bridge's DNS settings change: wait for it,
	// and believe the process, not the network's status.
	if err := waitDnsmasq(ctx, g, d.Network.Name, 15*time.Second); err != nil {
		return err
	}

	if err := host.BootFiles().SaveFirewall(func(s *SavedFirewall) { s.Gateway = d.Gateway }); err != nil {
		return err
	}
	if err := host.Storage().ensure(ctx, rep); err != nil {
		return err
	}
	note, chs, err := host.BootFiles().ensureUnits()
	rep.Changes = append(rep.Changes, chs...)
	if err != nil {
		return err
	}
	if note != "" {
		rep.Notes = append(rep.Notes, note)
	}
	return nil
}

// chooseSubnet is the bridge's subnet: an existing bridge's as it is (a
// pin that differs is refused: box never re-addresses live boxes), else
// the one a repaired bridge stored, the pin, or the first free /24.
func chooseSubnet(g *hostns.NS, ci ClusterInfo, net *incus.Network, stored map[string]string, pin netip.Prefix, members Membership, rep *Report) (model.SubnetChoice, error) {
	if net != nil {
		p, err := netip.ParsePrefix(net.Config["ipv4.address"])
		if err != nil {
			return model.SubnetChoice{}, fmt.Errorf("network %s exists with ipv4.address=%q, which box cannot build on: remove it with `box teardown-host`", model.Current.Network, net.Config["ipv4.address"])
		}
		if pin.IsValid() && pin != p.Masked() {
			return model.SubnetChoice{}, fmt.Errorf("network %s already exists on %s; BOX_SUBNET=%s would re-address it under live boxes: unset BOX_SUBNET, or `box teardown-host` first", model.Current.Network, p.Masked(), pin)
		}
		return model.SubnetChoice{Subnet: p.Masked(), Reason: "existing " + model.Current.Network}, nil
	}
	uses, err := members.addressUses(g, ci, rep)
	if err != nil {
		return model.SubnetChoice{}, err
	}
	if p, perr := netip.ParsePrefix(stored["ipv4.address"]); perr == nil && !pin.IsValid() {
		pin = p.Masked()
	}
	choice, err := model.PickSubnet(pin, uses)
	if err == nil && choice.Auto {
		rep.Notes = append(rep.Notes, "NOTE: "+choice.Reason)
	}
	return choice, err
}

// desiredOptions are the options the desired stack is built from: the
// operator's, with what the bridge (or a repaired one) stored kept, the
// egress policies boxes still name, and on a cluster every member's slice.
func desiredOptions(ctx context.Context, c *incus.Client, ci ClusterInfo, opts model.Options, subnet netip.Prefix, net *incus.Network, stored map[string]string) (model.Options, error) {
	var err error
	if net != nil || stored != nil {
		cfg := stored
		if net != nil {
			cfg = net.Config
		}
		if opts, err = opts.With(cfg); err != nil {
			return opts, err
		}
		if opts.Egress, err = usedPolicies(ctx, c, opts.Egress, model.PoliciesRecorded(cfg)); err != nil {
			return opts, err
		}
	}
	if ci.Clustered() {
		if opts.Slices, err = model.AssignSlices(subnet, opts.Slices, ci.Names()); err != nil {
			return opts, err
		}
	}
	return opts, nil
}

// convergeObjects makes the stack's Incus objects what d says, in the
// order they refer to each other (the ACL, the bridge, the profile),
// pushing onto undos how to back each out.
func convergeObjects(ctx context.Context, c *incus.Client, ci ClusterInfo, d model.Desired, net *incus.Network, netETag string, undos *converge.Undos, changed func(obj, action, detail string)) error {
	// The ACL first: the network refers to it.
	action, diff, err := converge.Do(ctx, undos, converge.Object[incus.NetworkACL]{
		What:   "acl " + d.ACL.Name,
		Read:   func(ctx context.Context) (*incus.NetworkACL, string, error) { return c.Networks().ACL(ctx, d.ACL.Name) },
		Create: func(ctx context.Context) error { return c.Networks().CreateACL(ctx, d.ACL) },
		Remove: func(ctx context.Context) error { return c.Networks().DeleteACL(ctx, d.ACL.Name) },
		Differs: func(cur *incus.NetworkACL) []string {
			if model.ACLRulesEqual(cur.Egress, d.ACL.Egress) && model.ACLRulesEqual(cur.Ingress, d.ACL.Ingress) {
				return nil
			}
			return []string{"rules differed"}
		},
		Update: func(ctx context.Context, _ *incus.NetworkACL, etag string) error {
			return c.Networks().UpdateACL(ctx, d.ACL.Name, d.ACL, etag)
		},
		Restore: func(ctx context.Context, old incus.NetworkACL) error {
			return c.Networks().UpdateACL(ctx, old.Name, old, "")
		},
	})
	if err != nil {
		return err
	}
	if action != "" {
		changed("acl "+d.ACL.Name, action, strings.Join(diff, ", "))
	}

	// The bridge, as read above.
	action, diff, err = converge.Do(ctx, undos, converge.Object[incus.Network]{
		What: "network " + d.Network.Name,
		Read: func(context.Context) (*incus.Network, string, error) { return net, netETag, nil },
		Create: func(ctx context.Context) error {
			if err := createNetwork(ctx, c, ci, d.Network); err != nil {
				return fmt.Errorf("on %s: %w", d.Subnet, err)
			}
			return nil
		},
		Remove: func(ctx context.Context) error { return c.Networks().Delete(ctx, d.Network.Name) },
		Differs: func(cur *incus.Network) []string {
			return append(configDiff(cur.Config, d.Network.Config), model.UnusedPolicyKeys(cur.Config, d.Network.Config)...)
		},
		Update: func(ctx context.Context, cur *incus.Network, etag string) error {
			cfg := maps.Clone(cur.Config)
			maps.Copy(cfg, d.Network.Config)
			for k := range cfg {
				if _, ok := d.Network.Config[k]; !ok && strings.HasPrefix(k, model.KeyEgressPolicy) {
					delete(cfg, k)
				}
			}
			return c.Networks().Update(ctx, d.Network.Name, incus.NetworkPut{Description: d.Network.Description, Config: cfg}, etag)
		},
		Restore: func(ctx context.Context, old incus.Network) error {
			return c.Networks().Update(ctx, d.Network.Name, incus.NetworkPut{Description: old.Description, Config: old.Config}, "")
		},
	})
	if err != nil {
		return err
	}
	if action == "created" {
		diff = []string{d.Subnet.String()}
	}
	if action != "" {
		changed("network "+d.Network.Name, action, strings.Join(diff, ", "))
	}

	// The profile: exactly the NIC and the root disk.
	action, diff, err = converge.Do(ctx, undos, converge.Object[incus.Profile]{
		What:    "profile " + d.Profile.Name,
		Read:    func(ctx context.Context) (*incus.Profile, string, error) { return c.Profile(ctx, d.Profile.Name) },
		Create:  func(ctx context.Context) error { return c.CreateProfile(ctx, d.Profile) },
		Remove:  func(ctx context.Context) error { return c.DeleteProfile(ctx, d.Profile.Name) },
		Differs: func(cur *incus.Profile) []string { return ProfileDiff(cur, d.Profile) },
		Update: func(ctx context.Context, _ *incus.Profile, etag string) error {
			return c.UpdateProfile(ctx, d.Profile.Name, d.Profile, etag)
		},
		Restore: func(ctx context.Context, old incus.Profile) error { return c.UpdateProfile(ctx, old.Name, old, "") },
	})
	if err != nil {
		return err
	}
	if action != "" {
		changed("profile "+d.Profile.Name, action, strings.Join(diff, ", "))
	}

	return nil
}
