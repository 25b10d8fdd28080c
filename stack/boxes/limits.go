package boxes

import (
	"context"
	"fmt"
	"strings"

	"github.com/box-isolation/box/stack/model"
)

// Limits a box cannot outgrow (docs/box.md, "Limits"): per box, the
// processes it may have at once (limits.processes: a fork bomb stops
// there), a CPU allowance (on a small host the CPU count alone limits
// nothing: limits.cpu=2 on two cores is the whole host), memory where the
// host applies it (Mint finds out where it does not, and says so), and the
// root disk's size where the pool enforces one (diskLimitNote says where
// it does not). docs/box.md, "Limits", has what each stops and the
// numbers measured here.

// diskQuotaDrivers are the pool drivers whose volumes have the size Incus
// gives them, and how.
var diskQuotaDrivers = map[string]string{
	"zfs":        "a dataset quota",
	"btrfs":      "a qgroup limit on the subvolume",
	"lvm":        "the logical volume's size",
	"lvmcluster": "the logical volume's size",
	"ceph":       "the RBD image's size",
	"powerflex":  "the volume's size",
	"linstor":    "the resource's size",
}

// DiskQuota says whether a pool of the driver enforces a volume's size,
// and how. A dir pool does only where its file system has project quotas
// (ext4 or xfs mounted with them), which the driver alone does not say:
// judged then by what Incus measures of the box (diskLimitNote).
func DiskQuota(driver string) (enforced bool, how string) {
	if how, ok := diskQuotaDrivers[driver]; ok {
		return true, how
	}
	if driver == "dir" {
		return false, "a project quota, only where the pool's file system (ext4 or xfs) is mounted with project quotas"
	}
	return false, "none known to box"
}

// withLimits puts a mint request's limits and id map on the instance's
// config.
func withLimits(cfg map[string]string, req MintRequest) {
	if req.Processes != "" {
		cfg["limits.processes"] = req.Processes
	}
	if req.CPUAllowance != "" {
		cfg["limits.cpu.allowance"] = req.CPUAllowance
	}
	if req.IsolatedIDMap {
		cfg["security.idmap.isolated"] = "true"
	}
}

// diskLimitNote says when a freshly minted box's root disk size is not
// enforced: a dir pool on a file system without project quotas skips it
// (incusd only logs that), and the box can fill the pool's file system.
// Incus measures a dir volume's usage only through its project quota, so
// a root disk it reports no usage for has none. "" when the size holds,
// or when no size was asked for.
func (mgr *Manager) diskLimitNote(ctx context.Context, req MintRequest) string {
	host := mgr.host
	if req.Disk == "" {
		return ""
	}
	pool, _, err := host.Incus.Storage().Pool(ctx, host.Options.PoolName())
	if err != nil {
		// A granted user may not read pools: say nothing rather than guess.
		return ""
	}
	if ok, _ := DiskQuota(pool.Driver); ok {
		return ""
	}
	if pool.Driver == "dir" {
		st, err := host.Incus.Instances().State(ctx, req.Name)
		if err != nil {
			return ""
		}
		if _, measured := st.Disk["root"]; measured {
			return ""
		}
	}
	_, how := DiskQuota(pool.Driver)
	return fmt.Sprintf("%s: pool %s (%s) did not enforce the root disk's size %s (its way: %s), so the box can fill the pool's file system; use a %s pool for disk limits",
		model.NoteNoDiskLimit, pool.Name, pool.Driver, req.Disk, how, strings.Join(quotaDrivers(), ", "))
}

func quotaDrivers() []string {
	return []string{"zfs", "btrfs", "lvm", "ceph", "dir on ext4 or xfs with project quotas"}
}
