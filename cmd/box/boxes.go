package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/box-isolation/box/stack"
	"github.com/box-isolation/box/stack/boxes"
	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/model"
	"github.com/box-isolation/box/templates"
)

// How long `box new` waits for a box's address, and for its provisioning
// (cloud-init) to report ready.
const (
	addressWait   = 60 * time.Second
	provisionWait = 20 * time.Minute
)

type newOpts struct {
	name, template, from, image string
	cpu, memory, disk           string
	egress, target              string
	vm, container, asJSON       bool
	// nesting is --nesting; nestingSet says it was given (a template's
	// nesting: true gives way to --nesting=false).
	nesting, nestingSet bool
}

// newResult is what `box new --json` prints.
type newResult struct {
	Box *stack.Box `json:"box"`
	// Address is the box's IPv4 address on the stack's bridge.
	Address string `json:"address"`
	// Provisioned is "ready", "failed: REASON" (box new exits 1, and
	// keeps the box for a look inside), or "not run" for an image without
	// cloud-init (the user-data is stored but nothing runs it).
	Provisioned string `json:"provisioned"`
	// Nesting says containers may run inside it (--nesting, or the
	// template's nesting: true).
	Nesting bool `json:"nesting"`
	// Seconds is how long each part took.
	Seconds newSeconds `json:"seconds"`
	// Clone is set for --from: where it came from and what it inherited.
	Clone *cloneInfo `json:"clone,omitempty"`
}

// newSeconds is how long box new's parts took, in seconds.
type newSeconds struct {
	// Made: incusd made and started it (the image's download and unpack
	// included; for a clone, the copy).
	Made float64 `json:"made"`
	// Address: then until it had its address.
	Address float64 `json:"address"`
	// Provisioned: then until its provisioning reported (cloud-init's
	// packages and agent install); 0 when nothing ran.
	Provisioned float64 `json:"provisioned"`
}

type cloneInfo struct {
	Source        string            `json:"source"`
	Inherited     map[string]string `json:"inherited"`
	SourceStopped bool              `json:"source_stopped"`
	// Provisioning is what the clone's cloud-init does: "checks" (its
	// source's user and checks, nothing installed again), "again" (user-
	// data box did not render, run again as it is), or "" (none).
	Provisioning string `json:"provisioning,omitempty"`
	// Policy is the clone's: its source's current one (but its doors).
	Policy boxes.PolicyNote `json:"policy"`
}

func setupNew(fs *flag.FlagSet) action {
	o := &newOpts{}
	fs.StringVar(&o.name, "name", "", "the new box's name (required)")
	fs.StringVar(&o.template, "template", "", "the template to mint from (box templates lists them; default "+templates.Default+")")
	fs.StringVar(&o.from, "from", "", "clone box SRC, or its snapshot SRC/SNAP, instead of minting from a template")
	fs.StringVar(&o.cpu, "cpu", "", "CPUs, or none for no limit (beats BOX_CPU, which beats the template)")
	fs.StringVar(&o.memory, "memory", "", "memory, e.g. 4GiB, or none for no limit (beats BOX_MEMORY, which beats the template)")
	fs.StringVar(&o.disk, "disk", "", "root disk size, e.g. 20GiB, or none for the pool's default (beats BOX_DISK, which beats the template)")
	fs.BoolVar(&o.vm, "vm", false, "make a virtual machine (default where the host can run one)")
	fs.BoolVar(&o.container, "container", false, "make a container (default where the host cannot run VMs)")
	fs.StringVar(&o.image, "image", "", "the image: an alias or fingerprint on this server, or REMOTE:ALIAS from an image server, as the incus CLI names it (beats BOX_IMAGE, which beats the template's); a box of an image named here is provisioned in itself, not copied from the template's image")
	fs.StringVar(&o.target, "target", "", "on an Incus cluster: the member to mint (or clone) it on (default: where Incus places it)")
	fs.StringVar(&o.egress, "egress", "", "open (the default), or allow:FILE: the box reaches only the names in FILE (one name or *.suffix a line)")
	fs.BoolVar(&o.nesting, "nesting", false, "let containers run inside the box (Docker); --nesting=false overrides a template's nesting: true (what it costs: docs/box.md)")
	fs.BoolVar(&o.asJSON, "json", false, "print the result as JSON")
	return func(c *call) error {
		fs.Visit(func(f *flag.Flag) { o.nestingSet = o.nestingSet || f.Name == "nesting" })
		return c.newBox(o)
	}
}

func (c *call) newBox(o *newOpts) error {
	// --json is for programs: no progress drawn, on a terminal or not.
	c.quiet = o.asJSON
	if o.name == "" {
		return usagef("new: --name is required (e.g. box new --name work)")
	}
	if o.vm && o.container {
		return usagef("new: --vm and --container contradict each other; pick one")
	}
	if o.from != "" {
		for _, f := range []struct {
			set  bool
			flag string
		}{
			{o.cpu != "", "--cpu"}, {o.memory != "", "--memory"}, {o.disk != "", "--disk"},
			{o.template != "", "--template"}, {o.image != "", "--image"}, {o.vm || o.container, "--vm/--container"},
			{o.egress != "", "--egress (a clone keeps its source's; change it with box egress)"},
			{o.nestingSet, "--nesting (a clone keeps its source's)"},
		} {
			if f.set {
				return usagef("new: %s cannot be used with --from: a clone keeps its source's template, image, type and resources (change limits afterwards with box incus %s -- config set {} ...)", f.flag, o.name)
			}
		}
		return c.cloneBox(o)
	}
	if o.template == "" {
		o.template = templates.Default
	}
	t, err := templates.Get(o.template)
	if err != nil {
		return usagef("new: %v", err)
	}
	res, err := templates.MergeResources(t, c.getenv, templates.Resources{CPU: o.cpu, Memory: o.memory, Disk: o.disk})
	if err != nil {
		return usagef("new: %v", err)
	}
	img := t.Image
	if v := strings.TrimSpace(c.getenv("BOX_IMAGE")); v != "" {
		img = v
	}
	if o.image != "" {
		img = o.image
	}
	// The template's own image is built into a local image once per host,
	// and a box of it is a copy (docs/images.md, "Template images"); a
	// box of an image the operator names (--image, BOX_IMAGE), even the
	// template's base, is provisioned in itself.
	fromTemplateImage := img == t.Image && o.image == "" && strings.TrimSpace(c.getenv("BOX_IMAGE")) == ""
	userData, err := t.UserData(templates.RenderOptions{BoxName: o.name, BoxVersion: version})
	if err != nil {
		return err
	}
	h, err := c.host()
	if err != nil {
		return err
	}
	want := ""
	switch {
	case o.vm:
		want = model.TypeVM
	case o.container:
		want = model.TypeContainer
	}
	typ, err := boxes.NewManager(h).NewBoxType(c.ctx, want)
	if err != nil {
		return err
	}
	if !typ.Chosen {
		making := "a container"
		if typ.Type == model.TypeVM {
			making = "a virtual machine (--container for a container)"
		}
		fmt.Fprintf(c.err, "box: %s: making %s\n", typ.Reason, making)
	}
	egress, err := egressFlag(o.egress)
	if err != nil {
		return err
	}
	nesting := o.wantNesting(t)
	req := boxes.MintRequest{Name: o.name, Image: img, UserData: userData,
		Stamps: map[string]string{
			model.StampTemplate: t.Name,
			model.StampUser:     t.User,
			model.StampVersion:  version,
		},
	}
	if fromTemplateImage && typ.Type == model.TypeContainer {
		if req, err = c.images(h).mint(t, o.name, req); err != nil {
			return err
		}
		img = req.Image
	}
	// The box's own time: a build of its image said its own.
	start := time.Now()
	req.Type, req.Egress, req.Target, req.Nesting = typ.Type, egress, o.target, nesting
	req.CPU, req.Memory, req.Disk, req.Processes, req.CPUAllowance = res.CPU, res.Memory, res.Disk, res.Processes, res.CPUAllowance
	c.progressf("minting %s from %s...", o.name, img)
	b, err := boxes.NewManager(h).Mint(c.ctx, req)
	c.progressDone()
	if b != nil {
		for _, n := range b.Notes {
			fmt.Fprintf(c.err, "box: %s: %s\n", o.name, n)
			if strings.HasPrefix(n, boxes.NoteNoMemoryLimit) {
				res.Memory = ""
			}
			if strings.HasPrefix(n, boxes.NoteStandbyTaken) {
				if ready, _, err := c.images(h).ims.Standbys(c.ctx, t.Name, req.Fingerprint); err == nil {
					fmt.Fprintf(c.err, "box: %d standby boxes of template %s left: box templates warm %s makes them up again\n", len(ready), t.Name, t.Name)
				}
			}
		}
	}
	wanted := fmt.Sprintf("template %s, %s", t.Name, res)
	if nesting {
		wanted += ", nesting"
	}
	var notStarted *boxes.NotStartedError
	if errors.As(err, &notStarted) {
		// stack removes a box that was created but would not start (and
		// has already tried without a memory limit).
		return fmt.Errorf("%w\n%s (%s) did not come up and was removed: incusd's log says why", err, o.name, wanted)
	}
	if err != nil {
		return err
	}
	r := &newResult{Box: b, Nesting: nesting}
	if err := c.settle(h, r, start); err != nil {
		return c.notProvisioned(r, o.asJSON, err)
	}
	return c.printNew(r, o.asJSON, wanted)
}

// wantNesting is the template's nesting, unless --nesting says otherwise.
func (o *newOpts) wantNesting(t *templates.Template) bool {
	if o.nestingSet {
		return o.nesting
	}
	return t.Nesting
}

func (c *call) cloneBox(o *newOpts) error {
	src, snap, _ := strings.Cut(o.from, "/")
	if src == "" {
		return usagef("new: --from %q: want SRC or SRC/SNAP", o.from)
	}
	h, err := c.host()
	if err != nil {
		return err
	}
	srcBox, err := stack.Info(c.ctx, h.Incus, src)
	if err != nil {
		return err
	}
	if snap != "" {
		snaps, err := boxes.NewManager(h).Snapshots(c.ctx, src)
		if err != nil {
			return err
		}
		if !slices.ContainsFunc(snaps, func(s incus.Snapshot) bool { return s.Name == snap }) {
			return fmt.Errorf("%s has no snapshot %s (box info %s lists them)", src, snap, src)
		}
	}
	start := time.Now()
	c.progressf("cloning %s into %s...", o.from, o.name)
	cr, err := boxes.NewManager(h).CloneTo(c.ctx, src, snap, o.name, o.target)
	c.progressDone()
	if err != nil {
		return err
	}
	if cr.SourceStopped {
		fmt.Fprintf(c.err, "box: this host cannot copy a running container: %s was stopped for the copy and started again\n", src)
	}
	if len(cr.DoorsDropped) > 0 {
		fmt.Fprintf(c.err, "box: %s's doors (%s) stay its own: the clone has none (box expose %s PORT makes one)\n", src, strings.Join(cr.DoorsDropped, ", "), o.name)
	}
	inherited := map[string]string{}
	for _, k := range []string{model.StampTemplate, model.StampUser, model.StampImage, model.StampType, model.StampVersion} {
		if v, ok := srcBox.Stamps[k]; ok {
			inherited[strings.TrimPrefix(k, model.StampPrefix)] = v
		}
	}
	if l := cr.Policy.Line(o.name); l != "" {
		fmt.Fprintf(c.err, "box: %s\n", l)
	}
	r := &newResult{Box: cr.Box, Clone: &cloneInfo{Source: o.from, Inherited: inherited, SourceStopped: cr.SourceStopped, Provisioning: cr.Provisioning, Policy: cr.Policy}}
	if inst, _, err := h.Incus.Instances().Get(c.ctx, o.name); err == nil {
		r.Nesting = model.Nesting(inst.ExpandedConfig)
	}
	if err := c.settle(h, r, start); err != nil {
		return c.notProvisioned(r, o.asJSON, err)
	}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(inherited)) {
		parts = append(parts, k+"="+inherited[k])
	}
	inh := "nothing stamped (its source predates the stamps)"
	if len(parts) > 0 {
		inh = strings.Join(parts, ", ")
	}
	what := fmt.Sprintf("clone of %s, inherited %s; its disk state and users come with it, its MAC and machine-id are its own", o.from, inh)
	switch cr.Provisioning {
	case boxes.ProvisionChecks:
		what += "; not provisioned again (its user and agent checked only)"
	case boxes.ProvisionAgain:
		what += "; its user-data is not box's and ran again"
	}
	return c.printNew(r, o.asJSON, what)
}

// settle waits for the box's address and, where the image runs cloud-init,
// for its provisioning to report.
func (c *call) settle(h *stack.Host, r *newResult, start time.Time) error {
	name := r.Box.Name
	r.Seconds.Made = seconds(time.Since(start))
	done := make(chan struct{})
	defer close(done)
	go func() {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				c.progressf("waiting for %s: %s", name, time.Since(start).Round(time.Second))
			}
		}
	}()
	t0 := time.Now()
	addr, err := h.Addresses().Wait(c.ctx, name, addressWait)
	if err != nil {
		c.progressDone()
		return fmt.Errorf("minted %s, but: %w", name, err)
	}
	r.Address = addr.String()
	r.Seconds.Address = seconds(time.Since(t0))
	t0 = time.Now()
	r.Provisioned, err = c.waitProvisioned(h.Incus, name)
	if r.Provisioned != "not run" {
		r.Seconds.Provisioned = seconds(time.Since(t0))
	}
	c.progressDone()
	return err
}

func seconds(d time.Duration) float64 { return d.Round(100 * time.Millisecond).Seconds() }

// provisionFailed is a box whose provisioning reported a failure.
type provisionFailed struct{ name, reason string }

func (e *provisionFailed) Error() string {
	return fmt.Sprintf("minted %s, but provisioning failed: %s", e.name, e.reason)
}

// logTail is how many lines of cloud-init's output a failure shows.
const logTail = 15

// notProvisioned reports a box that was made but did not settle. One
// whose provisioning failed is kept, running, as it is: what went wrong
// is usually outside it (a mirror, a registry, an allowlist), and the one
// full account is inside it (cloud-init's output log); box shows its last
// lines, says how to look and how to start again, and exits 1. With
// --json the result is printed all the same, its provisioned field saying
// why.
func (c *call) notProvisioned(r *newResult, asJSON bool, err error) error {
	var pf *provisionFailed
	if !errors.As(err, &pf) {
		return err
	}
	r.Provisioned = "failed: " + pf.reason
	if asJSON {
		if jerr := c.printJSON(r); jerr != nil {
			return jerr
		}
	}
	h, herr := c.host()
	if herr == nil {
		if out, lerr := h.Incus.Instances().Exec(c.ctx, pf.name, incus.ExecRequest{Command: []string{"tail", "-n", strconv.Itoa(logTail), cloudInitLog}}); lerr == nil && out.ExitCode == 0 && len(out.Stdout) > 0 {
			fmt.Fprintf(c.err, "box: the last lines of %s in %s:\n", cloudInitLog, pf.name)
			for line := range strings.SplitSeq(strings.TrimRight(string(out.Stdout), "\n"), "\n") {
				fmt.Fprintf(c.err, "  | %s\n", line)
			}
		}
	}
	return fmt.Errorf("%w\n%s is kept, running, as it failed: look inside with box shell %s (%s has the whole story), or remove it and start again: box rm %s --force", err, pf.name, pf.name, cloudInitLog, pf.name)
}

// markerPoll is how often box new looks for a box's markers: a copy of a
// template's image reports within seconds, and every poll's wait is
// time the operator waits on top (two reads through incusd's file API,
// a few milliseconds each).
const markerPoll = 100 * time.Millisecond

// cloudInitLog is where cloud-init writes its modules' output.
const cloudInitLog = "/var/log/cloud-init-output.log"

// waitProvisioned waits for the template's user-data to report. An image
// without cloud-init stores the user-data and runs nothing: say so rather
// than wait for a marker that never comes.
func (c *call) waitProvisioned(cl *incus.Client, name string) (string, error) {
	if _, err := cl.Instances().PullFile(c.ctx, name, "/usr/bin/cloud-init"); incus.IsNotFound(err) {
		fmt.Fprintf(c.err, "box: %s's image has no cloud-init: the template's user-data is stored but not run\n", name)
		return "not run", nil
	}
	ctx, cancel := context.WithTimeout(c.ctx, provisionWait)
	defer cancel()
	for {
		// An empty marker is no marker: a clone's inherited ones are
		// emptied before it boots (stack's cloneprov.go).
		if b, err := cl.Instances().PullFile(ctx, name, templates.ReadyMarker); err == nil && len(b) > 0 {
			return "ready", nil
		}
		if b, err := cl.Instances().PullFile(ctx, name, templates.FailedMarker); err == nil && len(b) > 0 {
			return "", &provisionFailed{name: name, reason: strings.TrimSpace(string(b))}
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("minted %s, but it has not finished provisioning after %s: look inside with box shell %s (cloud-init status --long)", name, provisionWait, name)
		case <-time.After(markerPoll):
		}
	}
}

func (c *call) printNew(r *newResult, asJSON bool, what string) error {
	if asJSON {
		return c.printJSON(r)
	}
	where := r.Address
	if r.Box.Member != "" {
		where += " on member " + r.Box.Member
	}
	took := fmt.Sprintf("made in %s", fmtSeconds(r.Seconds.Made))
	if r.Seconds.Provisioned > 0 {
		took += fmt.Sprintf(", provisioned %s later", fmtSeconds(r.Seconds.Address+r.Seconds.Provisioned))
	}
	fmt.Fprintf(c.out, "%s: %s %s at %s (%s; %s)\n", r.Box.Name, r.Box.Type, strings.ToLower(r.Box.Status), where, what, took)
	return nil
}

func fmtSeconds(s float64) string {
	return (time.Duration(math.Round(s*10)) * 100 * time.Millisecond).String()
}

func setupTemplates(fs *flag.FlagSet) action {
	asJSON := fs.Bool("json", false, "print JSON")
	refresh := fs.Bool("refresh", false, "build: build again even where the image is current (a base that moved on)")
	return func(c *call) error {
		c.quiet = *asJSON
		if len(c.args) > 0 {
			if c.args[0] != "build" && c.args[0] != "warm" {
				return usagef("templates: %q is not a verb of templates (build builds images, warm keeps standby boxes)", c.args[0])
			}
			h, err := c.host()
			if err != nil {
				return err
			}
			if c.args[0] == "warm" {
				if *refresh {
					return usagef("templates: --refresh goes with build")
				}
				return c.images(h).warm(c.args[1:], *asJSON)
			}
			return c.images(h).build(c.args[1:], *refresh, *asJSON)
		}
		if *refresh {
			return usagef("templates: --refresh goes with build")
		}
		ts, err := templates.Builtin()
		if err != nil {
			return err
		}
		rows := make([]boxes.TemplateStatus, len(ts))
		for i := range ts {
			rows[i] = boxes.TemplateStatus{Template: ts[i]}
		}
		if h, err := c.host(); err == nil {
			if list, err := c.images(h).ims.List(c.ctx); err == nil {
				rows = list
			} else {
				fmt.Fprintf(c.err, "box: the templates' images were not read: %v\n", err)
			}
		}
		if *asJSON {
			return c.printJSON(rows)
		}
		tw := tabwriter.NewWriter(c.out, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "NAME\tUSER\tCPU\tMEMORY\tDISK\tIMAGE\tBUILT\tBASE\tSTANDBY\tDESCRIPTION")
		for _, r := range rows {
			name := r.Name
			if name == templates.Default {
				name += " (default)"
			}
			img, built, base := imageCells(r)
			standby := "-"
			if r.Image != nil && (r.Image.Standby > 0 || r.Standby > 0) {
				standby = fmt.Sprintf("%d/%d", r.Standby, r.Image.Standby)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", name, r.User, r.Resources.CPU, r.Resources.Memory, r.Resources.Disk, img, built, base, standby, r.Description)
		}
		return tw.Flush()
	}
}

func setupList(fs *flag.FlagSet) action {
	asJSON := fs.Bool("json", false, "print JSON (the stable interface)")
	return func(c *call) error {
		h, err := c.host()
		if err != nil {
			return err
		}
		boxes, cerr, err := h.BoxesOnStack(c.ctx)
		if err != nil {
			return err
		}
		if *asJSON {
			return c.printJSON(boxes)
		}
		return c.printBoxes(boxes, cerr)
	}
}

// printBoxes is the table of `box list` (and `box status`), with why a box
// is off the stack on stderr.
func (c *call) printBoxes(boxes []stack.Box, censusErr error) error {
	if len(boxes) == 0 {
		fmt.Fprintln(c.err, "no boxes yet: box new --name N mints one")
		return nil
	}
	// A cluster's boxes each name their member: only then is there a
	// MEMBER column.
	clustered := slices.ContainsFunc(boxes, func(b stack.Box) bool { return b.Member != "" })
	tw := tabwriter.NewWriter(c.out, 0, 4, 2, ' ', 0)
	member := func(b stack.Box) string {
		if !clustered {
			return ""
		}
		return cmp.Or(b.Member, "-") + "\t"
	}
	fmt.Fprintln(tw, "NAME\tSTATUS\tTYPE\t"+member(stack.Box{Member: "MEMBER"})+"STACK\tTEMPLATE\tUSER\tMINTED\tORIGIN")
	off := 0
	for _, b := range boxes {
		onStack := "?"
		if b.OnStack != nil && *b.OnStack {
			onStack = "on"
		} else if b.OnStack != nil {
			onStack, off = "OFF", off+1
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s%s\t%s\t%s\t%s\t%s\n", b.Name, b.Status, b.Type, member(b), onStack,
			stamp(b, model.StampTemplate), stamp(b, model.StampUser), stamp(b, model.StampMinted), stamp(b, model.StampOrigin))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, b := range boxes {
		for _, why := range b.OffStack {
			fmt.Fprintf(c.err, "box: %s is off the stack: %s\n", b.Name, why)
		}
	}
	switch {
	case censusErr != nil:
		fmt.Fprintf(c.err, "box: STACK is ? because the fleet census could not be taken (%v): box doctor, as root, checks every box\n", censusErr)
	case off > 0:
		fmt.Fprintf(c.err, "box: %d box(es) off the stack: box doctor names the fix for each\n", off)
	}
	return nil
}

// stamp reads a stamp for display; a box minted before the key existed
// shows "-".
func stamp(b stack.Box, key string) string {
	if v := b.Stamps[key]; v != "" {
		return v
	}
	return "-"
}

// infoResult is what `box info --json` prints.
type infoResult struct {
	*stack.Box
	Addresses []string         `json:"addresses"`
	Snapshots []incus.Snapshot `json:"snapshots"`
	// Doors are its doors (box expose), and devices that look like one.
	Doors []model.Door `json:"doors"`
	// Policy is its policy (docs/design.md, "A box's policy is the
	// operator's"); Recorded is box's copy on the bridge, when it has one,
	// and RecordDiffers how the box's own differs from it (recorded ->
	// the box's): set through Incus alone, or an Incus restore.
	Policy        model.Policy  `json:"policy"`
	Recorded      *model.Policy `json:"policy_recorded,omitempty"`
	RecordDiffers []string      `json:"policy_record_differs,omitempty"`
}

func setupInfo(fs *flag.FlagSet) action {
	asJSON := fs.Bool("json", false, "print JSON (the stable interface)")
	return func(c *call) error {
		h, err := c.host()
		if err != nil {
			return err
		}
		r := infoResult{Box: c.box, Addresses: []string{}}
		if r.Snapshots, err = boxes.NewManager(h).Snapshots(c.ctx, c.name()); err != nil {
			return err
		}
		if r.Snapshots == nil {
			r.Snapshots = []incus.Snapshot{}
		}
		if r.Doors, err = boxes.NewDoors(h).ListDoors(c.ctx, c.name()); err != nil {
			return err
		}
		if inst, _, err := h.Incus.Instances().Get(c.ctx, c.name()); err == nil {
			r.Policy = model.PolicyOf(inst.Config, inst.Devices)
			if rec, ok, err := h.Policies().Recorded(c.ctx, inst.Project, c.name()); err == nil && ok {
				r.Recorded, r.RecordDiffers = &rec, rec.Diff(r.Policy)
			}
		}
		if st, err := h.Incus.Instances().State(c.ctx, c.name()); err == nil {
			for nic, n := range st.Network {
				if nic == "lo" {
					continue
				}
				for _, a := range n.Addresses {
					if a.Scope == "global" {
						r.Addresses = append(r.Addresses, a.Address)
					}
				}
			}
			slices.Sort(r.Addresses)
		}
		if *asJSON {
			return c.printJSON(r)
		}
		printInfo(c.out, r)
		return nil
	}
}

func printInfo(w io.Writer, r infoResult) {
	tw := tabwriter.NewWriter(w, 0, 4, 1, ' ', 0)
	addrs := "-"
	if len(r.Addresses) > 0 {
		addrs = strings.Join(r.Addresses, ", ")
	}
	fmt.Fprintf(tw, "name:\t%s\n", r.Name)
	fmt.Fprintf(tw, "status:\t%s\n", r.Status)
	fmt.Fprintf(tw, "type:\t%s\n", r.Type)
	if r.Member != "" {
		fmt.Fprintf(tw, "member:\t%s\n", r.Member)
	}
	fmt.Fprintf(tw, "generation:\t%s\n", r.Generation)
	fmt.Fprintf(tw, "created:\t%s\n", r.Created.UTC().Format(time.RFC3339))
	fmt.Fprintf(tw, "addresses:\t%s\n", addrs)
	fmt.Fprintf(tw, "profiles:\t%s\n", strings.Join(r.Profiles, ", "))
	for _, k := range []string{model.StampTemplate, model.StampUser, model.StampMinted, model.StampVersion,
		model.StampImage, model.StampImageServer, model.StampFingerprint, model.StampType, model.StampOrigin} {
		fmt.Fprintf(tw, "%s:\t%s\n", strings.TrimPrefix(k, model.StampPrefix), stamp(*r.Box, k))
	}
	tw.Flush()
	if len(r.Doors) == 0 {
		fmt.Fprintln(w, "doors: none")
	} else {
		fmt.Fprintln(w, "doors:")
		for _, d := range r.Doors {
			what := d.Kind
			if d.Problem != "" {
				what = "not box's: " + d.Problem
			}
			fmt.Fprintf(w, "  %d -> %s	%s (%s)\n", d.Port, d.Host, d.Device, what)
		}
	}
	fmt.Fprintf(w, "policy: %s\n", r.Policy.Summary())
	if len(r.RecordDiffers) > 0 {
		fmt.Fprintf(w, "policy recorded by box: %s (recorded -> the box's: %s; changed through Incus alone, or restored by it; the recorded allowlist is the one enforced: box egress sets one on both, and expose or restore record the box's other settings again)\n",
			r.Recorded.Summary(), strings.Join(r.RecordDiffers, "; "))
	}
	if len(r.Snapshots) == 0 {
		fmt.Fprintln(w, "snapshots: none")
		return
	}
	fmt.Fprintln(w, "snapshots:")
	for _, s := range r.Snapshots {
		fmt.Fprintf(w, "  %s\t%s\n", s.Name, s.CreatedAt.UTC().Format(time.RFC3339))
	}
}

func setupExec(fs *flag.FlagSet) action {
	return func(c *call) error {
		argv := append(c.args[1:], c.rest...)
		if len(argv) == 0 {
			return usagef("exec: what command? box exec %s -- CMD [ARGS...]", c.name())
		}
		if c.box.Status != "Running" {
			return fmt.Errorf("%s is %s: start it first (box start %s)", c.name(), strings.ToLower(c.box.Status), c.name())
		}
		h, err := c.host()
		if err != nil {
			return err
		}
		u, err := c.boxUser(h.Incus)
		if err != nil {
			return err
		}
		res, err := h.Incus.Instances().Exec(c.ctx, c.name(), incus.ExecRequest{
			Command: argv, User: u.uid, Group: u.gid, Cwd: u.home,
			Env: map[string]string{"HOME": u.home, "USER": u.name, "LOGNAME": u.name},
		})
		if err != nil {
			return err
		}
		c.out.Write(res.Stdout) //nolint:errcheck
		c.err.Write(res.Stderr) //nolint:errcheck
		if res.Truncated {
			fmt.Fprintf(c.err, "box: output truncated at %d bytes per stream\n", incus.MaxExecOutput)
		}
		if res.ExitCode != 0 {
			return exitError{res.ExitCode}
		}
		return nil
	}
}

// boxUser is who box runs things as inside a box.
type boxUser struct {
	name     string
	uid, gid uint32
	home     string
}

// boxUser maps the box's user stamp to ids through the box's own
// /etc/passwd; a box without the stamp is entered as root.
func (c *call) boxUser(cl *incus.Client) (boxUser, error) {
	name := c.box.Stamps[model.StampUser]
	if name == "" || name == "root" {
		return boxUser{name: "root", home: "/root"}, nil
	}
	passwd, err := cl.Instances().PullFile(c.ctx, c.name(), "/etc/passwd")
	if err != nil {
		return boxUser{}, fmt.Errorf("looking up user %s in %s: %w", name, c.name(), err)
	}
	u, ok := lookupPasswd(string(passwd), name)
	if !ok {
		return boxUser{}, fmt.Errorf("%s's user %s is not in its /etc/passwd (is it still provisioning? box info %s); run as root with box incus %s -- exec {} -- CMD", c.name(), name, c.name(), c.name())
	}
	return u, nil
}

// lookupPasswd finds a user in the text of an /etc/passwd.
func lookupPasswd(passwd, name string) (boxUser, bool) {
	for line := range strings.SplitSeq(passwd, "\n") {
		f := strings.Split(line, ":")
		if len(f) < 7 || f[0] != name {
			continue
		}
		uid, err1 := strconv.ParseUint(f[2], 10, 32)
		gid, err2 := strconv.ParseUint(f[3], 10, 32)
		if err1 != nil || err2 != nil {
			return boxUser{}, false
		}
		home := f[5]
		if home == "" {
			home = "/"
		}
		return boxUser{name: name, uid: uint32(uid), gid: uint32(gid), home: home}, true
	}
	return boxUser{}, false
}

func setupSnapshot(fs *flag.FlagSet) action {
	return func(c *call) error {
		h, err := c.host()
		if err != nil {
			return err
		}
		label := ""
		if len(c.args) > 1 {
			label = c.args[1]
		}
		snap, err := boxes.NewManager(h).Snapshot(c.ctx, c.name(), label)
		if err != nil {
			return err
		}
		fmt.Fprintf(c.out, "%s/%s\n", c.name(), snap)
		return nil
	}
}

func setupRestore(fs *flag.FlagSet) action {
	withPolicy := fs.Bool("with-policy", false, "take the snapshot's policy (allowlist, limits, nesting, doors) instead of keeping the box's current one")
	asJSON := fs.Bool("json", false, "print the result as JSON")
	return func(c *call) error {
		h, err := c.host()
		if err != nil {
			return err
		}
		snap := c.args[1]
		res, err := boxes.NewManager(h).Restore(c.ctx, c.name(), snap, *withPolicy)
		if err != nil {
			return err
		}
		if res.Restarted {
			// Up again only at its fixed address (docs/design.md).
			if _, err := h.Addresses().Wait(c.ctx, c.name(), addressWait); err != nil {
				return fmt.Errorf("restored %s to %s and started it, but: %w", c.name(), snap, err)
			}
		}
		if *asJSON {
			return c.printJSON(res)
		}
		fmt.Fprintf(c.out, "%s restored to %s\n", c.name(), snap)
		if l := res.Policy.Line(c.name()); l != "" {
			fmt.Fprintln(c.out, l)
		}
		return nil
	}
}

func setupRename(fs *flag.FlagSet) action {
	return func(c *call) error {
		h, err := c.host()
		if err != nil {
			return err
		}
		if err := boxes.NewManager(h).Rename(c.ctx, c.name(), c.args[1]); err != nil {
			return err
		}
		fmt.Fprintf(c.out, "%s renamed to %s\n", c.name(), c.args[1])
		return nil
	}
}

func setupDown(fs *flag.FlagSet) action {
	force := fs.Bool("force", false, "kill it at once instead of a clean shutdown")
	return func(c *call) error {
		h, err := c.host()
		if err != nil {
			return err
		}
		if c.box.Status == "Stopped" {
			fmt.Fprintf(c.err, "%s is already stopped\n", c.name())
			return nil
		}
		if err := boxes.NewManager(h).Stop(c.ctx, c.name(), *force); err != nil {
			return err
		}
		fmt.Fprintf(c.out, "%s stopped\n", c.name())
		return nil
	}
}

func setupStart(fs *flag.FlagSet) action {
	return func(c *call) error {
		h, err := c.host()
		if err != nil {
			return err
		}
		if c.box.Status == "Running" {
			fmt.Fprintf(c.err, "%s is already running\n", c.name())
			return nil
		}
		if err := boxes.NewManager(h).Start(c.ctx, c.name()); err != nil {
			return err
		}
		// Started is up only at its fixed address (docs/design.md).
		addr, err := h.Addresses().Wait(c.ctx, c.name(), addressWait)
		if err != nil {
			return fmt.Errorf("started %s, but: %w", c.name(), err)
		}
		fmt.Fprintf(c.out, "%s started at %s\n", c.name(), addr)
		return nil
	}
}

func setupRm(fs *flag.FlagSet) action {
	return func(c *call) error {
		h, err := c.host()
		if err != nil {
			return err
		}
		snaps, err := boxes.NewManager(h).Snapshots(c.ctx, c.name())
		if err != nil {
			return err
		}
		if err := boxes.NewManager(h).Remove(c.ctx, c.name()); err != nil {
			return err
		}
		fmt.Fprintf(c.out, "%s removed (with %d snapshots)\n", c.name(), len(snaps))
		return nil
	}
}

func setupMove(fs *flag.FlagSet) action {
	target := fs.String("target", "", "the cluster member to move it to (required)")
	asJSON := fs.Bool("json", false, "print the result as JSON")
	return func(c *call) error {
		if *target == "" {
			return usagef("move: --target is required (box move %s --target MEMBER)", c.name())
		}
		h, err := c.host()
		if err != nil {
			return err
		}
		start := time.Now()
		c.progressf("moving %s to %s...", c.name(), *target)
		res, err := boxes.NewManager(h).Move(c.ctx, c.name(), *target)
		c.progressDone()
		if err != nil {
			return err
		}
		for _, n := range res.Notes {
			fmt.Fprintf(c.err, "box: %s: %s\n", c.name(), n)
		}
		if *asJSON {
			return c.printJSON(res)
		}
		if res.From == res.To {
			fmt.Fprintf(c.out, "%s is on %s (address %s)\n", c.name(), res.To, res.Address)
			return nil
		}
		fmt.Fprintf(c.out, "%s moved from %s to %s in %s, address %s kept (box start %s)\n", c.name(), res.From, res.To, time.Since(start).Round(time.Millisecond), res.Address, c.name())
		return nil
	}
}
