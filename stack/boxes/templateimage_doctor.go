package boxes

import (
	"context"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/model"
	"github.com/box-isolation/box/templates"
)

// DefaultImageMaxAge is the age past which box doctor notes a template's
// image: its packages are that old, whatever the mirror has since.
const DefaultImageMaxAge = 30 * 24 * time.Hour

// Notes are what box doctor says about the template images: each one
// older than maxAge, of a template box no longer has, gone from Incus, or
// changed behind box's back (its alias moved, its properties edited), and
// images box published that its record no longer names. None stops a
// mint (box mints by fingerprint); each says what to run.
func (ims *TemplateImages) Notes(ctx context.Context, maxAge time.Duration) ([]string, error) {
	rec, err := ReadTemplateImages(ims.File)
	if err != nil {
		return nil, err
	}
	names, err := templates.Names()
	if err != nil {
		return nil, err
	}
	imgs, err := ims.host.Incus.Images().List(ctx)
	if err != nil {
		return nil, fmt.Errorf("reading the template images: %w", err)
	}
	byFP := map[string]incus.Image{}
	for _, img := range imgs {
		byFP[img.Fingerprint] = img
	}
	var notes []string
	recorded := map[string]bool{}
	for _, tpl := range slices.Sorted(maps.Keys(rec)) {
		ti := rec[tpl]
		recorded[ti.Fingerprint] = true
		img, ok := byFP[ti.Fingerprint]
		switch {
		case !slices.Contains(names, tpl):
			notes = append(notes, fmt.Sprintf("template images: %s is the image of template %s, which this box no longer has: incus image delete %s removes it", Short(ti.Fingerprint), tpl, ti.Fingerprint))
			continue
		case !ok:
			notes = append(notes, fmt.Sprintf("template images: template %s's image %s is gone from Incus (deleted behind box's back): the next mint builds it again, or box templates build %s now", tpl, Short(ti.Fingerprint), tpl))
			continue
		}
		if age := time.Since(ti.Built); maxAge > 0 && age > maxAge {
			notes = append(notes, fmt.Sprintf("template images: template %s's image %s is %d days old (its packages are as the mirror had them on %s): box templates build --refresh %s rebuilds it", tpl, Short(ti.Fingerprint), int(age.Hours()/24), ti.Built.Format(time.DateOnly), tpl))
		}
		if img.Properties["user.box.template"] != tpl || img.Properties["user.box.template_hash"] != ti.Hash {
			notes = append(notes, fmt.Sprintf("template images: template %s's image %s has had its properties changed behind box's back (user.box.template=%q, user.box.template_hash=%q): box mints it by fingerprint, so its content is what box built; box templates build --refresh %s replaces it", tpl, Short(ti.Fingerprint), img.Properties["user.box.template"], img.Properties["user.box.template_hash"], tpl))
		}
		alias := ims.Alias(tpl)
		switch a, err := ims.host.Incus.Images().Alias(ctx, alias); {
		case incus.IsNotFound(err):
			notes = append(notes, fmt.Sprintf("template images: the alias %s is gone (box mints by fingerprint, so mints are unaffected): box templates build %s puts it back", alias, tpl))
		case err != nil:
			return notes, fmt.Errorf("reading the alias %s: %w", alias, err)
		case a.Target != ti.Fingerprint:
			notes = append(notes, fmt.Sprintf("template images: the alias %s points at %s, not at the image box built and mints from (%s): someone moved it (a granted user's project shares the default project's aliases); mints are unaffected; box templates build %s puts it back", alias, Short(a.Target), Short(ti.Fingerprint), tpl))
		}
		ready, other, err := ims.Standbys(ctx, tpl, ti.Fingerprint)
		if err != nil {
			return notes, err
		}
		if len(ready) < ti.Standby || len(other) > 0 {
			notes = append(notes, fmt.Sprintf("template images: template %s has %d of the %d standby boxes box templates warm keeps ready to take, and %d others (of an older image, or started by hand): box templates warm %s makes them up and removes the stopped others", tpl, len(ready), ti.Standby, len(other), tpl))
		}
	}
	for _, img := range imgs {
		if tpl := img.Properties["user.box.template"]; tpl != "" && !recorded[img.Fingerprint] && strings.HasPrefix(img.Properties["description"], "box template ") {
			notes = append(notes, fmt.Sprintf("template images: image %s says it is template %s's, but box's record does not name it (a build cut short, or another host's record): incus image delete %s removes it", Short(img.Fingerprint), tpl, img.Fingerprint))
		}
	}
	return notes, nil
}

// Purge removes the template images box recorded, their aliases and the
// record: what teardown-host --purge-incus takes away.
func (ims *TemplateImages) Purge(ctx context.Context) ([]model.Change, error) {
	rec, err := ReadTemplateImages(ims.File)
	if err != nil {
		return nil, err
	}
	var changes []model.Change
	for _, tpl := range slices.Sorted(maps.Keys(rec)) {
		ti := rec[tpl]
		if a, err := ims.host.Incus.Images().Alias(ctx, ims.Alias(tpl)); err == nil && a.Target == ti.Fingerprint {
			if err := ims.host.Incus.Images().DeleteAlias(ctx, ims.Alias(tpl)); err != nil && !incus.IsNotFound(err) {
				return changes, err
			}
		}
		if err := ims.host.Incus.Images().Delete(ctx, ti.Fingerprint); err != nil && !incus.IsNotFound(err) {
			return changes, fmt.Errorf("removing template %s's image: %w", tpl, err)
		}
		changes = append(changes, model.Change{Object: "image " + Short(ti.Fingerprint), Action: "removed", Detail: "template " + tpl + "'s image"})
	}
	if err := os.Remove(ims.File); err != nil && !os.IsNotExist(err) {
		return changes, fmt.Errorf("removing the template images' record: %w", err)
	}
	return changes, nil
}

// PoolCost is what a mint from a template's image costs on the pool this
// host mints on: a snapshot on a copy-on-write pool, a full copy on dir,
// with what the builds measured here.
type PoolCost struct {
	Pool        string `json:"pool"`
	Driver      string `json:"driver"`
	CopyOnWrite bool   `json:"copy_on_write"`
	// Measured is the largest image built here: its size and how long
	// its first instance took to make (TemplateImage.UnpackSeconds).
	Measured *TemplateImage `json:"measured,omitempty"`
}

// PoolCost reads the pool's driver and the record's measurements.
func (ims *TemplateImages) PoolCost(ctx context.Context) (*PoolCost, error) {
	name := ims.host.Options.PoolName()
	p, _, err := ims.host.Incus.Storage().Pool(ctx, name)
	if err != nil {
		return nil, err
	}
	pc := &PoolCost{Pool: name, Driver: p.Driver}
	switch p.Driver {
	case "btrfs", "zfs", "ceph":
		pc.CopyOnWrite = true
	case "lvm":
		pc.CopyOnWrite = p.Config["lvm.use_thinpool"] != "false"
	}
	rec, err := ReadTemplateImages(ims.File)
	if err != nil {
		return pc, err
	}
	for _, ti := range rec {
		if ti.Pool == name && ti.SizeBytes > 0 && (pc.Measured == nil || ti.SizeBytes > pc.Measured.SizeBytes) {
			pc.Measured = &ti
		}
	}
	return pc, nil
}

// String says it in a line.
func (pc PoolCost) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "storage pool %s (%s): ", pc.Pool, pc.Driver)
	if pc.CopyOnWrite {
		b.WriteString("copy-on-write: a mint snapshots the template's image volume, whatever its size")
	} else {
		b.WriteString("no copy-on-write: every mint copies the template's image in full")
	}
	m := pc.Measured
	switch {
	case m == nil:
		b.WriteString("; no template image built here yet to measure (box templates build builds them)")
	case pc.CopyOnWrite:
		fmt.Fprintf(&b, "; measured here: template %s's %.1f GB image made its volume in %.1f s, once, at its build", m.Template, gb(m.SizeBytes), m.UnpackSeconds)
	default:
		fmt.Fprintf(&b, "; measured here: template %s's %.1f GB image copied in %.1f s (%.1f s per GB), at every mint", m.Template, gb(m.SizeBytes), m.UnpackSeconds, m.UnpackSeconds/gb(m.SizeBytes))
	}
	if !pc.CopyOnWrite {
		b.WriteString("; a btrfs, zfs or lvm-thin pool makes a mint a snapshot (docs/images.md, \"The pool decides the speed\")")
	}
	return b.String()
}

func gb(n int64) float64 { return float64(n) / 1e9 }
