// Package hostns is box's plumbing in the network namespace incusd runs
// in: netlink opened there (NS), the bridge's ports and their isolated
// flag, addresses and routes as the kernel has them, the dnsmasq process
// that serves the bridge, the egress service's address, rule and route,
// and the flock files under /run that serialise box's commands and mark
// its long-running daemon and teardowns (RunDir). It decides nothing:
// stack and the daemon decide what to do with what it reads.
package hostns
