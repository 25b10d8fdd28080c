package stack

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/model"
)

// NotABoxError is returned for an instance that exists but that box did
// not mint: every box verb refuses it.
type NotABoxError struct {
	Name   string
	Reason string
}

func (e *NotABoxError) Error() string {
	return fmt.Sprintf("%s is not a box: %s; box only touches instances it minted (manage it with incus directly)", e.Name, e.Reason)
}

// NotStartedError is a box that was created but would not start; it has
// been removed. On small hosts the usual cause is a limit the kernel cannot
// apply (a memory cgroup that takes none).
type NotStartedError struct {
	Name      string
	Err       error
	RemoveErr error // removing the half-made box failed too
}

func (e *NotStartedError) Error() string {
	if e.RemoveErr != nil {
		return fmt.Sprintf("minting %s: it was created but would not start (%v), and removing it failed: %v (remove it by hand: incus delete --force %s)", e.Name, e.Err, e.RemoveErr, e.Name)
	}
	return fmt.Sprintf("minting %s: it was created but would not start, and was removed: %v", e.Name, e.Err)
}

func (e *NotStartedError) Unwrap() error { return e.Err }

// NoSuchBoxError is returned when no instance has the name.
type NoSuchBoxError struct{ Name string }

func (e *NoSuchBoxError) Error() string {
	return fmt.Sprintf("no box named %s (box list shows yours)", e.Name)
}

// Box is a box as `box list` and `box info` show it.
type Box struct {
	Name       string            `json:"name"`
	Status     string            `json:"status"`
	Type       string            `json:"type"`
	Generation string            `json:"generation"` // current or legacy tag
	Created    time.Time         `json:"created"`
	Stamps     map[string]string `json:"stamps"`
	Profiles   []string          `json:"profiles"`
	// Member is the cluster member the box is on; empty off a cluster.
	Member string `json:"member,omitempty"`
	// OnStack is what the fleet census says (nil when it could not be
	// taken, e.g. without the privileges to read nft); OffStack says why
	// not.
	OnStack  *bool    `json:"on_stack,omitempty"`
	OffStack []string `json:"off_stack,omitempty"`
	// Notes say what minting it decided on its own (no memory limit).
	Notes []string `json:"notes,omitempty"`
}

// isBox reports whether an instance carries either ownership tag, and which.
func isBox(i *incus.Instance) (string, bool) {
	switch {
	case i.Config[model.Current.Tag] == "1":
		return model.Current.Name, true
	case i.Config[model.Legacy.Tag] == "1":
		return model.Legacy.Name, true
	}
	return "", false
}

func boxOf(i *incus.Instance, gen string) Box {
	b := Box{Name: i.Name, Status: i.Status, Type: i.Type, Generation: gen, Created: i.CreatedAt, Stamps: map[string]string{}, Profiles: i.Profiles}
	if i.Location != "none" {
		// A standalone incusd says "none".
		b.Member = i.Location
	}
	for k, v := range i.Config {
		if strings.HasPrefix(k, model.StampPrefix) {
			b.Stamps[k] = v
		}
	}
	return b
}

// boxFilter is the one server-side filter for both tags.
var boxFilter = fmt.Sprintf("config.%s eq 1 or config.%s eq 1", model.Current.Tag, model.Legacy.Tag)

// Boxes lists every box, of either tag, in one request.
func (host *Host) Boxes(ctx context.Context) ([]Box, error) {
	insts, err := host.Incus.InstancesWhere(ctx, boxFilter)
	if err != nil {
		return nil, fmt.Errorf("listing boxes: %w", err)
	}
	out := []Box{}
	for i := range insts {
		// The filter is the server's; the tag check is ours.
		if gen, ok := isBox(&insts[i]); ok {
			out = append(out, boxOf(&insts[i], gen))
		}
	}
	sort.Slice(out, func(a, b int) bool { return out[a].Name < out[b].Name })
	return out, nil
}

// resolve finds a box by name through the tag: every operation on a named
// box goes through here first.
func (host *Host) resolve(ctx context.Context, name string) (*incus.Instance, string, error) {
	inst, etag, err := host.Incus.Instance(ctx, name)
	if incus.IsNotFound(err) {
		return nil, "", &NoSuchBoxError{Name: name}
	}
	if err != nil {
		return nil, "", fmt.Errorf("looking up %s: %w", name, err)
	}
	if _, ok := isBox(inst); !ok {
		return nil, "", &NotABoxError{Name: name, Reason: fmt.Sprintf("it has no %s=1 tag", model.Current.Tag)}
	}
	return inst, etag, nil
}

// Info returns one box.
func (host *Host) Info(ctx context.Context, name string) (*Box, error) {
	inst, _, err := host.resolve(ctx, name)
	if err != nil {
		return nil, err
	}
	gen, _ := isBox(inst)
	b := boxOf(inst, gen)
	return &b, nil
}

// NewBoxType is DecideType for this host: incusd is asked what it can run
// only when the operator did not choose.
func (mgr *Manager) NewBoxType(ctx context.Context, want string) (model.TypeDecision, error) {
	host := mgr.host
	if want != "" {
		return model.DecideType(nil, want)
	}
	srv, err := host.Incus.Server(ctx)
	if err != nil {
		return model.TypeDecision{}, err
	}
	return model.DecideType(srv, "")
}

// MintRequest describes a new box.
type MintRequest struct {
	Name string
	// Image is an alias or fingerprint on the server, or REMOTE:ALIAS,
	// which Incus pulls from that image server (Host.IncusConfigDir).
	Image string
	// Type is TypeContainer (when empty) or TypeVM; DecideType says which
	// box new makes.
	Type string
	// CPU, Memory and Disk are Incus limits (e.g. "2", "4GiB", "20GiB");
	// empty leaves the default.
	CPU, Memory, Disk string
	// UserData is cloud-init user-data.
	UserData string
	// Stamps are extra stamp keys (template, user, version).
	Stamps map[string]string
	// Egress is the box's allowlist of names; nil leaves it open.
	Egress []string
	// Target is, on a cluster, the member to mint it on; empty leaves the
	// placement to Incus.
	Target string
	// Nesting lets containers run inside the box (Docker): it sets
	// NestingConfig on the instance. The one way to ask for it.
	Nesting bool
	// Processes and CPUAllowance are limits.processes and
	// limits.cpu.allowance (limits.go); empty leaves them unset.
	Processes, CPUAllowance string
	// IsolatedIDMap gives the box a host id range of its own
	// (security.idmap.isolated), shared with no other instance.
	IsolatedIDMap bool

	// progress hears Incus's progress while it makes the box (a pulled
	// image's download).
	progress func(string)
}

// NoStackError is a box verb on a host with no isolation stack.
type NoStackError struct{ Missing string }

func (e *NoStackError) Error() string {
	return fmt.Sprintf("there is no isolation stack on this host (%s is missing): run `box setup-host` first (as root)", e.Missing)
}

// RequireStack returns the stack's bridge, or a NoStackError naming what
// is missing; a daemon that does not answer is incus's own error.
func (host *Host) RequireStack(ctx context.Context) (*incus.Network, error) {
	net, _, err := host.Incus.Network(ctx, model.Current.Network)
	if incus.IsNotFound(err) {
		return nil, &NoStackError{Missing: "network " + model.Current.Network}
	}
	if err != nil {
		return nil, err
	}
	if _, _, err := host.Incus.Profile(ctx, model.Current.Profile); incus.IsNotFound(err) {
		return nil, &NoStackError{Missing: "profile " + model.Current.Profile}
	} else if err != nil {
		return nil, err
	}
	return net, nil
}

// KeyMemoryLimits on the bridge records that this host cannot apply a
// memory limit (memoryUnsupported), found by a mint that failed to start
// with one and started without.
const (
	KeyMemoryLimits   = "user.box.memory_limits"
	memoryUnsupported = "unsupported"
	// NoteNoMemoryLimit starts the note of a box minted without its
	// memory limit.
	NoteNoMemoryLimit = "no memory limit"
)

// rememberNoMemoryLimits stores the finding on the bridge (best effort: a
// later mint finds it out again).
func (mgr *Manager) rememberNoMemoryLimits(ctx context.Context) {
	host := mgr.host
	net, etag, err := host.Incus.Network(ctx, model.Current.Network)
	if err != nil {
		return
	}
	cfg := maps.Clone(net.Config)
	cfg[KeyMemoryLimits] = memoryUnsupported
	_ = host.Incus.UpdateNetwork(ctx, model.Current.Network, incus.NetworkPut{Description: net.Description, Config: cfg}, etag)
}

// Mint creates and starts a box on the isolation stack: the box-net
// profile only, the ownership tag and the stamps. On a host that cannot
// apply a memory limit it mints without one and says so in the box's
// Notes.
func (mgr *Manager) Mint(ctx context.Context, req MintRequest) (*Box, error) {
	host := mgr.host
	if req.Name == "" || req.Image == "" {
		return nil, errors.New("minting a box needs a name and an image")
	}
	typ := cmp.Or(req.Type, model.TypeContainer)
	if err := model.CheckType(typ); err != nil {
		return nil, fmt.Errorf("minting %s: %w", req.Name, err)
	}
	if _, _, err := host.Incus.Instance(ctx, req.Name); err == nil {
		return nil, fmt.Errorf("minting %s: an instance of that name already exists: pick another --name", req.Name)
	} else if !incus.IsNotFound(err) {
		return nil, fmt.Errorf("minting %s: %w", req.Name, err)
	}
	net, err := host.RequireStack(ctx)
	if err != nil {
		return nil, fmt.Errorf("minting %s: %w", req.Name, err)
	}
	if host.Tier {
		if err := host.RequireWatcher(); err != nil {
			return nil, fmt.Errorf("minting %s: %w", req.Name, err)
		}
	}
	if req.Egress != nil {
		// The policy exists before the box does, so its first refresh
		// puts it under the allowlist.
		names, err := model.NormalizeNames(req.Egress)
		if err != nil {
			return nil, fmt.Errorf("minting %s: %w", req.Name, err)
		}
		if _, err := host.ensurePolicy(ctx, model.PolicyID(names), names); err != nil {
			return nil, fmt.Errorf("minting %s: %w", req.Name, err)
		}
		req.Stamps = maps.Clone(req.Stamps)
		if req.Stamps == nil {
			req.Stamps = map[string]string{}
		}
		req.Stamps[model.KeyEgress] = model.PolicyID(names)
		req.Stamps[model.KeyEgressNames] = strings.Join(names, ",")
	}
	var notes []string
	if req.Memory != "" && net.Config[KeyMemoryLimits] == memoryUnsupported {
		notes = append(notes, fmt.Sprintf("%s: this host cannot apply one (%s=%s on %s, found at an earlier mint)", NoteNoMemoryLimit, KeyMemoryLimits, memoryUnsupported, model.Current.Network))
		req.Memory = ""
	}
	b, err := mgr.mint(ctx, req)
	var ns *NotStartedError
	if req.Memory != "" && errors.As(err, &ns) && ns.RemoveErr == nil {
		// The usual reason a fresh box will not start on a small host: a
		// memory cgroup that takes no limit. Try once without; if that
		// starts, the host cannot apply memory limits: say so once and
		// remember it on the stack.
		wanted := req.Memory
		req.Memory = ""
		if b, err2 := mgr.mint(ctx, req); err2 == nil {
			b.Notes = append(notes, fmt.Sprintf("%s: this host cannot apply one (the start with limits.memory=%s failed, the same box without it started); later mints skip it", NoteNoMemoryLimit, wanted))
			mgr.rememberNoMemoryLimits(ctx)
			return b, nil
		}
	}
	if b != nil {
		b.Notes = append(notes, b.Notes...)
	}
	return b, err
}

// mint creates and starts one box as asked.
func (mgr *Manager) mint(ctx context.Context, req MintRequest) (*Box, error) {
	host := mgr.host
	typ := cmp.Or(req.Type, model.TypeContainer)
	img, err := mgr.mintImage(ctx, req.Image)
	if err != nil {
		return nil, fmt.Errorf("minting %s: %w", req.Name, err)
	}
	cfg := map[string]string{model.Current.Tag: "1"}
	maps.Copy(cfg, req.Stamps)
	cfg[model.StampMinted] = time.Now().UTC().Format(time.RFC3339)
	cfg[model.StampImage] = req.Image
	if img.fingerprint != "" {
		cfg[model.StampFingerprint] = img.fingerprint
	}
	if img.source.Server != "" {
		cfg[model.StampImageServer] = img.source.Server
	}
	cfg[model.StampType] = typ
	cfg[model.StampOrigin] = "image " + req.Image
	if req.CPU != "" {
		cfg["limits.cpu"] = req.CPU
	}
	if req.Memory != "" {
		cfg["limits.memory"] = req.Memory
	}
	withLimits(cfg, req)
	if req.UserData != "" {
		cfg["cloud-init.user-data"] = req.UserData
	}
	if req.Nesting {
		model.WithNesting(cfg)
	}
	devices := map[string]map[string]string{}
	if req.Disk != "" {
		devices["root"] = map[string]string{"type": "disk", "path": "/", "pool": host.Pool(), "size": req.Disk}
	}
	req.progress = func(s string) { host.progressf("minting %s from %s: %s", req.Name, req.Image, s) }
	err = host.create(ctx, req, incus.InstancesPost{
		Name: req.Name, Type: typ, Config: cfg, Devices: devices,
		Profiles: []string{model.Current.Profile},
		Source:   img.source,
		Start:    true,
	})
	if err != nil {
		// A box that was created but would not start is no box: remove it
		// rather than leave a tagged, stopped half-box behind (also when
		// the caller gave up: the check runs past its cancellation).
		cctx := context.WithoutCancel(ctx)
		if inst, _, gerr := host.Incus.Instance(cctx, req.Name); gerr == nil {
			rerr := host.RemoveInstance(cctx, req.Name)
			if rerr == nil {
				// Incus leaves the NIC's veth pair when a start fails.
				host.removeLeftPorts(inst)
			}
			return nil, &NotStartedError{Name: req.Name, Err: err, RemoveErr: rerr}
		}
		if img.pulled(err) {
			return nil, fmt.Errorf("minting %s: %w", req.Name, &ImagePullError{Image: req.Image, Server: img.source.Server, Err: err})
		}
		return nil, fmt.Errorf("minting %s: %w", req.Name, err)
	}
	if _, err := host.RefreshPorts(ctx); err != nil {
		// A box that is not isolated is not a box: remove it too.
		if rerr := host.RemoveInstance(context.WithoutCancel(ctx), req.Name); rerr != nil {
			err = errors.Join(err, fmt.Errorf("removing it: %w (remove it by hand: incus delete --force %s)", rerr, req.Name))
		}
		return nil, fmt.Errorf("minting %s: isolating its bridge port failed, so it was not kept: %w", req.Name, err)
	}
	var notes []string
	if img.fingerprint == "" {
		if err := mgr.stampBaseImage(ctx, req.Name); err != nil {
			notes = append(notes, fmt.Sprintf("the fingerprint %s resolved to is not stamped: %v", req.Image, err))
		}
	}
	if n := mgr.diskLimitNote(ctx, req); n != "" {
		notes = append(notes, n)
	} else if n := host.accountingNote(ctx, req); n != "" {
		notes = append(notes, n)
	}
	b, err := host.Info(ctx, req.Name)
	if b != nil {
		b.Notes = append(b.Notes, notes...)
	}
	return b, err
}

func (host *Host) Pool() string {
	if host.Options.Pool != "" {
		return host.Options.Pool
	}
	return "default"
}

// mintImage is where a box's root comes from.
type mintImage struct {
	source incus.InstanceSource
	// fingerprint is the image's, when known before the box is made (an
	// image on the server); a pulled image's is read back from the box.
	fingerprint string
}

// mintImage resolves the image a box is minted from: an alias or
// fingerprint on the server (local:NAME, or no remote), or REMOTE:ALIAS
// through the incus CLI's remotes, which incusd pulls and caches itself.
// Nothing here asks the image server: a server that is down must not stop
// a mint Incus can make from its cache.
func (mgr *Manager) mintImage(ctx context.Context, image string) (mintImage, error) {
	host := mgr.host
	remotes, err := incus.LoadRemotes(host.IncusConfigDir)
	if err != nil {
		return mintImage{}, err
	}
	remote, name, err := remotes.Lookup(image)
	if err != nil {
		return mintImage{}, err
	}
	if remote != nil {
		src, err := remote.PullSource(name)
		return mintImage{source: src}, err
	}
	fp, err := mgr.resolveImage(ctx, name)
	if err != nil {
		return mintImage{}, err
	}
	return mintImage{source: incus.InstanceSource{Type: "image", Fingerprint: fp}, fingerprint: fp}, nil
}

// pulled says a failed create failed on pulling the image: incusd could
// not resolve it on the image server ("Failed getting remote image info",
// what it says when the server is unreachable and it has never fetched
// the server's index), or its error names the server.
func (img mintImage) pulled(err error) bool {
	if img.source.Server == "" {
		return false
	}
	msg := err.Error()
	host := strings.TrimPrefix(strings.TrimPrefix(img.source.Server, "https://"), "http://")
	return strings.Contains(msg, "remote image info") || strings.Contains(msg, host)
}

// ImagePullError is a mint whose image Incus could not pull from its image
// server and did not have: nothing was made.
type ImagePullError struct {
	Image, Server string
	Err           error
}

func (e *ImagePullError) Error() string {
	return fmt.Sprintf("incusd could not get %s from the image server %s, and has no copy of it: %v\n"+
		"offline, or with the server down: import an image file (incus image import FILE --alias NAME) and mint with --image NAME (or BOX_IMAGE=NAME), or pass --image with an image already here (incus image list)",
		e.Image, e.Server, e.Err)
}

func (e *ImagePullError) Unwrap() error { return e.Err }

// stampBaseImage stamps a box with the fingerprint Incus resolved its
// image to (volatile.base_image): known only once a pulled image is made.
func (mgr *Manager) stampBaseImage(ctx context.Context, name string) error {
	host := mgr.host
	inst, etag, err := host.Incus.Instance(ctx, name)
	if err != nil {
		return err
	}
	fp := inst.Config["volatile.base_image"]
	if fp == "" {
		return errors.New("incus recorded no base image")
	}
	put := inst.Writable()
	put.Config[model.StampFingerprint] = fp
	return host.Incus.UpdateInstance(ctx, name, put, etag)
}

// resolveImage turns an alias (or a fingerprint) on the server into a
// fingerprint.
func (mgr *Manager) resolveImage(ctx context.Context, image string) (string, error) {
	host := mgr.host
	a, err := host.Incus.ImageAlias(ctx, image)
	if err == nil {
		return a.Target, nil
	}
	if !incus.IsNotFound(err) {
		return "", fmt.Errorf("resolving image %s: %w", image, err)
	}
	img, err := host.Incus.Image(ctx, image)
	if err != nil {
		if incus.IsNotFound(err) {
			return "", fmt.Errorf("no image %s on this server (incus image list shows them): import one (incus image import FILE --alias %s), or name one on an image server (images:ALIAS)", image, image)
		}
		return "", fmt.Errorf("resolving image %s: %w", image, err)
	}
	return img.Fingerprint, nil
}

// CloneResult says how a clone came to be.
type CloneResult struct {
	Box *Box `json:"box"`
	// SourceStopped is set when the source had to be stopped for the copy
	// (a host that cannot freeze containers cannot copy a running one).
	SourceStopped bool `json:"source_stopped"`
	// DoorsDropped names the source's doors the clone did not get.
	DoorsDropped []string `json:"doors_dropped,omitempty"`
	// Provisioning is what the clone's cloud-init does at its first boot:
	// ProvisionChecks, ProvisionAgain, or "" (no user-data).
	Provisioning string `json:"provisioning,omitempty"`
}

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
	inst, _, err := host.resolve(ctx, src)
	if err != nil {
		return nil, err
	}
	if _, _, err := host.Incus.Instance(ctx, name); err == nil {
		return nil, fmt.Errorf("cloning %s: an instance named %s already exists: pick another --name", src, name)
	}
	ci, err := host.Cluster(ctx)
	if err != nil {
		return nil, fmt.Errorf("cloning %s: %w", src, err)
	}
	if target != "" && !ci.Clustered() {
		return nil, fmt.Errorf("cloning %s: --target %s: this incusd is not a cluster member", src, target)
	}
	if err := ci.checkMember(target); err != nil {
		return nil, fmt.Errorf("cloning %s: %w", src, err)
	}
	source := src
	if snap != "" {
		source = src + "/" + snap
	}
	res := &CloneResult{}
	copyReq := incus.InstancesPost{Name: name, Type: inst.Type, Source: incus.InstanceSource{Type: "copy", Source: source}}
	cl := host.Incus
	if ci.Clustered() {
		if copyReq, err = mgr.clusterCopy(ctx, inst, snap, copyReq); err != nil {
			return nil, fmt.Errorf("cloning %s: %w", source, err)
		}
		if target != "" {
			cl = cl.Target(target)
		}
	}
	err = cl.CreateInstance(ctx, copyReq)
	if err != nil && snap == "" && inst.Status == "Running" && needsColdCopy(err) {
		// This host cannot freeze a running container to copy it
		// consistently (nor, on a cluster, migrate it live to another
		// member): stop the source for the copy and start it again.
		if serr := host.Incus.SetInstanceState(ctx, src, "stop", 60*time.Second, false); serr != nil {
			return nil, fmt.Errorf("cloning %s: %w; stopping it for a cold copy: %v", src, err, serr)
		}
		res.SourceStopped = true
		err = cl.CreateInstance(ctx, copyReq)
	}
	// A source stopped for the copy starts again once the copy no longer
	// asks for its fixed address (the re-stamp below, or the copy's
	// removal): Incus refuses to start a NIC whose address another NIC
	// asks for.
	stopped := res.SourceStopped
	restartSource := func() error {
		if !stopped {
			return nil
		}
		stopped = false
		if serr := host.Incus.SetInstanceState(context.WithoutCancel(ctx), src, "start", 0, false); serr != nil {
			return fmt.Errorf("restarting %s after the copy: %w", src, serr)
		}
		return nil
	}
	if err != nil {
		return nil, errors.Join(fmt.Errorf("cloning %s into %s: %w", source, name, err), restartSource())
	}

	// From here on a failure leaves a copy that is not yet a proper box
	// (an inherited identity): remove it rather than leave it behind.
	defer func() {
		if err != nil {
			if rerr := host.RemoveInstance(context.WithoutCancel(ctx), name); rerr != nil && !incus.IsNotFound(rerr) {
				err = errors.Join(err, fmt.Errorf("removing the half-made clone %s: %w", name, rerr))
			}
			err = errors.Join(err, restartSource())
		}
	}()

	// A fresh identity before the first boot: no inherited MAC, a new
	// machine-id (a shared one means one DHCP lease for two boxes).
	clone, etag, err := host.Incus.Instance(ctx, name)
	if err != nil {
		return nil, err
	}
	put := clone.Writable()
	forgetMACs(put.Config)
	put.Config[model.Current.Tag] = "1"
	put.Config[model.StampMinted] = time.Now().UTC().Format(time.RFC3339)
	put.Config[model.StampOrigin] = "clone of " + source
	// The source's doors stay the source's: the clone would take their
	// host port (and fail to start) or their socket.
	res.DoorsDropped = withoutDoors(put.Devices)
	// So does its fixed address: the clone gets its own (below).
	withoutFixedAddress(put.Devices)
	// Not provisioned again (cloneprov.go).
	res.Provisioning = cloneUserData(put.Config, name)
	if err := host.Incus.UpdateInstance(ctx, name, put, etag); err != nil {
		return nil, fmt.Errorf("re-stamping clone %s: %w", name, err)
	}
	if err := restartSource(); err != nil {
		return nil, err
	}
	member, err := host.memberOf(ctx, clone)
	if err != nil {
		return nil, err
	}
	if _, err := host.fixAddress(ctx, name, member); err != nil {
		return nil, fmt.Errorf("cloning %s into %s: %w", source, name, err)
	}
	if err := mgr.freshMachineID(ctx, clone); err != nil {
		return nil, fmt.Errorf("giving clone %s a machine-id: %w", name, err)
	}
	if res.Provisioning != "" {
		if err := mgr.emptyMarkers(ctx, clone); err != nil {
			return nil, fmt.Errorf("emptying the provisioning markers clone %s inherited: %w", name, err)
		}
	}
	if err = host.startFixed(ctx, name, member); err != nil {
		return nil, fmt.Errorf("starting clone %s: %w", name, err)
	}
	if _, err := host.RefreshPorts(ctx); err != nil {
		return nil, fmt.Errorf("cloned %s, but isolating its bridge port failed: %w (run box doctor --fix)", name, err)
	}
	res.Box, err = host.Info(ctx, name)
	return res, err
}

// needsColdCopy says a copy of a running container failed only because it
// ran: this host cannot freeze it, or (to another member) migrate it live.
func needsColdCopy(err error) bool {
	return strings.Contains(err.Error(), "freezing") || strings.Contains(err.Error(), "live container migration")
}

// clusterCopy is a copy request on a cluster: Incus copies across members
// only from a whole definition (a bare copy is refused, "Architecture
// isn't supported"), so the request carries the source's (or its
// snapshot's) config, devices and profiles, as the incus CLI sends them,
// with the NIC's fixed address left out: the source's stays the source's.
func (mgr *Manager) clusterCopy(ctx context.Context, inst *incus.Instance, snap string, req incus.InstancesPost) (incus.InstancesPost, error) {
	host := mgr.host
	def := inst
	if snap != "" {
		snaps, err := host.Incus.SnapshotDefinitions(ctx, inst.Name)
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

// keepMACs puts back the MACs a stopped instance had (as was, before a
// restore changed them).
func (mgr *Manager) keepMACs(ctx context.Context, was *incus.Instance) error {
	host := mgr.host
	cur, etag, err := host.Incus.Instance(ctx, was.Name)
	if err != nil || cur.Status != "Stopped" {
		return err
	}
	put := cur.Writable()
	changed := false
	for k, v := range was.Config {
		if strings.HasPrefix(k, "volatile.") && strings.HasSuffix(k, ".hwaddr") && put.Config[k] != v {
			put.Config[k] = v
			changed = true
		}
	}
	if !changed {
		return nil
	}
	if err := host.Incus.UpdateInstance(ctx, was.Name, put, etag); err != nil {
		return fmt.Errorf("keeping its own MAC: %w", err)
	}
	return nil
}

// withoutFixedAddress drops the fixed address of a copy's own NIC on the
// bridge: it is its source's.
func withoutFixedAddress(devices map[string]map[string]string) {
	for _, d := range devices {
		if model.IsNIC(d) && model.OnBridge(model.Current.Network, d) {
			delete(d, "ipv4.address")
		}
	}
}

// forgetMACs drops the MACs Incus gave a copy's NICs (volatile.<nic>.hwaddr),
// so it draws new ones at its first start.
func forgetMACs(cfg map[string]string) {
	for k := range cfg {
		if strings.HasPrefix(k, "volatile.") && strings.HasSuffix(k, ".hwaddr") {
			delete(cfg, k)
		}
	}
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
	return host.Incus.PushFile(ctx, inst.Name, "/etc/machine-id", strings.NewReader(mid), 0o444, 0, 0)
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

// machineIDTemplate has Incus write the instance's /etc/machine-id at its
// next start after a copy: in a VM its agent writes it early in the boot,
// before cloud-init (and reboots a cloud image it seeds).
func (mgr *Manager) machineIDTemplate(ctx context.Context, name string) error {
	return mgr.copyTemplate(ctx, name, MachineIDTemplate, machineIDTemplateText, "/etc/machine-id")
}

// Snapshot takes a snapshot; an empty label gets a time-stamped name.
func (mgr *Manager) Snapshot(ctx context.Context, name, label string) (string, error) {
	host := mgr.host
	if _, _, err := host.resolve(ctx, name); err != nil {
		return "", err
	}
	if label == "" {
		label = "snap-" + time.Now().UTC().Format("20060102-150405")
	}
	if err := host.Incus.CreateSnapshot(ctx, name, label); err != nil {
		if strings.Contains(err.Error(), "freezing") {
			return "", fmt.Errorf("snapshotting %s: this host cannot freeze a running container: stop it first (box down %s)", name, name)
		}
		return "", fmt.Errorf("snapshotting %s: %w", name, err)
	}
	return label, nil
}

// Snapshots lists a box's snapshots.
func (mgr *Manager) Snapshots(ctx context.Context, name string) ([]incus.Snapshot, error) {
	host := mgr.host
	if _, _, err := host.resolve(ctx, name); err != nil {
		return nil, err
	}
	return host.Incus.Snapshots(ctx, name)
}

// Restore rolls a box back to a snapshot. A stopped box keeps its own
// MAC: Incus restores the snapshot's volatile keys, and a snapshot a clone
// carried holds its source's (two boxes with one MAC), while the box's
// lease is its own MAC's.
func (mgr *Manager) Restore(ctx context.Context, name, snap string) error {
	host := mgr.host
	inst, _, err := host.resolve(ctx, name)
	if err != nil {
		return err
	}
	if err := host.Incus.RestoreSnapshot(ctx, name, snap); err != nil {
		return fmt.Errorf("restoring %s to %s: %w", name, snap, err)
	}
	if err := mgr.keepMACs(ctx, inst); err != nil && !host.Tier {
		return fmt.Errorf("restored %s to %s, but: %w", name, snap, err)
	}
	if err := host.readdressIfTaken(ctx, name); err != nil && !host.Tier {
		return fmt.Errorf("restored %s to %s, but: %w", name, snap, err)
	}
	_, err = host.RefreshPorts(ctx)
	return err
}

// Start starts a box. A box without a fixed address gets one first
// (L-DHCP): on a cluster the one it held when a move of it stopped
// half-way, else the one it still leases, else a free one of its member's
// slice (a box minted before box gave them). A granted user's gets one
// from the port watcher once it runs.
func (mgr *Manager) Start(ctx context.Context, name string) error {
	host := mgr.host
	inst, _, err := host.resolve(ctx, name)
	if err != nil {
		return err
	}
	member, err := host.memberOf(ctx, inst)
	if err != nil {
		return fmt.Errorf("starting %s: %w", name, err)
	}
	if host.Tier {
		err = host.Incus.SetInstanceState(ctx, name, "start", 0, false)
	} else {
		if !model.FixedAddressOf(inst).IsValid() {
			if a := movingAddress(inst); a.IsValid() {
				_, err = host.landAddress(ctx, name, member, a)
			} else {
				_, err = host.ensureFixed(ctx, inst, member)
			}
			if err != nil {
				return fmt.Errorf("starting %s: %w", name, err)
			}
		}
		err = host.startFixed(ctx, name, member)
	}
	if err != nil {
		return fmt.Errorf("starting %s: %w", name, err)
	}
	_, err = host.RefreshPorts(ctx)
	return err
}

// memberOf is the cluster member an instance is on; "" off a cluster.
func (host *Host) memberOf(ctx context.Context, inst *incus.Instance) (string, error) {
	ci, err := host.Cluster(ctx)
	if err != nil || !ci.Clustered() {
		return "", err
	}
	return inst.Location, nil
}

// Stop stops a box, cleanly within a minute or at once with force, and
// takes its port out of the bridge drop's port set (on whatever member it
// is: a stale name there is a doctor finding).
func (mgr *Manager) Stop(ctx context.Context, name string, force bool) error {
	host := mgr.host
	if _, _, err := host.resolve(ctx, name); err != nil {
		return err
	}
	if err := host.Incus.SetInstanceState(ctx, name, "stop", time.Minute, force); err != nil {
		return fmt.Errorf("stopping %s: %w", name, err)
	}
	if host.Tier {
		return nil // the port watcher's to refresh
	}
	if _, err := host.RefreshPorts(ctx); err != nil {
		return fmt.Errorf("stopped %s, but refreshing the bridge ports failed: %w (run box doctor --fix)", name, err)
	}
	return nil
}

// Remove deletes a box with its snapshots, stopping it first, and drops
// its port from the bridge drop's port set.
func (mgr *Manager) Remove(ctx context.Context, name string) error {
	host := mgr.host
	inst, _, err := host.resolve(ctx, name)
	if err != nil {
		return err
	}
	if err := host.RemoveInstance(ctx, name); err != nil {
		return err
	}
	for _, d := range inst.Devices {
		if d["type"] == "proxy" && d[DoorTag] == "1" {
			removeDoorSocket(d)
		}
	}
	_, err = host.RefreshPorts(ctx)
	return err
}

func (host *Host) RemoveInstance(ctx context.Context, name string) error {
	inst, _, err := host.Incus.Instance(ctx, name)
	if err != nil {
		return fmt.Errorf("removing %s: %w", name, err)
	}
	// The status from the instance, not its state: incusd answers 500
	// "invalid PID" for the state of a box whose start just failed.
	if inst.Status != "Stopped" {
		if err := host.Incus.SetInstanceState(ctx, name, "stop", 0, true); err != nil {
			return fmt.Errorf("stopping %s to remove it: %w", name, err)
		}
	}
	if err := host.Incus.DeleteInstance(ctx, name); err != nil {
		return fmt.Errorf("removing %s: %w", name, err)
	}
	return nil
}

// Rename renames a stopped box; a running one is refused with the fix.
func (mgr *Manager) Rename(ctx context.Context, name, newName string) error {
	host := mgr.host
	inst, _, err := host.resolve(ctx, name)
	if err != nil {
		return err
	}
	if inst.Status != "Stopped" {
		return fmt.Errorf("%s is %s: stop it first (box down %s), then rename it", name, strings.ToLower(inst.Status), name)
	}
	if err := host.Incus.RenameInstance(ctx, name, newName); err != nil {
		return fmt.Errorf("renaming %s: %w", name, err)
	}
	if err := (&Doors{host: host}).renameDoors(ctx, newName); err != nil {
		return fmt.Errorf("renamed %s to %s, but: %w", name, newName, err)
	}
	return nil
}

// WaitAddress waits until a box has an IPv4 address on the stack's subnet,
// read from Incus's view of its interfaces (whatever they are named).
func (host *Host) WaitAddress(ctx context.Context, name string, limit time.Duration) (netip.Addr, error) {
	net, _, err := host.Incus.Network(ctx, model.Current.Network)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("reading network %s: %w", model.Current.Network, err)
	}
	p, err := netip.ParsePrefix(net.Config["ipv4.address"])
	if err != nil && host.Tier {
		// A granted user sees no network's config, only its state.
		p, err = host.bridgeSubnetFromState(ctx)
	}
	if err != nil {
		return netip.Addr{}, fmt.Errorf("network %s has no usable ipv4.address", model.Current.Network)
	}
	ip, err := host.Incus.WaitAddress(ctx, name, p.Masked(), limit)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("%w: is dnsmasq serving %s? (box doctor)", err, model.Current.Network)
	}
	// The box holds its address now: a refresh pins a granted user's box
	// (the watcher gave it its address) and fills its egress sets.
	_, err = host.RefreshPorts(ctx)
	return ip, err
}

// names lists boxes' names, for messages.
func names(bs []Box) []string {
	out := make([]string, len(bs))
	for i, b := range bs {
		out[i] = b.Name
	}
	return out
}

// bridgeSubnetFromState reads the bridge's IPv4 subnet from its state.
func (host *Host) bridgeSubnetFromState(ctx context.Context) (netip.Prefix, error) {
	st, err := host.Incus.NetworkState(ctx, model.Current.Network)
	if err != nil {
		return netip.Prefix{}, err
	}
	for _, a := range st.Addresses {
		if a.Family == "inet" && a.Scope == "global" {
			return netip.ParsePrefix(a.Address + "/" + a.Netmask)
		}
	}
	return netip.Prefix{}, fmt.Errorf("%s has no IPv4 address", model.Current.Network)
}

// Manager runs the box lifecycle on a host, behind the ownership tag.
type Manager struct {
	host *Host
}

// NewManager is the box manager of host.
func NewManager(host *Host) *Manager { return &Manager{host: host} }

// Doors opens and closes a host's loopback doors to its boxes.
type Doors struct {
	host *Host
}

// NewDoors is the door keeper of host.
func NewDoors(host *Host) *Doors { return &Doors{host: host} }
