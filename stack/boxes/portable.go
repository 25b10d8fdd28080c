package boxes

import (
	"cmp"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/box-isolation/box/stack"
	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/model"
)

// Export and import: a box with its snapshots as one file, in Incus's
// backup format (backupfile.go describes it).

// backupExpiry is how long incusd keeps a backup box made for an export
// when box could not delete it (it dies, or the delete fails).
const backupExpiry = 24 * time.Hour

// ExportResult says how an export went.
type ExportResult struct {
	Name      string   `json:"name"`
	Bytes     int64    `json:"bytes"`
	Snapshots []string `json:"snapshots"`
	// SourceStopped is set when the box ran: it was stopped for the
	// export and started again.
	SourceStopped bool `json:"source_stopped"`
	// Notes say what went wrong on the side (the server's copy left for
	// incusd to expire).
	Notes []string `json:"notes,omitempty"`
}

// Export writes a box, its snapshots and its stamps (its whole config) to
// w as an Incus backup tarball, gzip-compressed. incusd writes the backup
// on its own disk first, then box streams it to w and deletes it.
//
// A running box is stopped for the backup and started again as soon as
// incusd has written it (before the copy to w): Incus 6.0 backs up a
// running container by reading its files while it keeps writing them (it
// freezes it for a snapshot, but not for a backup), and this host could
// not freeze it anyway, so only a stopped box makes a consistent file.
func (mgr *Manager) Export(ctx context.Context, name string, w io.Writer) (*ExportResult, error) {
	host := mgr.host
	inst, _, err := stack.Resolve(ctx, host.Incus, name)
	if err != nil {
		return nil, err
	}
	snaps, err := host.Incus.Instances().Snapshots(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("exporting %s: %w", name, err)
	}
	res := &ExportResult{Name: name, Snapshots: []string{}}
	for _, s := range snaps {
		res.Snapshots = append(res.Snapshots, s.Name)
	}
	if inst.Status != "Stopped" {
		host.Progressf("stopping %s for the export...", name)
		if err := host.Incus.Instances().SetState(ctx, name, "stop", time.Minute, false); err != nil {
			return nil, fmt.Errorf("exporting %s: stopping it for a consistent copy: %w", name, err)
		}
		res.SourceStopped = true
	}
	backup := fmt.Sprintf("box-export-%d", time.Now().UnixNano())
	host.Progressf("exporting %s: incusd writes the backup...", name)
	err = host.Incus.Instances().CreateBackup(ctx, name, incus.BackupsPost{
		Name: backup, ExpiresAt: time.Now().Add(backupExpiry).UTC(),
		InstanceOnly: false, OptimizedStorage: false, CompressionAlgorithm: "gzip",
	})
	if res.SourceStopped {
		// The copy to w reads incusd's backup, not the box.
		if serr := mgr.startAgain(ctx, name); serr != nil {
			err = errors.Join(err, serr)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("exporting %s: %w", name, err)
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		if derr := host.Incus.Instances().DeleteBackup(dctx, name, backup); derr != nil {
			res.Notes = append(res.Notes, fmt.Sprintf("incusd's copy of the backup was not deleted (%v): it expires by itself within %s", derr, backupExpiry))
		}
	}()
	host.Progressf("exporting %s: copying the backup...", name)
	res.Bytes, err = host.Incus.Instances().ExportBackup(ctx, name, backup, w)
	if err != nil {
		return res, fmt.Errorf("exporting %s: %w", name, err)
	}
	return res, nil
}

// startAgain starts a box that was stopped for a moment, even if the
// caller has given up, and isolates its new port.
func (mgr *Manager) startAgain(ctx context.Context, name string) error {
	host := mgr.host
	ctx = context.WithoutCancel(ctx)
	if err := host.Incus.Instances().SetState(ctx, name, "start", 0, false); err != nil {
		return fmt.Errorf("starting %s again: %w (start it: box start %s)", name, err, name)
	}
	if _, err := host.RefreshPorts(ctx); err != nil {
		return fmt.Errorf("started %s again, but isolating its bridge port failed: %w (run box doctor --fix)", name, err)
	}
	return nil
}

// ImportResult says how an import went.
type ImportResult struct {
	Box *stack.Box `json:"box"`
	// From is the box's name in the file; File the file.
	From      string   `json:"from"`
	File      string   `json:"file"`
	Snapshots []string `json:"snapshots"`
	// Notes say what the import decided on its own (no memory limit).
	Notes []string `json:"notes,omitempty"`
	// Policy is the imported box's: the file's (but what Notes say the
	// import dropped), recorded on this host.
	Policy model.Policy `json:"policy"`
}

// Import makes a new box from a file Export wrote: named name, or as in
// the file. Before anything is created the file is read and judged
// (judgeBackup): a file that is not a box's, or whose box or one of whose
// snapshots would be off the stack on this host, is refused with every
// reason. What Incus made of it is judged again before it ever starts.
// The box is re-tagged and re-stamped (minted now, its origin the file;
// the other stamps are the file's), and gets a new identity: new MACs,
// machine-id and instance UUID, always, since a file can be imported
// beside its source or twice, and two boxes with one identity share one
// DHCP lease. Then it is started and its port isolated.
func (mgr *Manager) Import(ctx context.Context, file, name string) (res *ImportResult, err error) {
	host := mgr.host
	f, err := os.Open(file)
	if err != nil {
		return nil, fmt.Errorf("importing: %w", err)
	}
	defer f.Close()
	bf, err := ReadBackupFile(f)
	if err != nil {
		return nil, fmt.Errorf("importing %s: %w", file, err)
	}
	name = cmp.Or(name, bf.Name)
	net, err := checkImportable(ctx, host, bf, file, name)
	if err != nil {
		return nil, err
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return nil, fmt.Errorf("importing %s: %w", file, err)
	}
	host.Progressf("importing %s as %s...", file, name)
	if err := host.Incus.Instances().ImportBackup(ctx, name, f, host.Options.PoolName()); err != nil {
		return nil, fmt.Errorf("importing %s: %w", file, err)
	}
	// From here on a failure leaves an instance that is not a proper box:
	// remove it.
	defer func() {
		if err != nil {
			if rerr := stack.RemoveInstance(context.WithoutCancel(ctx), host.Incus, name); rerr != nil && !incus.IsNotFound(rerr) {
				err = errors.Join(err, fmt.Errorf("removing the half-imported %s: %w (remove it by hand: incus delete --force %s)", name, rerr, name))
			}
		}
	}()
	res = &ImportResult{From: bf.Name, File: file, Snapshots: []string{}}
	inst, etag, err := host.Incus.Instances().Get(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("importing %s: %w", file, err)
	}
	if err := mgr.judgeImported(ctx, file, inst); err != nil {
		return nil, err
	}
	snaps, err := host.Incus.Instances().Snapshots(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("importing %s: %w", file, err)
	}
	for _, s := range snaps {
		res.Snapshots = append(res.Snapshots, s.Name)
	}

	put := inst.Writable()
	if err := importEgress(ctx, host, file, put.Config); err != nil {
		return nil, err
	}
	ci, err := host.Cluster(ctx)
	if err != nil {
		return nil, fmt.Errorf("importing %s: %w", file, err)
	}
	if err := freshImportConfig(&put, res, name, net); err != nil {
		return nil, err
	}
	if err := host.Incus.Instances().Update(ctx, name, put, etag); err != nil {
		return nil, fmt.Errorf("re-stamping %s: %w", name, err)
	}
	res.Policy = model.PolicyOf(put.Config, put.Devices)
	if err := host.Policies().Record(ctx, inst.Project, name, res.Policy); err != nil {
		return nil, fmt.Errorf("importing %s: %w", file, err)
	}
	// A backup lands on the member that received it, whatever ?target=
	// says: on a cluster the box's address is of that member's slice.
	member := ""
	if ci.Clustered() {
		member = inst.Location
	}
	if err := mgr.startImported(ctx, file, inst, member); err != nil {
		return nil, err
	}
	res.Box, err = stack.Info(ctx, host.Incus, name)
	return res, err
}

// checkImportable judges a file (bf, read from file) before anything is
// made of it, and returns the bridge: the stack must be up (and, for a
// granted user, the port watcher), the file's box and snapshots on the
// stack with this host's profiles, and name free.
func checkImportable(ctx context.Context, host *stack.Host, bf *BackupFile, file, name string) (*incus.Network, error) {
	net, _, err := stack.RequireStack(ctx, host.Incus)
	if err != nil {
		return nil, fmt.Errorf("importing %s: %w", file, err)
	}
	if host.Tier.Granted {
		if err := stack.RequireWatcher(host.NetNS); err != nil {
			return nil, fmt.Errorf("importing %s: %w", file, err)
		}
	}
	plist, err := host.Incus.Profiles(ctx)
	if err != nil {
		return nil, fmt.Errorf("importing %s: %w", file, err)
	}
	profiles := map[string]incus.Profile{}
	for _, p := range plist {
		profiles[p.Name] = p
	}
	if reasons := judgeBackup(bf, profiles); len(reasons) > 0 {
		return nil, &ImportRefusedError{File: file, Reasons: reasons}
	}
	if _, _, err := host.Incus.Instances().Get(ctx, name); err == nil {
		hint := "pass --name NEW"
		if name == bf.Name {
			hint = "it is the box this file was exported from, or another import of it: pass --name NEW"
		}
		return nil, fmt.Errorf("importing %s: an instance named %s already exists (%s)", file, name, hint)
	} else if !incus.IsNotFound(err) {
		return nil, fmt.Errorf("importing %s: %w", file, err)
	}
	return net, nil
}

// importEgress: an imported box's egress allowlist travels by its names
// (in its config, cfg): this host learns it, or the import is refused (an
// allowlisted box must never come up open).
func importEgress(ctx context.Context, host *stack.Host, file string, cfg map[string]string) error {
	id := cfg[model.KeyEgress]
	if id == "" {
		return nil
	}
	names, err := model.NormalizeNames(strings.Split(cfg[model.KeyEgressNames], ","))
	if err != nil || model.PolicyID(names) != id {
		return &ImportRefusedError{File: file, Reasons: []string{fmt.Sprintf("it is under egress allowlist %s, whose names the file does not carry (%s=%q): import it on a host that has the allowlist, or export it again from a box whose allowlist was set with this version", id, model.KeyEgressNames, cfg[model.KeyEgressNames])}}
	}
	if _, err := host.Policies().EnsureAllowlist(ctx, id, names); err != nil {
		return fmt.Errorf("importing %s: its egress allowlist: %w", file, err)
	}
	return nil
}

// freshImportConfig makes put (the imported box name's) its own: no
// doors, MACs, bridge port or instance UUID of its source, re-tagged and
// stamped minted now from res.File, and without a memory limit this host
// (net) cannot apply. What it drops goes into res.Notes.
func freshImportConfig(put *incus.InstancePut, res *ImportResult, name string, net *incus.Network) error {
	// Its doors stay the exporting host's: a host port here may be taken,
	// and a unix door's socket names the source.
	if dropped := withoutDoors(put.Devices); len(dropped) > 0 {
		res.Notes = append(res.Notes, fmt.Sprintf("its doors (%s) were dropped: box expose %s PORT makes one here", strings.Join(dropped, ", "), name))
	}
	// A fixed address in the file is the one of the host it came from.
	// The box gets one of this host's (startImported) once it has its own
	// MAC (Incus checks the NIC's MAC when the NIC changes, and the file's
	// is its source's), before it starts.
	if a := put.Devices["eth0"]["ipv4.address"]; a != "" {
		res.Notes = append(res.Notes, fmt.Sprintf("its fixed address %s was the host's it came from: it gets one of this host's", a))
	}
	stack.ForgetMACs(put.Config)
	for k := range put.Config {
		// The source's bridge port, which is not this box's.
		if strings.HasPrefix(k, "volatile.") && strings.HasSuffix(k, ".host_name") {
			delete(put.Config, k)
		}
	}
	uuid, err := newUUID()
	if err != nil {
		return err
	}
	put.Config["volatile.uuid"], put.Config["volatile.uuid.generation"] = uuid, uuid
	put.Config[model.Current.Tag] = "1"
	put.Config[model.StampMinted] = time.Now().UTC().Format(time.RFC3339)
	abs, err := filepath.Abs(res.File)
	if err != nil {
		abs = res.File
	}
	put.Config[model.StampOrigin] = fmt.Sprintf("import of %s from %s", res.From, abs)
	if put.Config["limits.memory"] != "" && net.Config[KeyMemoryLimits] == memoryUnsupported {
		res.Notes = append(res.Notes, fmt.Sprintf("%s: this host cannot apply one (%s=%s on %s), so limits.memory=%s from the file was dropped",
			NoteNoMemoryLimit, KeyMemoryLimits, memoryUnsupported, model.Current.Network, put.Config["limits.memory"]))
		delete(put.Config, "limits.memory")
	}
	return nil
}

// startImported gives an imported box, re-stamped, an address of this
// host's (of member's slice on a cluster) and a machine-id of its own, then
// starts it and isolates its port.
func (mgr *Manager) startImported(ctx context.Context, file string, inst *incus.Instance, member string) error {
	host := mgr.host
	name := inst.Name
	if _, err := host.Addresses().FixAddress(ctx, name, member); err != nil {
		return fmt.Errorf("importing %s: %w", file, err)
	}
	if err := mgr.freshMachineID(ctx, inst); err != nil {
		return fmt.Errorf("giving %s a machine-id: %w", name, err)
	}
	host.Progressf("starting %s...", name)
	if err := host.Addresses().StartFixed(ctx, name, member); err != nil {
		return fmt.Errorf("starting %s: %w", name, err)
	}
	if _, err := host.RefreshPorts(ctx); err != nil {
		return fmt.Errorf("imported %s, but isolating its bridge port failed: %w", name, err)
	}
	return nil
}

// judgeImported judges the instance Incus made of a file, and its
// snapshots, as the server expanded them: what was judged in the file is
// what Incus made, or the import is undone.
func (mgr *Manager) judgeImported(ctx context.Context, file string, inst *incus.Instance) error {
	host := mgr.host
	var reasons []string
	for _, p := range model.JudgeDefinition(model.Current.Network, inst).Problems {
		reasons = append(reasons, "as Incus made it, the box: "+p.What)
	}
	snaps, err := host.Incus.Instances().SnapshotDefinitions(ctx, inst.Name)
	if err != nil {
		return fmt.Errorf("importing %s: %w", file, err)
	}
	for i := range snaps {
		for _, p := range model.JudgeDefinition(model.Current.Network, &snaps[i]).Problems {
			reasons = append(reasons, fmt.Sprintf("as Incus made it, snapshot %s: %s", snaps[i].Name, p.What))
		}
	}
	if len(reasons) > 0 {
		return &ImportRefusedError{File: file, Reasons: reasons, Undone: true}
	}
	return nil
}

// newUUID is a random (version 4) UUID, as Incus gives an instance.
func newUUID() (string, error) {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16]), nil
}
