package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"github.com/box-isolation/box/drill"
	"github.com/box-isolation/box/drill/image"
	"github.com/box-isolation/box/drill/report"
	"github.com/box-isolation/box/drill/topo"
	"github.com/box-isolation/box/internal/worldstate"
	"github.com/box-isolation/box/stack"
	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/model"
	"github.com/box-isolation/box/templates"
)

// listFlag collects a repeatable, comma-separated flag.
type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error {
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			*l = append(*l, s)
		}
	}
	return nil
}

const runSynopsis = "run [--claim ID]... [--skip ID]... [--no-setup] [--mutate LAYER]... [--template T | --image IMAGE] [--host --canary ADDR:PORT] [--json] [--html FILE] [--junit FILE] [--matrix FILE] [--record FILE]"

// outputs are the files a run writes besides stdout.
type outputs struct {
	html, junit, matrix, record string
}

// runOptions are the flags of drill run.
type runOptions struct {
	claims, skips listFlag
	mutate        listFlag
	noSetup       bool
	fillLoads     bool
	asJSON        bool
	out           outputs
	image         string
	template      string
	// Host mode (--host): the public canary and name.
	onHost     bool
	canary     string
	publicName string
}

func setupRun(fs *flag.FlagSet) runner {
	var o runOptions
	fs.Var(&o.claims, "claim", "run only these claims (id or glob, repeatable; !ID excludes)")
	fs.Var(&o.skips, "skip", "leave these claims out (id or glob, repeatable)")
	fs.BoolVar(&o.noSetup, "no-setup", false, "verify the isolation stack instead of ensuring it")
	fs.BoolVar(&o.fillLoads, "fill-loads", false, "add the kernel claim's memory hog and disk fill to box-l's load")
	fs.BoolVar(&o.asJSON, "json", false, "print the versioned JSON report instead of the table")
	fs.StringVar(&o.out.html, "html", "", "also write the report as one self-contained HTML page")
	fs.StringVar(&o.out.junit, "junit", "", "also write a JUnit XML file")
	fs.StringVar(&o.out.matrix, "matrix", "", "also write the reachability matrix (SVG)")
	fs.StringVar(&o.out.record, "record", "", "append a row to this RUNS.md and store the JSON report under drills/ beside it; in host mode the run takes the opt-in claims too (drill list names them and why)")
	fs.StringVar(&o.image, "image", image.DefaultAlias, "image of the probe boxes (an alias here, or REMOTE:ALIAS)")
	fs.StringVar(&o.template, "template", "", "mint the probe boxes as box new mints this template's (its image and user-data, waited for until ready): the boxes people use")
	fs.Var(&o.mutate, "mutate", "knock out a layer for this run to prove the drill fails ("+strings.Join(mutationNames(), ", ")+"); the stack is restored afterwards")
	fs.BoolVar(&o.onHost, "host", false, "run on this real Incus host instead of the hermetic world (never on a development or CI machine)")
	fs.StringVar(&o.canary, "canary", "", "with --host: a public resolver that also takes TCP, as ADDR:PORT (e.g. 1.1.1.1:443)")
	fs.StringVar(&o.publicName, "public-name", "example.com.", "with --host: a public name the box's resolver must resolve")
	return func(ctx context.Context, s stdio, _ []string) int {
		if o.onHost {
			return runOnHost(ctx, s, o)
		}
		if o.canary != "" {
			return fail(s, fmt.Errorf("--canary goes with --host; the hermetic world has its own canary"))
		}
		sel, err := drill.Resolve(drill.ModeWorld, o.claims, o.skips, false)
		if err != nil {
			return fail(s, err)
		}
		mutations, err := drill.SelectMutations(o.mutate)
		if err != nil {
			return fail(s, err)
		}
		st, err := worldstate.Load()
		if err != nil {
			return fail(s, fmt.Errorf("%w (on a real Incus host, use --host --canary ADDR:PORT)", err))
		}
		opts, err := model.OptionsFromEnv(os.Getenv)
		if err != nil {
			return fail(s, err)
		}
		if len(opts.DNS) == 0 {
			// The world's own resolver stands in for the public ones.
			opts.DNS = []netip.Addr{worldstate.Resolver}
		}
		host := &stack.Host{Incus: incus.New(st.IncusSocket), NetNS: st.Names.HostNS, Options: opts, IncusConfigDir: st.IncusConf, Members: stack.Membership{NetNS: st.MemberNetNS()}}
		cfg := drill.Config{Host: host, Topology: st.Topology(), Image: o.image, NoSetup: o.noSetup, FillLoads: o.fillLoads,
			Claims: sel.Claims, Left: sel.Left, Log: s.err, Version: version, Mutations: mutations}
		if err := withTemplate(&cfg, o); err != nil {
			return fail(s, err)
		}
		return runAndReport(ctx, s, cfg, sel.Whole, o)
	}
}

// runOnHost is --host: the drill on a real Incus host, whose own addresses,
// routes and LAN are the targets. It refuses where a hermetic world is up:
// that is a development or CI machine, where no probe may leave the world.
func runOnHost(ctx context.Context, s stdio, o runOptions) int {
	traces := worldTraces()
	if err := hostModeGuard(traces, os.Getenv("BOX_NETNS")); err != nil {
		return fail(s, err)
	}
	// A host-mode row is what a release rests on: a namespace world on a
	// development machine is no real host.
	if o.out.record != "" && traces != "" {
		return fail(s, fmt.Errorf("--record: this machine has a hermetic world (%s), so it is a development or CI machine, not a real host: record host runs on a real Incus host", traces))
	}
	if o.canary == "" {
		return fail(s, fmt.Errorf("--host needs --canary ADDR:PORT, a public resolver that also takes TCP (e.g. 1.1.1.1:443)"))
	}
	ap, err := netip.ParseAddrPort(o.canary)
	if err != nil {
		return fail(s, fmt.Errorf("--canary %q: want ADDR:PORT such as 1.1.1.1:443", o.canary))
	}
	sel, err := drill.Resolve(drill.ModeHost, o.claims, o.skips, o.out.record != "")
	if err != nil {
		return fail(s, err)
	}
	mutations, err := drill.SelectMutations(o.mutate)
	if err != nil {
		return fail(s, err)
	}
	opts, err := model.OptionsFromEnv(os.Getenv)
	if err != nil {
		return fail(s, err)
	}
	// The drill converges the stack's objects but leaves the boot unit to
	// `box setup-host`, which knows where box lives.
	host := &stack.Host{Incus: incus.New(""), NetNS: os.Getenv("BOX_NETNS"), Options: opts, IncusConfigDir: incus.ConfigDir(os.Getenv)}
	if len(mutations) > 0 {
		// Knocking a layer out acts on the whole bridge: refuse while
		// boxes the drill did not mint live on it.
		boxes, err := stack.Boxes(ctx, host.Incus)
		if err != nil {
			return fail(s, err)
		}
		if len(boxes) > 0 {
			return fail(s, fmt.Errorf("--mutate would weaken the isolation of %d boxes on this host (box list): run mutations where no other box lives", len(boxes)))
		}
	}
	if o.image == image.DefaultAlias && o.template == "" {
		// A fresh host has no image server for the probe image: build it
		// here from busybox-static, as `drill image` does.
		res, err := image.Ensure(ctx, host.Incus, o.image, image.Options{})
		if err != nil {
			return fail(s, fmt.Errorf("the probe image: %w (or import one yourself and pass --image)", err))
		}
		if res.Imported || res.AliasMoved {
			fmt.Fprintf(s.err, "drill: probe image %s %s: %s\n", res.Alias, imageVerb(res), res.Fingerprint[:12])
		}
	}
	upstream := model.DefaultDNS[0]
	if len(opts.DNS) > 0 {
		upstream = opts.DNS[0]
	}
	t, err := topo.Discover(topo.HostOptions{NetNS: host.NetNS, Canary: ap, PublicName: o.publicName, Upstream: upstream})
	if err != nil {
		return fail(s, fmt.Errorf("discovering this host's targets: %w", err))
	}
	cfg := drill.Config{Host: host, Topology: t, Image: o.image, NoSetup: o.noSetup, FillLoads: o.fillLoads,
		Claims: sel.Claims, Left: sel.Left, Log: s.err, Version: version, Mutations: mutations}
	if err := withTemplate(&cfg, o); err != nil {
		return fail(s, err)
	}
	return runAndReport(ctx, s, cfg, sel.Whole, o)
}

// withTemplate makes a run with --template mint the template's boxes: its
// image unless --image names another.
func withTemplate(cfg *drill.Config, o runOptions) error {
	if o.template == "" {
		return nil
	}
	t, err := templates.Get(o.template)
	if err != nil {
		return fmt.Errorf("--template: %w", err)
	}
	cfg.Template = t
	if o.image == image.DefaultAlias {
		cfg.Image = t.Image
	}
	return nil
}

// runAndReport runs the drill and writes its reports; whole says no
// pattern narrowed the claims.
func runAndReport(ctx context.Context, s stdio, cfg drill.Config, whole bool, o runOptions) int {
	asJSON, out := o.asJSON, o.out
	record := out.record
	// A RUNS.md row says "this commit's claims held": only a whole,
	// unmutated run can say it.
	if record != "" && (len(cfg.Mutations) > 0 || !whole) {
		return fail(s, fmt.Errorf("--record needs a whole run: drop --claim, --skip and --mutate"))
	}
	// Found out now, not after the run: a row it could not take.
	if record != "" {
		if err := report.CheckRecordTarget(record); err != nil {
			return fail(s, err)
		}
	}
	rep, err := drill.Run(ctx, cfg)
	if err != nil {
		fmt.Fprintf(s.err, "drill: %v\n", err)
		return drill.ExitUsage
	}
	if asJSON {
		if err := report.JSON(s.out, rep); err != nil {
			return fail(s, err)
		}
	} else {
		report.Text(s.out, rep)
	}
	for _, f := range []struct {
		path  string
		write func(io.Writer, *drill.Report) error
	}{{out.html, report.HTML}, {out.junit, report.JUnit}, {out.matrix, report.Matrix}} {
		if f.path == "" {
			continue
		}
		if err := writeFile(f.path, rep, f.write); err != nil {
			fmt.Fprintf(s.err, "drill: %v\n", err)
			return drill.ExitUsage
		}
	}
	if record != "" {
		if err := recordRun(s, record, rep); err != nil {
			fmt.Fprintf(s.err, "drill: recording the run: %v\n", err)
			return drill.ExitUsage
		}
	}
	return rep.ExitCode
}

func writeFile(path string, rep *drill.Report, write func(io.Writer, *drill.Report) error) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := write(f, rep); err != nil {
		f.Close()
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return f.Close()
}

// claimIDs are the catalogue's claim ids, and mutationNames the
// mutations' names, as the completions offer them.
func claimIDs() []string {
	var out []string
	for _, c := range drill.Catalogue {
		out = append(out, string(c.ID))
	}
	return out
}

func mutationNames() []string {
	var out []string
	for _, m := range drill.Mutations {
		out = append(out, m.Name)
	}
	return out
}

// netnsDir is where `ip netns` keeps named namespaces.
var netnsDir = "/run/netns"

// hostModeGuard refuses a host-mode run aimed at the machine's own
// namespace on a machine with a hermetic world (a development or CI
// machine, where no probe may leave the world). Aimed at a namespace
// (BOX_NETNS: a namespace world's host namespace) it may run: the targets
// are then what that namespace holds and routes to.
func hostModeGuard(traces, netns string) error {
	if netns != "" {
		if _, err := os.Stat(filepath.Join(netnsDir, netns)); err != nil {
			return fmt.Errorf("BOX_NETNS=%s: no such network namespace (ip netns list shows them)", netns)
		}
		return nil
	}
	if traces != "" {
		return fmt.Errorf("this machine has a hermetic world (%s), so it is a development or CI machine: --host may only aim at a namespace world's host namespace here (BOX_NETNS=NAME), never at the machine's own network (run without --host for the world)", traces)
	}
	return nil
}

// worldTraces says what on this machine belongs to a hermetic world (a
// state file, a world namespace), or "" if nothing does. Any trace, even of
// a broken world, makes this a development or CI machine.
func worldTraces() string {
	if _, err := worldstate.Load(); !errors.Is(err, worldstate.ErrNoWorld) {
		return "world state under " + worldstate.StateRoot
	}
	if m, _ := filepath.Glob(filepath.Join(worldstate.StateRoot, "*", "state.json")); len(m) > 0 {
		return m[0]
	}
	if m, _ := filepath.Glob("/run/netns/" + worldstate.DefaultName + "-*"); len(m) > 0 {
		return "network namespace " + filepath.Base(m[0])
	}
	return ""
}
