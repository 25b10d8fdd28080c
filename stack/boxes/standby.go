package boxes

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/box-isolation/box/stack"
	"github.com/box-isolation/box/stack/hostns"
	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/model"
	"github.com/box-isolation/box/templates"
)

// Standby boxes (docs/images.md, "Standby boxes"). box templates warm T N
// keeps N boxes of T minted from T's image, booted once (their own
// cloud-init run: user, SSH host keys, machine-id, ready marker) and
// stopped, each stamped StampStandby with its own fixed address. The next
// box new of T takes one instead of making a copy: renamed to the box's
// name, its config made the mint's (stamps, limits, nesting, allowlist),
// its hostname moved, started. Incus renders an image's templates
// (hostname, hosts, cloud-init's meta-data) only at create and copy, so
// the take writes them; the meta-data keeps the standby's cloud-init
// instance-id, as a new one would rerun the per-instance modules (a copy's
// boot again). A take costs a start; a copy, a create and a first boot.

// standbyPrefix starts every standby box's name; StampStandby marks it.
const standbyPrefix = "box-standby-"

// standbyName is a new standby box's name for template.
func standbyName(template string) string {
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	return standbyPrefix + template + "-" + hex.EncodeToString(b)
}

// isStandby says inst is a standby box of template (any, for ""): named
// and stamped as one.
func isStandby(inst incus.Instance, template string) bool {
	t := inst.Config[model.StampStandby]
	return t != "" && (template == "" || t == template) && strings.HasPrefix(inst.Name, standbyPrefix+t+"-")
}

// take makes req's box of a standby box of req.Standby's image, when one
// is there. b is nil when there was none to take, or when taking one
// failed (then note says why, the half-taken box is removed, and the
// caller makes a copy as if there had been none). Two takes at once each
// rename a different one: a rename of a box another take renamed first
// fails, and the next is tried.
func (mgr *Manager) take(ctx context.Context, req MintRequest) (b *stack.Box, note string, err error) {
	host := mgr.host
	if req.Standby == "" || req.Fingerprint == "" || cmp.Or(req.Type, model.TypeContainer) != model.TypeContainer || req.Target != "" || host.Tier.Granted {
		return nil, "", nil
	}
	insts, err := host.Incus.Instances().List(ctx, map[string]string{model.StampStandby: req.Standby})
	if err != nil {
		return nil, fmt.Sprintf("the standby boxes could not be listed (%v): a copy of the image was made", err), nil
	}
	slices.SortFunc(insts, func(a, b incus.Instance) int { return strings.Compare(a.Name, b.Name) })
	for _, inst := range insts {
		if !isStandby(inst, req.Standby) || inst.Status != "Stopped" || inst.Type != model.TypeContainer || inst.Config[model.StampFingerprint] != req.Fingerprint {
			continue
		}
		if err := host.Incus.Instances().Rename(ctx, inst.Name, req.Name); err != nil {
			continue // taken by another mint, or gone: the next
		}
		if err := mgr.ready(ctx, inst.Name, req); err != nil {
			// Whatever failed, the box is no box: removed (with the veth
			// pair a failed start leaves), and a copy is made instead.
			cctx := context.WithoutCancel(ctx)
			cur, _, gerr := host.Incus.Instances().Get(cctx, req.Name)
			if gerr == nil {
				if rerr := stack.RemoveInstance(cctx, host.Incus, req.Name); rerr != nil {
					return nil, "", fmt.Errorf("minting %s: the standby box %s taken for it failed (%v), and removing it failed: %w (remove it by hand: incus delete --force %s)", req.Name, inst.Name, err, rerr, req.Name)
				}
				host.RemoveLeftPorts(cur)
			}
			return nil, fmt.Sprintf("the standby box %s could not be taken (%v) and was removed: a copy of the image was made instead", inst.Name, err), nil
		}
		b, err := stack.Info(ctx, host.Incus, req.Name)
		if err != nil {
			return nil, "", fmt.Errorf("minted %s from the standby box %s, but: %w", req.Name, inst.Name, err)
		}
		b.Notes = append(b.Notes, fmt.Sprintf("%s%s, booted once and stopped: its SSH host keys, machine-id, MAC and fixed address are its own; its cloud-init instance stays %s", NoteStandbyTaken, inst.Name, inst.Name))
		if n := mgr.diskLimitNote(ctx, req); n != "" {
			b.Notes = append(b.Notes, n)
		} else if n := host.Storage().AccountingNote(ctx, req.Disk); n != "" {
			b.Notes = append(b.Notes, n)
		}
		return b, "", nil
	}
	return nil, "", nil
}

// ready makes the standby box standby, renamed to req.Name, req's box:
// its config the mint's (kept: Incus's volatile and image keys), its root
// disk req's size (none: no size), its hostname req.Name; then starts it.
func (mgr *Manager) ready(ctx context.Context, standby string, req MintRequest) error {
	host := mgr.host
	inst, etag, err := host.Incus.Instances().Get(ctx, req.Name)
	if err != nil {
		return err
	}
	put := inst.Writable()
	cfg := mintConfig(req, model.TypeContainer, mintImage{fingerprint: req.Fingerprint})
	for k, v := range inst.Config {
		if strings.HasPrefix(k, "volatile.") || strings.HasPrefix(k, "image.") {
			cfg[k] = v
		}
	}
	put.Config = cfg
	if root, ok := put.Devices["root"]; ok {
		root = maps.Clone(root)
		if req.Disk != "" {
			root["size"] = req.Disk
		} else {
			delete(root, "size")
		}
		put.Devices["root"] = root
	}
	if err := host.Incus.Instances().Update(ctx, req.Name, put, etag); err != nil {
		return fmt.Errorf("setting its config: %w", err)
	}
	if err := mgr.moveHostname(ctx, standby, req.Name); err != nil {
		return err
	}
	// Recorded before its start, as a mint's (model.EnforcedEgress).
	if err := host.Policies().Record(ctx, inst.Project, req.Name, model.PolicyOf(put.Config, put.Devices)); err != nil {
		return err
	}
	return mgr.Start(ctx, req.Name)
}

// NoteStandbyTaken starts the note of a box taken from a standby box.
const NoteStandbyTaken = "taken from the standby box "

// moveHostname writes into the stopped box name what Incus renders from
// the image's templates at a create (not at a rename): /etc/hostname,
// /etc/hosts and cloud-init's local-hostname (which cloud-init sets at
// every boot), with cloud-init's instance-id (standby) kept.
func (mgr *Manager) moveHostname(ctx context.Context, standby, name string) error {
	files := map[string]string{
		"/etc/hostname": name + "\n",
		"/etc/hosts":    "127.0.1.1\t" + name + "\n127.0.0.1\tlocalhost\n::1\t\tlocalhost ip6-localhost ip6-loopback\nff02::1\t\tip6-allnodes\nff02::2\t\tip6-allrouters\n",
		standbyMetaData: "instance-id: " + standby + "\nlocal-hostname: " + name + "\n",
	}
	for _, path := range slices.Sorted(maps.Keys(files)) {
		if err := mgr.host.Incus.Instances().PushFile(ctx, name, path, strings.NewReader(files[path]), 0o644, 0, 0); err != nil {
			return fmt.Errorf("writing its %s: %w", path, err)
		}
	}
	return nil
}

// standbyMetaData is cloud-init's NoCloud meta-data in a box of a Debian
// cloud image (its image's template renders it).
const standbyMetaData = "/var/lib/cloud/seed/nocloud-net/meta-data"

// Standbys are the standby boxes of template: those made from its image
// fp and stopped (ready to take), and the others (of an older image,
// running, or not containers).
func (ims *TemplateImages) Standbys(ctx context.Context, template, fp string) (ready, other []incus.Instance, err error) {
	insts, err := ims.host.Incus.Instances().List(ctx, map[string]string{model.StampStandby: template})
	if err != nil {
		return nil, nil, fmt.Errorf("listing template %s's standby boxes: %w", template, err)
	}
	slices.SortFunc(insts, func(a, b incus.Instance) int { return strings.Compare(a.Name, b.Name) })
	for _, i := range insts {
		switch {
		case !isStandby(i, template):
		case i.Status == "Stopped" && i.Type == model.TypeContainer && i.Config[model.StampFingerprint] == fp:
			ready = append(ready, i)
		default:
			other = append(other, i)
		}
	}
	return ready, other, nil
}

// WarmResult is what box templates warm did for a template.
type WarmResult struct {
	Template    string   `json:"template"`
	Fingerprint string   `json:"fingerprint"`
	Want        int      `json:"want"`
	Kept        []string `json:"kept,omitempty"`
	Made        []string `json:"made,omitempty"`
	Removed     []string `json:"removed,omitempty"`
}

// Warm keeps n standby boxes of t (n < 0: the number the record holds):
// its image built first where it is not current, the standby boxes of an
// older image and those past n removed (a running one is left alone: it
// is in use), the missing ones minted from the image, booted once and
// stopped. n is recorded for the next warm. One warm of a template at a
// time (a lock beside the record).
func (ims *TemplateImages) Warm(ctx context.Context, t *templates.Template, n int, b ImageBuild) (WarmResult, error) {
	ti, _, err := ims.Ensure(ctx, t, b)
	if err != nil {
		return WarmResult{}, err
	}
	unlock, err := hostns.LockFileWait(ctx, ims.lock(t.Name+"-standby"), "template "+t.Name+"'s standby boxes", imageBuildWait, func() {
		b.step("waiting for another box templates warm %s", t.Name)
	})
	if err != nil {
		return WarmResult{}, err
	}
	defer unlock()
	rec, err := ReadTemplateImages(ims.File)
	if err != nil {
		return WarmResult{}, err
	}
	if n < 0 {
		n = rec[t.Name].Standby
	}
	res := WarmResult{Template: t.Name, Fingerprint: ti.Fingerprint, Want: n}
	r := rec[t.Name]
	if r.Fingerprint == ti.Fingerprint && r.Standby != n {
		r.Standby = n
		rec[t.Name] = r
		if err := writeTemplateImages(ims.File, rec); err != nil {
			return res, err
		}
	}
	ready, other, err := ims.Standbys(ctx, t.Name, ti.Fingerprint)
	if err != nil {
		return res, err
	}
	mgr := NewManager(ims.host)
	for _, i := range other {
		if i.Status != "Stopped" {
			b.step("standby box %s is %s (started by hand?): left alone", i.Name, strings.ToLower(i.Status))
			continue
		}
		if err := mgr.Remove(ctx, i.Name); err != nil {
			return res, fmt.Errorf("removing the standby box %s of an older image: %w", i.Name, err)
		}
		res.Removed = append(res.Removed, i.Name)
	}
	for i, inst := range ready {
		if i < n {
			res.Kept = append(res.Kept, inst.Name)
			continue
		}
		if err := mgr.Remove(ctx, inst.Name); err != nil {
			return res, fmt.Errorf("removing the standby box %s: %w", inst.Name, err)
		}
		res.Removed = append(res.Removed, inst.Name)
	}
	for len(res.Kept)+len(res.Made) < n {
		name, err := ims.makeStandby(ctx, t, ti, b)
		if err != nil {
			return res, err
		}
		res.Made = append(res.Made, name)
	}
	return res, nil
}

// makeStandby mints one standby box of t from its image ti, waits for its
// first boot to report ready, and stops it; one that fails is removed.
func (ims *TemplateImages) makeStandby(ctx context.Context, t *templates.Template, ti TemplateImage, b ImageBuild) (string, error) {
	name := standbyName(t.Name)
	req, err := ims.Mint(t, ti, name, b.Version)
	if err != nil {
		return "", err
	}
	req.Stamps[model.StampStandby] = t.Name
	res, err := templates.MergeResources(t, func(string) string { return "" }, templates.Resources{})
	if err != nil {
		return "", err
	}
	req.CPU, req.Memory, req.Disk, req.Processes, req.CPUAllowance = res.CPU, res.Memory, res.Disk, res.Processes, res.CPUAllowance
	req.Nesting = t.Nesting
	b.step("minting standby box %s of template %s", name, t.Name)
	mgr := NewManager(ims.host)
	if _, err := mgr.Mint(ctx, req); err != nil {
		return "", fmt.Errorf("making a standby box of template %s: %w", t.Name, err)
	}
	err = waitMarkers(ctx, ims.host.Incus, name, nil)
	if err == nil {
		err = mgr.Stop(ctx, name, false)
	}
	if err != nil {
		if rerr := mgr.Remove(context.WithoutCancel(ctx), name); rerr != nil {
			err = errors.Join(err, fmt.Errorf("removing it: %w (remove it by hand: incus delete --force %s)", rerr, name))
		}
		return "", fmt.Errorf("making the standby box %s of template %s: %w", name, t.Name, err)
	}
	return name, nil
}
