// Package drill proves box's isolation claims with raw packets fired from
// inside boxes. It is modelled on cilium-cli's connectivity checks: a Claim
// (SPEC section 4) expands into Actions, one probe each from a source to a
// target over one channel, each carrying its expected result; judging turns
// an action's observations into a Verdict. An unexpected success is a
// failure with its evidence; an empty or ambiguous answer is inconclusive,
// never a pass; and a blocked verdict rests on two sides: the sender saw
// nothing and a witness (or listener) at the target saw nothing.
//
// Run goes through the phases of SPEC section 5: preflight (clean the
// drill's own leftovers), stack (ensure, or only verify), mint probe boxes
// (two peers and a clone), push the agent, baseline positive controls, all
// probes concurrently under one deadline, verdicts, and teardown of its own
// boxes, also when the caller's context is cancelled.
package drill

import (
	"fmt"
	"path"
	"strings"

	"github.com/box-isolation/box/stack"
)

// Claim is one isolation claim of SPEC section 4.
type Claim struct {
	ID       string   `json:"id"`
	From     string   `json:"from"`
	To       string   `json:"to"`
	Channels []string `json:"channels"`
	Expect   string   `json:"expect"`
	Layers   []string `json:"layers"`
	Why      string   `json:"why"`
	// Baseline claims are positive controls: if one of their probes fails,
	// every blocked claim of the run is inconclusive (a failure of their
	// stack channel alone fails them, and leaves the rest to their probes).
	Baseline bool `json:"baseline"`
}

// Catalogue is every claim, in report order.
var Catalogue = []Claim{
	{ID: "C-EGRESS", From: "box", To: "internet canary", Channels: []string{"tcp", "udp", "icmp"}, Expect: "reachable (the canary's greeting proves who answered)", Layers: []string{"L-NAT"}, Baseline: true,
		Why: "a box that cannot reach the internet makes every 'blocked' meaningless"},
	{ID: "C-DNS", From: "box", To: "gateway resolver", Channels: []string{"dns"}, Expect: "a public name resolves", Layers: []string{"L-DNS"}, Baseline: true,
		Why: "the resolver is the one host service a box may use"},
	{ID: "C-DHCP", From: "box", To: "lease", Channels: []string{"dhcp"}, Expect: "a lease on the box subnet", Layers: []string{"L-NAT"}, Baseline: true,
		Why: "without a lease no probe leaves from the address the rules are written for"},
	{ID: "C-SIBLING", From: "box", To: "peer box and a clone", Channels: []string{"arp", "icmp", "tcp", "udp", "broadcast", "icmpv6-link-local", "icmpv6-all-nodes"}, Expect: "no frame reaches the peer", Layers: []string{"L-PORTISO", "L-BRIDGEDROP"},
		Why: "two boxes on one bridge exchange frames below netfilter's L3 hooks unless the bridge itself refuses"},
	{ID: "C-HOST", From: "box", To: "every host address: the drill's listeners, every socket the host listens on (read from the kernel), DNS and DHCP off the gateway", Channels: []string{"tcp", "udp", "icmp"}, Expect: "dropped (DNS and DHCP to the gateway are the only exceptions; router solicitations reach an IPv6 stack the bridge must not have)", Layers: []string{"L-HOSTFW", "L-ACL"},
		Why: "the host's own services, including those on its public address, are not the box's"},
	{ID: "C-LAN", From: "box", To: "every private address the host can reach: the world's LAN hosts, or a host's route gateways and hosts, neighbours, resolvers, DHCP servers and a sample per private range", Channels: []string{"tcp", "udp", "icmp"}, Expect: "nothing arrives (a LAN witness, or in host mode an outbound witness on the host's interfaces, proves it)", Layers: []string{"L-ACL"},
		Why: "the LAN and the cloud metadata service are the first things a hostile agent looks for"},
	{ID: "C-NAMES", From: "box", To: "its resolver: sibling names, the host's hosts file, hostname and search domains, PTRs of host and LAN addresses, a LAN resolver's names", Channels: []string{"dns"}, Expect: "no private name resolves (a name the pinned public upstream answers the same is public)", Layers: []string{"L-DNS"},
		Why: "a name is the first step to a target, and a resolver that answers private names tells a box what the host knows"},
	{ID: "C-V6", From: "box", To: "IPv6", Channels: []string{"global-address", "default-route", "router-advertisement"}, Expect: "none", Layers: []string{"L-V6"},
		Why: "every other rule is IPv4-only: IPv6 would be an uncovered path"},
	{ID: "C-INBOUND", From: "host, LAN (in host mode a throwaway namespace behind the host, one source per private range)", To: "box", Channels: []string{"tcp", "icmp"}, Expect: "dropped", Layers: []string{"L-ACL"},
		Why: "nothing outside may open a connection into a box"},
	{ID: "C-CLONE", From: "clone", To: "its source", Channels: []string{"address", "mac", "machine-id"}, Expect: "distinct", Layers: []string{string(stack.LayerStack)},
		Why: "two boxes with one identity share one lease and both lose the network"},
	{ID: "C-SPOOF", From: "box-a, lying about who it is", To: "the host, box-b, the internet", Channels: []string{"arp", "mac", "ipv4-source", "return-traffic"}, Expect: "no forged ARP or IPv4 source reaches the host's bridge or a peer, the host never holds box-b's address at another MAC, box-b's return traffic keeps reaching it", Layers: []string{"L-PIN"},
		Why: "a box that takes a sibling's address steals its return traffic, and one that takes the gateway's misleads every box that believes it"},
	{ID: "C-FLEET", From: "every instance on boxnet (any project, tagged or not, running or stopped) and every port on it", To: "the stack", Channels: []string{ChannelCensus}, Expect: "exactly one NIC, on boxnet, isolated (config and kernel flag), in the bridge drop's port set; no other NIC, no proxy but box's own loopback doors, no host path or device passed through, no raw.lxc/raw.qemu, not privileged", Layers: []string{string(stack.LayerFleet)},
		Why: "the boxes people work in were minted weeks ago and changed since: a re-plugged NIC or a device added by hand takes one off the stack while fresh probe boxes pass"},
	{ID: "C-TIER", From: "box-t, minted by a granted local user through incus-user with port isolation turned off in its own NIC, and that user", To: "peer boxes, the host, the LAN, the resolver; Incus (other networks, host paths, proxies, privilege)", Channels: []string{"arp", "icmp", "tcp", "udp", "broadcast", "icmpv6-link-local", "icmpv6-all-nodes", "dns", ChannelIsolOff, ChannelRestriction, ChannelCensus}, Expect: "isolated like box-a (the host's layers hold though the user may turn port isolation off, and the census names that box); every attempt to leave boxnet refused by Incus for the restriction", Layers: []string{string(stack.LayerTier)},
		Why: "a granted user holds an Incus socket: the grant's narrowing to boxnet and the host-owned layers are all that stand between their agent and the host's networks"},
	{ID: "C-ALLOW", From: "box-w, under an egress allowlist (the canary's name, and a name that resolves to a LAN host); box-a, open", To: "the allowed canary by name; a second canary by name and by address; a public resolver straight; the LAN host the allowed name resolves to", Channels: []string{"tcp", "udp"}, Expect: "box-w reaches the allowed canary by name and nothing else; box-a reaches the second canary (it was there to be blocked)", Layers: []string{string(stack.LayerEgress)},
		Why: "an allowlist that leaks is a false sense of safety, and one that lets an allowed name point at the LAN is a way in (DNS rebinding); it must only ever drop"},
	{ID: "C-EXPOSE", From: "the host's loopback, its other addresses, the LAN; box-a", To: "box expose's door from the host's 127.0.0.1 to box-a's listener", Channels: []string{"tcp"}, Expect: "the door answers on the host's loopback only (elsewhere the port is closed), and opens nothing inside the box", Layers: []string{string(stack.LayerFleet)},
		Why: "a door is the one thing box puts between a box and the host: on any address but loopback it is a way in from the LAN, and a listener inside would be a way out"},
}

// ClaimByID finds a claim.
func ClaimByID(id string) (Claim, bool) {
	for _, c := range Catalogue {
		if c.ID == id {
			return c, true
		}
	}
	return Claim{}, false
}

// Select picks claims by id or glob pattern (path.Match syntax, case
// insensitive). No include pattern selects every claim; a skip pattern, or
// an include pattern starting with "!", removes claims. A pattern that
// matches nothing is an error, so a typo never silently drops a claim.
func Select(include, skip []string) ([]Claim, error) {
	var incl, excl []string
	for _, p := range include {
		if strings.HasPrefix(p, "!") {
			excl = append(excl, p[1:])
		} else {
			incl = append(incl, p)
		}
	}
	excl = append(excl, skip...)
	for _, p := range append(append([]string{}, incl...), excl...) {
		if !matchesAny(p) {
			return nil, fmt.Errorf("claim pattern %q matches no claim (drill list shows them)", p)
		}
	}
	var out []Claim
	for _, c := range Catalogue {
		if len(incl) > 0 && !match(incl, c.ID) {
			continue
		}
		if match(excl, c.ID) {
			continue
		}
		out = append(out, c)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("the selection leaves no claim to test")
	}
	return out, nil
}

func match(patterns []string, id string) bool {
	for _, p := range patterns {
		if ok, _ := path.Match(strings.ToUpper(p), id); ok {
			return true
		}
	}
	return false
}

func matchesAny(p string) bool {
	for _, c := range Catalogue {
		if match([]string{p}, c.ID) {
			return true
		}
	}
	return false
}
