package main

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/box-isolation/box/stack"
	"github.com/box-isolation/box/stack/boxes"
	"github.com/box-isolation/box/templates"
)

// imagesCLI is what box's commands do with the template images of the
// host they act on (docs/images.md): mint a copy of one, build them, say
// each step while the operator waits.
type imagesCLI struct {
	c   *call
	h   *stack.Host
	ims *boxes.TemplateImages
}

// images is h's template images, the record where BOX_TEMPLATE_IMAGES
// says when set.
func (c *call) images(h *stack.Host) *imagesCLI {
	ims := boxes.NewTemplateImages(h)
	if v := strings.TrimSpace(c.getenv("BOX_TEMPLATE_IMAGES")); v != "" {
		ims.File, ims.AliasPrefix = v, recordAliasPrefix(v)
	}
	return &imagesCLI{c: c, h: h, ims: ims}
}

// recordAliasPrefix starts the aliases of the images a record of its own
// (BOX_TEMPLATE_IMAGES) names: they move none of the host's.
func recordAliasPrefix(path string) string {
	sum := sha256.Sum256([]byte(path))
	return "box/template-" + hex.EncodeToString(sum[:4]) + "/"
}

// maxAge is the age past which doctor notes a template's image:
// BOX_TEMPLATE_IMAGE_MAX_AGE (a Go duration, 0 for never) or
// boxes.DefaultImageMaxAge.
func (ic *imagesCLI) maxAge() time.Duration {
	if d, err := time.ParseDuration(strings.TrimSpace(ic.c.getenv("BOX_TEMPLATE_IMAGE_MAX_AGE"))); err == nil {
		return d
	}
	return boxes.DefaultImageMaxAge
}

// mint is the request for box name as a copy of t's image, built first
// when this host has none current (root; a granted user mints from root's
// image when it is current, else mints provisioned, the box provisioning
// itself, and is told root can build the image; a remote always mints
// provisioned). Each step of a build is said on stderr.
func (ic *imagesCLI) mint(t *templates.Template, name string, provisioned boxes.MintRequest) (boxes.MintRequest, error) {
	c, h, ims := ic.c, ic.h, ic.ims
	var ti boxes.TemplateImage
	switch {
	case h.Remote != "":
		return provisioned, nil
	case h.Tier.Granted:
		var state boxes.ImageState
		var err error
		if ti, state, err = ims.Of(c.ctx, t); err != nil {
			return boxes.MintRequest{}, err
		}
		if !state.Usable() {
			fmt.Fprintf(c.err, "box: template %s has no current image on this host (%s): %s is provisioned in itself (minutes); the host's admin can build it once: box templates build %s\n", t.Name, state, name, t.Name)
			return provisioned, nil
		}
	default:
		// The stack first: a build on a host without one fails later and
		// less clearly.
		if _, _, err := stack.RequireStack(c.ctx, h.Incus); err != nil {
			return boxes.MintRequest{}, fmt.Errorf("minting %s: %w", name, err)
		}
		start := time.Now()
		var state boxes.ImageState
		var err error
		if ti, state, err = ims.Ensure(c.ctx, t, ic.buildOpts(t, false)); err != nil {
			return boxes.MintRequest{}, err
		}
		if d := time.Since(start); d > time.Second {
			ic.stepf("template %s's image %s is ready (%s)", t.Name, boxes.Short(ti.Fingerprint), d.Round(time.Second))
		}
		if state == boxes.ImageBaseOutdated && !c.quiet {
			fmt.Fprintf(c.err, "box: template %s's image was built from %s as it was on %s; incusd has a newer one since: box templates build --refresh %s rebuilds the image on it\n", t.Name, ti.Base, ti.Built.Format(time.DateOnly), t.Name)
		}
	}
	req, err := ims.Mint(t, ti, name, version)
	if !h.Tier.Granted {
		req.Standby = t.Name // root's own: a standby box of the image may be taken
	}
	return req, err
}

// warm is box templates warm T [N]: N standby boxes of T kept (the number
// recorded at the last warm when N is left out; 0 removes them).
func (ic *imagesCLI) warm(args []string, asJSON bool) error {
	c, ims := ic.c, ic.ims
	if len(args) < 1 || len(args) > 2 {
		return usagef("templates warm: want T [N] (N standby boxes of template T; 0 removes them)")
	}
	t, err := templates.Get(args[0])
	if err != nil {
		return usagef("templates warm: %v", err)
	}
	n := -1
	if len(args) == 2 {
		if n, err = strconv.Atoi(args[1]); err != nil || n < 0 || n > maxStandby {
			return usagef("templates warm: N is a number of boxes from 0 to %d, not %q", maxStandby, args[1])
		}
	}
	if ic.h.Remote != "" || ic.h.Tier.Granted {
		return errors.New("templates warm: standby boxes are root's, on the host itself (run box templates warm there, as root)")
	}
	res, err := ims.Warm(c.ctx, t, n, ic.buildOpts(t, false))
	c.progressDone()
	if err != nil {
		return err
	}
	if asJSON {
		return c.printJSON(res)
	}
	fmt.Fprintf(c.out, "%s: %d standby boxes of image %s kept (%s made, %s removed); box new --template %s takes one; box templates warm %s makes them up again\n",
		t.Name, res.Want, boxes.Short(res.Fingerprint), orNone(res.Made), orNone(res.Removed), t.Name, t.Name)
	return nil
}

// maxStandby bounds box templates warm's N: every standby box holds one of
// the bridge's fixed addresses.
const maxStandby = 32

func orNone(names []string) string {
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ", ")
}

// stepf says on stderr what box is doing while the operator waits: a
// progress line on a terminal, a line of its own elsewhere; nothing with
// --json.
func (ic *imagesCLI) stepf(format string, args ...any) {
	c := ic.c
	switch {
	case c.quiet:
	case c.stderrTTY:
		c.progressf(format, args...)
	default:
		fmt.Fprintf(c.err, "box: "+format+"\n", args...)
	}
}

// buildOpts is how a build of t's image is asked for: each step said,
// the time so far drawn on a terminal.
func (ic *imagesCLI) buildOpts(t *templates.Template, refresh bool) boxes.ImageBuild {
	return boxes.ImageBuild{Version: version, Refresh: refresh, Step: ic.stepf, Tick: func(step string, d time.Duration) {
		ic.c.progressf("template %s's image: %s (%s)", t.Name, step, d.Round(time.Second))
	}}
}

// imageCells are a template's image in cells: its state and fingerprint,
// its age, and the base it was built from ("-" for none; "?" for a state
// that could not be read).
func imageCells(r boxes.TemplateStatus) (image, built, base string) {
	switch {
	case r.State == "":
		return "?", "-", "-"
	case r.Image == nil:
		return string(r.State), "-", "-"
	}
	return fmt.Sprintf("%s %s", r.State, boxes.Short(r.Image.Fingerprint)),
		time.Since(r.Image.Built).Round(time.Minute).String() + " ago", r.Image.Base
}

// build builds the named templates' images (every template's
// when none is named).
func (ic *imagesCLI) build(names []string, refresh, asJSON bool) error {
	c, ims := ic.c, ic.ims
	var err error
	if len(names) == 0 {
		if names, err = templates.Names(); err != nil {
			return err
		}
	}
	ts := make([]*templates.Template, len(names))
	for i, n := range names {
		if ts[i], err = templates.Get(n); err != nil {
			return usagef("templates build: %v", err)
		}
	}
	var built []boxes.TemplateImage
	for _, t := range ts {
		ti, _, err := ims.Ensure(c.ctx, t, ic.buildOpts(t, refresh))
		c.progressDone()
		if err == nil {
			// A current image's alias, put back where someone moved it.
			err = ims.RepairAlias(c.ctx, ti)
		}
		if err != nil {
			return err
		}
		built = append(built, ti)
		if !asJSON {
			fmt.Fprintf(c.out, "%s: image %s (built %s, in %.0fs)\n", t.Name, boxes.Short(ti.Fingerprint), ti.Built.Format(time.RFC3339), ti.BuildSeconds)
		}
	}
	if asJSON {
		return c.printJSON(built)
	}
	return nil
}
