// Command mintbench measures box new against incus launch in a running
// hermetic world (scripts/mintbench.sh runs it; docs/images.md has the
// numbers). For each template, with its image built:
//
//   - ROUNDS alternating rounds of `box new --template T` and `incus
//     launch` of the same image fingerprint with the same profile, limits,
//     user-data and a fixed address (boxnet's dnsmasq leases no other),
//     each timed from its start to one endpoint: the box running with its
//     IPv4 address, the ready marker present and the
//     agent's --version answering (blank has no agent: the marker only);
//     the medians, their ratio and the load average are reported;
//   - with -first T (claude by default), the first mint's cost: a mint
//     with no image (it builds one), against a mint provisioned in the box
//     as every mint was before template images (--image of the template's
//     base), with the build's parts from the record.
//
// It makes boxes named mb-* and removes them; the images stay.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"time"

	"github.com/box-isolation/box/internal/benchstat"
	"github.com/box-isolation/box/internal/worldstate"
	"github.com/box-isolation/box/stack/boxes"
	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/model"
	"github.com/box-isolation/box/templates"
)

func main() {
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "mintbench:", err)
		os.Exit(1)
	}
}

// bench is one run's setting.
type bench struct {
	st     *worldstate.State
	c      *incus.Client
	box    string // the box binary
	log    io.Writer
	record string // the world host's template images
	// launched counts the instances incus launch made: each gets a fixed
	// address of its own (launchAddr).
	launched int
}

// Result is one template's measurement (the -json output).
type Result struct {
	Template    string    `json:"template"`
	Fingerprint string    `json:"fingerprint"`
	BoxNew      []float64 `json:"box_new_seconds"`
	Launch      []float64 `json:"incus_launch_seconds"`
	BoxMedian   float64   `json:"box_new_median"`
	LaunchMed   float64   `json:"incus_launch_median"`
	Ratio       float64   `json:"ratio"`
	Standby     []float64 `json:"standby_seconds,omitempty"`
	StandbyMed  float64   `json:"standby_median,omitempty"`
	Load        []string  `json:"load_average"` // before, after
}

// First is the first mint's cost against a provisioned mint's.
type First struct {
	Template         string  `json:"template"`
	FirstMint        float64 `json:"first_mint_seconds"`
	ProvisionedMint  float64 `json:"provisioned_mint_seconds"`
	Extra            float64 `json:"extra_seconds"`
	BuildSeconds     float64 `json:"build_seconds"`
	ProvisionSeconds float64 `json:"builder_provision_seconds"`
	PublishSeconds   float64 `json:"publish_seconds"`
	UnpackSeconds    float64 `json:"unpack_seconds"`
	SizeBytes        int64   `json:"size_bytes"`
	Load             string  `json:"load_average"`
}

func run(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("mintbench", flag.ContinueOnError)
	rounds := fs.Int("rounds", 5, "alternating rounds per template")
	first := fs.String("first", "claude", "the template whose first mint is measured (\"\" for none)")
	boxBin := fs.String("box", "bin/box", "the box binary")
	asJSON := fs.Bool("json", false, "print the results as JSON")
	standby := fs.Bool("standby", false, "also time box new taking a standby box (box templates warm T 1 before each, not timed)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	names := fs.Args()
	if len(names) == 0 {
		var err error
		if names, err = templates.Names(); err != nil {
			return err
		}
	}
	st, err := worldstate.Load()
	if err != nil {
		return fmt.Errorf("%w (run it in a world: BOX_WORLD_STATE, or drill world up)", err)
	}
	if st.IncusSocket == "" || st.IncusConf == "" || st.DebianImage == "" {
		return errors.New("the world has no incusd or no Debian image on its image server: bin/drill world image --debian")
	}
	b := &bench{st: st, c: incus.New(st.IncusSocket), box: *boxBin, log: stderr, record: boxes.TemplateImagesFile(st.Names.HostNS)}
	ctx := context.Background()
	if _, err := b.boxCmd(ctx, "setup-host"); err != nil {
		return err
	}
	out := struct {
		First   *First   `json:"first,omitempty"`
		Results []Result `json:"results"`
	}{}
	if *first != "" {
		f, err := b.first(ctx, *first)
		if err != nil {
			return err
		}
		out.First = f
		if !*asJSON {
			fmt.Fprintf(stdout, "first mint of %s (no image: it builds one): %.1f s; a mint provisioned in the box: %.1f s; extra: %.1f s (build %.1f s: builder provisioned %.1f s, publish %.1f s, unpack %.1f s, image %.2f GB; load %s)\n",
				f.Template, f.FirstMint, f.ProvisionedMint, f.Extra, f.BuildSeconds, f.ProvisionSeconds, f.PublishSeconds, f.UnpackSeconds, float64(f.SizeBytes)/1e9, f.Load)
		}
	}
	for _, n := range names {
		r, err := b.compare(ctx, n, *rounds, *standby)
		if err != nil {
			return err
		}
		out.Results = append(out.Results, r)
		if !*asJSON {
			fmt.Fprintf(stdout, "%-7s box new %5.1f s, incus launch %5.1f s (medians of %d): %.2fx; load %s -> %s; box new %v, incus launch %v\n",
				n, r.BoxMedian, r.LaunchMed, *rounds, r.Ratio, r.Load[0], r.Load[1], r.BoxNew, r.Launch)
			if *standby {
				fmt.Fprintf(stdout, "%-7s a standby box taken %5.1f s (median; %v): box new is %.2fx that\n", n, r.StandbyMed, r.Standby, r.BoxMedian/r.StandbyMed)
			}
		}
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(out)
	}
	return nil
}

// boxCmd runs box in the world's host as root; it must succeed.
func (b *bench) boxCmd(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, b.box, args...)
	cmd.Env = append(os.Environ(), "INCUS_SOCKET="+b.st.IncusSocket, "BOX_NETNS="+b.st.Names.HostNS,
		"BOX_DNS="+worldstate.Resolver.String(), "INCUS_CONF="+b.st.IncusConf, "BOX_IMAGE=", "BOX_TEMPLATE_IMAGES=")
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("box %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(errb.String()))
	}
	return out.String(), nil
}

// image is template's image, built when there is none.
func (b *bench) image(ctx context.Context, template string) (boxes.TemplateImage, error) {
	if _, err := b.boxCmd(ctx, "templates", "build", template); err != nil {
		return boxes.TemplateImage{}, err
	}
	rec, err := boxes.ReadTemplateImages(b.record)
	if err != nil {
		return boxes.TemplateImage{}, err
	}
	ti, ok := rec[template]
	if !ok {
		return ti, fmt.Errorf("box templates build %s recorded nothing in %s", template, b.record)
	}
	return ti, nil
}

// first times a first mint (the image deleted: box new builds it) and a
// provisioned one, each to the endpoint.
func (b *bench) first(ctx context.Context, template string) (*First, error) {
	tp, err := templates.Get(template)
	if err != nil {
		return nil, err
	}
	ti, err := b.image(ctx, template)
	if err != nil {
		return nil, err
	}
	if err := b.c.Images().Delete(ctx, ti.Fingerprint); err != nil {
		return nil, err
	}
	f := &First{Template: template, Load: benchstat.LoadAvg()}
	if f.FirstMint, err = b.timeBox(ctx, tp, "mb-first", "new", "--name", "mb-first", "--template", template); err != nil {
		return nil, err
	}
	if f.ProvisionedMint, err = b.timeBox(ctx, tp, "mb-prov", "new", "--name", "mb-prov", "--template", template, "--image", tp.Image); err != nil {
		return nil, err
	}
	f.Extra = round(f.FirstMint - f.ProvisionedMint)
	if ti, err = b.image(ctx, template); err != nil {
		return nil, err
	}
	f.BuildSeconds, f.ProvisionSeconds, f.PublishSeconds, f.UnpackSeconds, f.SizeBytes = ti.BuildSeconds, ti.ProvisionSeconds, ti.PublishSeconds, ti.UnpackSeconds, ti.SizeBytes
	return f, nil
}

// compare runs the alternating rounds of one template.
func (b *bench) compare(ctx context.Context, template string, rounds int, standby bool) (Result, error) {
	tp, err := templates.Get(template)
	if err != nil {
		return Result{}, err
	}
	ti, err := b.image(ctx, template)
	if err != nil {
		return Result{}, err
	}
	r := Result{Template: template, Fingerprint: ti.Fingerprint, Load: []string{benchstat.LoadAvg()}}
	for i := range rounds {
		steps := []func() error{
			func() error {
				name := fmt.Sprintf("mb-box-%s-%d", template, i)
				s, err := b.timeBox(ctx, tp, name, "new", "--name", name, "--template", template)
				r.BoxNew = append(r.BoxNew, s)
				return err
			},
			func() error {
				s, err := b.timeLaunch(ctx, tp, ti, fmt.Sprintf("mb-launch-%s-%d", template, i))
				r.Launch = append(r.Launch, s)
				return err
			},
		}
		if standby {
			steps = append(steps, func() error {
				s, err := b.timeStandby(ctx, tp, fmt.Sprintf("mb-standby-%s-%d", template, i))
				r.Standby = append(r.Standby, s)
				return err
			})
		}
		if i%2 == 1 {
			slices.Reverse(steps)
		}
		for _, step := range steps {
			if err := step(); err != nil {
				return r, err
			}
		}
		fmt.Fprintf(b.log, "mintbench: %s round %d: box new %.1f s, incus launch %.1f s (load %s)\n", template, i+1, r.BoxNew[i], r.Launch[i], benchstat.LoadAvg())
	}
	r.BoxMedian, r.LaunchMed, r.StandbyMed = median(r.BoxNew), median(r.Launch), median(r.Standby)
	r.Ratio = round(r.BoxMedian / r.LaunchMed)
	r.Load = append(r.Load, benchstat.LoadAvg())
	return r, nil
}

// timeBox times box ARGS to the endpoint, then removes the box.
func (b *bench) timeBox(ctx context.Context, tp *templates.Template, name string, args ...string) (float64, error) {
	defer b.remove(name)
	start := time.Now()
	if _, err := b.boxCmd(ctx, args...); err != nil {
		return 0, err
	}
	if err := b.endpoint(ctx, tp, name); err != nil {
		return 0, err
	}
	return round(time.Since(start).Seconds()), nil
}

// timeStandby makes one standby box of the template (box templates warm
// T 1, not timed), then times box new taking it, to the endpoint; the
// box must answer to its own name (a standby keeps its own hostname
// unless box moves it). warm 0 afterwards removes any left.
func (b *bench) timeStandby(ctx context.Context, tp *templates.Template, name string) (float64, error) {
	defer b.remove(name)
	if _, err := b.boxCmd(ctx, "templates", "warm", tp.Name, "1"); err != nil {
		return 0, err
	}
	defer b.boxCmd(context.WithoutCancel(ctx), "templates", "warm", tp.Name, "0") //nolint:errcheck
	start := time.Now()
	out, err := b.boxCmd(ctx, "new", "--name", name, "--template", tp.Name, "--json")
	if err != nil {
		return 0, err
	}
	if err := b.endpoint(ctx, tp, name); err != nil {
		return 0, err
	}
	took := round(time.Since(start).Seconds())
	if !strings.Contains(out, "taken from the standby box") {
		return 0, fmt.Errorf("box new %s made a copy, not a standby box taken: %s", name, out)
	}
	r, err := b.c.Instances().Exec(ctx, name, incus.ExecRequest{Command: []string{"hostname"}})
	if err != nil {
		return 0, fmt.Errorf("reading %s's hostname: %w", name, err)
	}
	if got := strings.TrimSpace(string(r.Stdout)); got != name {
		return 0, fmt.Errorf("the box %s taken from a standby box calls itself %q", name, got)
	}
	return took, nil
}

// timeLaunch times incus launch of the image by fingerprint on box's
// profile with the template's limits and a copy's user-data to the
// endpoint, then removes the instance.
func (b *bench) timeLaunch(ctx context.Context, tp *templates.Template, ti boxes.TemplateImage, name string) (float64, error) {
	defer b.remove(name)
	ud, err := tp.CopyUserData(name, "mintbench")
	if err != nil {
		return 0, err
	}
	res := tp.Resources
	addr, err := b.launchAddr(ctx)
	if err != nil {
		return 0, err
	}
	args := []string{"launch", ti.Fingerprint, name, "--profile", model.Current.Profile, "-d", "eth0,ipv4.address=" + addr.String(),
		"-c", "limits.cpu=" + res.CPU, "-c", "limits.memory=" + res.Memory, "-c", "limits.processes=" + res.Processes,
		"-c", "limits.cpu.allowance=" + res.CPUAllowance, "-c", "cloud-init.user-data=" + ud, "-d", "root,size=" + res.Disk}
	start := time.Now()
	cmd := exec.CommandContext(ctx, "incus", args...)
	cmd.Env = append(os.Environ(), "INCUS_DIR="+b.st.IncusDir)
	if out, err := cmd.CombinedOutput(); err != nil {
		return 0, fmt.Errorf("incus launch: %w: %s", err, out)
	}
	if err := b.endpoint(ctx, tp, name); err != nil {
		return 0, err
	}
	return round(time.Since(start).Seconds()), nil
}

// launchAddr is a fixed address for the next launched instance, as box
// gives each box one (boxnet's dnsmasq answers only the addresses Incus
// names: an instance without one gets no lease there): from .200 up in
// the bridge's /24, one per launch, so no lease of an earlier round is in
// the way.
func (b *bench) launchAddr(ctx context.Context) (netip.Addr, error) {
	n, _, err := b.c.Networks().Get(ctx, model.Current.Network)
	if err != nil {
		return netip.Addr{}, err
	}
	p, err := netip.ParsePrefix(n.Config["ipv4.address"])
	if err != nil {
		return netip.Addr{}, fmt.Errorf("%s's ipv4.address: %w", model.Current.Network, err)
	}
	a := p.Masked().Addr().As4()
	a[3] = byte(200 + b.launched%50)
	b.launched++
	return netip.AddrFrom4(a), nil
}

// endpoint waits for name to be running with an IPv4 address on eth0,
// its ready marker present, and (for an agent's template) the agent's
// --version answering as the template's user.
func (b *bench) endpoint(ctx context.Context, tp *templates.Template, name string) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	for {
		if b.ready(ctx, tp, name) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: not running with an address, its ready marker and its agent within 5 minutes", name)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (b *bench) ready(ctx context.Context, tp *templates.Template, name string) bool {
	s, err := b.c.Instances().State(ctx, name)
	if err != nil || s.Status != "Running" {
		return false
	}
	addr := false
	for _, a := range s.Network["eth0"].Addresses {
		addr = addr || (a.Family == "inet" && a.Scope == "global")
	}
	if !addr {
		return false
	}
	if m, err := b.c.Instances().PullFile(ctx, name, templates.ReadyMarker); err != nil || len(m) == 0 {
		return false
	}
	if tp.Agent == nil {
		return true
	}
	r, err := b.c.Instances().Exec(ctx, name, incus.ExecRequest{Command: []string{"su", "-l", tp.User, "-c", tp.Agent.Command + " --version"}})
	return err == nil && r.ExitCode == 0 && len(r.Stdout) > 0
}

func (b *bench) remove(name string) {
	cmd := exec.Command("incus", "delete", "--force", name)
	cmd.Env = append(os.Environ(), "INCUS_DIR="+b.st.IncusDir)
	if out, err := cmd.CombinedOutput(); err != nil && !strings.Contains(string(out), "not found") {
		fmt.Fprintf(b.log, "mintbench: removing %s: %v: %s\n", name, err, out)
	}
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return round((s[len(s)/2-1] + s[len(s)/2]) / 2)
}

func round(f float64) float64 { return float64(int(f*100+0.5)) / 100 }
