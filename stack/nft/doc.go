// Package nft keeps box's nftables tables, written as code through
// github.com/google/nftables (netlink; no nft subprocess), in a chosen
// network namespace.
//
// # The two tables
//
// L-HOSTFW, table inet box, chain input (hook input, priority filter,
// policy accept): for packets arriving on the bridge (iifname "boxnet") it
// accepts replies (ct direction reply, ct state established,related: a
// flow the box began is never let on for being established), DNS (udp
// and tcp 53) and DHCP (udp 67) to the gateway, what the egress table hands to box's
// resolver and proxy, and drops everything else. It is the layer that protects
// every host address, the public ones included (the Incus ACL only drops
// private ranges). Matching on iifname keeps it from touching any traffic
// that does not come from the bridge.
//
// L-BRIDGEDROP, table bridge box, chain forward (hook forward, priority
// filter, policy accept): drops every frame forwarded between two ports of
// the bridge, whatever its ethertype (ARP, IPv4, IPv6). Two ports on one
// bridge exchange frames below the L3 hooks, so nothing in the inet family
// can see box-to-box traffic; only the bridge family can.
//
// # The pin table
//
// C-SPOOF, table bridge box_pin, chain prerouting (hook prerouting,
// priority filter, policy accept): pins each port of the bridge to its
// identity. A frame from a port must carry the port's MAC (from the Incus
// config, which the box cannot change); its ARP must name that MAC and one
// of the port's IPv4 addresses (the fixed address box stored for its NIC),
// or 0.0.0.0 for an ARP probe; its IPv4 must come from one of those, or be
// a DHCP request from 0.0.0.0. A DHCP message (UDP to port 67, L-DHCP)
// must come whole and name the port's own MAC as an Ethernet address in
// its payload (htype 1, hlen 6, chaddr): dnsmasq keys leases on the
// payload, not the frame, and takes a release or decline naming a client
// from anyone. 802.1Q-tagged frames are dropped (a priority tag
// would carry a forged ARP past the ARP rules). The sets are keyed by port
// name, so a port with no pin has every frame dropped, and an address
// change is a set update in one transaction (SetPins), never a flush. It is a
// table of its own, with its own port set, so that it can be removed
// without the bridge drop (the drill's pinning mutation does).
//
// It hooks prerouting, not forward: a box poisoning the host's neighbour
// table, or sending to the host with a forged source, sends frames to the
// host itself, which are never forwarded; every frame from a port passes
// prerouting, whichever way it goes next. It is done here rather than with
// Incus's security.ipv4_filtering: measured upstream, it breaks Docker
// inside the box, and it was rejected for that (docs/design.md, "The layer map").
//
// # The egress table
//
// L-EGRESS, table inet box_egress (egress.go), while an allowlist exists:
// its boxes' DNS to the gateway goes by destination NAT to box's resolver
// on EgressDNSAddr (chain dns, priority dstnat), their TCP 80 and 443 by
// TPROXY to box's proxy, marked EgressMark (chain names, priority mangle;
// dropped when no proxy takes them), and every other new connection they
// forward only to their policy's allow set, never to UDP 443, port 853 or
// a public resolver (chain forward). The input chain of table inet box
// accepts the two handed-over kinds (a DNATed question to the resolver's
// address, a marked packet) and nothing else new. The resolver fills the
// allow sets (EgressAllower); Apply never touches their elements.
//
// # Capability probe and fallback
//
// The natural rule is "meta ibrname boxnet meta obrname boxnet drop", but
// those meta keys need CONFIG_NFT_BRIDGE_META, which some kernels lack
// (adding the rule fails with "operation not supported"). Probe finds out by
// adding the rule in a throwaway table and deleting that table in the same
// netlink batch, so nothing is ever committed. Without the keys the drop is
// scoped by a named set instead:
//
//	set boxnet_ports { type ifname }
//	iifname @boxnet_ports oifname @boxnet_ports drop
//
// Apply and SetPorts (SyncPorts) fill the set with the bridge's current ports (the
// caller reads them from netlink: the stack does, by the bridge's master
// index). Incus names host-side veths at random and renames them on every
// start, so the set has to be refreshed whenever a box starts (the stack
// does after its own commands, and its port watcher on the kernel's link
// events); Verify reports a stale set. The pin table is scoped the same
// way, by its own set (ApplyPins and SetPins), and its pins name the same
// ports: until they are refreshed, a new port is neither in the set nor
// pinned, and a box's new address is cut off (VerifyPins names both). A drop
// with no scope to the bridge is never
// produced: it would cut every other bridge on the host (Docker's among
// them).
//
// # Convergence
//
// Desired is the whole desired state as data; Ruleset.String renders it as
// `nft list` would. Apply reads the live tables, compares every rule in a
// canonical form of its decoded expressions, and writes only what differs,
// in one batch, so a failure leaves the previous state. It touches only its
// own two tables, never the rest of the ruleset. Verify runs the same
// comparison and reports findings instead of fixing them.
//
// # Tests
//
// Unit tests need nothing: go test ./stack/nft/
//
// The privileged tier (TestPrivileged*) builds throwaway network namespaces
// named boxnft-*, with two bridges and up to four "boxes" that send forged
// frames, and needs root:
//
//	sudo go test ./stack/nft/ -run Privileged -v
package nft
