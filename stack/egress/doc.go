// Package egress is box's egress service for allowlisted boxes (layer
// L-EGRESS): a resolver that answers only the names a box's allowlist
// holds (anything else is answered here, never forwarded, so no DNS
// tunnel leaves the host), and a transparent proxy that lets a box's TLS
// and HTTP connections through only to addresses those answers gave and
// only with an allowed name in SNI or Host. It runs in box's daemon, one
// service per network namespace, and knows the policies from a state file
// (State) that the stack rewrites on every refresh of its egress table:
// it talks to the rest of box through that file alone and imports no
// part of the stack that converges.
package egress
