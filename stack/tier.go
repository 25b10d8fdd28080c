package stack

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"

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

// TierProjectRE matches a granted user's project (model.TierProjectRE).
var TierProjectRE = model.TierProjectRE

// TierSet is what a granted project's config must say: boxnet only, no
// host paths, no proxies, unprivileged, snapshots and backups allowed, and
// the host's images (features.images off) so box's images are reachable.
var TierSet = map[string]string{
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

// TierConfigProblems lists how a project's config differs from the tier's.
func TierConfigProblems(cfg map[string]string) []string {
	var out []string
	for _, k := range slices.Sorted(maps.Keys(TierSet)) {
		want := TierSet[k]
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
	projects, err := host.Incus.Projects().List(ctx)
	if err != nil {
		return nil, err
	}
	nets, err := host.Incus.Networks().List(ctx)
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
		m := TierProjectRE.FindStringSubmatch(p.Name)
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
		insts, err := host.Incus.Project(p.Name).Instances().List(ctx, nil)
		if err != nil {
			return nil, err
		}
		for i := range insts {
			if _, ok := model.IsBox(&insts[i]); ok {
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
	if ents, err := os.ReadDir(filepath.Dir(UserStatePath(ServerDir(host.Incus), 0))); err == nil {
		for _, e := range ents {
			uid64, err := strconv.ParseUint(e.Name(), 10, 32)
			if err != nil || seen[uint32(uid64)] || !Tombstoned(ServerDir(host.Incus), uint32(uid64)) {
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
	probs := TierConfigProblems(cfg)
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

// AsUser is a client that reaches incusd the way u does: through
// incus-user's socket, under u's uid and with the tier's group.
func (host *Host) AsUser(u accounts.User, groupGID uint32) *incus.Client {
	sock := host.Tier.Socket(host.Incus)
	cred := ascred.Cred{UID: u.UID, GID: u.GID, Groups: []uint32{groupGID}}
	return incus.NewDialer(sock, func(ctx context.Context) (net.Conn, error) {
		return ascred.DialUnix(ctx, sock, cred)
	}).Project(TierProject(u.UID))
}
