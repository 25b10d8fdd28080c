// Package hostscan reads what a host really exposes, so the drill can aim
// its probes at it instead of at a guess: the sockets listening in a
// network namespace (Listeners), the neighbours it knows (Neighbours), the
// resolvers and search domains it uses (Resolvers), the DHCP servers it
// got leases from (DHCPServers), its hosts file (ReadHosts), its name
// (Hostname, FQDN) and the ports it forwards with destination NAT
// (Forwards).
//
// # Namespaces
//
// The kernel readers (Listeners, Neighbours, Forwards) read the network
// namespace of the calling OS thread, not the process's. To scan another
// namespace wrap the call in internal/nsrun.Do, which locks the goroutine
// to a thread moved into that namespace:
//
//	err := nsrun.Do(nsName, func() error {
//		ls, err = hostscan.Listeners()
//		return err
//	})
//
// That is why they read /proc/thread-self/net (never /proc/self/net or
// /proc/net, which show the main thread's namespace) and open their
// netlink sockets in the calling thread's namespace.
//
// Hostname reads the calling thread's UTS namespace. The file readers
// (Resolvers, DHCPServers) take a root directory instead ("" or "/" for
// the machine's own files) so they can read a container's root filesystem
// or test fixtures; symlinks under that root, absolute ones too, are
// followed inside it. ReadHosts takes the hosts file's path.
//
// # Parsers and readers
//
// Every reader is a thin wrapper around a pure parser that takes an
// io.Reader, []byte or already-decoded kernel objects (ParseProcNet,
// UsableNeighbours, ParseResolvConf, ParseDhclientLeases,
// ParseNetworkdLease, ParseHosts, FQDN, DecodeRule, SetPortRanges), so
// each format is unit-tested on fixture text in testdata.
//
// # What is not seen
//
// Forwards reads nftables only, iptables-nft's rules included; rules of
// legacy iptables are not read, and Forwarding.LegacyTables says when
// there are tables holding them, so a caller can say its forward list may
// be incomplete. A forward's conditions are its own rule's: those of the
// rules jumping to its chain are not followed. Listeners cannot tell an IPv6 wildcard socket that set
// IPV6_V6ONLY (so takes no IPv4) from one that did not, nor see a socket's
// SO_BINDTODEVICE.
//
// Nothing here sends a packet: everything is read from the kernel's own
// tables or from files.
package hostscan
