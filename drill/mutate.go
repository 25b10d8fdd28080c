package drill

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/box-isolation/box/internal/nsrun"
	"github.com/box-isolation/box/stack"
	"github.com/box-isolation/box/stack/guard"
	"github.com/box-isolation/box/stack/hostns"
	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/model"
)

// Mutation knocks out one isolation layer for a run, to prove the drill can
// fail (docs/claims.md, "Mutations"): the claims the layer backs must flip to fail. The
// run restores the stack afterwards and verifies it, whatever happened.
type Mutation struct {
	Name   string
	Layers []model.LayerID // the layers it removes
	What   string
	// ShownBy is the evidence that must show the layer gone: packets the
	// agents sent (the default), or, for a layer that is a rule of Incus's
	// and no packet path, Incus's answers to requests.
	ShownBy Evidence
	// AfterBoxes mutations act on the probe boxes' live ports, so they run
	// once the boxes exist; the others change the stack before any box is
	// minted (reconfiguring a bridge under live boxes has deadlocked incusd).
	AfterBoxes bool
	// apply knocks the layer out; boxes are the run's own probe boxes.
	apply func(ctx context.Context, h *stack.Host, boxes []string) error
}

// Mutations is every layer the drill knows how to knock out.
var Mutations = []Mutation{
	{Name: "bridge-drop", Layers: []model.LayerID{model.LayerBridgeDrop}, What: "delete the nft table bridge box", apply: func(ctx context.Context, h *stack.Host, _ []string) error {
		return deleteTable(h, nftables.TableFamilyBridge, model.Current.NFTTable)
	}},
	// Its own table, so it is knocked out apart from the sibling layers.
	{Name: "pinning", Layers: []model.LayerID{model.LayerPin}, What: "delete the nft table bridge box_pin (per-port pinning)", apply: func(ctx context.Context, h *stack.Host, _ []string) error {
		return deleteTable(h, nftables.TableFamilyBridge, model.Current.NFTTable+"_pin")
	}},
	// Only the kernel flag: changing the profile under live boxes re-plugs
	// their NICs, and they lose their leases.
	{Name: "port-isolation", Layers: []model.LayerID{model.LayerPortIso}, What: "turn the isolated flag off on every boxnet port", AfterBoxes: true, apply: portIsolationOff},
	// Its own table: the ACL still drops the private ranges, so only the
	// LAN host outside them (the world's 198.18.20.10) shows it gone.
	{Name: "route", Layers: []model.LayerID{model.LayerRoute}, What: "delete the nft table inet box_route (boxes may leave by any route)", apply: func(ctx context.Context, h *stack.Host, _ []string) error {
		return deleteTable(h, nftables.TableFamilyINet, model.Current.NFTTable+"_route")
	}},
	{Name: "host-fw", Layers: []model.LayerID{model.LayerHostFW}, What: "delete the nft table inet box", apply: func(ctx context.Context, h *stack.Host, _ []string) error {
		return deleteTable(h, nftables.TableFamilyINet, model.Current.NFTTable)
	}},
	// Both programs, the bridge's and the uplinks': the nft layers still
	// hold alone, so this flips nothing by itself (host-fw, acl or route
	// beside it shows what the guard held).
	{Name: "guard", Layers: []model.LayerID{model.LayerGuard}, What: "detach box's eBPF guard from boxnet's tc ingress and the uplinks' egress", apply: func(ctx context.Context, h *stack.Host, _ []string) error {
		g, err := hostns.Open(h.NetNS)
		if err != nil {
			return err
		}
		defer g.Close()
		removed, err := guard.Remove(g)
		if err == nil && len(removed) == 0 {
			err = fmt.Errorf("no guard attached to detach (%s absent before the mutation)", model.LayerGuard)
		}
		return err
	}},
	{Name: "acl", Layers: []model.LayerID{model.LayerACL}, What: "detach the box-isolate ACL from boxnet", apply: func(ctx context.Context, h *stack.Host, _ []string) error {
		return setNetwork(ctx, h, map[string]string{"security.acls": "", "security.acls.default.egress.action": "", "security.acls.default.ingress.action": ""})
	}},
	{Name: "dns-managed", Layers: []model.LayerID{model.LayerDNS}, What: "set dns.mode=managed on boxnet and let DHCP names through", apply: func(ctx context.Context, h *stack.Host, _ []string) error {
		return setNetwork(ctx, h, map[string]string{"dns.mode": "managed", "raw.dnsmasq": "no-resolv\nserver=" + firstDNS(h) + "\n"})
	}},
	{Name: "hosts-file", Layers: []model.LayerID{model.LayerDNS}, What: "take no-hosts out of boxnet's dnsmasq settings (it answers from the host's hosts file)", apply: func(ctx context.Context, h *stack.Host, _ []string) error {
		n, _, err := h.Incus.Networks().Get(ctx, model.Current.Network)
		if err != nil {
			return err
		}
		return setNetwork(ctx, h, map[string]string{"raw.dnsmasq": strings.Replace(n.Config["raw.dnsmasq"], "no-hosts\n", "", 1)})
	}},
	{Name: "ipv6-on", Layers: []model.LayerID{model.LayerV6}, What: "give boxnet an IPv6 subnet with router advertisements", apply: func(ctx context.Context, h *stack.Host, _ []string) error {
		if err := setNetwork(ctx, h, map[string]string{"ipv6.address": "fd42:b0c5::1/64", "ipv6.nat": "true"}); err != nil {
			return err
		}
		return nsrun.Do(h.NetNS, func() error {
			return os.WriteFile("/proc/sys/net/ipv6/conf/"+model.Current.Network+"/disable_ipv6", []byte("0"), 0o644)
		})
	}},
	// The grant's load-bearing key: without it the user may attach any
	// network (the granted user's attempts must then succeed).
	{Name: "tier", Layers: []model.LayerID{model.LayerTier}, What: "lift restricted.networks.access from the run's granted user's project", ShownBy: EvidenceRequests, AfterBoxes: true, apply: liftTierRestriction},
	{Name: "egress", Layers: []model.LayerID{model.LayerEgress}, What: "delete the nft table inet box_egress (no allowlist is enforced)", AfterBoxes: true, apply: dropEgressTable},
	// An operator widening box-a's door by hand (its door only).
	{Name: "door-wide", Layers: []model.LayerID{model.LayerFleet}, What: "make box-a's door listen on every host address (tcp:0.0.0.0)", AfterBoxes: true, apply: widenDoor},
	{Name: "nat-off", Layers: []model.LayerID{model.LayerNAT}, What: "set ipv4.nat=false on boxnet (breaks egress: the run must be inconclusive)", apply: func(ctx context.Context, h *stack.Host, _ []string) error {
		return setNetwork(ctx, h, map[string]string{"ipv4.nat": "false"})
	}},
	// One chain of the egress table at a time: each part of the
	// allowlist shown by its own probes.
	{Name: "egress-dns", Layers: []model.LayerID{model.LayerEgress}, What: "delete chain dns of table inet box_egress (allowlisted boxes' DNS goes to dnsmasq and on)", AfterBoxes: true, apply: dropEgressChain("dns")},
	{Name: "egress-names", Layers: []model.LayerID{model.LayerEgress}, What: "delete chain names of table inet box_egress (no proxy checks TLS server names and HTTP Hosts)", AfterBoxes: true, apply: dropEgressChain("names")},
	{Name: "egress-forward", Layers: []model.LayerID{model.LayerEgress}, What: "delete chain forward of table inet box_egress (no allow set, QUIC, port 853 or resolver drop)", AfterBoxes: true, apply: dropEgressChain("forward")},
	// Both halves of the DHCP restriction: dnsmasq answers any client, by
	// any identifier, and the pin table lets any DHCP message through.
	// Once the boxes exist: a granted user's box started on an open
	// dnsmasq leases an address before the port watcher gives it its own,
	// and is cut off by its pin (C-TIER's controls failed so).
	{Name: "dhcp-open", Layers: []model.LayerID{model.LayerDHCP}, What: "take dhcp-ignore=tag:!known and dhcp-ignore-clid out of boxnet's dnsmasq settings, and the DHCP rules out of the nft table bridge box_pin", AfterBoxes: true, apply: dhcpOpen},
	// The kernel boundary, each on clone-a (claim_kernel.go).
	{Name: "privileged", Layers: []model.LayerID{model.LayerFleet}, What: "make clone-a privileged (security.privileged=true), and restart it", AfterBoxes: true, apply: kernelMutation(map[string]string{"security.privileged": "true"}, nil)},
	{Name: "host-path", Layers: []model.LayerID{model.LayerFleet}, What: "give clone-a a disk of a host path (" + hostPathSource + ", read-only), hot-plugged", AfterBoxes: true, apply: kernelMutation(nil, hostPathDisk)},
	{Name: "raw-lxc", Layers: []model.LayerID{model.LayerFleet}, What: "bind a host path (" + hostPathSource + ", read-only) into clone-a by raw.lxc, and restart it", AfterBoxes: true, apply: kernelMutation(map[string]string{"raw.lxc": rawLXCBind}, nil)},
	{Name: "idmap-root", Layers: []model.LayerID{model.LayerFleet}, What: "map host uid and gid 0 into clone-a by raw.idmap (both 0 0), and restart it", AfterBoxes: true, apply: kernelMutation(map[string]string{"raw.idmap": "both 0 0"}, nil)},
	{Name: "guest-api", Layers: []model.LayerID{model.LayerFleet}, What: "turn the guest API (/dev/incus) on for clone-a (security.guestapi=true), and restart it", AfterBoxes: true, apply: kernelMutation(map[string]string{model.GuestAPIKey: "true"}, nil)},
	{Name: "unix-char", Layers: []model.LayerID{model.LayerFleet}, What: "give clone-a the host's " + unixCharSource + " as a unix-char device, hot-plugged", AfterBoxes: true, apply: kernelMutation(nil, unixCharDevice)},
}

// dhcpOpen takes the DHCP restriction away: the two lines of the bridge's
// dnsmasq settings, and the pin table's DHCP drops (a refresh of the pins
// changes only their sets, so they stay away for the run).
func dhcpOpen(ctx context.Context, h *stack.Host, _ []string) error {
	n, _, err := h.Incus.Networks().Get(ctx, model.Current.Network)
	if err != nil {
		return err
	}
	raw := n.Config["raw.dnsmasq"]
	for _, l := range []string{"dhcp-ignore=tag:!known\n", "dhcp-ignore-clid\n"} {
		raw = strings.Replace(raw, l, "", 1)
	}
	if err := setNetwork(ctx, h, map[string]string{"raw.dnsmasq": raw}); err != nil {
		return err
	}
	return withNFT(h, func(conn *nftables.Conn) error {
		t := &nftables.Table{Family: nftables.TableFamilyBridge, Name: model.Current.NFTTable + "_pin"}
		rules, err := conn.GetRules(t, &nftables.Chain{Name: "prerouting", Table: t})
		if err != nil {
			return err
		}
		n := 0
		for _, r := range rules {
			if isDHCPDrop(r.Exprs) {
				if err := conn.DelRule(r); err != nil {
					return err
				}
				n++
			}
		}
		if n == 0 {
			return fmt.Errorf("no DHCP rule in table bridge %s", t.Name)
		}
		return conn.Flush()
	})
}

// isDHCPDrop says whether a pin table rule is one of its DHCP drops: it
// matches UDP to port 67 and drops.
func isDHCPDrop(exprs []expr.Any) bool {
	dport, drop := false, false
	for i, e := range exprs {
		if p, ok := e.(*expr.Payload); ok && p.Base == expr.PayloadBaseTransportHeader && p.Offset == 2 && p.Len == 2 && i+1 < len(exprs) {
			if c, ok := exprs[i+1].(*expr.Cmp); ok && len(c.Data) == 2 && c.Data[0] == 0 && c.Data[1] == 67 {
				dport = true
			}
		}
		if v, ok := e.(*expr.Verdict); ok && v.Kind == expr.VerdictDrop {
			drop = true
		}
	}
	return dport && drop
}

// shownBy is the evidence that must show the mutation.
func (m Mutation) shownBy() Evidence {
	if m.ShownBy == "" {
		return EvidenceProbes
	}
	return m.ShownBy
}

// SelectMutations finds mutations by name.
func SelectMutations(names []string) ([]Mutation, error) {
	var out []Mutation
	for _, n := range names {
		i := slices.IndexFunc(Mutations, func(m Mutation) bool { return m.Name == n })
		if i < 0 {
			var all []string
			for _, m := range Mutations {
				all = append(all, m.Name)
			}
			sort.Strings(all)
			return nil, fmt.Errorf("no mutation %q (there are: %s)", n, strings.Join(all, ", "))
		}
		out = append(out, Mutations[i])
	}
	return out, nil
}

func firstDNS(h *stack.Host) string {
	if len(h.Options.DNS) > 0 {
		return h.Options.DNS[0].String()
	}
	return model.DefaultDNS[0].String()
}

func deleteTable(h *stack.Host, family nftables.TableFamily, name string) error {
	return withNFT(h, func(conn *nftables.Conn) error {
		conn.DelTable(&nftables.Table{Family: family, Name: name})
		return conn.Flush()
	})
}

// withNFT runs fn with an nftables connection in the host's namespace.
func withNFT(h *stack.Host, fn func(conn *nftables.Conn) error) error {
	return withNetNS(h.NetNS, func(fd int) error {
		var opts []nftables.ConnOption
		if fd > 0 {
			opts = append(opts, nftables.WithNetNSFd(fd))
		}
		conn, err := nftables.New(opts...)
		if err != nil {
			return err
		}
		return fn(conn)
	})
}

func setNetwork(ctx context.Context, h *stack.Host, set map[string]string) error {
	n, etag, err := h.Incus.Networks().Get(ctx, model.Current.Network)
	if err != nil {
		return err
	}
	for k, v := range set {
		if v == "" {
			delete(n.Config, k)
		} else {
			n.Config[k] = v
		}
	}
	return h.Incus.Networks().Update(ctx, model.Current.Network, incus.NetworkPut{Description: n.Description, Config: n.Config}, etag)
}

// portIsolationOff turns the isolated flag off on the run's own boxes'
// bridge ports, and on nothing else.
func portIsolationOff(ctx context.Context, h *stack.Host, boxes []string) error {
	ports := map[string]bool{}
	for _, b := range boxes {
		st, err := h.Incus.Instances().State(ctx, b)
		if err != nil {
			return err
		}
		for _, nic := range st.Network {
			if nic.HostName != "" {
				ports[nic.HostName] = true
			}
		}
	}
	if len(ports) == 0 {
		return fmt.Errorf("no bridge port found for boxes %v", boxes)
	}
	var err error
	ns := netns.None()
	if h.NetNS != "" {
		if ns, err = netns.GetFromName(h.NetNS); err != nil {
			return err
		}
		defer ns.Close()
	}
	hp, err := netlink.NewHandleAt(ns)
	if err != nil {
		return err
	}
	defer hp.Close()
	br, err := hp.LinkByName(model.Current.Network)
	if err != nil {
		return err
	}
	links, err := hp.LinkList()
	if err != nil {
		return err
	}
	for _, l := range links {
		if l.Attrs().MasterIndex == br.Attrs().Index && ports[l.Attrs().Name] {
			if err := hp.LinkSetIsolated(l, false); err != nil {
				return fmt.Errorf("port %s: %w", l.Attrs().Name, err)
			}
		}
	}
	return nil
}

// applyMutations applies those of one phase; names are the run's boxes.
func applyMutations(ctx context.Context, cfg *Config, afterBoxes bool, names map[Place]string) error {
	var boxes []string
	for _, p := range []Place{PlaceA, PlaceB, PlaceC} {
		if n, ok := names[p]; ok {
			boxes = append(boxes, n)
		}
	}
	for _, m := range cfg.Mutations {
		if m.AfterBoxes != afterBoxes {
			continue
		}
		cfg.logf("mutation: %s (%s)", m.Name, m.What)
		if err := m.apply(ctx, cfg.Host, boxes); err != nil {
			return fmt.Errorf("mutation %s: %w", m.Name, err)
		}
	}
	return nil
}

// restoreStack converges the stack back and verifies it is as it was
// before the mutations: no finding that was not there already (a host may
// carry findings box cannot fix, such as another firewall's forward drop).
func restoreStack(ctx context.Context, cfg *Config, before []model.Finding) error {
	cfg.logf("restore: converging the stack back after the mutations")
	if _, err := cfg.Host.Ensure(ctx); err != nil {
		return fmt.Errorf("restoring the stack: %w", err)
	}
	v, err := cfg.Host.Verify(ctx)
	if err != nil {
		return fmt.Errorf("verifying the restored stack: %w", err)
	}
	known := map[string]bool{}
	for _, f := range before {
		known[f.String()] = true
	}
	var left []string
	for _, f := range v.Findings {
		if !known[f.String()] {
			left = append(left, f.String())
		}
	}
	if len(left) > 0 {
		return fmt.Errorf("the restored stack still differs: %s (run box doctor --fix)", strings.Join(left, "; "))
	}
	return nil
}
