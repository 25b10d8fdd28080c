package model

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/box-isolation/box/stack/incus"
)

// Generation names one generation of the stack's objects.
type Generation struct {
	Name     string // "current" or "legacy"
	Network  string
	Profile  string
	ACL      string
	Tag      string // the ownership config key, set to "1"
	NFTTable string // "" when the generation had no nft tables of ours
}

// The two generations. The legacy one is recognised, migrated and torn
// down; its tag is honoured forever.
var (
	Current = Generation{Name: "current", Network: "boxnet", Profile: "box-net", ACL: "box-isolate", Tag: "user.box", NFTTable: "box"}
	// The legacy host firewall was a script (claudebox-firewall) that
	// loaded its own nft tables named claudebox.
	Legacy = Generation{Name: "legacy", Network: "claudenet", Profile: "claude-dev", ACL: "claude-isolate", Tag: "user.claudebox", NFTTable: "claudebox"}
)

// Subnets.
var (
	DefaultSubnet = netip.MustParsePrefix("10.88.0.0/24")
	// Auto-picked subnets run from 10.89.0.0/24 to 10.127.0.0/24.
	firstAuto = 89
	lastAuto  = 127
)

// DefaultDNS are the upstream resolvers dnsmasq forwards to when BOX_DNS
// does not say otherwise: public ones, so no split-horizon or LAN name ever
// resolves inside a box.
var DefaultDNS = []netip.Addr{netip.MustParseAddr("1.1.1.1"), netip.MustParseAddr("9.9.9.9")}

// PrivateRanges are what a box may never reach (L-ACL).
var PrivateRanges = []netip.Prefix{
	netip.MustParsePrefix("10.0.0.0/8"),
	netip.MustParsePrefix("172.16.0.0/12"),
	netip.MustParsePrefix("192.168.0.0/16"),
	netip.MustParsePrefix("100.64.0.0/10"),
	netip.MustParsePrefix("169.254.0.0/16"),
}

// Options are the operator's choices; the zero value is the default stack.
type Options struct {
	// Subnet pins the bridge's /24 (BOX_SUBNET); honoured or refused.
	Subnet netip.Prefix
	// DNS pins the upstream resolvers (BOX_DNS).
	DNS []netip.Addr
	// Pool is the storage pool of the profile's root disk.
	Pool string
	// Egress are the egress policies (id -> names), as stored on the
	// bridge: they are not the operator's environment's.
	Egress map[string][]string
	// Slices are, on a cluster, every member's address slice (cluster.go),
	// as stored on the bridge; nil on a standalone host.
	Slices map[string]netip.Prefix
}

// The operator's choices are stored on the bridge, so a later doctor or
// setup-host run without the same environment compares with, and keeps,
// what was chosen.
const (
	KeyDNS    = "user.box.dns"    // BOX_DNS at setup-host, comma separated
	KeySubnet = "user.box.subnet" // BOX_SUBNET at setup-host
)

// With returns o with what the operator left unset taken from the choices
// stored on the bridge's config: what the environment says now wins, what
// it does not say stays as chosen. The egress policies are always the
// stored ones.
func (o Options) With(stored map[string]string) (Options, error) {
	if ps := PoliciesOf(stored); len(ps) > 0 {
		o.Egress = ps
	}
	sl, err := SlicesOf(stored)
	if err != nil {
		return o, err
	}
	if len(sl) > 0 {
		o.Slices = sl
	}
	if len(o.DNS) == 0 && stored[KeyDNS] != "" {
		for _, f := range strings.Split(stored[KeyDNS], ",") {
			a, err := netip.ParseAddr(strings.TrimSpace(f))
			if err != nil {
				return o, fmt.Errorf("the stack's stored %s=%q is not a list of addresses: fix it with BOX_DNS=... box setup-host", KeyDNS, stored[KeyDNS])
			}
			o.DNS = append(o.DNS, a)
		}
	}
	if !o.Subnet.IsValid() && stored[KeySubnet] != "" {
		p, err := netip.ParsePrefix(stored[KeySubnet])
		if err != nil {
			return o, fmt.Errorf("the stack's stored %s=%q is not a prefix: fix it with BOX_SUBNET=... box setup-host", KeySubnet, stored[KeySubnet])
		}
		o.Subnet = p
	}
	return o, nil
}

// PoolName is the storage pool boxes are minted on: Pool, else "default".
func (o Options) PoolName() string {
	if o.Pool != "" {
		return o.Pool
	}
	return "default"
}

// OptionsFromEnv reads BOX_SUBNET and BOX_DNS (comma or space separated).
func OptionsFromEnv(getenv func(string) string) (Options, error) {
	var o Options
	if s := strings.TrimSpace(getenv("BOX_SUBNET")); s != "" {
		p, err := netip.ParsePrefix(s)
		if err != nil || !p.Addr().Is4() || p.Bits() != 24 || p.Masked() != p {
			return o, fmt.Errorf("BOX_SUBNET=%q is not an IPv4 /24 such as 10.88.0.0/24", s)
		}
		o.Subnet = p
	}
	if s := strings.TrimSpace(getenv("BOX_DNS")); s != "" {
		for _, f := range strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == ' ' }) {
			a, err := netip.ParseAddr(f)
			if err != nil {
				return o, fmt.Errorf("BOX_DNS: %q is not an IP address", f)
			}
			o.DNS = append(o.DNS, a)
		}
	}
	o.Pool = strings.TrimSpace(getenv("BOX_POOL"))
	return o, nil
}

// Desired is the whole isolation stack as data.
type Desired struct {
	Gen     Generation
	Subnet  netip.Prefix // the bridge's /24
	Gateway netip.Addr   // the bridge's own address (.1)
	DNS     []netip.Addr
	Pool    string
	// Slices are, on a cluster, the members' address slices.
	Slices map[string]netip.Prefix

	Network incus.NetworksPost
	ACL     incus.NetworkACL
	Profile incus.Profile
}

// BuildDesired makes the desired stack for a chosen subnet.
func BuildDesired(subnet netip.Prefix, opts Options) Desired {
	gw := subnet.Masked().Addr().Next()
	dns := opts.DNS
	if len(dns) == 0 {
		dns = DefaultDNS
	}
	pool := opts.Pool
	if pool == "" {
		pool = "default"
	}
	g := Current
	d := Desired{Gen: g, Subnet: subnet.Masked(), Gateway: gw, DNS: dns, Pool: pool, Slices: opts.Slices}

	// dns.mode=none stops Incus from adding per-instance records, but
	// dnsmasq still answers for the hostnames DHCP clients send it (the
	// drill's C-ENUM (now C-NAMES) caught sibling names and PTRs resolving):
	// dhcp-ignore-names drops them. Incus starts dnsmasq without
	// --no-hosts, so it also answers every name in the host's /etc/hosts
	// (measured: a name added there resolved from a box): no-hosts.
	// The DHCP lines are L-DHCP's (dhcp.go).
	var raw strings.Builder
	raw.WriteString("no-resolv\nno-hosts\ndhcp-ignore-names\n")
	for _, a := range dns {
		fmt.Fprintf(&raw, "server=%s\n", a)
	}
	for _, l := range DHCPLines {
		raw.WriteString(l + "\n")
	}
	d.Network = incus.NetworksPost{
		Name:        g.Network,
		Type:        "bridge",
		Description: "box: isolated NAT bridge (managed by box setup-host)",
		Config: map[string]string{
			"ipv4.address":                         netip.PrefixFrom(gw, subnet.Bits()).String(),
			"ipv4.nat":                             "true",
			"ipv6.address":                         "none",
			"ipv6.nat":                             "false",
			"dns.mode":                             "none",
			"raw.dnsmasq":                          raw.String(),
			"security.acls":                        g.ACL,
			"security.acls.default.egress.action":  "allow",
			"security.acls.default.ingress.action": "drop",
		},
	}
	if len(opts.DNS) > 0 {
		strs := make([]string, len(opts.DNS))
		for i, a := range opts.DNS {
			strs[i] = a.String()
		}
		d.Network.Config[KeyDNS] = strings.Join(strs, ",")
	}
	if opts.Subnet.IsValid() {
		d.Network.Config[KeySubnet] = opts.Subnet.String()
	}
	for id, names := range opts.Egress {
		d.Network.Config[KeyEgressPolicy+id] = strings.Join(names, ",")
	}
	if len(opts.Slices) > 0 {
		d.Network.Config["ipv4.dhcp.ranges"] = DynamicRange(d.Subnet)
		for m, p := range opts.Slices {
			d.Network.Config[KeySlice+m] = p.String()
		}
	}

	acl := incus.NetworkACL{Name: g.ACL, Description: "box: boxes reach the internet and nothing private"}
	// Incus orders every drop before every allow (docs/design.md, "The layer map"), so this allow
	// cannot open a hole in 10/8; DNS and DHCP to the gateway pass through
	// Incus's own input accepts. It documents intent and covers a gateway
	// outside the private ranges.
	for _, proto := range []string{"udp", "tcp"} {
		acl.Egress = append(acl.Egress, incus.ACLRule{
			Action: "allow", Protocol: proto, Destination: gw.String() + "/32", DestinationPort: "53",
			Description: "DNS to the gateway", State: "enabled",
		})
	}
	for _, p := range PrivateRanges {
		acl.Egress = append(acl.Egress, incus.ACLRule{
			Action: "drop", Destination: p.String(), Description: "private range", State: "enabled",
		})
	}
	d.ACL = acl

	d.Profile = incus.Profile{
		Name:        g.Profile,
		Description: "box: the NIC on boxnet with port isolation, and the root disk; nothing else",
		// No guest API (/dev/incus): Incus 6.0's guest API server reads its connection map
		// unlocked while connections open and close (lxc/incus#3618), and
		// one box's overlapping requests took the host's incusd down
		// within a second (docs/measurements.md, "The guest API").
		// cloud-init reads a box's user-data from the seed files Incus
		// writes (NoCloud), not from it.
		Config: map[string]string{GuestAPIKey: "false"},
		Devices: map[string]map[string]string{
			"eth0": {"type": "nic", "network": g.Network, "name": "eth0", "security.port_isolation": "true"},
			"root": {"type": "disk", "path": "/", "pool": pool},
		},
	}
	return d
}

// ACLRulesEqual compares rules as Incus stores them (it fills State).
func ACLRulesEqual(a, b []incus.ACLRule) bool {
	norm := func(rs []incus.ACLRule) []string {
		out := make([]string, len(rs))
		for i, r := range rs {
			if r.State == "" {
				r.State = "enabled"
			}
			r.Description = ""
			out[i] = fmt.Sprintf("%+v", r)
		}
		return out
	}
	return slices.Equal(norm(a), norm(b))
}
