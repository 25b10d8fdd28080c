package access

import (
	"fmt"
	"maps"

	"cmp"
	"context"
	"encoding/base64"
	"errors"
	"net/netip"
	"os"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/box-isolation/box/internal/accounts"
	"github.com/box-isolation/box/internal/converge"
	"github.com/box-isolation/box/stack"
	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/model"
)

// tierCertName is the trust store name incus-user gives uid's certificate.
func tierCertName(uid uint32) string { return fmt.Sprintf("incus-user-%d", uid) }

// tierConfig is old with the tier's settings applied ("" removes a key).
func tierConfig(old map[string]string, state, user string) map[string]string {
	cfg := maps.Clone(old)
	if cfg == nil {
		cfg = map[string]string{}
	}
	for k, v := range stack.TierSet {
		if v == "" {
			delete(cfg, k)
		} else {
			cfg[k] = v
		}
	}
	cfg[stack.KeyTier] = state
	cfg[stack.KeyTierUser] = user
	return cfg
}

// GrantRequest is a grant.
type GrantRequest struct {
	User  accounts.User
	Group string // the group incus-user serves; DefaultTierGroup if empty
}

// GrantResult is what a grant found and did.
type GrantResult struct {
	User    string   `json:"user"`
	UID     uint32   `json:"uid"`
	Project string   `json:"project"`
	Bridge  string   `json:"bridge"` // the private bridge incus-user would make (removed when it existed)
	Group   string   `json:"group"`
	Did     []string `json:"did"` // empty: it was already granted as it should be
	// RestartedIncusUser are the incus-user PIDs ended so a fresh one reads
	// the project list.
	RestartedIncusUser []int `json:"restarted_incus_user,omitempty"`
}

// Grant gives a local user boxes of their own: it converges their
// incus-user project to the tier, makes incus-user's state for them
// consistent, and adds them to the group last. A grant that fails backs
// out what it did, the group membership first.
func (m *Manager) Grant(ctx context.Context, req GrantRequest) (_ *GrantResult, err error) {
	host := m.host
	u := req.User
	if u.UID == 0 {
		return nil, errors.New("root needs no tier: it is an admin already")
	}
	group := cmp.Or(req.Group, host.Tier.Group, stack.DefaultTierGroup)
	gid, err := accounts.GroupGID(group)
	if err != nil {
		return nil, err
	}
	project, bridge := stack.TierProject(u.UID), stack.TierBridge(u.UID)
	res := &GrantResult{User: u.Name, UID: u.UID, Project: project, Bridge: bridge, Group: group, Did: []string{}}
	did := func(format string, args ...any) { res.Did = append(res.Did, fmt.Sprintf(format, args...)) }

	if _, _, err := stack.RequireStack(ctx, host.Incus); err != nil {
		return nil, fmt.Errorf("granting %s: %w", u.Name, err)
	}
	if err := stack.RequireWatcher(host.NetNS); err != nil {
		return nil, fmt.Errorf("granting %s: %w (a granted user's boxes join the bridge drop and the pins only through it; box setup-host installs box-guard-and-serve.service)", u.Name, err)
	}

	var back converge.Undos
	defer func() {
		if err == nil {
			return
		}
		if berr := back.Run(context.WithoutCancel(ctx)); berr != nil {
			err = fmt.Errorf("%w; %v (box revoke --purge %s removes what is left)", err, berr, u.Name)
		} else if len(back) > 0 {
			err = fmt.Errorf("%w (the grant was backed out: %s is as before)", err, u.Name)
		}
	}()

	// 1. The project, narrowed, and 2. its default profile cleared.
	created, err := m.narrowProject(ctx, u, &back, did)
	if err != nil {
		return nil, fmt.Errorf("granting %s: %w", u.Name, err)
	}

	// 3. The private bridge, deleted.
	if err := deletePrivateBridge(ctx, host.Incus, bridge, &back, did); err != nil {
		return nil, fmt.Errorf("granting %s: %w", u.Name, err)
	}

	// 4. The box-net profile in their project.
	d, err := m.desiredNow(ctx)
	if err != nil {
		return nil, fmt.Errorf("granting %s: %w", u.Name, err)
	}
	if err := installProfile(ctx, host.Incus.Project(project), project, d.Profile, &back, did); err != nil {
		return nil, fmt.Errorf("granting %s: %w", u.Name, err)
	}

	// 5. incus-user's state: the uid's certificate, trusted for the
	// project only, and no tombstone; incus-user restarted when it would
	// re-run its stock setup.
	if res.RestartedIncusUser, err = m.settleIncusUser(ctx, u, created, &back, did); err != nil {
		return nil, fmt.Errorf("granting %s: %w", u.Name, err)
	}

	// 6. The group, last: nobody holds a socket to an un-narrowed project.
	if err := joinGroup(u.Name, group, &back, did); err != nil {
		return nil, fmt.Errorf("granting %s: %w", u.Name, err)
	}

	// 7. Proof: as the user, through incus-user, the project is the tier's,
	// and incus-user did not run its stock setup on the way.
	if err := m.checkAsUser(ctx, u, gid); err != nil {
		return nil, fmt.Errorf("granting %s: %w", u.Name, err)
	}
	return res, nil
}

// narrowProject converges u's project to the tier (created narrowed, or
// its config narrowed) and clears its default profile. A project that
// exists (incus-user's stock setup made it) is refused when its instances
// use other networks, and has its default profile cleared before it is
// narrowed: Incus refuses to narrow a project whose default profile has a
// NIC on a network the narrowing forbids. It reports whether it created
// the project.
func (m *Manager) narrowProject(ctx context.Context, u accounts.User, back *converge.Undos, did func(string, ...any)) (bool, error) {
	host := m.host
	c := host.Incus
	project := stack.TierProject(u.UID)
	pc := c.Project(project)
	pool := host.Options.PoolName()
	p, etag, perr := c.Projects().Get(ctx, project)
	if perr == nil {
		if err := m.checkNoOtherNetworks(ctx, project); err != nil {
			return false, err
		}
		if err := clearDefaultProfile(ctx, pc, project, pool, back, did); err != nil {
			return false, err
		}
	}
	action, _, err := converge.Do(ctx, back, converge.Object[incus.Project]{
		What: "project " + project,
		Read: func(context.Context) (*incus.Project, string, error) { return p, etag, perr },
		Create: func(ctx context.Context) error {
			return c.Projects().Create(ctx, incus.Project{Name: project, Description: fmt.Sprintf("box tier for %s (uid %d)", u.Name, u.UID), Config: tierConfig(nil, stack.TierGranted, u.Name)})
		},
		Remove: func(ctx context.Context) error { return m.deleteProjectContents(ctx, project, true) },
		Differs: func(cur *incus.Project) []string {
			if maps.Equal(tierConfig(cur.Config, stack.TierGranted, u.Name), cur.Config) {
				return nil
			}
			return []string{"narrowed"}
		},
		Update: func(ctx context.Context, cur *incus.Project, etag string) error {
			np := *cur
			np.Config = tierConfig(cur.Config, stack.TierGranted, u.Name)
			return c.Projects().Update(ctx, project, np, etag)
		},
		Restore: func(ctx context.Context, old incus.Project) error { return c.Projects().Update(ctx, project, old, "") },
	})
	if err != nil {
		return false, err
	}
	switch action {
	case "created":
		did("created project %s, narrowed to %s", project, model.Current.Network)
	case "updated":
		did("narrowed project %s to %s", project, model.Current.Network)
	}
	if err := clearDefaultProfile(ctx, pc, project, pool, back, did); err != nil {
		return false, err
	}
	return action == "created", nil
}

// clearDefaultProfile leaves project's default profile (pc is a client of
// project) no NIC (the private bridge's goes) and no host id map, with a
// root disk on pool: a tier's boxes get their NIC from box's profile only.
func clearDefaultProfile(ctx context.Context, pc *incus.Client, project, pool string, back *converge.Undos, did func(string, ...any)) error {
	prof, petag, err := pc.Profile(ctx, "default")
	if err != nil {
		return err
	}
	np := *prof
	np.Devices = map[string]map[string]string{}
	for name, d := range prof.Devices {
		if d["type"] != "nic" {
			np.Devices[name] = d
		}
	}
	if _, ok := np.Devices["root"]; !ok {
		np.Devices["root"] = map[string]string{"type": "disk", "path": "/", "pool": pool}
	}
	// A copy: deleting from prof's own map would hide the change from the
	// comparison below and from the profile restored on a back-out.
	np.Config = maps.Clone(prof.Config)
	delete(np.Config, "raw.idmap")
	if !maps.EqualFunc(np.Devices, prof.Devices, maps.Equal) || !maps.Equal(np.Config, prof.Config) {
		old := *prof
		if err := pc.UpdateProfile(ctx, "default", np, petag); err != nil {
			return fmt.Errorf("clearing %s's default profile: %w", project, err)
		}
		back.Push("restoring "+project+"'s default profile", func(ctx context.Context) error { return pc.UpdateProfile(ctx, "default", old, "") })
		did("removed the NIC and host id map from %s's default profile", project)
	}
	return nil
}

// deletePrivateBridge deletes the private bridge incus-user's stock setup
// makes for a user (bridge), when it exists: a granted user's boxes live
// on boxnet only.
func deletePrivateBridge(ctx context.Context, c *incus.Client, bridge string, back *converge.Undos, did func(string, ...any)) error {
	n, _, err := c.Networks().Get(ctx, bridge)
	if incus.IsNotFound(err) {
		return nil
	} else if err != nil {
		return err
	}
	if err := c.Networks().Delete(ctx, bridge); err != nil {
		return fmt.Errorf("deleting the private bridge %s: %w", bridge, err)
	}
	old := incus.NetworksPost{Name: n.Name, Type: n.Type, Description: n.Description, Config: n.Config}
	back.Push("re-creating "+bridge, func(ctx context.Context) error { return c.Networks().Create(ctx, old) })
	did("deleted the private bridge %s", bridge)
	return nil
}

// installProfile converges box's profile (want) in project (pc is a client
// of project): the tier's boxes get the same NIC and root disk as root's.
func installProfile(ctx context.Context, pc *incus.Client, project string, want incus.Profile, back *converge.Undos, did func(string, ...any)) error {
	action, _, err := converge.Do(ctx, back, converge.Object[incus.Profile]{
		What: "profile " + model.Current.Profile + " in " + project,
		Read: func(ctx context.Context) (*incus.Profile, string, error) {
			return pc.Profile(ctx, model.Current.Profile)
		},
		Create:  func(ctx context.Context) error { return pc.CreateProfile(ctx, want) },
		Remove:  func(ctx context.Context) error { return pc.DeleteProfile(ctx, model.Current.Profile) },
		Differs: func(cur *incus.Profile) []string { return stack.ProfileDiff(cur, want) },
		Update: func(ctx context.Context, _ *incus.Profile, etag string) error {
			return pc.UpdateProfile(ctx, model.Current.Profile, want, etag)
		},
		Restore: func(ctx context.Context, old incus.Profile) error {
			return pc.UpdateProfile(ctx, model.Current.Profile, old, "")
		},
	})
	if err != nil {
		return err
	}
	switch action {
	case "created":
		did("installed profile %s in %s", model.Current.Profile, project)
	case "updated":
		did("reset profile %s in %s", model.Current.Profile, project)
	}
	return nil
}

// joinGroup adds user to group, the grant's last step: the group is the
// socket to incus-user, so nobody holds one before the project is narrowed.
func joinGroup(user, group string, back *converge.Undos, did func(string, ...any)) error {
	in, err := accounts.InGroup(user, group)
	if err != nil || in {
		return err
	}
	if err := accounts.AddToGroup(user, group); err != nil {
		return err
	}
	back.Push("removing "+user+" from group "+group, func(context.Context) error { return accounts.RemoveFromGroup(user, group) })
	did("added %s to group %s", user, group)
	return nil
}

// settleIncusUser converges incus-user's state for u and, when a running
// incus-user would otherwise re-run its stock setup for u, restarts it. It
// returns the PIDs it ended.
func (m *Manager) settleIncusUser(ctx context.Context, u accounts.User, created bool, back *converge.Undos, did func(string, ...any)) ([]int, error) {
	changedState, err := m.convergeUserState(ctx, u, back, did)
	if err != nil {
		return nil, err
	}
	if !created && !changedState {
		return nil, nil
	}
	// A running incus-user read the project list before the project
	// existed, or holds another certificate for the uid: it would re-run
	// its stock setup. (A project that existed was in its list already: it
	// made it, or a grant restarted it after making it.) The restart drops
	// the connections it proxies, every user's.
	return m.restartIncusUser(ctx)
}

// convergeUserState makes incus-user's state for u match the trust store:
// a certificate on disk, trusted for u's project only. It reports whether
// it changed anything.
func (m *Manager) convergeUserState(ctx context.Context, u accounts.User, back *converge.Undos, did func(string, ...any)) (bool, error) {
	host := m.host
	c := host.Incus
	changed := false
	if stack.Tombstoned(stack.ServerDir(host.Incus), u.UID) {
		st := stack.UserStatePath(stack.ServerDir(host.Incus), u.UID)
		if err := os.Remove(st); err != nil {
			return false, fmt.Errorf("removing the purge tombstone %s: %w", st, err)
		}
		back.Push("restoring the purge tombstone", func(context.Context) error { return m.writeTombstone(u.UID) })
		did("removed the purge tombstone of uid %d", u.UID)
		changed = true
	}
	cert, ok, err := m.readUserCert(u.UID)
	if err != nil {
		return false, err
	}
	if !ok {
		if cert, err = m.writeUserCert(u.UID, tierCertName(u.UID)); err != nil {
			return false, err
		}
		st := stack.UserStatePath(stack.ServerDir(host.Incus), u.UID)
		back.Push("removing "+st, func(context.Context) error { return os.RemoveAll(st) })
		did("made incus-user's client certificate for uid %d", u.UID)
		changed = true
	}
	certs, err := c.Certificates(ctx)
	if err != nil {
		return false, err
	}
	project := stack.TierProject(u.UID)
	for _, tc := range certs {
		if tc.Fingerprint == cert.Fingerprint {
			if tc.Restricted && slices.Equal(tc.Projects, []string{project}) {
				return changed, nil
			}
			return false, fmt.Errorf("uid %d's certificate %s is trusted beyond project %s (restricted=%v, projects %v): remove it with incus config trust remove %s, then grant again",
				u.UID, tc.Fingerprint[:12], project, tc.Restricted, tc.Projects, tc.Fingerprint[:12])
		}
	}
	err = c.AddCertificate(ctx, incus.Certificate{Name: tierCertName(u.UID), Type: "client", Restricted: true,
		Projects: []string{project}, Certificate: base64.StdEncoding.EncodeToString(cert.DER)})
	if err != nil {
		return false, err
	}
	back.Push("untrusting uid's certificate", func(ctx context.Context) error { return c.DeleteCertificate(ctx, cert.Fingerprint) })
	did("trusted uid %d's certificate for project %s only", u.UID, project)
	return true, nil
}

// checkNoOtherNetworks refuses a project whose instances use a network
// other than boxnet: narrowing it would strand them.
func (m *Manager) checkNoOtherNetworks(ctx context.Context, project string) error {
	host := m.host
	insts, err := host.Incus.Project(project).Instances().List(ctx, nil)
	if err != nil {
		return err
	}
	var off []string
	for _, in := range insts {
		for name, d := range in.ExpandedDevices {
			if d["type"] == "nic" && d["network"] != model.Current.Network {
				off = append(off, fmt.Sprintf("%s (NIC %s on %q)", in.Name, name, cmp.Or(d["network"], d["parent"])))
			}
		}
	}
	if len(off) > 0 {
		sort.Strings(off)
		return fmt.Errorf("project %s has instances on other networks: %s; the tier allows %s only: move or delete them (incus --project %s ...), then grant again",
			project, strings.Join(off, ", "), model.Current.Network, project)
	}
	return nil
}

// checkAsUser proves the grant from the user's side.
func (m *Manager) checkAsUser(ctx context.Context, u accounts.User, gid uint32) error {
	host := m.host
	project := stack.TierProject(u.UID)
	uc := host.AsUser(u, gid)
	cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	p, _, err := uc.Projects().Get(cctx, project)
	if incus.IsUnreachable(err) {
		return fmt.Errorf("no incus-user answers on %s (%v): enable it with systemctl enable --now incus-user.socket, then grant again", host.Tier.Socket(host.Incus), err)
	}
	if err != nil {
		return fmt.Errorf("checking the grant as %s through incus-user: %w", u.Name, err)
	}
	if probs := stack.TierConfigProblems(p.Config); len(probs) > 0 {
		return fmt.Errorf("as %s, project %s is not the tier's: %s", u.Name, project, strings.Join(probs, "; "))
	}
	if _, _, err := uc.Profile(cctx, model.Current.Profile); err != nil {
		return fmt.Errorf("as %s, profile %s is not reachable: %w", u.Name, model.Current.Profile, err)
	}
	// incus-user's stock setup, had it run, would have made the bridge.
	if _, _, err := host.Incus.Networks().Get(ctx, stack.TierBridge(u.UID)); err == nil {
		return fmt.Errorf("incus-user re-ran its stock setup for %s (the private bridge %s is back): restart incus-user and grant again", u.Name, stack.TierBridge(u.UID))
	} else if !incus.IsNotFound(err) {
		return err
	}
	return nil
}

// desiredNow is the desired stack for the bridge as it is.
func (m *Manager) desiredNow(ctx context.Context) (model.Desired, error) {
	host := m.host
	n, _, err := host.Incus.Networks().Get(ctx, model.Current.Network)
	if err != nil {
		return model.Desired{}, err
	}
	p, err := netip.ParsePrefix(n.Config["ipv4.address"])
	if err != nil {
		return model.Desired{}, fmt.Errorf("%s has ipv4.address=%q: run box doctor", model.Current.Network, n.Config["ipv4.address"])
	}
	opts, err := host.Options.With(n.Config)
	if err != nil {
		return model.Desired{}, err
	}
	return model.BuildDesired(p.Masked(), opts), nil
}
