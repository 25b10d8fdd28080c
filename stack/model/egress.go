package model

import (
	"crypto/sha256"
	"encoding/hex"
	"maps"
	"net/netip"
	"slices"
	"strings"
)

// Egress policies (layer L-EGRESS). A box is open (the default: the
// internet, nothing private) or under an allowlist of names
// (egressnames.go says what an entry means). The allowlist is enforced on
// the host, in three places (stack/nft/egress.go has the table):
//
//   - DNS: the box's questions to its gateway go to box's own resolver
//     (stack/egress/dns.go), which answers the policy's names only, from the
//     stack's pinned upstream, and puts the addresses it answered into the
//     policy's allow set; any other question is refused at once, with the
//     reason, and never leaves the host (no DNS tunnel).
//   - TLS and HTTP (tcp 443 and 80): box's proxy (stack/egress/proxy.go) takes
//     the connection, reads the TLS server name or the HTTP Host, and
//     dials the name's address itself only when the name is allowed.
//   - Every other new connection the box forwards goes only to the allow
//     set's addresses; never QUIC, DNS over TLS, or a known DNS-over-HTTPS
//     resolver's address.
//
// The resolver and the proxy run in the port watcher's process (box
// watch-ports); when none runs, an allowlisted box resolves nothing and
// opens nothing on 80 and 443: closed, never open, and box doctor says
// so. Every refusal is logged with the box and the name (stack/egress/log.go).
//
// Sets are per policy, and boxes join one by their address (the pins keep
// a box to its own). A policy is named by its names (PolicyID), stored on
// the bridge (user.box.egress.<id> = the names); storing one is a user key
// of the bridge's, which Incus changes without restarting dnsmasq.
const (
	// KeyEgress on a box: the id of its policy; absent (or "") is open.
	// KeyEgressNames beside it: the policy's names, so the box carries its
	// allowlist to another host (export, import).
	KeyEgress      = "user.box.egress"
	KeyEgressNames = "user.box.egress_names"
	// keyEgressPolicy on the bridge, followed by a policy id: its names.
	KeyEgressPolicy = "user.box.egress."
	// EgressOpen is how an open box's policy is shown.
	EgressOpen = "open"
	// PolicyHeld is the policy a box is held closed under when the id it
	// names could name no policy (set by hand): it allows nothing.
	// PolicyID's ids are longer, so none is ever this one.
	PolicyHeld = "pheld"
)

// PolicyID names the policy of a normalised allowlist: the same names are
// the same policy, whichever box asks.
func PolicyID(names []string) string {
	sum := sha256.Sum256([]byte(strings.Join(names, "\n")))
	return "p" + hex.EncodeToString(sum[:])[:10]
}

// PoliciesOf reads the policies stored on the bridge's config.
func PoliciesOf(cfg map[string]string) map[string][]string {
	out := map[string][]string{}
	for k, v := range cfg {
		if id, ok := strings.CutPrefix(k, KeyEgressPolicy); ok && id != "" && !strings.Contains(id, ".") {
			out[id] = strings.Split(v, ",")
		}
	}
	return out
}

// DnsmasqServers are the upstream resolvers the bridge's dnsmasq settings
// pin (server= lines): the allowlisted boxes' resolver asks the same.
func DnsmasqServers(raw string) []netip.Addr {
	var out []netip.Addr
	for _, l := range strings.Split(raw, "\n") {
		v, ok := strings.CutPrefix(strings.TrimSpace(l), "server=")
		if !ok {
			continue
		}
		if a, err := netip.ParseAddr(v); err == nil {
			out = append(out, a)
		}
	}
	return out
}

// UnusedPolicyKeys names the stored policies a converge drops.
func UnusedPolicyKeys(live, want map[string]string) []string {
	var out []string
	for _, k := range slices.Sorted(maps.Keys(live)) {
		if _, ok := want[k]; !ok && strings.HasPrefix(k, KeyEgressPolicy) {
			out = append(out, k+" (no box names it)")
		}
	}
	return out
}
