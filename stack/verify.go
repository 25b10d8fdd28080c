package stack

import (
	"context"
	"fmt"
	"net/netip"
	"strings"

	"github.com/box-isolation/box/stack/bootunits"
	"github.com/box-isolation/box/stack/guard"
	"github.com/box-isolation/box/stack/hostns"
	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/model"
	"github.com/box-isolation/box/stack/nft"
)

// Verification is what Verify saw.
type Verification struct {
	// pending: Incus has the bridge Pending (pending.go), whose finding
	// says what to do instead of "restart incusd".
	pending bool

	Findings []model.Finding `json:"findings"`
	Subnet   netip.Prefix    `json:"subnet,omitempty"`
	// Instances is how many instances this host (member) runs: what the
	// host's limits are read against.
	Instances  int            `json:"instances"`
	Gateway    netip.Addr     `json:"gateway,omitempty"`
	BridgeMode nft.BridgeMode `json:"bridge_mode,omitempty"`
	DnsmasqPID int            `json:"dnsmasq_pid,omitempty"`
	// Pool is what the bridge's dnsmasq hands out and holds (on a
	// cluster, this member's); nil when it could not be read (Notes say
	// why).
	Pool *DHCPPool `json:"dhcp_pool,omitempty"`
	// WatcherPID is the daemon's (port-set mode), 0 when none runs.
	WatcherPID int `json:"watcher_pid,omitempty"`
	// Daemon is box's daemon in the host's namespace and each of its
	// services, up or down (nil when no daemon runs).
	Daemon *hostns.DaemonStatus `json:"daemon,omitempty"`
	Ports  []hostns.Port        `json:"ports"`
	// Fleet is the census of every instance and port on the bridge.
	Fleet *model.Census `json:"fleet,omitempty"`
	// Tiers are the user projects (access tiers) and their state.
	Tiers []Tier `json:"tiers"`
	// GuardCounters are the guard's counts (L-GUARD) on each hook it is
	// attached to ("boxnet ingress"), by reason: packets passed and
	// dropped since it was attached.
	GuardCounters map[string]map[string]uint64 `json:"guard_counters,omitempty"`
	// GuardLoaded is when the kernel loaded each hook's program, in
	// nanoseconds since the host's boot (its boot-time clock).
	GuardLoaded map[string]int64 `json:"guard_loaded_ns,omitempty"`
	// GuardAbsent says why this kernel has no guard (it would not load
	// the programs): no finding, as nothing box does can put it there.
	GuardAbsent string `json:"guard_absent,omitempty"`
	// Notes say what is weaker than it could be without being a finding.
	Notes []string `json:"notes,omitempty"`
	// Cluster and Members are, on an Incus cluster, its members and
	// whether each one's host layers are in place.
	Cluster *ClusterInfo   `json:"cluster,omitempty"`
	Members []MemberLayers `json:"members,omitempty"`
}

// Clean reports whether nothing differs.
func (v *Verification) Clean() bool { return len(v.Findings) == 0 }

// Verify compares the live host with the desired stack from ground truth:
// Incus's objects, the kernel's nft ruleset, the bridge ports' isolated
// flag, the dnsmasq process actually serving the bridge and who holds the
// gateway address. It changes nothing.
func (host *Host) Verify(ctx context.Context) (*Verification, error) {
	g, err := host.OpenNS()
	if err != nil {
		return nil, err
	}
	defer g.Close()
	c := host.Incus
	v := &Verification{Findings: []model.Finding{}, Ports: []hostns.Port{}}
	find := func(layer model.LayerID, obj, problem string) {
		v.Findings = append(v.Findings, model.Finding{Layer: layer, Object: obj, Problem: problem, Fix: model.FixEnsure})
	}
	gen := model.Current

	net, _, err := c.Networks().Get(ctx, gen.Network)
	if incus.IsNotFound(err) {
		v.Findings = append(v.Findings, model.Finding{Layer: model.LayerNAT, Object: "network " + gen.Network, Problem: "missing: the isolation stack is not set up", Fix: "box setup-host"})
		return v, verifyLegacy(ctx, host.Incus, g, v)
	}
	if err != nil {
		return nil, fmt.Errorf("reading network %s: %w", gen.Network, err)
	}
	if v.pending = net.Status == networkPending; v.pending {
		v.Findings = append(v.Findings, pendingFinding(net))
	}
	p, err := netip.ParsePrefix(net.Config["ipv4.address"])
	if err != nil {
		find(model.LayerNAT, "network "+gen.Network, fmt.Sprintf("ipv4.address=%q is not an address box can use", net.Config["ipv4.address"]))
		return v, nil
	}
	opts, err := host.Options.With(net.Config)
	if err != nil {
		find(model.LayerNAT, "network "+gen.Network, err.Error())
		return v, nil
	}
	if opts.Subnet.IsValid() && opts.Subnet != p.Masked() {
		find(model.LayerNAT, "network "+gen.Network, fmt.Sprintf("it is on %s, but the subnet chosen at setup-host is %s", p.Masked(), opts.Subnet))
	}
	d := model.BuildDesired(p.Masked(), opts)
	v.Subnet, v.Gateway = d.Subnet, d.Gateway

	objs, err := verifyObjects(ctx, c, d, net)
	if err != nil {
		return nil, err
	}
	v.Findings = append(v.Findings, objs...)

	// One listing of every instance serves the census, the pins and the
	// cluster's addressing.
	insts, err := c.Instances().All(ctx)
	if err != nil {
		return nil, err
	}
	ci, err := host.Cluster(ctx)
	if err != nil {
		return nil, err
	}
	n0 := len(v.Findings)
	if err := host.verifyGround(ctx, g, d, p, onMember(insts, ci.Local), v); err != nil {
		return nil, err
	}
	if ci.Clustered() {
		for i := n0; i < len(v.Findings); i++ {
			v.Findings[i].Member = ci.Local
		}
		v.Cluster = &ci
		if err := host.verifyMembers(ctx, ci, d, insts, v); err != nil {
			return nil, err
		}
	}
	v.Findings = append(v.Findings, dhcpFindings(insts)...)
	v.Instances = len(onMember(insts, ci.Local))
	if host.Remote == "" && !host.Tier.Granted && !host.NoKernel {
		// The host's limits: capacity, not isolation (docs/design.md).
		v.Notes = append(v.Notes, hostns.LimitNotes(v.Instances)...)
	}
	if v.Tiers, err = host.Tiers(ctx, host.Tier.Group); err != nil {
		return nil, fmt.Errorf("reading the access tiers: %w", err)
	}
	for _, t := range v.Tiers {
		v.Findings = append(v.Findings, t.Findings...)
	}
	return v, verifyLegacy(ctx, host.Incus, g, v)
}

// verifyGround checks the layers that live in this host's (this member's)
// kernel and processes, for the instances placed here, into v: IPv6 off on
// the bridge, the forward policy, who holds the gateway, dnsmasq, the
// ports, the census, the nft tables, the pins and the egress sets.
func (host *Host) verifyGround(ctx context.Context, g *hostns.NS, d model.Desired, p netip.Prefix, insts []incus.Instance, v *Verification) error {
	gen := model.Current
	find := func(layer model.LayerID, obj, problem string) {
		v.Findings = append(v.Findings, model.Finding{Layer: layer, Object: obj, Problem: problem, Fix: model.FixEnsure})
	}
	bridge, pid, err := verifyBridge(g, d, v.pending)
	if err != nil {
		return err
	}
	v.Findings = append(v.Findings, bridge...)
	v.DnsmasqPID = pid

	// The pool is this host's own to read: another member's, read from
	// here, would name leases its own doctor names.
	if v.DnsmasqPID != 0 && v.Pool == nil && host.member == "" {
		if pool, err := poolOf(g, insts); err != nil {
			v.Notes = append(v.Notes, "the bridge's DHCP pool was not read: "+err.Error())
		} else {
			v.Pool = &pool
			v.Findings = append(v.Findings, poolFindings(pool)...)
		}
	}

	ports, err := g.BridgePorts(gen.Network)
	if err != nil {
		return err
	}
	v.Ports = append(v.Ports, ports...)
	for _, p := range ports {
		if !p.Isolated {
			find(model.LayerPortIso, "bridge port "+p.Name, "isolated is off")
		}
	}

	if v.Fleet, err = censusOf(g, insts, host.here()); err != nil {
		return fmt.Errorf("taking the fleet census: %w", err)
	}
	v.Findings = append(v.Findings, v.Fleet.Findings()...)
	// A root disk's size holds only while the pool's kernel counts.
	host.Storage().finding(ctx, v)

	ncfg := g.NFTConfig(gen)
	ncfg.Gateway = p.Addr()
	caps, err := nft.Probe(ncfg)
	if err != nil {
		return fmt.Errorf("probing nftables: %w", err)
	}
	v.BridgeMode = nft.Desired(ncfg, caps).Mode
	if v.Daemon, err = hostns.ReadDaemonStatus(host.NetNS); err != nil {
		return err
	}
	v.Notes = append(v.Notes, daemonNotes(v.Daemon, v.BridgeMode)...)
	if v.Daemon != nil && v.BridgeMode == nft.ModePortSet {
		v.WatcherPID = v.Daemon.PID
	}
	v.Findings = append(v.Findings, host.BootFiles().verify(p.Addr())...)
	nf, err := nft.Verify(ncfg, caps, hostns.PortNames(ports))
	if err != nil {
		return fmt.Errorf("reading nft tables: %w", err)
	}
	if err := verifyIncusChains(ctx, host.Incus, g, d, v); err != nil {
		return err
	}
	for _, f := range nf {
		layer := model.LayerHostFW
		if strings.HasPrefix(f.Object, "table bridge") || strings.Contains(f.Object, "set") {
			layer = model.LayerBridgeDrop
		}
		find(layer, "nft "+f.Object, f.Problem)
	}
	f, err := host.fleetOf(ctx, insts)
	if err != nil {
		return fmt.Errorf("reading what to pin: %w", err)
	}
	plan := f.PlanPins(hostns.PortNames(ports))
	pf, err := nft.VerifyPins(ncfg, caps, plan.Scope, plan.Pins)
	if err != nil {
		return fmt.Errorf("reading the pin table: %w", err)
	}
	v.Findings = append(v.Findings, pinFindings(pf, plan)...)
	rf, rnotes, err := VerifyRoute(g)
	if err != nil {
		return err
	}
	v.Findings = append(v.Findings, rf...)
	v.Notes = append(v.Notes, rnotes...)
	gf, absent, err := guard.Verify(g, p)
	if err != nil {
		return err
	}
	v.Findings = append(v.Findings, gf...)
	if v.GuardAbsent = absent; absent != "" {
		v.Notes = append(v.Notes, "WARNING: "+absent)
	} else if hooks, err := guard.Hooks(g); err != nil {
		v.Notes = append(v.Notes, "the guard's counters were not read: "+err.Error())
	} else {
		v.GuardCounters, v.GuardLoaded = map[string]map[string]uint64{}, map[string]int64{}
		for name, h := range hooks {
			v.GuardCounters[name], v.GuardLoaded[name] = h.Counters, h.Loaded.Nanoseconds()
		}
	}
	ef, notes, err := verifyEgress(ctx, host.Incus, g, f)
	if err != nil {
		return err
	}
	v.Findings = append(v.Findings, ef...)
	v.Notes = append(v.Notes, notes...)
	return nil
}

// verifyLegacy reports legacy objects still on the host.
func verifyLegacy(ctx context.Context, c *incus.Client, g *hostns.NS, v *Verification) error {
	objs, err := legacyObjects(ctx, c, g)
	if err != nil {
		return err
	}
	for _, o := range objs {
		v.Findings = append(v.Findings, model.Finding{Layer: model.LayerStack, Object: o, Problem: "legacy generation still present",
			Fix: "box migrate-host --all-boxes, then box migrate-host --retire-legacy", Advisory: true})
	}
	return nil
}

// legacyObjects lists the legacy generation's objects that exist.
func legacyObjects(ctx context.Context, c *incus.Client, g *hostns.NS) ([]string, error) {
	var out []string
	inet, bridge, err := nft.Present(g.NFTConfig(model.Legacy))
	if err != nil {
		return nil, fmt.Errorf("reading the legacy nft tables: %w", err)
	}
	if inet {
		out = append(out, "nft table inet "+model.Legacy.NFTTable)
	}
	if bridge {
		out = append(out, "nft table bridge "+model.Legacy.NFTTable)
	}
	if _, _, err := c.Profile(ctx, model.Legacy.Profile); err == nil {
		out = append(out, "profile "+model.Legacy.Profile)
	} else if !incus.IsNotFound(err) {
		return nil, err
	}
	if _, _, err := c.Networks().Get(ctx, model.Legacy.Network); err == nil {
		out = append(out, "network "+model.Legacy.Network)
	} else if !incus.IsNotFound(err) {
		return nil, err
	}
	if _, _, err := c.Networks().ACL(ctx, model.Legacy.ACL); err == nil {
		out = append(out, "acl "+model.Legacy.ACL)
	} else if !incus.IsNotFound(err) {
		return nil, err
	}
	return out, nil
}

// daemonNotes say what is missing while box's daemon, or one of its
// services, is down.
func daemonNotes(d *hostns.DaemonStatus, mode nft.BridgeMode) []string {
	if d == nil {
		note := "no daemon runs here (" + bootunits.DaemonUnitName + ", box guard-and-serve): allowlisted boxes resolve nothing, and box's tables are not put back after another tool's flush until a box command runs"
		if mode == nft.ModePortSet {
			note += "; a box that restarts on its own, or whose NIC is re-plugged, stays outside the port set and unpinned until then"
		}
		return []string{note + "; start it: systemctl start " + bootunits.DaemonUnitName}
	}
	var out []string
	for _, s := range d.Services {
		if !s.Up {
			out = append(out, fmt.Sprintf("the daemon's %s service (it %s) is down since %s: %s; its log: journalctl -u %s", s.Name, s.Does, s.Since.Format("15:04:05 MST"), s.Problem, bootunits.DaemonUnitName))
		}
	}
	return out
}

// verifyObjects compares the stack's Incus objects with d: the bridge's
// config key by key (each finding names the layer its key holds up), the
// ACL's rules and the profile's devices and config.
func verifyObjects(ctx context.Context, c *incus.Client, d model.Desired, net *incus.Network) ([]model.Finding, error) {
	var out []model.Finding
	find := func(layer model.LayerID, obj, problem string) {
		out = append(out, model.Finding{Layer: layer, Object: obj, Problem: problem, Fix: model.FixEnsure})
	}
	layerOf := map[string]model.LayerID{
		"ipv4.address": model.LayerNAT, "ipv4.nat": model.LayerNAT, "dns.mode": model.LayerDNS, "raw.dnsmasq": model.LayerDNS, model.KeyDNS: model.LayerDNS, model.KeySubnet: model.LayerNAT,
		"ipv6.address": model.LayerV6, "ipv6.nat": model.LayerV6, "security.acls": model.LayerACL,
		"security.acls.default.egress.action": model.LayerACL, "security.acls.default.ingress.action": model.LayerACL,
	}
	for k := range d.Network.Config {
		if strings.HasPrefix(k, model.KeyEgressPolicy) {
			layerOf[k] = model.LayerEgress
		}
		if strings.HasPrefix(k, model.KeySlice) || k == "ipv4.dhcp.ranges" {
			layerOf[k] = model.LayerNAT
		}
	}
	for k, want := range d.Network.Config {
		got := net.Config[k]
		switch {
		case got == want:
		case k == "raw.dnsmasq":
			out = append(out, rawDnsmasqFindings("network "+model.Current.Network, got, want)...)
		default:
			find(layerOf[k], "network "+model.Current.Network, fmt.Sprintf("%s is %q, want %q", k, got, want))
		}
	}
	acl, _, err := c.Networks().ACL(ctx, model.Current.ACL)
	switch {
	case incus.IsNotFound(err):
		find(model.LayerACL, "acl "+model.Current.ACL, "missing")
	case err != nil:
		return nil, fmt.Errorf("reading ACL %s: %w", model.Current.ACL, err)
	case !model.ACLRulesEqual(acl.Egress, d.ACL.Egress) || !model.ACLRulesEqual(acl.Ingress, d.ACL.Ingress):
		find(model.LayerACL, "acl "+model.Current.ACL, "rules differ from the desired ones")
	}

	prof, _, err := c.Profile(ctx, model.Current.Profile)
	switch {
	case incus.IsNotFound(err):
		find(model.LayerPortIso, "profile "+model.Current.Profile, "missing")
	case err != nil:
		return nil, fmt.Errorf("reading profile %s: %w", model.Current.Profile, err)
	default:
		for _, diff := range ProfileDiff(prof, d.Profile) {
			layer := model.LayerStack
			if strings.Contains(diff, "port_isolation") {
				layer = model.LayerPortIso
			}
			find(layer, "profile "+model.Current.Profile, diff)
		}
	}
	return out, nil
}

// verifyBridge checks the bridge in the host's kernel: IPv6 off on it, no
// other firewall dropping what it forwards, no other link holding its
// address, and a dnsmasq serving it (its pid, 0 for none; a Pending
// bridge's own finding says what to do instead).
func verifyBridge(g *hostns.NS, d model.Desired, pending bool) ([]model.Finding, int, error) {
	var out []model.Finding
	find := func(layer model.LayerID, obj, problem string) {
		out = append(out, model.Finding{Layer: layer, Object: obj, Problem: problem, Fix: model.FixEnsure})
	}
	if disabled, ok, err := g.IPv6Disabled(model.Current.Network); err != nil {
		return nil, 0, err
	} else if ok && !disabled {
		find(model.LayerV6, "bridge "+model.Current.Network, "IPv6 is enabled on the bridge interface (disable_ipv6=0)")
	}
	v6, err := g.GlobalV6(model.Current.Network)
	if err != nil {
		return nil, 0, err
	}
	for _, a := range v6 {
		find(model.LayerV6, "bridge "+model.Current.Network, "has IPv6 address "+a.IPNet.String())
	}
	blockers, err := forwardBlockers(g, model.Current.Network)
	if err != nil {
		return nil, 0, err
	}
	out = append(out, blockers...)
	holders, err := g.GatewayHolders(model.Current.Network, d.Gateway)
	if err != nil {
		return nil, 0, err
	}
	for _, h := range holders {
		out = append(out, model.Finding{Layer: model.LayerNAT, Object: "gateway " + d.Gateway.String(),
			Problem: "also held by " + h, Fix: "remove " + d.Gateway.String() + " from " + h + " (ip addr del)"})
	}
	// A Pending bridge's finding says what to do; restarting incusd is not it.
	pid := g.DnsmasqFor(model.Current.Network)
	if pid == 0 && !pending {
		out = append(out, model.Finding{Layer: model.LayerDNS, Object: "dnsmasq for " + model.Current.Network,
			Problem: "no dnsmasq process serves the bridge (Incus may still say Created)", Fix: "restart incusd, then box doctor"})
	}
	return out, pid, nil
}
