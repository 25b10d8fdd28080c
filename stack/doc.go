// Package stack is the single source of truth for box's isolated network
// and for how boxes live on it. It knows the desired state as data
// (Desired), converges a host to it (Ensure), compares a live host with it
// from ground truth (Verify), removes it (Teardown), moves boxes off the
// legacy generation (Migrate), and runs the box lifecycle behind the
// ownership boundary (Boxes). It knows nothing about probes: proving the
// isolation holds is the drill's job.
//
// The layers (docs/design.md, "The layer map"), each a LayerID that
// findings name (the table is Layers; a test holds this list to it):
//
//	L-NAT         bridge boxnet, ipv4.nat, a /24 nobody else claims
//	L-DNS         dns.mode=none, upstream resolvers pinned in dnsmasq
//	L-V6          ipv6.address=none, ipv6.nat=false
//	L-ACL         network ACL box-isolate: private ranges dropped, ingress dropped
//	L-HOSTFW      nft table inet box: from boxnet only DNS, DHCP and replies
//	L-PORTISO     security.port_isolation on the box-net profile's NIC
//	L-BRIDGEDROP  nft table bridge box: no frame between two boxnet ports
//	L-PIN         nft table bridge box_pin: a port sends only its own MAC and addresses
//	L-ROUTE       nft table inet box_route: forwarded only out of the default routes' interfaces
//	L-DHCP        fixed addresses stored by box; dnsmasq answers them only; DHCP names the port's own MAC
//	L-EGRESS      allowlists: nft table inet box_egress and the resolver's names
//	L-FLEET       the census: every instance and port on boxnet stays on the stack
//	L-TIER        user projects granted through incus-user, restricted to boxnet
//	L-STACK       the stack as a whole: the box-net profile beyond its NIC, legacy leftovers, a member not read
//
// Everything acts on a Host: an Incus client and the network namespace
// incusd lives in (the machine's own on a real host, the hermetic world's
// host namespace in tests).
package stack
