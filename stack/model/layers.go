package model

// LayerID names one layer of the stack in findings, claims and reports.
// Every ID is in Layers; the package doc lists the same table and a test
// holds the two together, and both against docs/design.md, "The layer map".
type LayerID string

// One constant per layer. These and Layers are the only place an "L-..."
// is spelled in the stack's code.
const (
	LayerNAT        LayerID = "L-NAT"
	LayerDNS        LayerID = "L-DNS"
	LayerV6         LayerID = "L-V6"
	LayerACL        LayerID = "L-ACL"
	LayerHostFW     LayerID = "L-HOSTFW"
	LayerPortIso    LayerID = "L-PORTISO"
	LayerBridgeDrop LayerID = "L-BRIDGEDROP"
	LayerPin        LayerID = "L-PIN"
	LayerRoute      LayerID = "L-ROUTE"
	LayerDHCP       LayerID = "L-DHCP"
	LayerEgress     LayerID = "L-EGRESS"
	LayerGuard      LayerID = "L-GUARD"
	LayerFleet      LayerID = "L-FLEET"
	LayerTier       LayerID = "L-TIER"
	LayerStack      LayerID = "L-STACK"
)

// Layer is one layer of the stack and what holds it in place.
type Layer struct {
	ID   LayerID
	What string
}

// Layers is every layer the stack has, in the order of docs/design.md, "The layer map":
// the layers proper first, then the stack's own.
var Layers = []Layer{
	{LayerNAT, "bridge boxnet, ipv4.nat, a /24 nobody else claims"},
	{LayerDNS, "dns.mode=none, upstream resolvers pinned in dnsmasq"},
	{LayerV6, "ipv6.address=none, ipv6.nat=false"},
	{LayerACL, "network ACL box-isolate: private ranges dropped, ingress dropped"},
	{LayerHostFW, "nft table inet box: from boxnet only DNS, DHCP and replies"},
	{LayerPortIso, "security.port_isolation on the box-net profile's NIC"},
	{LayerBridgeDrop, "nft table bridge box: no frame between two boxnet ports"},
	{LayerPin, "nft table bridge box_pin: a port sends only its own MAC and addresses"},
	{LayerRoute, "nft table inet box_route: forwarded only out of the default routes' interfaces"},
	{LayerDHCP, "fixed addresses stored by box; dnsmasq answers them only; DHCP names the port's own MAC"},
	{LayerEgress, "allowlists: nft table inet box_egress and the resolver's names"},
	{LayerGuard, "eBPF on boxnet's tc ingress and the uplinks' egress: no nft flush removes it"},
	{LayerFleet, "the census: every instance and port on boxnet stays on the stack"},
	{LayerTier, "user projects granted through incus-user, restricted to boxnet"},
	{LayerStack, "the stack as a whole: the box-net profile beyond its NIC, legacy leftovers, a member not read"},
}
