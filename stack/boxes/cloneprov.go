package boxes

import (
	"context"
	"strings"

	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/model"
	"github.com/box-isolation/box/templates"
)

// A clone's provisioning. A cloud image renders its cloud-init seed again
// on a copy, so a clone is a new cloud-init instance and would run its
// source's user-data again: apt and npm, minutes, through a network its
// egress allowlist may not open, upgrading the agent under the state the
// operator logged in with. box gives the clone user-data of its own
// (templates.ForClone: the source's user and checks, nothing installed)
// and empties the markers it inherited, so that what box new waits for is
// the clone's own report (docs/box.md, Clones).

// What a clone's cloud-init does at its first boot (CloneResult).
const (
	// ProvisionChecks: box's user-data, made the clone's: the user and
	// the checks, nothing installed again.
	ProvisionChecks = "checks"
	// ProvisionAgain: user-data box did not render (or that was changed
	// since): cloud-init runs it again, as it is.
	ProvisionAgain = "again"
)

// keyUserData is the instance key Incus renders into the NoCloud seed.
const keyUserData = "cloud-init.user-data"

// cloneUserData makes a copy's user-data its own (in cfg, its config
// before the first start) and says what its cloud-init will do; "" when
// it has none.
func cloneUserData(cfg map[string]string, name string) string {
	ud, ok := cfg[keyUserData]
	if !ok || strings.TrimSpace(ud) == "" {
		return ""
	}
	c, ok := templates.ForClone(ud, name)
	if !ok {
		return ProvisionAgain
	}
	cfg[keyUserData] = c
	return ProvisionChecks
}

// emptyTemplate is the instance template that renders an empty file.
const emptyTemplate = "box-empty.tpl"

// emptyMarkers empties the provisioning markers a stopped copy inherited,
// before it boots: an empty marker is no marker (box new waits for one
// with its content). A container's are written in its disk; a VM's disk
// cannot be written before its agent runs, so Incus empties them at the
// copy's first start, as with its machine-id (not proven on a VM here:
// docs/images.md).
func (mgr *Manager) emptyMarkers(ctx context.Context, inst *incus.Instance) error {
	host := mgr.host
	markers := []string{templates.ReadyMarker, templates.FailedMarker}
	if inst.Type != model.TypeContainer {
		return mgr.copyTemplate(ctx, inst.Name, emptyTemplate, "", markers...)
	}
	for _, p := range markers {
		b, err := host.Incus.Instances().PullFile(ctx, inst.Name, p)
		if incus.IsNotFound(err) || (err == nil && len(b) == 0) {
			continue
		}
		if err != nil {
			return err
		}
		if err := host.Incus.Instances().PushFile(ctx, inst.Name, p, strings.NewReader(""), 0o644, 0, 0); err != nil {
			return err
		}
	}
	return nil
}

// copyTemplate has Incus render the instance template tpl (text) onto
// each path at the instance's next start after a copy: it adds the
// template to the instance's image metadata, beside the image's own. An
// import is no copy to Incus: its copy templates are made to run at its
// next start too, as `incus copy` would.
func (mgr *Manager) copyTemplate(ctx context.Context, name, tpl, text string, paths ...string) error {
	host := mgr.host
	if err := host.Incus.Instances().PutTemplate(ctx, name, tpl, strings.NewReader(text)); err != nil {
		return err
	}
	md, etag, err := host.Incus.Instances().Metadata(ctx, name)
	if err != nil {
		return err
	}
	if md.Templates == nil {
		md.Templates = map[string]*incus.ImageTemplate{}
	}
	for _, p := range paths {
		md.Templates[p] = &incus.ImageTemplate{When: []string{"copy"}, Template: tpl, Properties: map[string]string{}}
	}
	if err := host.Incus.Instances().UpdateMetadata(ctx, name, *md, etag); err != nil {
		return err
	}
	inst, etag, err := host.Incus.Instances().Get(ctx, name)
	if err != nil {
		return err
	}
	if inst.Config["volatile.apply_template"] != "" {
		return nil // Incus set it: "copy" for a copy
	}
	put := inst.Writable()
	put.Config["volatile.apply_template"] = "copy"
	return host.Incus.Instances().Update(ctx, name, put, etag)
}
