package boxes

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/box-isolation/box/stack"
	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/model"
)

// CloneResult says how a clone came to be.
type CloneResult struct {
	Box *stack.Box `json:"box"`
	// SourceStopped is set when the source had to be stopped for the copy
	// (a host that cannot freeze containers cannot copy a running one).
	SourceStopped bool `json:"source_stopped"`
	// DoorsDropped names the source's doors the clone did not get.
	DoorsDropped []string `json:"doors_dropped,omitempty"`
	// Provisioning is what the clone's cloud-init does at its first boot:
	// ProvisionChecks, ProvisionAgain, or "" (no user-data).
	Provisioning string `json:"provisioning,omitempty"`
	// Policy is the clone's: its source's current one (but its doors),
	// whatever the snapshot it was copied from held.
	Policy PolicyNote `json:"policy"`
}

// MachineIDTemplate is the instance template (in the instance's image
// metadata) that writes a copy's /etc/machine-id: its own Incus UUID
// (volatile.uuid, new in every copy), without dashes, which is also what
// systemd makes of a VM's empty machine-id (the VM's SMBIOS UUID is that
// UUID). Not proven on a VM here (no vhost-vsock): docs/images.md.
const (
	MachineIDTemplate     = "box-machine-id.tpl"
	machineIDTemplateText = `{{ config_get("volatile.uuid", "")|cut:"-" }}` + "\n"
)

// Clone copies a box (or one of its snapshots) into a new box with a fresh
// MAC address and machine identity, re-stamped with its own coming into
// being and its lineage, and starts it (CloneTo, where Incus places it).
func (mgr *Manager) Clone(ctx context.Context, src, snap, name string) (*CloneResult, error) {
	return mgr.CloneTo(ctx, src, snap, name, "")
}

// CloneTo is Clone onto a cluster member (target; "" is where Incus places
// it). On a cluster the clone gets a fixed address of its own member's
// slice: a copy carries its source's NIC with the source's address, which
// another member would accept as it is.
func (mgr *Manager) CloneTo(ctx context.Context, src, snap, name, target string) (_ *CloneResult, err error) {
	host := mgr.host
	inst, _, err := stack.Resolve(ctx, host.Incus, src)
	if err != nil {
		return nil, err
	}
	if _, _, err := host.Incus.Instances().Get(ctx, name); err == nil {
		return nil, fmt.Errorf("cloning %s: an instance named %s already exists: pick another --name", src, name)
	}
	copyReq, cl, err := cloneRequest(ctx, host, inst, src, snap, name, target)
	if err != nil {
		return nil, err
	}
	source := copyReq.Source.Source // src, or src/snap
	stopped, restartSource, err := copyBox(ctx, host.Incus, cl, copyReq, inst, src, snap)
	if err != nil {
		return nil, err
	}
	res := &CloneResult{SourceStopped: stopped}

	// From here on a failure leaves a copy that is not yet a proper box
	// (an inherited identity): remove it rather than leave it behind.
	defer func() {
		if err != nil {
			if rerr := stack.RemoveInstance(context.WithoutCancel(ctx), host.Incus, name); rerr != nil && !incus.IsNotFound(rerr) {
				err = errors.Join(err, fmt.Errorf("removing the half-made clone %s: %w", name, rerr))
			}
			err = errors.Join(err, restartSource())
		}
	}()

	// A fresh identity before the first boot: no inherited MAC, a new
	// machine-id (a shared one means one DHCP lease for two boxes).
	// Its source's current policy, whatever the copy held (a snapshot's).
	cur, err := currentPolicy(ctx, host, inst)
	if err != nil {
		return nil, err
	}
	want := cur.WithoutDoors()
	clone, err := restampClone(ctx, host.Incus, name, source, want, res)
	if err != nil {
		return nil, err
	}
	if err := restartSource(); err != nil {
		return nil, err
	}
	if err := host.Policies().Record(ctx, clone.Project, name, want); err != nil {
		return nil, err
	}
	if err := mgr.startClone(ctx, clone, source, res.Provisioning != ""); err != nil {
		return nil, err
	}
	res.Box, err = stack.Info(ctx, host.Incus, name)
	return res, err
}

// cloneRequest is the request that copies src (or its snapshot snap) into
// name, and the client to send it to, once the cluster allows it: on a
// cluster the request carries a whole definition (clusterCopy), sent to
// target when one is named.
func cloneRequest(ctx context.Context, host *stack.Host, inst *incus.Instance, src, snap, name, target string) (incus.InstancesPost, *incus.Client, error) {
	ci, err := host.Cluster(ctx)
	if err != nil {
		return incus.InstancesPost{}, nil, fmt.Errorf("cloning %s: %w", src, err)
	}
	if target != "" && !ci.Clustered() {
		return incus.InstancesPost{}, nil, fmt.Errorf("cloning %s: --target %s: this incusd is not a cluster member", src, target)
	}
	if err := ci.CheckMember(target); err != nil {
		return incus.InstancesPost{}, nil, fmt.Errorf("cloning %s: %w", src, err)
	}
	source := src
	if snap != "" {
		source = src + "/" + snap
	}
	req := incus.InstancesPost{Name: name, Type: inst.Type, Source: incus.InstanceSource{Type: "copy", Source: source}}
	cl := host.Incus
	if ci.Clustered() {
		if req, err = clusterCopy(ctx, host.Incus, inst, snap, req); err != nil {
			return incus.InstancesPost{}, nil, fmt.Errorf("cloning %s: %w", source, err)
		}
		if target != "" {
			cl = cl.Target(target)
		}
	}
	return req, cl, nil
}

// copyBox sends the copy request (req, to cl) for src (inst, or its
// snapshot snap). A running source this host cannot copy live is stopped
// for a cold copy (stopped), and restart starts it again, once: the caller
// calls it when the copy no longer asks for the source's fixed address
// (the re-stamp, or the copy's removal), since Incus refuses to start a
// NIC whose address another NIC asks for. When the copy fails, copyBox
// has started the source again itself.
func copyBox(ctx context.Context, c, cl *incus.Client, req incus.InstancesPost, inst *incus.Instance, src, snap string) (stopped bool, restart func() error, err error) {
	err = cl.Instances().Create(ctx, req)
	if err != nil && snap == "" && inst.Status == "Running" && stack.NeedsColdCopy(err) {
		// This host cannot freeze a running container to copy it
		// consistently (nor, on a cluster, migrate it live to another
		// member): stop the source for the copy and start it again.
		if serr := c.Instances().SetState(ctx, src, "stop", 60*time.Second, false); serr != nil {
			return false, nil, fmt.Errorf("cloning %s: %w; stopping it for a cold copy: %v", src, err, serr)
		}
		stopped = true
		err = cl.Instances().Create(ctx, req)
	}
	pending := stopped
	restart = func() error {
		if !pending {
			return nil
		}
		pending = false
		if serr := c.Instances().SetState(context.WithoutCancel(ctx), src, "start", 0, false); serr != nil {
			return fmt.Errorf("restarting %s after the copy: %w", src, serr)
		}
		return nil
	}
	if err != nil {
		return false, nil, errors.Join(fmt.Errorf("cloning %s into %s: %w", req.Source.Source, req.Name, err), restart())
	}
	return stopped, restart, nil
}

// restampClone makes the copy name of source a box of its own: no
// inherited MAC, stamped with its own coming into being and its lineage,
// under the policy want, and none of the source's doors, fixed address or
// provisioning (res says what it dropped, and how the copy's policy
// differed). It returns the copy as read before the re-stamp, for its
// member and type.
func restampClone(ctx context.Context, c *incus.Client, name, source string, want model.Policy, res *CloneResult) (*incus.Instance, error) {
	clone, etag, err := c.Instances().Get(ctx, name)
	if err != nil {
		return nil, err
	}
	put := clone.Writable()
	stack.ForgetMACs(put.Config)
	put.Config[model.Current.Tag] = "1"
	put.Config[model.StampMinted] = time.Now().UTC().Format(time.RFC3339)
	put.Config[model.StampOrigin] = "clone of " + source
	// The source's doors stay the source's: the clone would take their
	// host port (and fail to start) or their socket.
	res.DoorsDropped = withoutDoors(put.Devices)
	other := "the source"
	if strings.Contains(source, "/") {
		other = "the snapshot"
	}
	res.Policy = PolicyNote{Policy: want, Source: "source", Other: other, Differs: model.PolicyOf(put.Config, put.Devices).Diff(want)}
	want.ApplyTo(put.Config, put.Devices)
	// So does its fixed address: the clone gets its own (startClone).
	stack.WithoutFixedAddress(put.Devices)
	// Not provisioned again (cloneprov.go).
	res.Provisioning = cloneUserData(put.Config, name)
	if err := c.Instances().Update(ctx, name, put, etag); err != nil {
		return nil, fmt.Errorf("re-stamping clone %s: %w", name, err)
	}
	return clone, nil
}

// startClone gives a re-stamped clone of source a fixed address of its
// member's slice, a new machine-id and, when it has user-data (its
// cloud-init runs at its first boot), empty provisioning markers, then
// starts it and isolates its port.
func (mgr *Manager) startClone(ctx context.Context, clone *incus.Instance, source string, userData bool) error {
	host := mgr.host
	name := clone.Name
	member, err := host.Addresses().MemberOf(ctx, clone)
	if err != nil {
		return err
	}
	// A granted user's clone, like their new box, gets its fixed address
	// from the port watcher when its port comes up: Incus hides the
	// bridge's config (its subnet) from their project.
	if !host.Tier.Granted {
		if _, err := host.Addresses().FixAddress(ctx, name, member); err != nil {
			return fmt.Errorf("cloning %s into %s: %w", source, name, err)
		}
	}
	if err := mgr.freshMachineID(ctx, clone); err != nil {
		return fmt.Errorf("giving clone %s a machine-id: %w", name, err)
	}
	if userData {
		if err := mgr.emptyMarkers(ctx, clone); err != nil {
			return fmt.Errorf("emptying the provisioning markers clone %s inherited: %w", name, err)
		}
	}
	if host.Tier.Granted {
		err = host.Incus.Instances().SetState(ctx, name, "start", 0, false)
	} else {
		err = host.Addresses().StartFixed(ctx, name, member)
	}
	if err != nil {
		return fmt.Errorf("starting clone %s: %w", name, err)
	}
	if err := host.Addresses().RefreshStarted(ctx, name); err != nil {
		return fmt.Errorf("cloned %s, but isolating its bridge port failed: %w (run box doctor --fix)", name, err)
	}
	return nil
}

// clusterCopy is a copy request on a cluster: Incus copies across members
// only from a whole definition (a bare copy is refused, "Architecture
// isn't supported"), so the request carries the source's (or its
// snapshot's) config, devices and profiles, as the incus CLI sends them,
// with the NIC's fixed address left out: the source's stays the source's.
func clusterCopy(ctx context.Context, c *incus.Client, inst *incus.Instance, snap string, req incus.InstancesPost) (incus.InstancesPost, error) {
	def := inst
	if snap != "" {
		snaps, err := c.Instances().SnapshotDefinitions(ctx, inst.Name)
		if err != nil {
			return req, err
		}
		i := slices.IndexFunc(snaps, func(s incus.Instance) bool { return s.Name == snap })
		if i < 0 {
			return req, fmt.Errorf("%s has no snapshot %s (box info %s lists them)", inst.Name, snap, inst.Name)
		}
		def = &snaps[i]
	}
	w := def.Writable()
	req.Architecture = w.Architecture
	req.Profiles = w.Profiles
	if req.Profiles == nil {
		req.Profiles = []string{} // nil would be the "default" profile
	}
	req.Config = map[string]string{}
	for k, v := range w.Config {
		// The copy's own volatile state is Incus's to make.
		if !strings.HasPrefix(k, "volatile.") || k == "volatile.base_image" {
			req.Config[k] = v
		}
	}
	req.Devices = w.Devices
	if req.Devices == nil {
		req.Devices = map[string]map[string]string{}
	}
	req.Devices["eth0"] = model.BoxNIC()
	return req, nil
}

// putBack gives a stopped box, just restored, its own MACs back (was is
// the box before the restore) and the policy want. A granted user's
// incus-user may refuse the MACs (volatile keys): their policy goes back
// all the same.
func (mgr *Manager) putBack(ctx context.Context, was *incus.Instance, want model.Policy) error {
	host := mgr.host
	for _, macs := range []bool{true, false} {
		cur, etag, err := host.Incus.Instances().Get(ctx, was.Name)
		if err != nil {
			return err
		}
		put := cur.Writable()
		changed := false
		if macs && cur.Status == "Stopped" {
			for k, v := range was.Config {
				if strings.HasPrefix(k, "volatile.") && strings.HasSuffix(k, ".hwaddr") && put.Config[k] != v {
					put.Config[k] = v
					changed = true
				}
			}
		}
		if !model.PolicyOf(put.Config, put.Devices).Equal(want) {
			if put.Devices == nil {
				put.Devices = map[string]map[string]string{}
			}
			want.ApplyTo(put.Config, put.Devices)
			changed = true
		}
		if !changed {
			return nil
		}
		err = host.Incus.Instances().Update(ctx, was.Name, put, etag)
		switch {
		case err == nil:
			return nil
		case !macs || !host.Tier.Granted:
			return fmt.Errorf("putting its own MAC and its policy back: %w", err)
		}
	}
	return nil
}

// freshMachineID gives a stopped copy (a clone, an import) a machine-id of
// its own before it boots: a container's is written into its disk; a
// VM's disk cannot be written before its agent runs, so Incus writes it
// (machineIDTemplate).
func (mgr *Manager) freshMachineID(ctx context.Context, inst *incus.Instance) error {
	host := mgr.host
	if inst.Type != model.TypeContainer {
		return mgr.machineIDTemplate(ctx, inst.Name)
	}
	id := make([]byte, 16)
	if _, err := rand.Read(id); err != nil {
		return err
	}
	mid := hex.EncodeToString(id) + "\n"
	return host.Incus.Instances().PushFile(ctx, inst.Name, "/etc/machine-id", strings.NewReader(mid), 0o444, 0, 0)
}

// machineIDTemplate has Incus write the instance's /etc/machine-id at its
// next start after a copy: in a VM its agent writes it early in the boot,
// before cloud-init (and reboots a cloud image it seeds).
func (mgr *Manager) machineIDTemplate(ctx context.Context, name string) error {
	return mgr.copyTemplate(ctx, name, MachineIDTemplate, machineIDTemplateText, "/etc/machine-id")
}
