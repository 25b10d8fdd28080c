package boxes

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/box-isolation/box/internal/atomicfile"
	"github.com/box-isolation/box/stack"
	"github.com/box-isolation/box/stack/hostns"
	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/model"
	"github.com/box-isolation/box/templates"
)

// Template images (docs/images.md, "Template images"). A template is built
// once per host into a local image: a builder box minted on the stack like
// any box (same profile, isolation and fixed address; open egress),
// provisioned by the template's user-data, checked, made anonymous, stopped
// and published. box records the image's fingerprint where only root can
// write (TemplateImagesFile), with what it was built from; every box of the
// template is then a copy of that image, minted by fingerprint (an alias
// is for people to read: a granted user can move one). An image whose
// template hash no longer matches is stale and built again at the next
// mint; the old image goes when the new one replaces it.

// TemplateImage is a template's image as box recorded it when it built it.
type TemplateImage struct {
	Template    string `json:"template"`
	Fingerprint string `json:"fingerprint"`
	// Hash is the template's (templates.Template.Hash) it was built from.
	Hash string `json:"hash"`
	// Base is the image the builder was minted from (REMOTE:ALIAS), and
	// BaseFingerprint what it resolved to.
	Base            string `json:"base"`
	BaseFingerprint string `json:"base_fingerprint"`
	// BaseServer is the image server Base was pulled from ("" for an
	// image that was already here).
	BaseServer string    `json:"base_server,omitempty"`
	BoxVersion string    `json:"box_version"`
	Built      time.Time `json:"built"`
	// BuildSeconds is the whole build's; ProvisionSeconds its part until
	// the builder reported ready (what a mint provisioned in the box
	// costs), PublishSeconds the publish's part. The rest (check, making
	// it anonymous, stop, publish, unpack) is what a first mint pays over
	// a provisioned one.
	BuildSeconds     float64 `json:"build_seconds"`
	ProvisionSeconds float64 `json:"provision_seconds"`
	PublishSeconds   float64 `json:"publish_seconds"`
	// SizeBytes is the image's (its tarball's, uncompressed), and
	// UnpackSeconds what making the first instance of it took on the
	// pool (the build makes one, never started, and removes it): on a
	// copy-on-write pool the image's volume is made then and every mint
	// snapshots it; on dir every mint copies the image in full.
	SizeBytes     int64   `json:"size_bytes"`
	UnpackSeconds float64 `json:"unpack_seconds"`
	Pool          string  `json:"pool"`
	// Standby is how many standby boxes of the template box templates
	// warm keeps (a rebuild keeps the number).
	Standby int `json:"standby,omitempty"`
}

// ImageState says how a template's recorded image stands.
type ImageState string

// The states of a template's image.
const (
	ImageCurrent ImageState = "current" // built from the template as it is
	// ImageBaseOutdated is current, but incusd has pulled a newer base
	// since (its cached copy of the base's alias moved on): it mints at
	// once; box templates build --refresh rebuilds it.
	ImageBaseOutdated ImageState = "base outdated"
	ImageStale        ImageState = "stale"   // built from another version of the template
	ImageMissing      ImageState = "missing" // recorded, but gone from Incus
	ImageNone         ImageState = "none"    // never built here
)

// ImageAlias is the alias box puts on a template's image, for people to
// read (incus image list); box never mints from it.
func ImageAlias(template string) string { return DefaultAliasPrefix + template }

// DefaultAliasPrefix starts the alias of every template image a host's
// own record names.
const DefaultAliasPrefix = "box/template/"

// Alias is the alias of template's image: ImageAlias, or under
// AliasPrefix for a record of its own.
func (ims *TemplateImages) Alias(template string) string {
	return cmp.Or(ims.AliasPrefix, DefaultAliasPrefix) + template
}

// DefaultTemplateImagesFile is where box records the template images it
// built on a real host.
const DefaultTemplateImagesFile = "/var/lib/box/template-images.json"

// TemplateImagesFile is the record of the host whose network namespace is
// netns: DefaultTemplateImagesFile on a real host (netns ""), one per
// namespace for the hermetic world's hosts, which are hosts of their own.
// Root writes it; everyone may read it (a granted user mints from the
// images root built).
func TemplateImagesFile(netns string) string {
	if netns == "" {
		return DefaultTemplateImagesFile
	}
	return filepath.Join(filepath.Dir(DefaultTemplateImagesFile), "template-images-"+netns+".json")
}

// TemplateImagesFiles is what the record of netns's host keeps on disk:
// the record and the locks of its templates' builds and standby boxes
// beside it (whatever exists of them). Whoever removes the host's images for good (a world's
// purge) removes these with them.
func TemplateImagesFiles(netns string) []string {
	ims := &TemplateImages{File: TemplateImagesFile(netns)}
	out := []string{ims.File}
	names, _ := templates.Names() // built in: cannot fail at run time
	for _, n := range names {
		out = append(out, ims.lock(n), ims.lock(n+"-standby"))
	}
	return out
}

// ReadTemplateImages reads a record; a missing one records nothing.
func ReadTemplateImages(path string) (map[string]TemplateImage, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return map[string]TemplateImage{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the template images' record: %w", err)
	}
	out := map[string]TemplateImage{}
	if err := json.Unmarshal(b, &out); err != nil {
		return nil, fmt.Errorf("reading the template images' record %s: %w (remove it: box rebuilds what it needs)", path, err)
	}
	return out, nil
}

// writeTemplateImages replaces the record in one rename.
func writeTemplateImages(path string, rec map[string]TemplateImage) error {
	b, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("writing the template images' record: %w", err)
	}
	if err := atomicfile.Write(path, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("writing the template images' record: %w", err)
	}
	return nil
}

// TemplateImages keeps a host's template images: which image each
// template has, building one when a mint needs it.
type TemplateImages struct {
	host *stack.Host
	// File records the images root built on the host (TemplateImagesFile
	// of its namespace by default).
	File string
	// AliasPrefix starts the aliases of the images File names
	// (DefaultAliasPrefix when empty): a record of its own (a test's)
	// moves no alias of the host's.
	AliasPrefix string
}

// NewTemplateImages is host's template images.
func NewTemplateImages(host *stack.Host) *TemplateImages {
	return &TemplateImages{host: host, File: TemplateImagesFile(host.NetNS)}
}

// ImageBuild is what building a template's image is asked with.
type ImageBuild struct {
	// Base is the image the builder is minted from; the template's when
	// empty.
	Base string
	// Version is box's, for the record and the context file's comment.
	Version string
	// Refresh builds again even when the image is current (a base that
	// moved on).
	Refresh bool
	// Step, when set, hears each step of a build (and that another build
	// is waited for); Tick how long the current one has taken so far.
	Step func(format string, args ...any)
	Tick func(step string, elapsed time.Duration)
}

func (b ImageBuild) step(format string, args ...any) {
	if b.Step != nil {
		b.Step(format, args...)
	}
}

// Of is t's recorded image and how it stands, without
// building anything.
func (ims *TemplateImages) Of(ctx context.Context, t *templates.Template) (TemplateImage, ImageState, error) {
	rec, err := ReadTemplateImages(ims.File)
	if err != nil {
		return TemplateImage{}, "", err
	}
	ti, ok := rec[t.Name]
	if !ok {
		return TemplateImage{}, ImageNone, nil
	}
	if _, err := ims.host.Incus.Images().Get(ctx, ti.Fingerprint); incus.IsNotFound(err) {
		return ti, ImageMissing, nil
	} else if err != nil {
		return ti, "", fmt.Errorf("reading template %s's image %s: %w", t.Name, ti.Fingerprint, err)
	}
	hash, err := t.Hash()
	if err != nil {
		return ti, "", err
	}
	if ti.Hash != hash {
		return ti, ImageStale, nil
	}
	if newer, err := ims.newerBase(ctx, ti); err != nil {
		return ti, "", err
	} else if newer != "" {
		return ti, ImageBaseOutdated, nil
	}
	return ti, ImageCurrent, nil
}

// Usable says whether a mint may copy an image in this state.
func (s ImageState) Usable() bool { return s == ImageCurrent || s == ImageBaseOutdated }

// newerBase is the fingerprint of a base newer than ti's that incusd has
// cached (pulled, or refreshed by its auto-update, from the same server
// and alias since the build), "" when there is none. Nothing here asks
// the image server: a server that is down must not stop a mint.
func (ims *TemplateImages) newerBase(ctx context.Context, ti TemplateImage) (string, error) {
	_, alias, ok := strings.Cut(ti.Base, ":")
	if !ok || ti.BaseServer == "" {
		return "", nil
	}
	imgs, err := ims.host.Incus.Images().List(ctx)
	if err != nil {
		return "", fmt.Errorf("reading the images' bases: %w", err)
	}
	for _, img := range imgs {
		if u := img.UpdateSource; img.Cached && u != nil && u.Alias == alias && u.Server == ti.BaseServer &&
			img.Fingerprint != ti.BaseFingerprint && img.CreatedAt.After(ti.Built) {
			return img.Fingerprint, nil
		}
	}
	return "", nil
}

// imageBuildWait bounds how long a mint waits for another build of the
// same image (a build is minutes: packages and the agent's npm package).
const imageBuildWait = 45 * time.Minute

// Ensure returns t's image and its state (current, or base outdated),
// building it first when there is none (or it is stale, gone, or a
// refresh is asked for). Two at once build once: the second waits for
// the first's build and uses it. Root only: it mints a builder and
// publishes an image.
func (ims *TemplateImages) Ensure(ctx context.Context, t *templates.Template, b ImageBuild) (TemplateImage, ImageState, error) {
	if ims.host.Remote != "" || ims.host.Tier.Granted {
		return TemplateImage{}, "", errors.New("template images are built by root on the host itself (box templates build there)")
	}
	if ti, state, err := ims.Of(ctx, t); err != nil || (state.Usable() && !b.Refresh) {
		return ti, state, err
	}
	unlock, err := hostns.LockFileWait(ctx, ims.lock(t.Name), "template "+t.Name+"'s image", imageBuildWait, func() {
		b.step("waiting for another build of template %s's image", t.Name)
	})
	if err != nil {
		return TemplateImage{}, "", err
	}
	defer unlock()
	// Another process may have built it while this one waited.
	if ti, state, err := ims.Of(ctx, t); err != nil || (state.Usable() && (!b.Refresh || time.Since(ti.Built) < imageBuildWait)) {
		return ti, state, err
	}
	ti, err := ims.build(ctx, t, b)
	return ti, ImageCurrent, err
}

// wtmpPath is the log a container's shutdown writes to.
const wtmpPath = "/var/log/wtmp"

// lock is the lock of template's image builds on this host, beside the
// record.
func (ims *TemplateImages) lock(template string) string {
	return filepath.Join(filepath.Dir(ims.File), "."+strings.TrimSuffix(filepath.Base(ims.File), ".json")+"-"+template+".lock")
}

// builderPrefix starts every builder box's name; StampBuilder marks it.
const builderPrefix = "box-build-"

// build builds t's image under its lock, records it and
// removes the image it replaces. The builder goes whatever happens; a
// build that fails leaves no image and says why.
func (ims *TemplateImages) build(ctx context.Context, t *templates.Template, b ImageBuild) (TemplateImage, error) {
	host := ims.host
	start := time.Now()
	base := b.Base
	if base == "" {
		base = t.Image
	}
	hash, err := t.Hash()
	if err != nil {
		return TemplateImage{}, err
	}
	if err := ims.removeBuilders(ctx, t.Name); err != nil {
		return TemplateImage{}, err
	}
	suffix := make([]byte, 3)
	if _, err := rand.Read(suffix); err != nil {
		return TemplateImage{}, err
	}
	name := builderPrefix + t.Name + "-" + hex.EncodeToString(suffix)
	defer func() {
		err := stack.RemoveInstance(context.WithoutCancel(ctx), host.Incus, name)
		switch {
		case incus.IsNotFound(err):
			// Never made.
		case err != nil:
			b.step("the builder %s was not removed: %v (remove it: box rm --force %s)", name, err, name)
		default:
			_, _ = host.RefreshPorts(context.WithoutCancel(ctx))
		}
	}()
	fail := func(err error) (TemplateImage, error) {
		return TemplateImage{}, fmt.Errorf("building template %s's image: %w", t.Name, err)
	}

	b.step("building template %s's image: minting the builder %s from %s", t.Name, name, base)
	ud, err := t.UserData(templates.RenderOptions{BoxName: name, BoxVersion: b.Version, Image: true})
	if err != nil {
		return fail(err)
	}
	if _, err := NewManager(ims.host).Mint(ctx, MintRequest{Name: name, Image: base, UserData: ud,
		CPU: t.Resources.CPU, Memory: t.Resources.Memory,
		Stamps: map[string]string{model.StampTemplate: t.Name, model.StampBuilder: t.Name, model.StampVersion: b.Version},
		Origin: "builder of template " + t.Name + "'s image"}); err != nil {
		return fail(err)
	}
	b.step("building template %s's image: provisioning (the template's packages and agent)", t.Name)
	if err := waitMarkers(ctx, host.Incus, name, func(d time.Duration) {
		if b.Tick != nil {
			b.Tick("provisioning", d)
		}
	}); err != nil {
		return fail(err)
	}
	provisioned := time.Since(start)
	inst, _, err := host.Incus.Instances().Get(ctx, name)
	if err != nil {
		return fail(err)
	}
	b.step("building template %s's image: checking it, making it anonymous", t.Name)
	if out, err := execScript(ctx, host.Incus, name, t.CheckScript()); err != nil {
		return fail(fmt.Errorf("the built box fails its check: %s", strings.TrimSpace(out+" "+err.Error())))
	}
	if out, err := execScript(ctx, host.Incus, name, templates.AnonymizeScript); err != nil {
		return fail(fmt.Errorf("making it anonymous: %s", strings.TrimSpace(out+" "+err.Error())))
	}
	// The shutdown itself logs to wtmp: emptied once the builder stopped.
	wtmp, _ := execScript(ctx, host.Incus, name, "stat -c '%a %u %g' "+wtmpPath)
	if err := host.Incus.Instances().SetState(ctx, name, "stop", time.Minute, false); err != nil {
		return fail(fmt.Errorf("stopping the builder: %w", err))
	}
	var mode os.FileMode
	var uid, gid int
	if _, err := fmt.Sscanf(wtmp, "%o %d %d", &mode, &uid, &gid); err == nil {
		if err := host.Incus.Instances().PushFile(ctx, name, wtmpPath, strings.NewReader(""), mode, uid, gid); err != nil {
			return fail(fmt.Errorf("emptying the builder's %s: %w", wtmpPath, err))
		}
	}
	b.step("building template %s's image: publishing it", t.Name)
	pub := time.Now()
	fp, err := host.Incus.Images().Publish(ctx, incus.ImagePublish{Instance: name, Compression: "none", Properties: map[string]string{
		"description": "box template " + t.Name, "user.box.template": t.Name, "user.box.template_hash": hash,
	}})
	if err != nil {
		return fail(err)
	}
	ti := TemplateImage{Template: t.Name, Fingerprint: fp, Hash: hash, Base: base, BaseFingerprint: inst.Config["volatile.base_image"],
		BaseServer: inst.Config[model.StampImageServer],
		BoxVersion: b.Version, Built: time.Now().UTC(), PublishSeconds: time.Since(pub).Round(100 * time.Millisecond).Seconds(),
		ProvisionSeconds: provisioned.Round(100 * time.Millisecond).Seconds()}
	b.step("building template %s's image: unpacking it on the pool (once: later mints copy it)", t.Name)
	if err := ims.unpack(ctx, t.Name, &ti); err != nil {
		_ = host.Incus.Images().Delete(context.WithoutCancel(ctx), fp)
		return fail(err)
	}
	ti.BuildSeconds = time.Since(start).Round(100 * time.Millisecond).Seconds()
	if err := ims.record(ctx, ti); err != nil {
		_ = host.Incus.Images().Delete(context.WithoutCancel(ctx), fp)
		return fail(err)
	}
	return ti, nil
}

// unpack makes the first instance of ti's image, never started and on no
// network, and removes it: the image's volume on a copy-on-write pool is
// made then, not at the first mint; how long it took is the pool's
// measured cost (UnpackSeconds).
func (ims *TemplateImages) unpack(ctx context.Context, template string, ti *TemplateImage) error {
	c := ims.host.Incus
	img, err := c.Images().Get(ctx, ti.Fingerprint)
	if err != nil {
		return err
	}
	ti.SizeBytes, ti.Pool = img.Size, ims.host.Options.PoolName()
	name := builderPrefix + template + "-unpack-" + Short(ti.Fingerprint)
	start := time.Now()
	err = c.Instances().Create(ctx, incus.InstancesPost{Name: name, Type: model.TypeContainer,
		Source:   incus.InstanceSource{Type: "image", Fingerprint: ti.Fingerprint},
		Config:   map[string]string{model.StampBuilder: template},
		Devices:  map[string]map[string]string{"root": {"type": "disk", "path": "/", "pool": ti.Pool}},
		Profiles: []string{}})
	ti.UnpackSeconds = time.Since(start).Round(100 * time.Millisecond).Seconds()
	if rmErr := stack.RemoveInstance(context.WithoutCancel(ctx), c, name); rmErr != nil && !incus.IsNotFound(rmErr) && err == nil {
		err = rmErr
	}
	if err != nil {
		return fmt.Errorf("unpacking the image on pool %s: %w", ti.Pool, err)
	}
	return nil
}

// record writes ti into the record, points the alias people read at it,
// and removes the image it replaces.
func (ims *TemplateImages) record(ctx context.Context, ti TemplateImage) error {
	c := ims.host.Incus
	rec, err := ReadTemplateImages(ims.File)
	if err != nil {
		return err
	}
	old, had := rec[ti.Template]
	ti.Standby = old.Standby
	rec[ti.Template] = ti
	if err := writeTemplateImages(ims.File, rec); err != nil {
		return err
	}
	if err := ims.RepairAlias(ctx, ti); err != nil {
		return err
	}
	if had && old.Fingerprint != ti.Fingerprint {
		if err := c.Images().Delete(ctx, old.Fingerprint); err != nil && !incus.IsNotFound(err) {
			return fmt.Errorf("removing the image it replaces, %s: %w", old.Fingerprint, err)
		}
	}
	return nil
}

// RepairAlias points the alias people read at ti, where it points
// elsewhere or nowhere (someone moved it: a granted user can). Mints do
// not read it; people and doctor do.
func (ims *TemplateImages) RepairAlias(ctx context.Context, ti TemplateImage) error {
	c := ims.host.Incus
	alias := ims.Alias(ti.Template)
	a, err := c.Images().Alias(ctx, alias)
	switch {
	case err == nil && a.Target == ti.Fingerprint:
		return nil
	case err == nil:
		if err := c.Images().DeleteAlias(ctx, alias); err != nil && !incus.IsNotFound(err) {
			return fmt.Errorf("moving the alias %s: %w", alias, err)
		}
	case !incus.IsNotFound(err):
		return fmt.Errorf("reading the alias %s: %w", alias, err)
	}
	if err := c.Images().CreateAlias(ctx, alias, ti.Fingerprint, "box template "+ti.Template+" (box mints by fingerprint, not by this alias)"); err != nil {
		return fmt.Errorf("the alias %s: %w", alias, err)
	}
	return nil
}

// removeBuilders removes the builders of template a build before this one
// left (one killed half way): under the image's lock no other runs.
func (ims *TemplateImages) removeBuilders(ctx context.Context, template string) error {
	c := ims.host.Incus
	insts, err := c.Instances().List(ctx, map[string]string{model.StampBuilder: template})
	if err != nil {
		return fmt.Errorf("looking for builders left behind: %w", err)
	}
	for _, i := range insts {
		if !strings.HasPrefix(i.Name, builderPrefix) || i.Config[model.StampBuilder] != template {
			continue
		}
		if err := stack.RemoveInstance(ctx, c, i.Name); err != nil {
			return fmt.Errorf("removing the builder %s a build before left: %w", i.Name, err)
		}
	}
	return nil
}

// markerPoll is how often a box's provisioning markers are looked for,
// markerLiveness how often the box itself (still there, still running).
const (
	markerPoll     = 200 * time.Millisecond
	markerLiveness = time.Second
)

// imageProvisionWait bounds a builder's provisioning.
const imageProvisionWait = 30 * time.Minute

// waitMarkers waits for a box's user-data to report: ready, or failed with
// its reason and the end of cloud-init's log. A box that is removed or
// stops meanwhile (by someone else) ends the wait at once. tick hears the
// time so far, every few seconds.
func waitMarkers(ctx context.Context, c *incus.Client, name string, tick func(time.Duration)) error {
	ctx, cancel := context.WithTimeout(ctx, imageProvisionWait)
	defer cancel()
	start, told, checked := time.Now(), time.Now(), time.Now()
	for {
		if b, err := c.Instances().PullFile(ctx, name, templates.ReadyMarker); err == nil && len(b) > 0 {
			return nil
		}
		if b, err := c.Instances().PullFile(ctx, name, templates.FailedMarker); err == nil && len(b) > 0 {
			return fmt.Errorf("provisioning failed: %s%s", strings.TrimSpace(string(b)), CloudInitTail(ctx, c, name))
		}
		if time.Since(checked) >= markerLiveness {
			checked = time.Now()
			inst, _, err := c.Instances().Get(ctx, name)
			switch {
			case incus.IsNotFound(err):
				return fmt.Errorf("%s is gone: something removed it while it was being provisioned", name)
			case err == nil && inst.Status != "Running":
				return fmt.Errorf("%s is %s: it stopped while it was being provisioned%s", name, strings.ToLower(inst.Status), CloudInitTail(ctx, c, name))
			}
		}
		if time.Since(told) >= 5*time.Second && tick != nil {
			tick(time.Since(start))
			told = time.Now()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("provisioning did not finish within %s%s", imageProvisionWait, CloudInitTail(context.WithoutCancel(ctx), c, name))
		case <-time.After(markerPoll):
		}
	}
}

// CloudInitTail is the end of a box's cloud-init output, for a
// provisioning failure's error ("" when it cannot be read).
func CloudInitTail(ctx context.Context, c *incus.Client, name string) string {
	b, err := c.Instances().PullFile(ctx, name, "/var/log/cloud-init-output.log")
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return "; the end of its /var/log/cloud-init-output.log:\n  " + strings.Join(lines[max(0, len(lines)-12):], "\n  ")
}

// execScript runs a shell script in a box as root; a non-zero exit is an
// error, with what it printed.
func execScript(ctx context.Context, c *incus.Client, name, script string) (string, error) {
	res, err := c.Instances().Exec(ctx, name, incus.ExecRequest{Command: []string{"sh", "-c", script}})
	if err != nil {
		return "", err
	}
	out := string(res.Stdout) + string(res.Stderr)
	if res.ExitCode != 0 {
		return out, fmt.Errorf("exit %d", res.ExitCode)
	}
	return out, nil
}

// Mint is the request that mints box name as a copy of t's image ti: by
// fingerprint, with the user-data that only checks what the image holds
// (nothing is installed), and the template's stamps.
func (ims *TemplateImages) Mint(t *templates.Template, ti TemplateImage, name, version string) (MintRequest, error) {
	ud, err := t.CopyUserData(name, version)
	if err != nil {
		return MintRequest{}, err
	}
	return MintRequest{Name: name, Image: ims.Alias(t.Name), Fingerprint: ti.Fingerprint, UserData: ud,
		Stamps: map[string]string{model.StampTemplate: t.Name, model.StampUser: t.User, model.StampVersion: version},
		Origin: "template " + t.Name + "'s image " + Short(ti.Fingerprint)}, nil
}

// Short is a fingerprint as people read it: its first 12 characters.
func Short(fp string) string { return fp[:min(12, len(fp))] }

// List lists the templates with their images and how each stands.
func (ims *TemplateImages) List(ctx context.Context) ([]TemplateStatus, error) {
	ts, err := templates.Builtin()
	if err != nil {
		return nil, err
	}
	var out []TemplateStatus
	for i := range ts {
		ti, state, err := ims.Of(ctx, &ts[i])
		if err != nil {
			return nil, err
		}
		s := TemplateStatus{Template: ts[i], State: state}
		if state != ImageNone {
			s.Image = &ti
		}
		if state.Usable() {
			ready, _, err := ims.Standbys(ctx, ts[i].Name, ti.Fingerprint)
			if err != nil {
				return nil, err
			}
			s.Standby = len(ready)
		}
		out = append(out, s)
	}
	return out, nil
}

// TemplateStatus is a template (its fields, as box templates --json has
// always shown them) and its image.
type TemplateStatus struct {
	templates.Template
	State ImageState     `json:"image_state,omitempty"`
	Image *TemplateImage `json:"template_image,omitempty"`
	// Standby is how many standby boxes of the image are ready to take
	// (Image.Standby is how many box templates warm keeps).
	Standby int `json:"standby_ready"`
}
