package drill

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/box-isolation/box/stack"
	"github.com/box-isolation/box/stack/boxes"
	"github.com/box-isolation/box/stack/model"
)

// Tags the drill puts on its own boxes, so an aborted run's boxes are found
// and removed by the next run, and nothing else ever is.
const (
	TagDrill = "user.drill"
	TagRun   = "user.drill.run"
)

// agentPath is where the agent binary is pushed inside a box.
const agentPath = "/usr/bin/drill-agent"

// probeType is what the probe boxes are minted as, whatever box new makes on
// the host: the probe image is a container image.
const probeType = model.TypeContainer

// mintBoxes mints box-a and box-b and clones box-a, while each selected
// claim mints its own box beside them (its mint hook); then has each claim
// prepare what else it needs (a door, the LAN stand-in), applies the
// mutations that act on live boxes, makes the claims' requests and reads
// the stack as the probes will find it. The boxes are removed at teardown
// whatever happens.
func (r *run) mintBoxes(ctx context.Context) error {
	cfg, rep := &r.cfg, r.rep
	names := map[Place]string{PlaceA: r.boxName("a"), PlaceB: r.boxName("b"), PlaceC: r.boxName("c")}
	for _, m := range r.members {
		if !m.Local {
			names[memberBoxPlace(m.Name)] = r.boxName(memberSuffix(m.Name))
		}
	}
	r.names, r.ends = names, map[Place]*BoxEnd{}
	// The run leaves dnsmasq's lease file as it found it: after its boxes
	// are gone, a lease of one of them (Incus does not always give one up)
	// or one its DHCP lies got is released.
	if before, err := cfg.Host.Addresses().DHCPLeases(); err == nil {
		r.later(func(ctx context.Context) error { return releaseRunLeases(ctx, cfg, before) })
	}
	r.later(func(ctx context.Context) error {
		cfg.logf("teardown: removing this run's boxes")
		if err := cleanLeftovers(ctx, cfg.Host, rep.RunID); err != nil {
			return fmt.Errorf("teardown: %w", err)
		}
		return nil
	})
	cfg.logf("boxes: minting %s, %s and cloning %s", names[PlaceA], names[PlaceB], names[PlaceC])
	mintTime := 3 * time.Minute
	if cfg.Template != nil {
		// The template's image built, then box-a and its clone, each
		// provisioned in turn.
		mintTime += 3 * provisionWait
	}
	mctx, cancel := context.WithTimeout(ctx, mintTime)
	defer cancel()
	if err := r.ensureTemplateImage(mctx); err != nil {
		return fmt.Errorf("boxes: %w", err)
	}
	common := maps.Clone(names)
	if err := r.mintSideBySide(mctx, func(ctx context.Context) error {
		if err := r.mintCommon(ctx, common); err != nil {
			return fmt.Errorf("boxes: %w", err)
		}
		return nil
	}); err != nil {
		return err
	}
	sortBoxes(rep.Boxes)
	if err := checkPlacement(r.members.local(), r.ends); err != nil {
		return fmt.Errorf("boxes: %w", err)
	}
	for _, c := range cfg.Claims {
		if c.prepare != nil {
			if err := c.prepare(mctx, r); err != nil {
				return err
			}
		}
	}
	noteInstanceType(rep, r.boxNew)
	actx, cancelAfter := context.WithTimeout(ctx, 2*time.Minute)
	defer cancelAfter()
	if err := applyMutations(actx, cfg, true, names); err != nil {
		return err
	}
	for _, c := range cfg.Claims {
		if c.requests != nil && r.skipped[c.ID] == "" {
			c.requests(actx, r)
		}
	}
	return r.verifyForProbes(actx)
}

// mintSideBySide runs the claims' setups, then mints the common boxes
// (common) and each claim's own at once: beside a host's many boxes every create and start of incusd's is
// slower, and one after the other they added up (docs/measurements.md,
// "A busy host"). In a template run the common boxes come first: box-t is
// minted from what box-a's image resolved to. The first error cancels the
// rest; teardown removes whatever was made.
func (r *run) mintSideBySide(ctx context.Context, common func(context.Context) error) error {
	for _, c := range r.cfg.Claims {
		if c.setup != nil {
			if err := c.setup(ctx, r); err != nil {
				return err
			}
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	do := func(fn func(context.Context) error) {
		if err := fn(ctx); err != nil {
			mu.Lock()
			errs = append(errs, err)
			mu.Unlock()
			cancel()
		}
	}
	if r.cfg.Template != nil {
		if err := common(ctx); err != nil {
			return err
		}
	} else {
		wg.Go(func() { do(common) })
	}
	for _, c := range r.cfg.Claims {
		if c.mint != nil {
			wg.Go(func() { do(func(ctx context.Context) error { return c.mint(ctx, r) }) })
		}
	}
	wg.Wait()
	// The first error is the cause; the others were cancelled by it.
	if len(errs) > 0 {
		return errs[0]
	}
	return nil
}

// mintCommon mints the boxes every run has (names): box-a and box-b, one
// box on every other member of a cluster, and clone-a, each provisioned in
// a template run; reads what box-a's image resolved to, and keeps their
// ends.
func (r *run) mintCommon(ctx context.Context, names map[Place]string) error {
	cfg := &r.cfg
	// On a cluster, box-a, box-b and the clone live on the member the
	// drill talks to, one more box on every other member it can enter.
	mints := map[Place]string{PlaceA: r.members.local(), PlaceB: r.members.local()}
	for _, m := range r.members {
		if !m.Local {
			mints[memberBoxPlace(m.Name)] = m.Name
		}
	}
	mintErr := make([]error, 0, len(mints))
	var mu sync.Mutex
	var wg sync.WaitGroup
	if cfg.Template != nil && r.tmplImage == nil {
		// box-a first: it pulls the image, which the others then find in
		// Incus's cache (two pulls of one image at once collide in incusd's
		// cache folder: "mkdir ...: file exists"). Copies of a template's
		// image pull nothing.
		if err := r.mintProvisioned(ctx, names[PlaceA], mints[PlaceA]); err != nil {
			return err
		}
		delete(mints, PlaceA)
	}
	for p, target := range mints {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := r.mintProvisioned(ctx, names[p], target)
			mu.Lock()
			mintErr = append(mintErr, err)
			mu.Unlock()
		}()
	}
	wg.Wait()
	if err := errors.Join(mintErr...); err != nil {
		return err
	}
	if _, err := cfg.Host.Addresses().Wait(ctx, names[PlaceA], 30*time.Second); err != nil {
		return err
	}
	if _, err := boxes.NewManager(cfg.Host).CloneTo(ctx, names[PlaceA], "", names[PlaceC], r.members.local()); err != nil {
		return err
	}
	if _, err := cfg.Host.Addresses().Wait(ctx, names[PlaceC], 30*time.Second); err != nil {
		return err
	}
	if err := r.waitProvisioned(ctx, cfg.Host.Incus, names[PlaceC]); err != nil {
		return err
	}
	if err := r.readBaseImage(ctx, names[PlaceA]); err != nil {
		return err
	}
	for _, p := range append([]Place{PlaceA, PlaceB, PlaceC}, r.members.boxPlaces()...) {
		e, err := boxEnd(ctx, cfg.Host, p, names[p])
		if err != nil {
			return err
		}
		r.addBox(e)
	}
	return nil
}

// mintProvisioned mints the probe box name on a member (target) and, in a
// template run, waits until it is provisioned.
func (r *run) mintProvisioned(ctx context.Context, name, target string) error {
	req, err := r.mintRequest(name, target, true)
	if err != nil {
		return err
	}
	if err := mintProbeBox(ctx, &r.cfg, req); err != nil {
		return err
	}
	// Its lease pinned first: until then the pin table drops what it
	// sends, its provisioning's traffic too.
	if _, err := r.cfg.Host.Addresses().Wait(ctx, name, 30*time.Second); err != nil {
		return err
	}
	return r.waitProvisioned(ctx, r.cfg.Host.Incus, name)
}

// The claims' mints run side by side (mintSideBySide): what they add to
// the run goes through locked and addBox, under r.mu.

// locked runs fn under r.mu.
func (r *run) locked(fn func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	fn()
}

// name gives place p the probe box name (its instance), and returns it.
func (r *run) name(p Place, name string) string {
	r.locked(func() { r.names[p] = name })
	return name
}

// addBox keeps a minted probe box's end for the scenario and the report.
func (r *run) addBox(e *BoxEnd) {
	r.locked(func() {
		r.ends[e.Place] = e
		r.rep.Boxes = append(r.rep.Boxes, *e)
	})
}

// note adds a note to the report.
func (r *run) note(s string) {
	r.locked(func() { r.rep.Notes = append(r.rep.Notes, s) })
}

// sortBoxes puts the report's boxes in a stable order, whatever order the
// mints ended in: box-a, box-b and the clone first, then by place.
func sortBoxes(bs []BoxEnd) {
	rank := func(p Place) int {
		if i := slices.Index([]Place{PlaceA, PlaceB, PlaceC}, p); i >= 0 {
			return i
		}
		return 3
	}
	slices.SortStableFunc(bs, func(x, y BoxEnd) int {
		return cmp.Or(cmp.Compare(rank(x.Place), rank(y.Place)), cmp.Compare(x.Place, y.Place))
	})
}

// boxName is the name of one of the run's probe boxes.
func (r *run) boxName(suffix string) string { return "drill-" + r.rep.RunID + "-" + suffix }

// stamps are the config keys every probe box carries: box's stamps, and
// the drill's tags that find an aborted run's boxes.
func (r *run) stamps() map[string]string {
	return map[string]string{TagDrill: "1", TagRun: r.rep.RunID, model.StampTemplate: "drill-probe", model.StampVersion: r.cfg.Version}
}

// mintProbeBox mints one probe box, and once more if incusd created it but
// could not start it (seen on a loaded machine: incusd's own start
// operation timing out). A probe box is scaffolding, not evidence: a second
// try changes no verdict.
func mintProbeBox(ctx context.Context, cfg *Config, req boxes.MintRequest) error {
	_, err := boxes.NewManager(cfg.Host).Mint(ctx, req)
	var ns *boxes.NotStartedError
	if !errors.As(err, &ns) || ctx.Err() != nil {
		return err
	}
	cfg.logf("boxes: %s would not start (%v); minting it again", req.Name, ns.Err)
	if rerr := boxes.NewManager(cfg.Host).RemoveAll(ctx, []string{req.Name}, busyWait); rerr != nil {
		return errors.Join(err, rerr)
	}
	_, err = boxes.NewManager(cfg.Host).Mint(ctx, req)
	return err
}

// noteInstanceType records the kind of box the run proved, as Incus reports
// the minted probe boxes, beside the kind box new makes on this host
// (boxNew, the decision box new acts on), and a note where they differ: a
// claim proved on a container is not proved on a virtual machine.
func noteInstanceType(rep *Report, boxNew model.TypeDecision) {
	var types []string
	for _, b := range rep.Boxes {
		if !slices.Contains(types, b.Type) {
			types = append(types, b.Type)
		}
	}
	slices.Sort(types)
	drilled := strings.Join(types, ", ")
	rep.Environment.InstanceType, rep.Environment.BoxNewType = drilled, boxNew.Type
	if boxNew.Type != "" && drilled != boxNew.Type {
		rep.Notes = append(rep.Notes, fmt.Sprintf("instance type: the probe boxes are %s, but box new makes %s on this host (%s): the claims were proved on %s boxes, not on the %s boxes box new makes",
			drilled, boxNew.Type, boxNew.Reason, drilled, boxNew.Type))
	}
}

// boxEnd reads what the scenario needs about a probe box.
func boxEnd(ctx context.Context, h *stack.Host, place Place, name string) (*BoxEnd, error) {
	ip, err := h.Addresses().Wait(ctx, name, 30*time.Second)
	if err != nil {
		return nil, err
	}
	inst, _, err := h.Incus.Instances().Get(ctx, name)
	if err != nil {
		return nil, err
	}
	mac, err := net.ParseMAC(inst.Config["volatile.eth0.hwaddr"])
	if err != nil {
		return nil, fmt.Errorf("%s has no usable MAC (volatile.eth0.hwaddr=%q)", name, inst.Config["volatile.eth0.hwaddr"])
	}
	return &BoxEnd{Place: place, Instance: name, IP: ip, MAC: mac, LinkLocal: drillLinkLocal(mac), Type: inst.Type, Member: inst.Location}, nil
}

// drillLinkLocal is the link-local address the agent adds on a probe box
// (without duplicate address detection, so it is usable at once): not the
// box's own EUI-64 address, which stays tentative for the box's first
// second or two.
func drillLinkLocal(mac net.HardwareAddr) netip.Addr {
	var b [16]byte
	b[0], b[1] = 0xfe, 0x80
	b[8], b[9] = 0xb0, 0xc5
	copy(b[10:], mac[len(mac)-6:])
	return netip.AddrFrom16(b)
}
