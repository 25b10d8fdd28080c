package stack

import (
	"cmp"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/box-isolation/box/internal/accounts"
	"github.com/box-isolation/box/internal/ascred"
	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/model"
)

// Access tiers (docs/tiers.md). A granted user talks to Incus through
// incus-user, which maps their uid to the project user-<uid>; box narrows
// that project to boxnet and only boxnet. The nft bridge drop and the pins
// are host layers the user cannot touch, so they hold for a granted
// user's boxes even where the user may edit their own profiles.
const (
	// DefaultTierGroup is the group Debian's incus-user.socket serves.
	DefaultTierGroup = "incus"
	// KeyTier on a user project: TierGranted or TierRevoked.
	KeyTier     = "user.box.tier"
	KeyTierUser = "user.box.tier.user"
	TierGranted = "granted"
	TierRevoked = "revoked"
)

// TierProject is the project incus-user gives uid.
func TierProject(uid uint32) string { return fmt.Sprintf("user-%d", uid) }

// TierBridge is the private bridge incus-user's stock setup makes for uid:
// incusbr-<uid>, or user-<uid> where that passes the kernel's 15
// characters of an interface name (uids of 8 digits and more, as LDAP and
// SSSD hand out). incus-user applies that rule since Incus 6.0.2 and 6.3
// (cmd/incus-user/server.go, serverSetupUser); before, its setup failed
// for such a uid and made no bridge at all, so one name per uid is exact.
func TierBridge(uid uint32) string {
	if name := fmt.Sprintf("incusbr-%d", uid); len(name) <= maxIfaceName {
		return name
	}
	return fmt.Sprintf("user-%d", uid)
}

// maxIfaceName is the longest interface name the kernel takes (IFNAMSIZ
// less its NUL).
const maxIfaceName = 15

// tierCertName is the trust store name incus-user gives uid's certificate.
func tierCertName(uid uint32) string { return fmt.Sprintf("incus-user-%d", uid) }

var tierProjectRE = regexp.MustCompile(`^user-([0-9]+)$`)

// tierSet is what a granted project's config must say: boxnet only, no
// host paths, no proxies, unprivileged, snapshots and backups allowed, and
// the host's images (features.images off) so box's images are reachable.
var tierSet = map[string]string{
	"features.images":                          "false",
	"features.networks":                        "false",
	"features.profiles":                        "true",
	"restricted":                               "true",
	"restricted.networks.access":               model.Current.Network,
	"restricted.devices.nic":                   "managed",
	"restricted.devices.disk":                  "managed",
	"restricted.devices.proxy":                 "block",
	"restricted.devices.gpu":                   "block",
	"restricted.devices.usb":                   "block",
	"restricted.devices.pci":                   "block",
	"restricted.devices.unix-char":             "block",
	"restricted.devices.unix-block":            "block",
	"restricted.devices.unix-hotplug":          "block",
	"restricted.devices.infiniband":            "block",
	"restricted.containers.privilege":          "unprivileged",
	"restricted.containers.nesting":            "allow", // in-box Docker; the census says why it is allowed
	"restricted.containers.lowlevel":           "block",
	"restricted.virtual-machines.lowlevel":     "block",
	"restricted.cluster.target":                "block",
	"restricted.snapshots":                     "allow",
	"restricted.backups":                       "allow",
	"restricted.containers.interception":       "block",
	"restricted.devices.disk.paths":            "",
	"restricted.idmap.uid":                     "",
	"restricted.idmap.gid":                     "",
	"restricted.networks.uplinks":              "",
	"restricted.networks.subnets":              "",
	"restricted.virtual-machines.raw.qemu":     "",
	"restricted.containers.raw.lxc":            "",
	"restricted.virtual-machines.raw.apparmor": "",
}

// tierConfig is old with the tier's settings applied ("" removes a key).
func tierConfig(old map[string]string, state, user string) map[string]string {
	cfg := maps.Clone(old)
	if cfg == nil {
		cfg = map[string]string{}
	}
	for k, v := range tierSet {
		if v == "" {
			delete(cfg, k)
		} else {
			cfg[k] = v
		}
	}
	cfg[KeyTier] = state
	cfg[KeyTierUser] = user
	return cfg
}

// tierConfigProblems lists how a project's config differs from the tier's.
func tierConfigProblems(cfg map[string]string) []string {
	var out []string
	for _, k := range slices.Sorted(maps.Keys(tierSet)) {
		want := tierSet[k]
		got, ok := cfg[k]
		switch {
		case want == "" && ok:
			out = append(out, fmt.Sprintf("%s is set (%q)", k, got))
		case want != "" && got != want:
			// An unset restriction under restricted=true is Incus's
			// default, which is the tier's value for the blocks.
			if !ok && restrictedDefault(k) == want {
				continue
			}
			out = append(out, fmt.Sprintf("%s is %q, want %q", k, got, want))
		}
	}
	return out
}

// restrictedDefault is Incus's value for an unset restriction under
// restricted=true (the ones the tier relies on).
func restrictedDefault(k string) string {
	switch k {
	case "restricted.devices.nic", "restricted.devices.disk":
		return "managed"
	case "restricted.containers.privilege":
		return "unprivileged"
	case "restricted.devices.proxy", "restricted.devices.gpu", "restricted.devices.usb", "restricted.devices.pci",
		"restricted.devices.unix-char", "restricted.devices.unix-block", "restricted.devices.unix-hotplug",
		"restricted.devices.infiniband", "restricted.containers.lowlevel", "restricted.virtual-machines.lowlevel",
		"restricted.cluster.target", "restricted.containers.nesting", "restricted.containers.interception",
		"restricted.snapshots", "restricted.backups":
		return "block"
	}
	return ""
}

// Tier is one user project as doctor lists it.
type Tier struct {
	User    string `json:"user,omitempty"` // "" when the uid has no account
	UID     uint32 `json:"uid"`
	Project string `json:"project"`
	// State: granted, revoked, stock (made by incus-user, never narrowed),
	// or purged (only box's tombstone is left).
	State    string          `json:"state"`
	InGroup  bool            `json:"in_group"`
	Boxes    int             `json:"boxes"`
	Findings []model.Finding `json:"findings,omitempty"`
}

// Tier states beyond KeyTier's.
const (
	TierStock  = "stock"
	TierPurged = "purged"
)

// Tiers lists every user project on the host, and every purged uid,
// judged against the tier. group is the group incus-user serves.
func (host *Host) Tiers(ctx context.Context, group string) ([]Tier, error) {
	projects, err := host.Incus.Projects(ctx)
	if err != nil {
		return nil, err
	}
	nets, err := host.Incus.Networks(ctx)
	if err != nil {
		return nil, err
	}
	netNames := map[string]bool{}
	for _, n := range nets {
		netNames[n.Name] = true
	}
	members, _ := accounts.Members(cmp.Or(group, DefaultTierGroup))
	out := []Tier{}
	seen := map[uint32]bool{}
	for _, p := range projects {
		m := tierProjectRE.FindStringSubmatch(p.Name)
		if m == nil {
			continue
		}
		uid64, err := strconv.ParseUint(m[1], 10, 32)
		if err != nil {
			continue
		}
		uid := uint32(uid64)
		seen[uid] = true
		t := Tier{UID: uid, Project: p.Name, State: p.Config[KeyTier], User: p.Config[KeyTierUser]}
		if u, err := accounts.Lookup(strconv.FormatUint(uid64, 10)); err == nil {
			t.User = u.Name
		}
		t.InGroup = t.User != "" && slices.Contains(members, t.User)
		insts, err := host.Incus.Project(p.Name).Instances(ctx, nil)
		if err != nil {
			return nil, err
		}
		for i := range insts {
			if _, ok := isBox(&insts[i]); ok {
				t.Boxes++
			}
		}
		who := cmp.Or(t.User, "UID")
		switch t.State {
		case TierGranted, TierRevoked:
			prof, _, err := host.Incus.Project(p.Name).Profile(ctx, "default")
			if err != nil {
				return nil, err
			}
			bridge := ""
			if netNames[TierBridge(uid)] {
				bridge = TierBridge(uid)
			}
			for _, prob := range tierProblems(p.Config, prof, bridge) {
				t.Findings = append(t.Findings, model.Finding{Layer: model.LayerTier, Object: "project " + p.Name, Problem: prob, Fix: "box grant " + who})
			}
		default:
			t.State = TierStock
			fix := fmt.Sprintf("box grant %s (narrows it to %s), or box revoke --purge %s", who, model.Current.Network, who)
			if uid == 0 {
				// Root is an admin and gets no tier: the project is a leftover
				// of root touching incus-user's socket.
				fix = fmt.Sprintf("delete it: incus delete --project %s --force <each instance>; incus profile device remove default eth0 --project %s; incus project delete %s; incus network delete %s",
					p.Name, p.Name, p.Name, TierBridge(uid))
			}
			t.Findings = append(t.Findings, model.Finding{Layer: model.LayerTier, Object: "project " + p.Name,
				Problem: "incus-user set it up with its stock defaults and box never narrowed it (" + stockSummary(uid, p.Config, netNames[TierBridge(uid)]) + ")",
				Fix:     fix})
		}
		out = append(out, t)
	}
	// Tombstones of purged uids whose project is gone.
	if ents, err := os.ReadDir(filepath.Dir(host.userState(0))); err == nil {
		for _, e := range ents {
			uid64, err := strconv.ParseUint(e.Name(), 10, 32)
			if err != nil || seen[uint32(uid64)] || !host.tombstoned(uint32(uid64)) {
				continue
			}
			t := Tier{UID: uint32(uid64), Project: TierProject(uint32(uid64)), State: TierPurged}
			if u, err := accounts.Lookup(e.Name()); err == nil {
				t.User = u.Name
				t.InGroup = slices.Contains(members, u.Name)
			}
			out = append(out, t)
		}
	}
	sort.Slice(out, func(a, b int) bool { return out[a].UID < out[b].UID })
	return out, nil
}

// stockSummary says what makes an un-narrowed project dangerous.
func stockSummary(uid uint32, cfg map[string]string, bridge bool) string {
	var parts []string
	if bridge {
		parts = append(parts, "private NAT bridge "+TierBridge(uid)+" with IPv6")
	}
	if a := cfg["restricted.networks.access"]; a != model.Current.Network {
		parts = append(parts, fmt.Sprintf("networks %q", a))
	}
	if p := cfg["restricted.devices.disk.paths"]; p != "" {
		parts = append(parts, "host path "+p+" attachable")
	}
	if len(parts) == 0 {
		return "not stamped " + KeyTier
	}
	return strings.Join(parts, ", ")
}

// tierProblems lists how a granted project differs from the tier: its
// config, a NIC in its default profile, the private bridge.
func tierProblems(cfg map[string]string, defaultProfile *incus.Profile, bridge string) []string {
	probs := tierConfigProblems(cfg)
	if defaultProfile != nil {
		for _, name := range slices.Sorted(maps.Keys(defaultProfile.Devices)) {
			if d := defaultProfile.Devices[name]; d["type"] == "nic" {
				probs = append(probs, fmt.Sprintf("its default profile has NIC %s (network %q)", name, d["network"]))
			}
		}
	}
	if bridge != "" {
		probs = append(probs, "the private bridge "+bridge+" exists")
	}
	return probs
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
func (host *Host) Grant(ctx context.Context, req GrantRequest) (_ *GrantResult, err error) {
	u := req.User
	if u.UID == 0 {
		return nil, errors.New("root needs no tier: it is an admin already")
	}
	group := cmp.Or(req.Group, host.TierGroup, DefaultTierGroup)
	gid, err := accounts.GroupGID(group)
	if err != nil {
		return nil, err
	}
	project, bridge := TierProject(u.UID), TierBridge(u.UID)
	res := &GrantResult{User: u.Name, UID: u.UID, Project: project, Bridge: bridge, Group: group, Did: []string{}}
	did := func(format string, args ...any) { res.Did = append(res.Did, fmt.Sprintf(format, args...)) }

	if _, err := host.requireStack(ctx); err != nil {
		return nil, fmt.Errorf("granting %s: %w", u.Name, err)
	}
	if err := host.requireWatcher(); err != nil {
		return nil, fmt.Errorf("granting %s: %w (a granted user's boxes join the bridge drop and the pins only through it; box setup-host installs box-ports.service)", u.Name, err)
	}

	var back undoStack
	defer func() {
		if err == nil {
			return
		}
		if berr := back.run(context.WithoutCancel(ctx)); berr != nil {
			err = fmt.Errorf("%w; %v (box revoke --purge %s removes what is left)", err, berr, u.Name)
		} else if len(back) > 0 {
			err = fmt.Errorf("%w (the grant was backed out: %s is as before)", err, u.Name)
		}
	}()
	c := host.Incus
	pc := c.Project(project)

	// 2. Its default profile: no NIC (the private bridge's goes), no host
	// id map. Cleared before the project is narrowed when incus-user's
	// stock setup made it: Incus refuses to narrow a project whose default
	// profile has a NIC on a network the narrowing forbids.
	clearProfile := func() error {
		prof, petag, err := pc.Profile(ctx, "default")
		if err != nil {
			return fmt.Errorf("granting %s: %w", u.Name, err)
		}
		np := *prof
		np.Devices = map[string]map[string]string{}
		for name, d := range prof.Devices {
			if d["type"] != "nic" {
				np.Devices[name] = d
			}
		}
		if _, ok := np.Devices["root"]; !ok {
			np.Devices["root"] = map[string]string{"type": "disk", "path": "/", "pool": host.pool()}
		}
		// A copy: deleting from prof's own map would hide the change from the
		// comparison below and from the profile restored on a back-out.
		np.Config = maps.Clone(prof.Config)
		delete(np.Config, "raw.idmap")
		if !maps.EqualFunc(np.Devices, prof.Devices, maps.Equal) || !maps.Equal(np.Config, prof.Config) {
			old := *prof
			if err := pc.UpdateProfile(ctx, "default", np, petag); err != nil {
				return fmt.Errorf("granting %s: clearing %s's default profile: %w", u.Name, project, err)
			}
			back.push("restoring "+project+"'s default profile", func(ctx context.Context) error { return pc.UpdateProfile(ctx, "default", old, "") })
			did("removed the NIC and host id map from %s's default profile", project)
		}
		return nil
	}

	// 1. The project, narrowed.
	p, etag, perr := c.GetProject(ctx, project)
	if perr == nil {
		if err := host.checkNoOtherNetworks(ctx, project); err != nil {
			return nil, fmt.Errorf("granting %s: %w", u.Name, err)
		}
		if err := clearProfile(); err != nil {
			return nil, err
		}
	}
	action, _, err := converge(ctx, &back, incusObject[incus.Project]{
		what: "project " + project,
		read: func(context.Context) (*incus.Project, string, error) { return p, etag, perr },
		create: func(ctx context.Context) error {
			return c.CreateProject(ctx, incus.Project{Name: project, Description: fmt.Sprintf("box tier for %s (uid %d)", u.Name, u.UID), Config: tierConfig(nil, TierGranted, u.Name)})
		},
		remove: func(ctx context.Context) error { return host.deleteProjectContents(ctx, project, true) },
		differs: func(cur *incus.Project) []string {
			if maps.Equal(tierConfig(cur.Config, TierGranted, u.Name), cur.Config) {
				return nil
			}
			return []string{"narrowed"}
		},
		update: func(ctx context.Context, cur *incus.Project, etag string) error {
			np := *cur
			np.Config = tierConfig(cur.Config, TierGranted, u.Name)
			return c.UpdateProject(ctx, project, np, etag)
		},
		restore: func(ctx context.Context, old incus.Project) error { return c.UpdateProject(ctx, project, old, "") },
	})
	if err != nil {
		return nil, fmt.Errorf("granting %s: %w", u.Name, err)
	}
	created := action == "created"
	switch action {
	case "created":
		did("created project %s, narrowed to %s", project, model.Current.Network)
	case "updated":
		did("narrowed project %s to %s", project, model.Current.Network)
	}

	if err := clearProfile(); err != nil {
		return nil, err
	}

	// 3. The private bridge, deleted.
	if n, _, err := c.Network(ctx, bridge); err == nil {
		if err := c.DeleteNetwork(ctx, bridge); err != nil {
			return nil, fmt.Errorf("granting %s: deleting the private bridge %s: %w", u.Name, bridge, err)
		}
		old := incus.NetworksPost{Name: n.Name, Type: n.Type, Description: n.Description, Config: n.Config}
		back.push("re-creating "+bridge, func(ctx context.Context) error { return c.CreateNetwork(ctx, old) })
		did("deleted the private bridge %s", bridge)
	} else if !incus.IsNotFound(err) {
		return nil, fmt.Errorf("granting %s: %w", u.Name, err)
	}

	// 4. The box-net profile in their project.
	d, err := host.desiredNow(ctx)
	if err != nil {
		return nil, fmt.Errorf("granting %s: %w", u.Name, err)
	}
	action, _, err = converge(ctx, &back, incusObject[incus.Profile]{
		what: "profile " + model.Current.Profile + " in " + project,
		read: func(ctx context.Context) (*incus.Profile, string, error) {
			return pc.Profile(ctx, model.Current.Profile)
		},
		create:  func(ctx context.Context) error { return pc.CreateProfile(ctx, d.Profile) },
		remove:  func(ctx context.Context) error { return pc.DeleteProfile(ctx, model.Current.Profile) },
		differs: func(cur *incus.Profile) []string { return profileDiff(cur, d.Profile) },
		update: func(ctx context.Context, _ *incus.Profile, etag string) error {
			return pc.UpdateProfile(ctx, model.Current.Profile, d.Profile, etag)
		},
		restore: func(ctx context.Context, old incus.Profile) error {
			return pc.UpdateProfile(ctx, model.Current.Profile, old, "")
		},
	})
	if err != nil {
		return nil, fmt.Errorf("granting %s: %w", u.Name, err)
	}
	switch action {
	case "created":
		did("installed profile %s in %s", model.Current.Profile, project)
	case "updated":
		did("reset profile %s in %s", model.Current.Profile, project)
	}

	// 5. incus-user's state: the uid's certificate, trusted for the
	// project only, and no tombstone.
	changedState, err := host.convergeUserState(ctx, u, &back, did)
	if err != nil {
		return nil, fmt.Errorf("granting %s: %w", u.Name, err)
	}
	if created || changedState {
		// A running incus-user read the project list before the project
		// existed, or holds another certificate for the uid: it would
		// re-run its stock setup. (A project that existed was in its list
		// already: it made it, or a grant restarted it after making it.)
		// The restart drops the connections it proxies, every user's.
		if res.RestartedIncusUser, err = host.restartIncusUser(ctx); err != nil {
			return nil, fmt.Errorf("granting %s: %w", u.Name, err)
		}
	}

	// 6. The group, last: nobody holds a socket to an un-narrowed project.
	in, err := accounts.InGroup(u.Name, group)
	if err != nil {
		return nil, fmt.Errorf("granting %s: %w", u.Name, err)
	}
	if !in {
		if err := accounts.AddToGroup(u.Name, group); err != nil {
			return nil, fmt.Errorf("granting %s: %w", u.Name, err)
		}
		back.push("removing "+u.Name+" from group "+group, func(context.Context) error { return accounts.RemoveFromGroup(u.Name, group) })
		did("added %s to group %s", u.Name, group)
	}

	// 7. Proof: as the user, through incus-user, the project is the tier's,
	// and incus-user did not run its stock setup on the way.
	if err := host.checkAsUser(ctx, u, gid); err != nil {
		return nil, fmt.Errorf("granting %s: %w", u.Name, err)
	}
	return res, nil
}

// convergeUserState makes incus-user's state for u match the trust store:
// a certificate on disk, trusted for u's project only. It reports whether
// it changed anything.
func (host *Host) convergeUserState(ctx context.Context, u accounts.User, back *undoStack, did func(string, ...any)) (bool, error) {
	c := host.Incus
	changed := false
	if host.tombstoned(u.UID) {
		st := host.userState(u.UID)
		if err := os.Remove(st); err != nil {
			return false, fmt.Errorf("removing the purge tombstone %s: %w", st, err)
		}
		back.push("restoring the purge tombstone", func(context.Context) error { return host.writeTombstone(u.UID) })
		did("removed the purge tombstone of uid %d", u.UID)
		changed = true
	}
	cert, ok, err := host.readUserCert(u.UID)
	if err != nil {
		return false, err
	}
	if !ok {
		if cert, err = host.writeUserCert(u.UID, tierCertName(u.UID)); err != nil {
			return false, err
		}
		st := host.userState(u.UID)
		back.push("removing "+st, func(context.Context) error { return os.RemoveAll(st) })
		did("made incus-user's client certificate for uid %d", u.UID)
		changed = true
	}
	certs, err := c.Certificates(ctx)
	if err != nil {
		return false, err
	}
	project := TierProject(u.UID)
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
	back.push("untrusting uid's certificate", func(ctx context.Context) error { return c.DeleteCertificate(ctx, cert.Fingerprint) })
	did("trusted uid %d's certificate for project %s only", u.UID, project)
	return true, nil
}

// checkNoOtherNetworks refuses a project whose instances use a network
// other than boxnet: narrowing it would strand them.
func (host *Host) checkNoOtherNetworks(ctx context.Context, project string) error {
	insts, err := host.Incus.Project(project).Instances(ctx, nil)
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

// AsUser is a client that reaches incusd the way u does: through
// incus-user's socket, under u's uid and with the tier's group.
func (host *Host) AsUser(u accounts.User, groupGID uint32) *incus.Client {
	sock := host.UserSocket()
	cred := ascred.Cred{UID: u.UID, GID: u.GID, Groups: []uint32{groupGID}}
	return incus.NewDialer(sock, func(ctx context.Context) (net.Conn, error) {
		return ascred.DialUnix(ctx, sock, cred)
	}).Project(TierProject(u.UID))
}

// checkAsUser proves the grant from the user's side.
func (host *Host) checkAsUser(ctx context.Context, u accounts.User, gid uint32) error {
	project := TierProject(u.UID)
	uc := host.AsUser(u, gid)
	cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	p, _, err := uc.GetProject(cctx, project)
	if incus.IsUnreachable(err) {
		return fmt.Errorf("no incus-user answers on %s (%v): enable it with systemctl enable --now incus-user.socket, then grant again", host.UserSocket(), err)
	}
	if err != nil {
		return fmt.Errorf("checking the grant as %s through incus-user: %w", u.Name, err)
	}
	if probs := tierConfigProblems(p.Config); len(probs) > 0 {
		return fmt.Errorf("as %s, project %s is not the tier's: %s", u.Name, project, strings.Join(probs, "; "))
	}
	if _, _, err := uc.Profile(cctx, model.Current.Profile); err != nil {
		return fmt.Errorf("as %s, profile %s is not reachable: %w", u.Name, model.Current.Profile, err)
	}
	// incus-user's stock setup, had it run, would have made the bridge.
	if _, _, err := host.Incus.Network(ctx, TierBridge(u.UID)); err == nil {
		return fmt.Errorf("incus-user re-ran its stock setup for %s (the private bridge %s is back): restart incus-user and grant again", u.Name, TierBridge(u.UID))
	} else if !incus.IsNotFound(err) {
		return err
	}
	return nil
}

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
func (host *Host) Revoke(ctx context.Context, u accounts.User, group string, purge bool) (*RevokeResult, error) {
	if u.UID == 0 {
		return nil, errors.New("root has no tier to revoke")
	}
	group = cmp.Or(group, host.TierGroup, DefaultTierGroup)
	project := TierProject(u.UID)
	res := &RevokeResult{User: u.Name, UID: u.UID, Project: project, Did: []string{}, Purged: purge}
	did := func(format string, args ...any) { res.Did = append(res.Did, fmt.Sprintf(format, args...)) }
	c := host.Incus

	if in, err := accounts.InGroup(u.Name, group); err != nil {
		return nil, err
	} else if in {
		if err := accounts.RemoveFromGroup(u.Name, group); err != nil {
			return nil, fmt.Errorf("revoking %s: %w", u.Name, err)
		}
		did("removed %s from group %s", u.Name, group)
	}
	if !purge {
		if p, etag, err := c.GetProject(ctx, project); err == nil {
			if p.Config[KeyTier] != TierRevoked {
				np := *p
				np.Config = maps.Clone(p.Config)
				np.Config[KeyTier] = TierRevoked
				if err := c.UpdateProject(ctx, project, np, etag); err != nil {
					return nil, fmt.Errorf("revoking %s: %w", u.Name, err)
				}
				did("marked project %s revoked (its boxes are kept)", project)
			}
		} else if !incus.IsNotFound(err) {
			return nil, fmt.Errorf("revoking %s: %w", u.Name, err)
		}
		held, err := accounts.Processes(u.UID)
		if err != nil {
			return nil, err
		}
		res.Held = held
		return res, nil
	}

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
	if err := host.writeTombstone(u.UID); err != nil {
		return nil, fmt.Errorf("purging %s: %w", u.Name, err)
	}
	if _, err := host.restartIncusUser(ctx); err != nil {
		return nil, fmt.Errorf("purging %s: %w", u.Name, err)
	}
	did("replaced incus-user's state for uid %d with a tombstone", u.UID)

	certs, err := c.Certificates(ctx)
	if err != nil {
		return nil, err
	}
	for _, tc := range certs {
		if tc.Name == tierCertName(u.UID) || slices.Contains(tc.Projects, project) {
			if err := c.DeleteCertificate(ctx, tc.Fingerprint); err != nil {
				return nil, fmt.Errorf("purging %s: %w", u.Name, err)
			}
			did("removed trusted certificate %s (%s)", tc.Name, tc.Fingerprint[:12])
		}
	}
	if _, _, err := c.GetProject(ctx, project); err == nil {
		if err := host.deleteProjectContents(ctx, project, true); err != nil {
			return nil, fmt.Errorf("purging %s: %w", u.Name, err)
		}
		did("deleted project %s with its boxes", project)
	} else if !incus.IsNotFound(err) {
		return nil, err
	}
	if _, _, err := c.Network(ctx, TierBridge(u.UID)); err == nil {
		if err := c.DeleteNetwork(ctx, TierBridge(u.UID)); err != nil {
			return nil, fmt.Errorf("purging %s: %w", u.Name, err)
		}
		did("deleted the private bridge %s", TierBridge(u.UID))
	}
	// Their boxes' ports are gone from the bridge: out of the set and the
	// pins with them.
	if _, err := host.refreshPorts(ctx); err != nil {
		return nil, fmt.Errorf("purging %s: refreshing the bridge ports: %w", u.Name, err)
	}
	// What must be gone is checked, not assumed.
	if err := host.checkPurged(ctx, u.UID); err != nil {
		return nil, fmt.Errorf("purging %s: %w", u.Name, err)
	}
	return res, nil
}

// checkPurged asserts nothing of uid's tier is left in Incus.
func (host *Host) checkPurged(ctx context.Context, uid uint32) error {
	c := host.Incus
	project := TierProject(uid)
	var left []string
	if _, _, err := c.GetProject(ctx, project); err == nil {
		left = append(left, "project "+project)
	}
	if _, _, err := c.Network(ctx, TierBridge(uid)); err == nil {
		left = append(left, "network "+TierBridge(uid))
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
func (host *Host) deleteProjectContents(ctx context.Context, project string, self bool) error {
	pc := host.Incus.Project(project)
	insts, err := pc.Instances(ctx, nil)
	if err != nil {
		return err
	}
	for _, in := range insts {
		if err := host.withClient(pc).removeInstance(ctx, in.Name); err != nil {
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
	if err := host.deleteProjectVolumes(ctx, project); err != nil {
		return err
	}
	if !self {
		return nil
	}
	return host.Incus.DeleteProject(ctx, project)
}

// withClient is host acting through another client (a project's).
func (host *Host) withClient(c *incus.Client) *Host {
	h := *host
	h.Incus = c
	return &h
}

// deleteProjectVolumes deletes the custom volumes of project in every pool.
func (host *Host) deleteProjectVolumes(ctx context.Context, project string) error {
	pools, err := host.Incus.StoragePools(ctx)
	if err != nil {
		return err
	}
	pc := host.Incus.Project(project)
	for _, pool := range pools {
		vols, err := pc.CustomVolumes(ctx, pool.Name)
		if err != nil {
			return err
		}
		for _, v := range vols {
			if err := pc.DeleteCustomVolume(ctx, pool.Name, v.Name); err != nil {
				return err
			}
		}
	}
	return nil
}

// desiredNow is the desired stack for the bridge as it is.
func (host *Host) desiredNow(ctx context.Context) (model.Desired, error) {
	n, _, err := host.Incus.Network(ctx, model.Current.Network)
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
