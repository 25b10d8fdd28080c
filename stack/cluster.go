package stack

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sort"
	"strings"

	"github.com/box-isolation/box/internal/converge"
	"github.com/box-isolation/box/stack/hostns"
	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/model"
	"github.com/box-isolation/box/stack/nft"
	"github.com/vishvananda/netlink"
)

// On an Incus cluster the stack has two halves.
//
// The Incus objects are the cluster's, made once from any member: the ACL,
// the profile and the bridge boxnet, which Incus defines on every member
// (created per member with ?target=, then committed) with one config for
// all. Incus keeps a bridge's addressing the same on every member, but
// each member's bridge is its own L2 segment with its own dnsmasq, and
// Incus checks a fixed address's uniqueness on one member only. So the
// subnet is cut into slices of 32 (ClusterSliceBits): the first holds the
// gateway and the only dynamic DHCP range, every member gets a slice of
// its own for good (user.box.slice.MEMBER on the bridge), and every box
// gets a fixed address (its NIC's ipv4.address) from the slice of the
// member it is minted on, picked against every instance and lease of the
// cluster. Two members can then never lease the same address to a box:
// their slices do not overlap, and within a member Incus's own check
// refuses a duplicate. A box moved to another member keeps its address,
// which no member hands out again. A granted user's box (its user sees no
// cluster to pick from) gets one from its member's port watcher; the
// dynamic range serves no one (L-DHCP: known clients only), and Verify
// names any address handed out on two members.
//
// The host layers (the nft tables, the ports' isolated flags, IPv6 off on
// the bridge, the boot unit, the port watcher) are each member's own:
// `box setup-host` converges them where it runs, `box setup-host
// --member-only` (or the boot unit) on every other member. Verify reads
// them on its own member and on every member whose network namespace it
// is told (Host.MemberNetNS: the hermetic world's members, all on one
// machine); for any other member it says it could not look.

func sortedCopy(s []string) []string {
	out := slices.Clone(s)
	sort.Strings(out)
	return out
}

// ClusterInfo is what a host knows of its cluster.
type ClusterInfo struct {
	// Local is the member this incusd is; "" on a standalone server.
	Local string `json:"local,omitempty"`
	// Members are every member's name, sorted, with its status.
	Members []incus.ClusterMember `json:"members,omitempty"`
}

// Clustered says whether the host is a cluster member.
func (ci ClusterInfo) Clustered() bool { return ci.Local != "" }

// Names lists the members' names, sorted.
func (ci ClusterInfo) Names() []string {
	var out []string
	for _, m := range ci.Members {
		out = append(out, m.ServerName)
	}
	sort.Strings(out)
	return out
}

// Cluster reads whether incusd is clustered and its members. A granted
// user's project sees no cluster: its host is taken as standalone.
func (host *Host) Cluster(ctx context.Context) (ClusterInfo, error) {
	if host.cluster != nil {
		return *host.cluster, nil
	}
	var ci ClusterInfo
	srv, err := host.Incus.Server(ctx)
	if err != nil {
		return ci, err
	}
	if srv.Environment.ServerClustered && !host.Tier.Granted {
		ci.Local = srv.Environment.ServerName
		if ci.Members, err = host.Incus.ClusterMembers(ctx); err != nil {
			return ci, err
		}
		sort.Slice(ci.Members, func(i, j int) bool { return ci.Members[i].ServerName < ci.Members[j].ServerName })
	}
	host.cluster = &ci
	return ci, nil
}

// ForMember is host acting on another member of its cluster: its Incus
// client aimed there, and its network namespace, which Members.NetNS must
// name (ok false otherwise: the member is another machine's, and nothing
// here may act in its place).
func (host *Host) ForMember(member string) (mh *Host, ok bool) {
	ns, ok := host.Members.NetNS[member]
	cp := *host
	cp.Incus = host.Incus.Target(member)
	cp.NetNS = ns
	cp.Boot.UnitDir = "" // another machine's boot unit is its own business
	cp.member = member
	return &cp, ok
}

// onMember keeps the instances placed on member (all of them on a
// standalone host, where member is "").
func onMember(insts []incus.Instance, member string) []incus.Instance {
	return placedOn(insts, member, func(i incus.Instance) string { return i.Location })
}

// leasesOn keeps the leases a member's dnsmasq holds (all on a standalone
// host).
func leasesOn(leases []incus.NetworkLease, member string) []incus.NetworkLease {
	return placedOn(leases, member, func(l incus.NetworkLease) string { return l.Location })
}

// placedOn keeps what is located on member, or located nowhere in
// particular (a standalone server says "none").
func placedOn[T any](xs []T, member string, location func(T) string) []T {
	if member == "" {
		return xs
	}
	var out []T
	for _, x := range xs {
		if l := location(x); l == member || l == "" || l == "none" {
			out = append(out, x)
		}
	}
	return out
}

// For picks a fixed address for a new box on member (L-DHCP): the
// first of the member's slice (on a standalone host, member "", of the
// bridge's subnet) that no instance's NIC on the bridge holds or asks for,
// and no lease holds, anywhere in the cluster, in any project.
func (addrs *Addresses) For(ctx context.Context, member string) (netip.Addr, error) {
	host := addrs.host
	slice, gw, err := addrs.Slice(ctx, member)
	if err != nil {
		return netip.Addr{}, err
	}
	f, err := host.readClusterFleet(ctx)
	if err != nil {
		return netip.Addr{}, err
	}
	used := usedAddresses(f)
	for a := range addrs.strayLeases(member) {
		used[a] = true
	}
	if a, ok := model.FreeAddress(slice, gw, used); ok {
		return a, nil
	}
	if member == "" {
		return netip.Addr{}, fmt.Errorf("every address of %s (%s) is taken by a box or a lease: remove a box (box doctor names leases that belong to no box)", model.Current.Network, slice)
	}
	return netip.Addr{}, fmt.Errorf("member %s's slice %s of %s is full: remove a box there, or mint on another member (--target)", member, slice, model.Current.Network)
}

// quickFor is For on a standalone host from its kernel, with no list of
// every instance: the first address of the subnet no pin binds, no lease
// holds and this process did not just hand out (hostns.Given). A stopped
// box's is in none, but Incus refuses it when it is set, and FixAddress
// picks again with For. False with no ownNS.
func (addrs *Addresses) quickFor() (netip.Addr, bool) {
	g := addrs.ownNS()
	if g == nil {
		return netip.Addr{}, false
	}
	defer g.Close()
	gw, ok := bridgeGateway(g)
	pinned, err := nft.PinnedAddrs(g.NFTConfig(model.Current))
	pool, perr := dhcpPool(g, model.Current.Network)
	if !ok || err != nil || perr != nil {
		return netip.Addr{}, false
	}
	used := hostns.Given(addrs.host.NetNS)
	for _, a := range pinned {
		used[a] = true
	}
	for _, l := range pool.Leases {
		used[l.Address] = true
	}
	return model.FreeAddress(gw.Masked(), gw, used)
}

// Slice is member's address slice and the bridge's address; a
// member without a slice has never been set up by box. A standalone
// host's (member "") is the bridge's whole subnet.
func (addrs *Addresses) Slice(ctx context.Context, member string) (slice, gw netip.Prefix, err error) {
	host := addrs.host
	if member == "" {
		if gw, ok := addrs.kernelGateway(); ok {
			return gw.Masked(), gw, nil
		}
	}
	n, _, err := host.Incus.Networks().Get(ctx, model.Current.Network)
	if err != nil {
		return slice, gw, fmt.Errorf("reading network %s: %w", model.Current.Network, err)
	}
	if member == "" {
		gw, err = netip.ParsePrefix(n.Config["ipv4.address"])
		if err != nil || !gw.Addr().Is4() {
			return slice, gw, fmt.Errorf("network %s has ipv4.address=%q, not an address box can use: run box doctor", model.Current.Network, n.Config["ipv4.address"])
		}
		return gw.Masked(), gw, nil
	}
	sl, err := model.SlicesOf(n.Config)
	if err != nil {
		return slice, gw, err
	}
	slice, ok := sl[member]
	if !ok {
		return slice, gw, fmt.Errorf("member %s has no address slice on %s, so box has not set it up: run box setup-host on any member, then box setup-host --member-only on %s", member, model.Current.Network, member)
	}
	gw, _ = netip.ParsePrefix(n.Config["ipv4.address"])
	return slice, gw, nil
}

// readsKernel says box reads this host's kernel to spare a call to Incus:
// not a remote's, a granted user's or another member's.
func (addrs *Addresses) readsKernel() bool {
	host := addrs.host
	return !host.NoKernel && host.Remote == "" && !host.Tier.Granted && host.member == ""
}

// ownNS opens the host's namespace where readsKernel (nil elsewhere, or
// when it cannot be opened: the caller asks Incus instead).
func (addrs *Addresses) ownNS() *hostns.NS {
	if !addrs.readsKernel() {
		return nil
	}
	g, err := addrs.host.OpenNS()
	if err != nil {
		return nil
	}
	return g
}

// kernelGateway is the bridge's address and subnet as the kernel has them
// (Incus set them from ipv4.address), with no call to Incus, whose answer
// for the bridge lists every instance on it. False with no namespace
// (ownNS) or a bridge that holds other than one IPv4 address.
func (addrs *Addresses) kernelGateway() (netip.Prefix, bool) {
	g := addrs.ownNS()
	if g == nil {
		return netip.Prefix{}, false
	}
	defer g.Close()
	return bridgeGateway(g)
}

// bridgeGateway is kernelGateway in an open namespace.
func bridgeGateway(g *hostns.NS) (netip.Prefix, bool) {
	as, err := g.LinkAddrs(model.Current.Network, netlink.FAMILY_V4)
	if err != nil || len(as) != 1 {
		return netip.Prefix{}, false
	}
	return hostns.PrefixOf(as[0].IPNet)
}

// usedAddresses is every address a NIC on the bridge asks for, a box
// being moved holds (keyMoving) or a lease holds, in every project on
// every member.
func usedAddresses(f Fleet) map[netip.Addr]bool {
	used := map[netip.Addr]bool{}
	for i := range f.insts {
		// A box on its way to another member holds its address here.
		if a, err := netip.ParseAddr(f.insts[i].Config[model.KeyMoving]); err == nil {
			used[a] = true
		}
		for _, d := range f.insts[i].ExpandedDevices {
			if model.IsNIC(d) && model.OnBridge(model.Current.Network, d) {
				if a, err := netip.ParseAddr(d["ipv4.address"]); err == nil {
					used[a] = true
				}
			}
		}
	}
	for _, l := range f.leases {
		if a, err := netip.ParseAddr(l.Address); err == nil {
			used[a] = true
		}
	}
	return used
}

// addressFindings names every address two members hand out (a lease on
// each, or a fixed address asked for on each). A box with no fixed address
// is dhcpFindings', on every host.
func addressFindings(f Fleet) []model.Finding {
	where := map[netip.Addr]map[string]bool{}
	add := func(a netip.Addr, member string) {
		if where[a] == nil {
			where[a] = map[string]bool{}
		}
		where[a][member] = true
	}
	var out []model.Finding
	for i := range f.insts {
		inst := &f.insts[i]
		for _, d := range inst.ExpandedDevices {
			if !model.IsNIC(d) || !model.OnBridge(model.Current.Network, d) {
				continue
			}
			a, err := netip.ParseAddr(d["ipv4.address"])
			if err != nil {
				continue
			}
			add(a, inst.Location)
		}
	}
	for _, l := range f.leases {
		if a, err := netip.ParseAddr(l.Address); err == nil && l.Type != "gateway" {
			add(a, l.Location)
		}
	}
	var addrs []netip.Addr
	for a, ms := range where {
		if len(ms) > 1 {
			addrs = append(addrs, a)
		}
	}
	slices.SortFunc(addrs, func(a, b netip.Addr) int { return a.Compare(b) })
	for _, a := range addrs {
		var ms []string
		for m := range where[a] {
			ms = append(ms, m)
		}
		sort.Strings(ms)
		out = append(out, model.Finding{Layer: model.LayerNAT, Object: "address " + a.String(),
			Problem: "handed out on more than one member: " + strings.Join(ms, ", "),
			Fix:     "remove or re-address the instance box did not mint (box doctor lists them)"})
	}
	return out
}

// here is the member this Host acts on: one memberHost aims at, else the
// incusd's own (once Cluster was read); "" off a cluster.
func (host *Host) here() string {
	if host.member != "" {
		return host.member
	}
	if host.cluster != nil {
		return host.cluster.Local
	}
	return ""
}

// MemberLayers says whether one member's host layers are in place.
type MemberLayers struct {
	Member string `json:"member"`
	Local  bool   `json:"local,omitempty"` // the member box ran on
	// State is "converged" (this run converged them), "clean" (read, and
	// nothing differs), "findings" (read, and Findings say what differs)
	// or "not-read" (another machine's: run box on it).
	State    string          `json:"state"`
	Findings []model.Finding `json:"findings,omitempty"`
	Slice    string          `json:"slice,omitempty"` // its address slice
}

// Member layer states.
const (
	MemberConverged = "converged"
	MemberClean     = "clean"
	MemberFindings  = "findings"
	MemberNotRead   = "not-read"
)

// addressUses is what uses addresses on this member and on every member
// whose namespace is known, so an auto-picked subnet is free on all of
// them; members not read are noted.
func (ms Membership) addressUses(g *hostns.NS, ci ClusterInfo, rep *Report) ([]model.AddressUse, error) {
	uses, err := g.AddressUses(model.Current.Network)
	if err != nil || !ci.Clustered() {
		return uses, err
	}
	var unread []string
	for _, m := range ci.Names() {
		if m == ci.Local {
			continue
		}
		ns, ok := ms.NetNS[m]
		if !ok {
			unread = append(unread, m)
			continue
		}
		mg, err := hostns.Open(ns)
		if err != nil {
			return nil, fmt.Errorf("member %s: %w", m, err)
		}
		mu, err := mg.AddressUses(model.Current.Network)
		mg.Close()
		if err != nil {
			return nil, fmt.Errorf("member %s: %w", m, err)
		}
		uses = append(uses, mu...)
	}
	if len(unread) > 0 {
		rep.Notes = append(rep.Notes, fmt.Sprintf("NOTE: the subnet was checked free here, not on %s (another machine): if one of them routes it, pick another with BOX_SUBNET", strings.Join(unread, ", ")))
	}
	return uses, nil
}

// createNetwork creates the bridge: on a cluster, defined on every member
// first (?target=), then committed with its config.
func createNetwork(ctx context.Context, c *incus.Client, ci ClusterInfo, req incus.NetworksPost) error {
	if !ci.Clustered() || len(ci.Members) < 2 {
		return c.Networks().Create(ctx, req)
	}
	for _, m := range ci.Names() {
		pending := incus.NetworksPost{Name: req.Name, Type: req.Type, Config: map[string]string{}}
		if err := c.Target(m).Networks().Create(ctx, pending); err != nil && !incus.IsConflict(err) {
			return fmt.Errorf("defining it on member %s: %w", m, err)
		}
	}
	return c.Networks().Create(ctx, req)
}

// ensureMember converges this member's host layers only (setup-host
// --member-only), on the cluster's bridge as it is.
func (host *Host) ensureMember(ctx context.Context, g *hostns.NS, net *incus.Network, rep *Report) (err error) {
	p, err := netip.ParsePrefix(net.Config["ipv4.address"])
	if err != nil {
		return fmt.Errorf("network %s has ipv4.address=%q, which box cannot build on: run box setup-host on any member", model.Current.Network, net.Config["ipv4.address"])
	}
	opts, err := host.Options.With(net.Config)
	if err != nil {
		return err
	}
	d := model.BuildDesired(p.Masked(), opts)
	rep.Subnet = model.SubnetChoice{Subnet: p.Masked(), Reason: "the cluster's " + model.Current.Network}
	rep.Gateway = d.Gateway
	if _, ok := opts.Slices[host.here()]; !ok {
		rep.Notes = append(rep.Notes, fmt.Sprintf("NOTE: member %s has no address slice on %s yet, so no box can be minted here: run box setup-host (without --member-only) on any member", host.here(), model.Current.Network))
	}
	var undos converge.Undos
	defer func() {
		if err != nil {
			if uerr := undos.Run(context.WithoutCancel(ctx)); uerr != nil {
				err = errors.Join(err, uerr)
			}
		}
	}()
	return host.ensureHostLayers(ctx, g, d, rep, &undos)
}

// memberLayers reads, after a converge, whether every member's host
// layers are in place (this member's were converged by the run).
func (host *Host) memberLayers(ctx context.Context, ci ClusterInfo, d model.Desired) []MemberLayers {
	var out []MemberLayers
	insts, lerr := host.Incus.Instances().All(ctx)
	for _, m := range ci.Names() {
		ml, _, err := host.memberState(ctx, m, d, insts)
		switch {
		case m == ci.Local:
			ml.State = MemberConverged
		case errors.Join(lerr, err) != nil:
			ml.State = MemberFindings
			ml.Findings = []model.Finding{{Layer: model.LayerStack, Object: "member " + m, Problem: errors.Join(lerr, err).Error(), Fix: "box doctor on " + m}}
		}
		out = append(out, ml)
	}
	return out
}

// memberState is another member's host layers as read from here (clean,
// findings, or not read: another machine's), with its slice and its
// census; for the local member only the slice.
func (host *Host) memberState(ctx context.Context, member string, d model.Desired, insts []incus.Instance) (ml MemberLayers, census *model.Census, err error) {
	ml = MemberLayers{Member: member, Local: member == host.here(), State: MemberClean}
	if sl, ok := d.Slices[member]; ok {
		ml.Slice = sl.String()
	}
	if ml.Local {
		return ml, nil, nil
	}
	fs, census, read, err := host.readMember(ctx, member, d, insts)
	switch {
	case err != nil:
		return ml, nil, err
	case !read:
		ml.State = MemberNotRead
	case len(fs) > 0:
		ml.State, ml.Findings = MemberFindings, fs
	}
	return ml, census, nil
}

// readMember verifies another member's host layers where its namespace is
// known (read false where it is not), its findings naming it, and returns
// its census of the instances placed there.
// insts is every instance of the cluster, listed once by the caller.
func (host *Host) readMember(ctx context.Context, member string, d model.Desired, insts []incus.Instance) (fs []model.Finding, census *model.Census, read bool, err error) {
	mh, ok := host.ForMember(member)
	if !ok {
		return nil, nil, false, nil
	}
	g, err := mh.OpenNS()
	if err != nil {
		return nil, nil, true, err
	}
	defer g.Close()
	v := &Verification{Findings: []model.Finding{}}
	if err := mh.verifyGround(ctx, g, d, netip.PrefixFrom(d.Gateway, d.Subnet.Bits()), onMember(insts, member), v); err != nil {
		return nil, nil, true, fmt.Errorf("member %s: %w", member, err)
	}
	for i := range v.Findings {
		v.Findings[i].Member = member
		if v.Findings[i].Fix == model.FixEnsure {
			// doctor --fix here converges this member only.
			v.Findings[i].Fix = "box setup-host --member-only on " + member
		}
	}
	return v.Findings, v.Fleet, true, nil
}

// verifyMembers adds, on a cluster, every other member's host layers that
// can be read from here, and the cluster's addressing, to v.
func (host *Host) verifyMembers(ctx context.Context, ci ClusterInfo, d model.Desired, insts []incus.Instance, v *Verification) error {
	for _, m := range ci.Names() {
		ml, census, err := host.memberState(ctx, m, d, insts)
		if err != nil {
			return err
		}
		if ml.Slice == "" {
			v.Findings = append(v.Findings, model.Finding{Layer: model.LayerNAT, Object: "member " + m, Member: m,
				Problem: "has no address slice on " + model.Current.Network + ": no box can be minted there", Fix: "box setup-host"})
		}
		switch {
		case ml.Local:
			for _, f := range v.Findings {
				if f.Member == m {
					ml.Findings = append(ml.Findings, f)
				}
			}
			if len(ml.Findings) > 0 {
				ml.State = MemberFindings
			}
		case ml.State == MemberNotRead:
			v.Notes = append(v.Notes, fmt.Sprintf("member %s's host layers were not read from here (another machine): run box doctor on %s", m, m))
		default:
			v.Fleet.JoinCensus(census)
			v.Findings = append(v.Findings, ml.Findings...)
		}
		v.Members = append(v.Members, ml)
	}
	leases, err := bridgeLeases(ctx, host.Incus, insts)
	if err != nil {
		return err
	}
	v.Findings = append(v.Findings, addressFindings(Fleet{insts: insts, leases: leases})...)
	return nil
}

// ParseMemberNetNS reads BOX_MEMBER_NETNS: "member=namespace" pairs,
// comma or space separated.
func ParseMemberNetNS(s string) (map[string]string, error) {
	out := map[string]string{}
	for _, f := range strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == ' ' }) {
		m, ns, ok := strings.Cut(f, "=")
		if !ok || m == "" || ns == "" {
			return nil, fmt.Errorf("BOX_MEMBER_NETNS: %q is not member=namespace", f)
		}
		out[m] = ns
	}
	return out, nil
}

// Create creates (and, with post.Start, starts) a box's instance. The
// box gets a fixed address (L-DHCP: the bridge's DHCP answers no one
// else), on a cluster from its member's slice: it is created stopped on
// the member asked for (or where Incus places it), given the address
// (fixAddress), then started (startFixed). A granted user sees neither the
// bridge nor the other projects' boxes to pick one from: the port watcher
// (root) gives theirs one as its port comes up (fixMissingAddresses).
func (addrs *Addresses) Create(ctx context.Context, post incus.InstancesPost, target string, progress func(string)) error {
	host := addrs.host
	ci, err := host.Cluster(ctx)
	if err != nil {
		return err
	}
	if !ci.Clustered() && target != "" {
		return fmt.Errorf("minting %s: --target %s: this incusd is not a cluster member", post.Name, target)
	}
	if host.Tier.Granted {
		return host.Incus.Instances().CreateWithProgress(ctx, post, progress)
	}
	if err := ci.CheckMember(target); err != nil {
		return fmt.Errorf("minting %s: %w", post.Name, err)
	}
	start := post.Start
	post.Start = false
	cl := host.Incus
	if target != "" {
		cl = cl.Target(target)
	}
	if err := cl.Instances().CreateWithProgress(ctx, post, progress); err != nil {
		return err
	}
	member := target
	if member == "" && ci.Clustered() {
		inst, _, err := host.Incus.Instances().Get(ctx, post.Name)
		if err != nil {
			return err
		}
		member = inst.Location
	}
	if _, err := addrs.fixAddress(ctx, post.Name, member, true); err != nil {
		return err
	}
	if !start {
		return nil
	}
	return addrs.StartFixed(ctx, post.Name, member)
}

// CheckMember refuses a --target that names no member ("" is Incus's
// choice).
func (ci ClusterInfo) CheckMember(member string) error {
	if member != "" && !slices.Contains(ci.Names(), member) {
		return fmt.Errorf("no cluster member %s (members: %s)", member, strings.Join(ci.Names(), ", "))
	}
	return nil
}

// addressTries is how often box picks a fixed address when Incus says
// another NIC on the member asks for it.
const addressTries = 3

// isAddressConflict is Incus refusing a fixed address another NIC on the
// member asks for, when it is set ("Failed update validation") or when
// the instance starts ("Failed start validation"); a copy is not checked.
func isAddressConflict(err error) bool {
	return err != nil && strings.Contains(err.Error(), "already defined on another NIC")
}

// FixAddress gives an instance a fixed address of its member's slice (of
// the bridge's subnet on a standalone host, member ""). A box minted at
// the same moment on the same member may have taken the address between
// AddressFor and the update: Incus refuses it, and box picks again.
//
// Picking an address and setting it are one step for every box command on
// this machine: two mints at once could pick the same one, which Incus
// refuses to one of them only at its start (docs/measurements.md, "A
// cluster").
func (addrs *Addresses) FixAddress(ctx context.Context, name, member string) (netip.Addr, error) {
	return addrs.fixAddress(ctx, name, member, false)
}

// fixAddress is FixAddress, its first pick quickFor's when quick is set
// (a new box's).
func (addrs *Addresses) fixAddress(ctx context.Context, name, member string, quick bool) (netip.Addr, error) {
	for try := 1; ; try++ {
		unlock, err := hostns.LockFile(ctx, hostns.AddressLock, "the address slices")
		if err != nil {
			return netip.Addr{}, err
		}
		addr, ok := netip.Addr{}, false
		if quick && try == 1 && member == "" {
			addr, ok = addrs.quickFor()
		}
		if !ok {
			addr, err = addrs.For(ctx, member)
		}
		if err == nil {
			if err = addrs.setFixedAddress(ctx, name, addr); err == nil {
				hostns.NoteGiven(addrs.host.NetNS, addr)
			}
		}
		unlock()
		if err == nil {
			return addr, nil
		}
		if !isAddressConflict(err) || try == addressTries {
			if member == "" {
				return netip.Addr{}, fmt.Errorf("giving %s a fixed address: %w", name, err)
			}
			return netip.Addr{}, fmt.Errorf("giving %s a fixed address on member %s: %w", name, member, err)
		}
	}
}

// StartFixed starts an instance with a fixed address. Incus checks it
// again at the start: one another NIC on the member asks for by then is
// replaced by a fresh one (fixAddress), and it starts.
func (addrs *Addresses) StartFixed(ctx context.Context, name, member string) error {
	host := addrs.host
	for try := 1; ; try++ {
		err := host.Incus.Instances().SetState(ctx, name, "start", 0, false)
		if !isAddressConflict(err) || try == addressTries {
			return err
		}
		if _, err := addrs.FixAddress(ctx, name, member); err != nil {
			return err
		}
	}
}

// setFixedAddress gives an instance's NIC on the bridge a fixed address:
// its own device's keys kept (a granted user's box may have turned port
// isolation off in it), or the profile's NIC made its own. An instance with
// no NIC on the bridge gets the profile's.
func (addrs *Addresses) setFixedAddress(ctx context.Context, name string, addr netip.Addr) error {
	host := addrs.host
	inst, etag, err := host.Incus.Instances().Get(ctx, name)
	if err != nil {
		return err
	}
	put := inst.Writable()
	if put.Devices == nil {
		put.Devices = map[string]map[string]string{}
	}
	dev, nic := model.BridgeNICOf(inst)
	if dev == "" {
		dev, nic = "eth0", model.BoxNIC()
	} else if own, ok := put.Devices[dev]; ok {
		nic = maps.Clone(own)
	} else {
		nic = maps.Clone(nic)
	}
	if nic["name"] == model.TransitName {
		nic["name"] = "eth0" // a move that stopped half way
	}
	nic["ipv4.address"] = addr.String()
	put.Devices[dev] = nic
	delete(put.Config, model.KeyMoving)
	return host.Incus.Instances().Update(ctx, name, put, etag)
}

// MemberReport is one member's host layers converged (EnsureMembers).
type MemberReport struct {
	Member string  `json:"member"`
	Report *Report `json:"report"`
}

// EnsureMembers converges the host layers of every other member whose
// namespace MemberNetNS names (setup-host --member-only there), after
// Ensure converged the cluster's objects and this member's. A standalone
// host has none.
func (host *Host) EnsureMembers(ctx context.Context) ([]MemberReport, error) {
	ci, err := host.Cluster(ctx)
	if err != nil || !ci.Clustered() {
		return nil, err
	}
	var out []MemberReport
	for _, m := range ci.Names() {
		mh, ok := host.ForMember(m)
		if !ok || m == ci.Local {
			continue
		}
		mh.Members.Only = true
		rep, err := mh.Ensure(ctx)
		if err != nil {
			return out, fmt.Errorf("member %s: %w", m, err)
		}
		out = append(out, MemberReport{Member: m, Report: rep})
	}
	return out, nil
}

// ClusterMemberAddr is a member's name and cluster address.
type ClusterMemberAddr struct {
	Name string
	Addr netip.Addr
}

// MemberAddrs reads every member's cluster address from its URL.
func (ci ClusterInfo) MemberAddrs() []ClusterMemberAddr {
	var out []ClusterMemberAddr
	for _, m := range ci.Members {
		hp := strings.TrimPrefix(strings.TrimPrefix(m.URL, "https://"), "http://")
		ap, err := netip.ParseAddrPort(hp)
		a := ap.Addr()
		if err != nil {
			a, _ = netip.ParseAddr(hp)
		}
		out = append(out, ClusterMemberAddr{Name: m.ServerName, Addr: a})
	}
	return out
}

// teardown removes, on a cluster, both generations' nft tables on
// every other member whose namespace is known (Host.MemberNetNS). The
// cluster's Incus objects went with Teardown's own calls; a member on
// another machine keeps its tables until `box teardown-host` runs there.
func (ms Membership) teardown(ci ClusterInfo) ([]model.Change, error) {
	if !ci.Clustered() {
		return nil, nil
	}
	var changes []model.Change
	var errs []error
	for _, m := range ci.Names() {
		if m == ci.Local {
			continue
		}
		ns, ok := ms.NetNS[m]
		if !ok {
			continue
		}
		g, err := hostns.Open(ns)
		if err != nil {
			errs = append(errs, fmt.Errorf("member %s: %w", m, err))
			continue
		}
		for _, gen := range []model.Generation{model.Current, model.Legacy} {
			if gen.NFTTable == "" {
				continue
			}
			removed, err := nft.Delete(g.NFTConfig(gen))
			if err != nil {
				errs = append(errs, fmt.Errorf("removing member %s's nft tables: %w", m, err))
			}
			for _, r := range removed {
				changes = append(changes, model.Change{Object: "nft " + r + " on member " + m, Action: "removed"})
			}
		}
		g.Close()
	}
	return changes, errors.Join(errs...)
}

// CreateNetwork creates a managed network as req says: on a cluster,
// defined on every member first, then committed (what Ensure does for the
// bridge; the drill's decoy network uses it too).
func (host *Host) CreateNetwork(ctx context.Context, req incus.NetworksPost) error {
	ci, err := host.Cluster(ctx)
	if err != nil {
		return err
	}
	return createNetwork(ctx, host.Incus, ci, req)
}

// ReaddressIfTaken gives a box a fresh address of its member's slice when
// the one it asks for is another instance's: a snapshot a clone or a copy
// carried holds its source's address, and a restore brings it back (Incus
// does not let box edit a snapshot's devices). A snapshot taken before box
// gave its boxes fixed addresses brings back a NIC with none: it gets one
// (ensureFixed).
func (addrs *Addresses) ReaddressIfTaken(ctx context.Context, name string) error {
	host := addrs.host
	inst, _, err := host.Incus.Instances().Get(ctx, name)
	if err != nil {
		return err
	}
	member, err := addrs.MemberOf(ctx, inst)
	if err != nil {
		return err
	}
	addr := model.FixedAddressOf(inst)
	if !addr.IsValid() {
		_, err := addrs.EnsureFixed(ctx, inst, member)
		return err
	}
	f, err := host.readClusterFleet(ctx)
	if err != nil {
		return err
	}
	others := f
	others.insts = slices.DeleteFunc(slices.Clone(f.insts), func(i incus.Instance) bool {
		return i.Name == inst.Name && model.ProjectOf(i.Project) == model.ProjectOf(inst.Project)
	})
	mac := inst.Config["volatile.eth0.hwaddr"]
	others.leases = slices.DeleteFunc(slices.Clone(f.leases), func(l incus.NetworkLease) bool { return strings.EqualFold(l.Hwaddr, mac) })
	if !usedAddresses(others)[addr] {
		return nil
	}
	_, err = addrs.FixAddress(ctx, name, member)
	return err
}

// LandAddress gives a box on member its fixed address addr again (after a
// move), or a fresh one of the member's slice when addr is not valid or
// another NIC on the member took it meanwhile.
func (addrs *Addresses) LandAddress(ctx context.Context, name, member string, addr netip.Addr) (netip.Addr, error) {
	if addr.IsValid() {
		err := addrs.setFixedAddress(ctx, name, addr)
		if !isAddressConflict(err) {
			return addr, err
		}
	}
	return addrs.FixAddress(ctx, name, member)
}

// Addresses hands out and keeps boxes' fixed addresses (L-DHCP): a free
// one of the member's slice for a new box, a fresh one for a copy that
// carried its source's, the lease a box held before box gave addresses;
// and reads and releases the bridge's DHCP leases.
type Addresses struct {
	host *Host
}

// Addresses is this host's address keeper.
func (host *Host) Addresses() *Addresses { return &Addresses{host: host} }
