// Package access grants and revokes access tiers (docs/tiers.md): a local
// user in incus-user's group gets their own Incus project, narrowed to
// boxnet and only boxnet, with box's profile in it, so their boxes are
// isolated like root's; revoking takes that back and, with --purge,
// removes the user's project, boxes and bridge. What a tier looks like on
// a host, and how Verify judges it (layer L-TIER), is package stack's
// (Tiers); this package changes it.
package access

import "github.com/box-isolation/box/stack"

// Manager grants and revokes access tiers on a host: root acting through
// the host's Incus, never a granted user.
type Manager struct {
	host *stack.Host
}

// NewManager is the tier manager of host.
func NewManager(host *stack.Host) *Manager { return &Manager{host: host} }
