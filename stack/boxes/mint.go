package boxes

import (
	"fmt"
	"strings"

	"cmp"
	"context"
	"errors"
	"maps"
	"time"

	"github.com/box-isolation/box/stack"
	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/model"
)

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

	// Origin is how the box came to be, for its stamp (StampOrigin);
	// "image IMAGE" when empty.
	Origin string
	// Fingerprint, when set, is the local image the box is made from,
	// exactly: no alias is looked up (a name a granted user can create
	// would come first), and Image is only what the stamps say.
	Fingerprint string
	// Standby, when set, is the template whose standby boxes of
	// Fingerprint the box may be taken from (standby.go) before a copy is
	// made.
	Standby string

	// progress hears Incus's progress while it makes the box (a pulled
	// image's download).
	progress func(string)
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

// mintImage is where a box's root comes from.
type mintImage struct {
	source incus.InstanceSource
	// fingerprint is the image's, when known before the box is made (an
	// image on the server); a pulled image's is read back from the box.
	fingerprint string
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

// cacheRace says a pull failed on incusd's own cache of the image
// server's index: two creates that reach the server at once both make its
// cache directory, and the second fails ("mkdir .../cache/HASH: file
// exists", seen with Incus 6.0.4 when four template builds start
// together). Tried again, the index is there.
func cacheRace(err error) bool {
	msg := err.Error()
	return strings.Contains(msg, "/cache/") && strings.Contains(msg, "file exists")
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

// rememberNoMemoryLimits stores the finding on the bridge (best effort: a
// later mint finds it out again).
func (mgr *Manager) rememberNoMemoryLimits(ctx context.Context) {
	host := mgr.host
	net, etag, err := host.Incus.Networks().Get(ctx, model.Current.Network)
	if err != nil {
		return
	}
	cfg := maps.Clone(net.Config)
	cfg[KeyMemoryLimits] = memoryUnsupported
	_ = host.Incus.Networks().Update(ctx, model.Current.Network, incus.NetworkPut{Description: net.Description, Config: cfg}, etag)
}

// Mint creates and starts a box on the isolation stack: the box-net
// profile only, the ownership tag and the stamps. On a host that cannot
// apply a memory limit it mints without one and says so in the box's
// Notes.
func (mgr *Manager) Mint(ctx context.Context, req MintRequest) (*stack.Box, error) {
	host := mgr.host
	if req.Name == "" || req.Image == "" {
		return nil, errors.New("minting a box needs a name and an image")
	}
	typ := cmp.Or(req.Type, model.TypeContainer)
	if err := model.CheckType(typ); err != nil {
		return nil, fmt.Errorf("minting %s: %w", req.Name, err)
	}
	if _, _, err := host.Incus.Instances().Get(ctx, req.Name); err == nil {
		return nil, fmt.Errorf("minting %s: an instance of that name already exists: pick another --name", req.Name)
	} else if !incus.IsNotFound(err) {
		return nil, fmt.Errorf("minting %s: %w", req.Name, err)
	}
	net, etag, err := stack.RequireStack(ctx, host.Incus)
	if err != nil {
		return nil, fmt.Errorf("minting %s: %w", req.Name, err)
	}
	// The record's write tries the bridge as read here first (beside a
	// full bridge every read of it costs).
	bridge := stack.BridgeRead{Network: net, ETag: etag}
	if host.Tier.Granted {
		if err := stack.RequireWatcher(host.NetNS); err != nil {
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
		if _, err := host.Policies().EnsureAllowlist(ctx, model.PolicyID(names), names); err != nil {
			return nil, fmt.Errorf("minting %s: %w", req.Name, err)
		}
		bridge = stack.BridgeRead{} // written since it was read
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
	b, took, err := mgr.take(ctx, req)
	if err != nil {
		return nil, err
	}
	if took != "" {
		notes = append(notes, took)
	}
	if b == nil {
		b, err = mgr.mint(ctx, req, bridge)
	}
	var ns *NotStartedError
	if req.Memory != "" && errors.As(err, &ns) && ns.RemoveErr == nil {
		// The usual reason a fresh box will not start on a small host: a
		// memory cgroup that takes no limit. Try once without; if that
		// starts, the host cannot apply memory limits: say so once and
		// remember it on the stack.
		wanted := req.Memory
		req.Memory = ""
		if b, err2 := mgr.mint(ctx, req, stack.BridgeRead{}); err2 == nil {
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

// mint creates and starts one box as asked; its record's write starts
// from bridge, the bridge as read before (none: read it).
func (mgr *Manager) mint(ctx context.Context, req MintRequest, bridge stack.BridgeRead) (*stack.Box, error) {
	host := mgr.host
	typ := cmp.Or(req.Type, model.TypeContainer)
	img := mintImage{source: incus.InstanceSource{Type: "image", Fingerprint: req.Fingerprint}, fingerprint: req.Fingerprint}
	var err error
	if req.Fingerprint == "" {
		img, err = mgr.mintImage(ctx, req.Image)
	}
	if err != nil {
		return nil, fmt.Errorf("minting %s: %w", req.Name, err)
	}
	cfg := mintConfig(req, typ, img)
	devices := mintDevices(req, host.Options.PoolName())
	req.progress = func(s string) { host.Progressf("minting %s from %s: %s", req.Name, req.Image, s) }
	post := incus.InstancesPost{
		Name: req.Name, Type: typ, Config: cfg, Devices: devices,
		Profiles: []string{model.Current.Profile},
		Source:   img.source,
		Start:    true,
	}
	// The box's policy is recorded before the box exists: a record an
	// earlier box of that name left (removed through Incus alone) is never
	// the new box's, not even at its first refresh (model.EnforcedEgress).
	if err := host.Policies().RecordOn(ctx, bridge, host.Incus.ProjectName(), req.Name, model.PolicyOf(cfg, devices)); err != nil {
		return nil, fmt.Errorf("minting %s: %w", req.Name, err)
	}
	err = host.Addresses().Create(ctx, post, req.Target, req.progress)
	if err != nil && img.pulled(err) && cacheRace(err) {
		// Nothing was made: the pull failed before the instance existed.
		err = host.Addresses().Create(ctx, post, req.Target, req.progress)
	}
	if err != nil {
		_ = host.Policies().Forget(context.WithoutCancel(ctx), host.Incus.ProjectName(), req.Name)
	}
	if err != nil {
		// A box that was created but would not start is no box: remove it
		// rather than leave a tagged, stopped half-box behind (also when
		// the caller gave up: the check runs past its cancellation).
		cctx := context.WithoutCancel(ctx)
		if inst, _, gerr := host.Incus.Instances().Get(cctx, req.Name); gerr == nil {
			rerr := stack.RemoveInstance(cctx, host.Incus, req.Name)
			if rerr == nil {
				// Incus leaves the NIC's veth pair when a start fails.
				host.RemoveLeftPorts(inst)
			}
			return nil, &NotStartedError{Name: req.Name, Err: err, RemoveErr: rerr}
		}
		if img.pulled(err) {
			return nil, fmt.Errorf("minting %s: %w", req.Name, &ImagePullError{Image: req.Image, Server: img.source.Server, Err: err})
		}
		return nil, fmt.Errorf("minting %s: %w", req.Name, err)
	}
	if err := host.Addresses().RefreshStarted(ctx, req.Name); err != nil {
		// A box that is not isolated is not a box: remove it too.
		if rerr := stack.RemoveInstance(context.WithoutCancel(ctx), host.Incus, req.Name); rerr != nil {
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
	} else if n := host.Storage().AccountingNote(ctx, req.Disk); n != "" {
		notes = append(notes, n)
	}
	b, err := stack.Info(ctx, host.Incus, req.Name)
	if b != nil {
		b.Notes = append(b.Notes, notes...)
	}
	return b, err
}

// mintConfig is a new box's config as req asks for it: the ownership tag,
// the stamps, the limits, the user-data and nesting.
// mintDevices are a new box's own devices: its root disk when it is
// given a size.
func mintDevices(req MintRequest, pool string) map[string]map[string]string {
	devices := map[string]map[string]string{}
	if req.Disk != "" {
		devices["root"] = map[string]string{"type": "disk", "path": "/", "pool": pool, "size": req.Disk}
	}
	return devices
}

func mintConfig(req MintRequest, typ string, img mintImage) map[string]string {
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
	cfg[model.StampOrigin] = cmp.Or(req.Origin, "image "+req.Image)
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
	return cfg
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

// stampBaseImage stamps a box with the fingerprint Incus resolved its
// image to (volatile.base_image): known only once a pulled image is made.
func (mgr *Manager) stampBaseImage(ctx context.Context, name string) error {
	host := mgr.host
	inst, etag, err := host.Incus.Instances().Get(ctx, name)
	if err != nil {
		return err
	}
	fp := inst.Config["volatile.base_image"]
	if fp == "" {
		return errors.New("incus recorded no base image")
	}
	put := inst.Writable()
	put.Config[model.StampFingerprint] = fp
	return host.Incus.Instances().Update(ctx, name, put, etag)
}

// resolveImage turns an alias (or a fingerprint) on the server into a
// fingerprint.
func (mgr *Manager) resolveImage(ctx context.Context, image string) (string, error) {
	host := mgr.host
	a, err := host.Incus.Images().Alias(ctx, image)
	if err == nil {
		return a.Target, nil
	}
	if !incus.IsNotFound(err) {
		return "", fmt.Errorf("resolving image %s: %w", image, err)
	}
	img, err := host.Incus.Images().Get(ctx, image)
	if err != nil {
		if incus.IsNotFound(err) {
			return "", fmt.Errorf("no image %s on this server (incus image list shows them): import one (incus image import FILE --alias %s), or name one on an image server (images:ALIAS)", image, image)
		}
		return "", fmt.Errorf("resolving image %s: %w", image, err)
	}
	return img.Fingerprint, nil
}
