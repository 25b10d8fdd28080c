package model

// DHCPLines are the bridge's dnsmasq settings for L-DHCP. dhcp-ignore=
// tag:!known ignores a client no dhcp-host names (Incus writes one for a
// NIC with ipv4.address, none otherwise); dhcp-ignore-clid identifies a
// client by its hardware address only: dnsmasq would otherwise key a lease
// on the client-identifier option, which a box sets to anything from its
// own MAC (nft cannot match it: the option sits anywhere in the message),
// and take any number of leases, or name a sibling's.
var DHCPLines = []string{"dhcp-ignore=tag:!known", "dhcp-ignore-clid"}
