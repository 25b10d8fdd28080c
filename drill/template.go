package drill

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/box-isolation/box/stack/boxes"
	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/templates"
)

// A run with a template (drill run --template) drills the boxes people
// use: its probe boxes are minted as box new mints that template's boxes,
// as copies of the template's image (built first when the host has none
// current, as the first box new of it would: docs/images.md) with the
// copy's cloud-init user-data, and the agent is pushed once each has
// reported ready. box-w is minted from the image without the user-data
// (docs/claims.md). A run with --image other than the template's, or
// against a remote, mints from that image and provisions each box in
// itself, as box new does.

// provisionWait bounds how long a template box may take to report ready
// (an agent template installs packages and the agent's npm package).
const provisionWait = 10 * time.Minute

// ensureTemplateImage makes sure a template run has its template's image
// (building it when the host has none current) and mints from it; a run
// that cannot (another image asked for, a remote) provisions each box.
func (r *run) ensureTemplateImage(ctx context.Context) error {
	t := r.cfg.Template
	if t == nil || (r.cfg.Image != "" && r.cfg.Image != t.Image) || r.cfg.Host.Remote != "" {
		return nil
	}
	ims := boxes.NewTemplateImages(r.cfg.Host)
	start := time.Now()
	ti, state, err := ims.Ensure(ctx, t, boxes.ImageBuild{Version: r.cfg.Version, Step: func(format string, args ...any) {
		r.cfg.logf("boxes: "+format, args...)
	}})
	if err != nil {
		return fmt.Errorf("template %s's image: %w", t.Name, err)
	}
	r.cfg.logf("boxes: template %s's image %s (%s; ready in %s): every probe box is a copy of it", t.Name, ti.Fingerprint[:12], state, time.Since(start).Round(time.Second))
	r.tmplImages, r.tmplImage = ims, &ti
	return nil
}

// mintRequest is what a probe box at place is minted with: the run's
// image; in a template run a copy of the template's image with the copy's
// user-data (none when provision is false), or where there is none the
// template's base with its whole user-data.
func (r *run) mintRequest(name, target string, provision bool) (boxes.MintRequest, error) {
	req := boxes.MintRequest{Name: name, Image: r.cfg.Image, Type: probeType, Stamps: r.stamps(), Target: target}
	if t, ti := r.cfg.Template, r.tmplImage; t != nil && ti != nil {
		copyReq, err := r.tmplImages.Mint(t, *ti, name, r.cfg.Version)
		if err != nil {
			return req, fmt.Errorf("template %s: %w", t.Name, err)
		}
		req.Image, req.Fingerprint, req.Origin = copyReq.Image, copyReq.Fingerprint, copyReq.Origin
		if provision {
			req.UserData = copyReq.UserData
		}
		return req, nil
	}
	if t := r.cfg.Template; t != nil {
		req.Image = t.Image
		if r.cfg.Image != "" && r.cfg.Image != t.Image {
			req.Image = r.cfg.Image
		}
		if provision {
			ud, err := t.UserData(templates.RenderOptions{BoxName: name, BoxVersion: r.cfg.Version})
			if err != nil {
				return req, fmt.Errorf("template %s: %w", t.Name, err)
			}
			req.UserData = ud
		}
	}
	return req, nil
}

// waitProvisioned waits for a template box's user-data to report: ready,
// or failed with the reason, which stops the run (its probes would run in
// a box that is not the one people use). cloud-init is waited for first: a
// clone carries its source's markers until its own run clears them.
// Nothing to wait for without a template.
func (r *run) waitProvisioned(ctx context.Context, c *incus.Client, name string) error {
	if r.cfg.Template == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, provisionWait)
	defer cancel()
	start := time.Now()
	// Its exit code says little (2 for a warning); the markers decide.
	if _, err := c.Instances().Exec(ctx, name, incus.ExecRequest{Command: []string{"cloud-init", "status", "--wait"}}); err != nil {
		return fmt.Errorf("%s: waiting for cloud-init: %w", name, err)
	}
	// An empty marker is no marker: a clone's inherited ones are emptied
	// before its first boot.
	if b, err := c.Instances().PullFile(ctx, name, templates.ReadyMarker); err == nil && len(b) > 0 {
		r.cfg.logf("boxes: %s provisioned from template %s in %s", name, r.cfg.Template.Name, time.Since(start).Round(time.Second))
		return nil
	}
	if b, err := c.Instances().PullFile(ctx, name, templates.FailedMarker); err == nil && len(b) > 0 {
		return fmt.Errorf("%s: template %s's provisioning failed: %s%s", name, r.cfg.Template.Name, strings.TrimSpace(string(b)), boxes.CloudInitTail(ctx, c, name))
	}
	return fmt.Errorf("%s: cloud-init finished, but template %s's user-data left no marker (%s or %s)%s", name, r.cfg.Template.Name, templates.ReadyMarker, templates.FailedMarker, boxes.CloudInitTail(ctx, c, name))
}

// readBaseImage records the fingerprint box-a's image (its instance
// boxA) resolved to.
func (r *run) readBaseImage(ctx context.Context, boxA string) error {
	inst, _, err := r.cfg.Host.Incus.Instances().Get(ctx, boxA)
	if err != nil {
		return err
	}
	r.baseImage = inst.Config["volatile.base_image"]
	return nil
}

// localImage is the image source of a box minted without a pull: the
// fingerprint box-a resolved to in a template run (its image is cached by
// then), else the run's image alias.
func (r *run) localImage() incus.InstanceSource {
	if r.cfg.Template != nil && r.baseImage != "" {
		return incus.InstanceSource{Type: "image", Fingerprint: r.baseImage}
	}
	return incus.InstanceSource{Type: "image", Alias: r.cfg.Image}
}
