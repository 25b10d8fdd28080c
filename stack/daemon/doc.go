// Package daemon is box's long-running service on a host, what the boot
// unit runs: the port watcher (every port of the bridge isolated, in the
// bridge drop's port set and pinned as boxes come and go on their own),
// the healer (box's nft tables and Incus's put back after another tool's
// flush), the route watcher (L-ROUTE's uplinks follow the routes) and the
// egress service for allowlisted boxes (package egress). It decides
// nothing the stack does not: every refresh and repair is a call into
// package stack, made on the kernel's events.
package daemon
