// Package model is the isolation stack as data and pure rules, with no
// I/O: the layers and their IDs, the two generations of the stack's
// objects, the operator's options, the desired state (Desired), the
// subnet choice, the cluster's address slices, the kernel keys a box must
// not carry, egress allowlist names, and the findings and changes the
// stack reports. Every package of box that talks about the stack speaks
// these types; this one imports nothing of box but the Incus client's
// types.
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
//	L-GUARD       eBPF on boxnet's tc ingress and the uplinks' egress: no nft flush removes it
//	L-FLEET       the census: every instance and port on boxnet stays on the stack
//	L-TIER        user projects granted through incus-user, restricted to boxnet
//	L-STACK       the stack as a whole: the box-net profile beyond its NIC, legacy leftovers, a member not read
package model
