package access

import (
	"fmt"
	"strings"

	"cmp"
	"context"
	"errors"
	"maps"
	"slices"
	"time"

	"github.com/box-isolation/box/internal/accounts"
	"github.com/box-isolation/box/stack"
	"github.com/box-isolation/box/stack/incus"
)

// RevokeResult is what a revoke found and did.
type RevokeResult struct {
	User    string   `json:"user"`
	UID     uint32   `json:"uid"`
	Project string   `json:"project"`
	Did     []string `json:"did"`
	// Held are the user's processes at the end of a plain revoke: they
	// keep the group, so the socket, until they end.
	Held []accounts.Process `json:"held,omitempty"`
	// Ended are the processes a purge ended.
	Ended  []accounts.Process `json:"ended,omitempty"`
	Purged bool               `json:"purged"`
}

// SessionsLeftError is a purge that could not end the user's processes;
// nothing was deleted.
type SessionsLeftError struct {
	User  string
	Procs []accounts.Process
}

func (e *SessionsLeftError) Error() string {
	var ps []string
	for _, p := range e.Procs {
		ps = append(ps, fmt.Sprintf("%d (%s)", p.PID, p.Command))
	}
	return fmt.Sprintf("%d processes of %s would not end: %s; the purge deleted nothing (their group membership is removed): end them, then run box revoke --purge %s again",
		len(e.Procs), e.User, strings.Join(ps, ", "), e.User)
}

// Revoke takes the tier away from u. Without purge the project and boxes
// stay (stamped revoked) and the processes u already runs keep the group,
// and so the socket, until they end. With purge those processes are ended
// first (refusing if any survive), then the project with every box, the
// private bridge and u's trusted certificate are deleted, and a tombstone
// keeps incus-user from setting the uid up again.
func (m *Manager) Revoke(ctx context.Context, u accounts.User, group string, purge bool) (*RevokeResult, error) {
	host := m.host
	if u.UID == 0 {
		return nil, errors.New("root has no tier to revoke")
	}
	group = cmp.Or(group, host.Tier.Group, stack.DefaultTierGroup)
	project := stack.TierProject(u.UID)
	res := &RevokeResult{User: u.Name, UID: u.UID, Project: project, Did: []string{}, Purged: purge}
	did := func(format string, args ...any) { res.Did = append(res.Did, fmt.Sprintf(format, args...)) }

	if in, err := accounts.InGroup(u.Name, group); err != nil {
		return nil, err
	} else if in {
		if err := accounts.RemoveFromGroup(u.Name, group); err != nil {
			return nil, fmt.Errorf("revoking %s: %w", u.Name, err)
		}
		did("removed %s from group %s", u.Name, group)
	}
	if purge {
		return m.purge(ctx, u, res, did)
	}
	if err := markRevoked(ctx, host.Incus, project, did); err != nil {
		return nil, fmt.Errorf("revoking %s: %w", u.Name, err)
	}
	held, err := accounts.Processes(u.UID)
	if err != nil {
		return nil, err
	}
	res.Held = held
	return res, nil
}

// markRevoked stamps project revoked, when it exists: a plain revoke keeps
// the project and its boxes, and box doctor lists the project as revoked.
func markRevoked(ctx context.Context, c *incus.Client, project string, did func(string, ...any)) error {
	p, etag, err := c.Projects().Get(ctx, project)
	if incus.IsNotFound(err) {
		return nil
	} else if err != nil {
		return err
	}
	if p.Config[stack.KeyTier] == stack.TierRevoked {
		return nil
	}
	np := *p
	np.Config = maps.Clone(p.Config)
	np.Config[stack.KeyTier] = stack.TierRevoked
	if err := c.Projects().Update(ctx, project, np, etag); err != nil {
		return err
	}
	did("marked project %s revoked (its boxes are kept)", project)
	return nil
}

// purge is Revoke's purge, once u is out of the group: u's processes
// ended (res is returned with a SessionsLeftError, and nothing deleted,
// when any survive), the tombstone written, then everything of the tier
// deleted and checked gone.
func (m *Manager) purge(ctx context.Context, u accounts.User, res *RevokeResult, did func(string, ...any)) (*RevokeResult, error) {
	host := m.host
	// What runs now is what the purge ends (EndSessions says only what
	// survived).
	running, err := accounts.Processes(u.UID)
	if err != nil {
		return nil, fmt.Errorf("purging %s: %w", u.Name, err)
	}
	left, err := accounts.EndSessions(u, 5*time.Second)
	if err != nil {
		return nil, fmt.Errorf("purging %s: %w", u.Name, err)
	}
	if len(left) > 0 {
		return res, &SessionsLeftError{User: u.Name, Procs: left}
	}
	res.Ended = running
	did("ended every process of %s", u.Name)
	// The tombstone before anything is deleted, and incus-user restarted
	// so no connection it proxies outlives the purge.
	if err := m.writeTombstone(u.UID); err != nil {
		return nil, fmt.Errorf("purging %s: %w", u.Name, err)
	}
	if _, err := m.restartIncusUser(ctx); err != nil {
		return nil, fmt.Errorf("purging %s: %w", u.Name, err)
	}
	did("replaced incus-user's state for uid %d with a tombstone", u.UID)

	if err := m.deleteTier(ctx, u, did); err != nil {
		return nil, err
	}
	// Their boxes' ports are gone from the bridge: out of the set and the
	// pins with them.
	if _, err := host.RefreshPorts(ctx); err != nil {
		return nil, fmt.Errorf("purging %s: refreshing the bridge ports: %w", u.Name, err)
	}
	// What must be gone is checked, not assumed.
	if err := m.checkPurged(ctx, u.UID); err != nil {
		return nil, fmt.Errorf("purging %s: %w", u.Name, err)
	}
	return res, nil
}

// deleteTier deletes what Incus holds of u's tier: the certificates
// trusted for it, the project with every box, and the private bridge.
// checkPurged is its proof.
func (m *Manager) deleteTier(ctx context.Context, u accounts.User, did func(string, ...any)) error {
	c := m.host.Incus
	project := stack.TierProject(u.UID)
	certs, err := c.Certificates(ctx)
	if err != nil {
		return err
	}
	for _, tc := range certs {
		if tc.Name == tierCertName(u.UID) || slices.Contains(tc.Projects, project) {
			if err := c.DeleteCertificate(ctx, tc.Fingerprint); err != nil {
				return fmt.Errorf("purging %s: %w", u.Name, err)
			}
			did("removed trusted certificate %s (%s)", tc.Name, tc.Fingerprint[:12])
		}
	}
	if _, _, err := c.Projects().Get(ctx, project); err == nil {
		if err := m.deleteProjectContents(ctx, project, true); err != nil {
			return fmt.Errorf("purging %s: %w", u.Name, err)
		}
		did("deleted project %s with its boxes", project)
	} else if !incus.IsNotFound(err) {
		return err
	}
	if _, _, err := c.Networks().Get(ctx, stack.TierBridge(u.UID)); err == nil {
		if err := c.Networks().Delete(ctx, stack.TierBridge(u.UID)); err != nil {
			return fmt.Errorf("purging %s: %w", u.Name, err)
		}
		did("deleted the private bridge %s", stack.TierBridge(u.UID))
	}
	return nil
}

// checkPurged asserts nothing of uid's tier is left in Incus.
func (m *Manager) checkPurged(ctx context.Context, uid uint32) error {
	host := m.host
	c := host.Incus
	project := stack.TierProject(uid)
	var left []string
	if _, _, err := c.Projects().Get(ctx, project); err == nil {
		left = append(left, "project "+project)
	}
	if _, _, err := c.Networks().Get(ctx, stack.TierBridge(uid)); err == nil {
		left = append(left, "network "+stack.TierBridge(uid))
	}
	certs, err := c.Certificates(ctx)
	if err != nil {
		return err
	}
	for _, tc := range certs {
		if tc.Name == tierCertName(uid) || slices.Contains(tc.Projects, project) {
			left = append(left, "trusted certificate "+tc.Name)
		}
	}
	if len(left) > 0 {
		return fmt.Errorf("still present after the purge: %s", strings.Join(left, ", "))
	}
	return nil
}

// deleteProjectContents deletes every instance, profile but default,
// custom volume and image in project, then (with self) the project.
func (m *Manager) deleteProjectContents(ctx context.Context, project string, self bool) error {
	host := m.host
	pc := host.Incus.Project(project)
	insts, err := pc.Instances().List(ctx, nil)
	if err != nil {
		return err
	}
	for _, in := range insts {
		if err := stack.RemoveInstance(ctx, pc, in.Name); err != nil {
			return fmt.Errorf("deleting %s in %s: %w", in.Name, project, err)
		}
	}
	profs, err := pc.Profiles(ctx)
	if err != nil {
		return err
	}
	for _, p := range profs {
		if p.Name != "default" {
			if err := pc.DeleteProfile(ctx, p.Name); err != nil {
				return err
			}
		}
	}
	if err := m.deleteProjectVolumes(ctx, project); err != nil {
		return err
	}
	if !self {
		return nil
	}
	return host.Incus.Projects().Delete(ctx, project)
}

// deleteProjectVolumes deletes the custom volumes of project in every pool.
func (m *Manager) deleteProjectVolumes(ctx context.Context, project string) error {
	host := m.host
	pools, err := host.Incus.Storage().Pools(ctx)
	if err != nil {
		return err
	}
	pc := host.Incus.Project(project)
	for _, pool := range pools {
		vols, err := pc.Storage().CustomVolumes(ctx, pool.Name)
		if err != nil {
			return err
		}
		for _, v := range vols {
			if err := pc.Storage().DeleteCustomVolume(ctx, pool.Name, v.Name); err != nil {
				return err
			}
		}
	}
	return nil
}
