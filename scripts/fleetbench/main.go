// Command fleetbench measures what a fleet of idle boxes costs the drill
// and box's own verbs, in a running hermetic world (scripts/fleetbench.sh
// runs it; docs/measurements.md, "A busy host", has the numbers). For
// each fleet size (0, 50, 120 and 240 boxes by default), grown with `box
// new` of the drill's busybox image (box-probe) and named fb-NNN:
//
//   - RUNS warm drill runs (`drill run --json`): exit code, inconclusive
//     claims, the run's time and each phase's, the probe phase, how late
//     the latest agent began, and the agents' arming and slack where the
//     report has them;
//   - ROUNDS alternating rounds of `box new` (one more box, removed
//     after, untimed) and `incus launch` of the same image with box's
//     profile and a fixed address, each timed to the box running with
//     its IPv4 address;
//   - `box list` and `box doctor`, once each;
//   - the port watcher's handling of one port's event: a veth pair made
//     and put on the bridge, timed until the port is in the bridge drop's
//     port set (ROUNDS times), with box guard-and-serve running (started
//     here when none runs, and stopped after).
//
// It leaves the fleet behind with -keep, and removes it otherwise.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/vishvananda/netns"

	"github.com/box-isolation/box/internal/benchstat"
	"github.com/box-isolation/box/internal/worldstate"
	"github.com/box-isolation/box/stack/hostns"
	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/model"
	"github.com/box-isolation/box/stack/nft"
)

func main() {
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "fleetbench:", err)
		os.Exit(1)
	}
}

// image is the drill's busybox image: the fleet's boxes are made of it.
const image = "box-probe"

// bench is one run's setting.
type bench struct {
	st    *worldstate.State
	c     *incus.Client
	box   string
	drill string
	log   io.Writer
	runs  int
	round int
	env   []string
	// statePath is the world's state file (the drill's BOX_WORLD_STATE).
	statePath string
	// launched counts incus launch's instances (each its own name).
	launched int
}

// Size is one fleet size's measurement (the -json output).
type Size struct {
	Boxes int `json:"boxes"`
	// Drill runs: each one's exit code, inconclusive claims, duration,
	// phases, probe phase and agents' lateness (ms).
	DrillExit         []int              `json:"drill_exit"`
	DrillInconclusive []int              `json:"drill_inconclusive"`
	DrillMS           []int64            `json:"drill_ms"`
	DrillWallMS       []int64            `json:"drill_wall_ms"`
	ProbePhaseMS      []int64            `json:"probe_phase_ms"`
	AgentsLateMS      []int64            `json:"agents_late_ms"`
	PhasesMS          map[string][]int64 `json:"phases_ms"`
	Arming            []string           `json:"arming,omitempty"`
	BoxNewMS          []int64            `json:"box_new_ms"`
	LaunchMS          []int64            `json:"incus_launch_ms"`
	ListMS            int64              `json:"box_list_ms"`
	DoctorMS          int64              `json:"box_doctor_ms"`
	PortEventMS       []float64          `json:"port_event_ms"`
	// Limits are doctor's lines naming the host's limits.
	Limits []string `json:"limits,omitempty"`
	Load   []string `json:"load_average"` // before, after
}

func run(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("fleetbench", flag.ContinueOnError)
	sizes := fs.String("sizes", "0,50,120,240", "fleet sizes, ascending")
	runs := fs.Int("runs", 3, "warm drill runs per size")
	rounds := fs.Int("rounds", 5, "box new / incus launch / port event rounds per size")
	keep := fs.Bool("keep", false, "leave the fleet behind")
	asJSON := fs.Bool("json", false, "print the results as JSON")
	pair := fs.String("pair", "", "a second world's state file: alternate -series drill runs between this world, with the largest size's fleet, and that one, with "+strconv.Itoa(pairBoxes)+" boxes")
	series := fs.Int("series", 10, "drill runs in each world of an alternating series (-pair)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var want []int
	for _, f := range strings.Split(*sizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 0 || (len(want) > 0 && n < want[len(want)-1]) {
			return fmt.Errorf("-sizes %q: want ascending counts of boxes", *sizes)
		}
		want = append(want, n)
	}
	b, err := newBench(os.Getenv(worldstate.StateEnv), stderr, *runs, *rounds)
	if err != nil {
		return err
	}
	ctx := context.Background()
	if *pair != "" {
		return b.series(ctx, stdout, *pair, want[len(want)-1], *series, *asJSON)
	}
	// A warm run first: it makes the stack and imports the image.
	if _, err := b.drillRun(ctx); err != nil {
		return err
	}
	stop, err := b.watcher()
	if err != nil {
		return err
	}
	defer stop()
	if !*keep {
		defer b.shrink(ctx, 0)
	}
	var out []Size
	for _, n := range want {
		if err := b.grow(ctx, n); err != nil {
			return err
		}
		s, err := b.measure(ctx, n)
		if err != nil {
			return err
		}
		out = append(out, s)
		if !*asJSON {
			printSize(stdout, s)
		}
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(out)
	}
	return nil
}

// newBench is the setting of one world (its state file; "" the default
// world's).
func newBench(statePath string, log io.Writer, runs, rounds int) (*bench, error) {
	if statePath == "" {
		statePath = worldstate.StatePath(filepath.Join(worldstate.StateRoot, worldstate.DefaultName))
	}
	st, err := worldstate.LoadFile(statePath)
	if err != nil {
		return nil, fmt.Errorf("%w (run it in a world: BOX_WORLD_STATE, or drill world up)", err)
	}
	return &bench{st: st, statePath: statePath, c: incus.New(st.IncusSocket), box: "bin/box", drill: "bin/drill", log: log, runs: runs, round: rounds,
		env: append(os.Environ(), "INCUS_SOCKET="+st.IncusSocket, "BOX_NETNS="+st.Names.HostNS, "BOX_DNS="+worldstate.Resolver.String(), "BOX_IMAGE=", "BOX_TEMPLATE_IMAGES=")}, nil
}

// pairBoxes is the fleet of the pair world in an alternating series.
const pairBoxes = 2

// Run is one drill run of a series.
type Run struct {
	World        string `json:"world"`
	Boxes        int    `json:"boxes"`
	Exit         int    `json:"exit"`
	Inconclusive int    `json:"inconclusive"`
	MS           int64  `json:"ms"`
	ProbePhaseMS int64  `json:"probe_phase_ms"`
	// MaxArmingMS and MinSlackMS are over the run's agents.
	MaxArmingMS int64    `json:"max_arming_ms"`
	MinSlackMS  int64    `json:"min_slack_ms"`
	Problems    []string `json:"problems,omitempty"`
}

// series grows this world's fleet to n and the pair world's to pairBoxes,
// then alternates runs drill runs between them, warm (one untimed run in
// each first), and says each run and the medians.
func (b *bench) series(ctx context.Context, w io.Writer, pairState string, n, runs int, asJSON bool) error {
	p, err := newBench(pairState, b.log, 0, 0)
	if err != nil {
		return fmt.Errorf("the pair world: %w", err)
	}
	stop, err := b.watcher()
	if err != nil {
		return err
	}
	defer stop()
	stopPair, err := p.watcher()
	if err != nil {
		return err
	}
	defer stopPair()
	for _, x := range []struct {
		b *bench
		n int
	}{{b, n}, {p, pairBoxes}} {
		if _, err := x.b.drillRun(ctx); err != nil {
			return err
		}
		if err := x.b.grow(ctx, x.n); err != nil {
			return err
		}
		if _, err := x.b.drillRun(ctx); err != nil {
			return err
		}
	}
	var out []Run
	ms := map[int][]int64{}
	for i := range runs {
		for _, x := range []struct {
			b *bench
			n int
		}{{b, n}, {p, pairBoxes}} {
			rep, err := x.b.drillRun(ctx)
			if err != nil {
				return err
			}
			r := Run{World: x.b.st.Names.HostNS, Boxes: x.n, Exit: rep.ExitCode, Inconclusive: rep.Summary.Inconclusive, MS: rep.DurationMS,
				ProbePhaseMS: rep.Summary.ProbePhaseMS, MinSlackMS: -1, Problems: rep.Problems}
			for j, a := range rep.Summary.Agents {
				r.MaxArmingMS = max(r.MaxArmingMS, a.ArmingMS)
				if j == 0 || a.SlackMS < r.MinSlackMS {
					r.MinSlackMS = a.SlackMS
				}
			}
			out = append(out, r)
			ms[x.n] = append(ms[x.n], r.MS)
			if !asJSON {
				fmt.Fprintf(w, "run %2d, %3d boxes: exit %d, %d inconclusive, run %d ms, probe phase %d ms, agents armed in at most %d ms, least slack %d ms\n",
					i+1, r.Boxes, r.Exit, r.Inconclusive, r.MS, r.ProbePhaseMS, r.MaxArmingMS, r.MinSlackMS)
				for _, pr := range r.Problems {
					fmt.Fprintf(w, "        problem: %s\n", pr)
				}
			}
		}
	}
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(out)
	}
	fmt.Fprintf(w, "median run: %d ms beside %d boxes, %d ms beside %d: %.2fx\n", benchstat.Middle(ms[n]), n, benchstat.Middle(ms[pairBoxes]), pairBoxes,
		float64(benchstat.Middle(ms[n]))/float64(max(1, benchstat.Middle(ms[pairBoxes]))))
	return nil
}

func printSize(w io.Writer, s Size) {
	ph := []string{}
	for _, p := range []string{"preflight", "stack", "mint", "agents", "probes", "judge", "teardown"} {
		ph = append(ph, fmt.Sprintf("%s %d", p, benchstat.Middle(s.PhasesMS[p])))
	}
	fmt.Fprintf(w, "%3d boxes: drill exit %v inconclusive %v, run %d ms (median; %v), wall %d ms, probe phase %d ms, agents late %v ms; phases (median ms): %s\n",
		s.Boxes, s.DrillExit, s.DrillInconclusive, benchstat.Middle(s.DrillMS), s.DrillMS, benchstat.Middle(s.DrillWallMS), benchstat.Middle(s.ProbePhaseMS), s.AgentsLateMS, strings.Join(ph, ", "))
	if len(s.Arming) > 0 {
		fmt.Fprintf(w, "           arming: %s\n", strings.Join(s.Arming, "; "))
	}
	fmt.Fprintf(w, "           box new %d ms (median; %v), incus launch %d ms (%v): %.2fx; box list %d ms; box doctor %d ms; port event %.1f ms (median; %v); load %s -> %s\n",
		benchstat.Middle(s.BoxNewMS), s.BoxNewMS, benchstat.Middle(s.LaunchMS), s.LaunchMS, float64(benchstat.Middle(s.BoxNewMS))/float64(max(1, benchstat.Middle(s.LaunchMS))),
		s.ListMS, s.DoctorMS, benchstat.Middle(s.PortEventMS), s.PortEventMS, s.Load[0], s.Load[1])
	for _, l := range s.Limits {
		fmt.Fprintf(w, "           doctor: %s\n", l)
	}
}

// measure takes one size's measurements.
func (b *bench) measure(ctx context.Context, n int) (Size, error) {
	s := Size{Boxes: n, PhasesMS: map[string][]int64{}, Load: []string{benchstat.LoadAvg()}}
	for range b.runs {
		t0 := time.Now()
		rep, err := b.drillRun(ctx)
		if err != nil {
			return s, err
		}
		s.DrillWallMS = append(s.DrillWallMS, time.Since(t0).Milliseconds())
		s.DrillExit = append(s.DrillExit, rep.ExitCode)
		s.DrillInconclusive = append(s.DrillInconclusive, rep.Summary.Inconclusive)
		s.DrillMS = append(s.DrillMS, rep.DurationMS)
		s.ProbePhaseMS = append(s.ProbePhaseMS, rep.Summary.ProbePhaseMS)
		s.AgentsLateMS = append(s.AgentsLateMS, rep.Summary.AgentsLateMS)
		for _, p := range rep.Summary.Phases {
			s.PhasesMS[p.Phase] = append(s.PhasesMS[p.Phase], p.MS)
		}
		for _, a := range rep.Summary.Agents {
			s.Arming = append(s.Arming, fmt.Sprintf("%s %d ms (slack %d ms)", a.Place, a.ArmingMS, a.SlackMS))
		}
		for _, p := range rep.Problems {
			fmt.Fprintf(b.log, "fleetbench: %d boxes: drill problem: %s\n", n, p)
		}
	}
	for i := range b.round {
		name := fmt.Sprintf("fb-new-%d", i)
		t0 := time.Now()
		if _, err := b.boxCmd(ctx, "new", "--name", name, "--image", image); err != nil {
			return s, err
		}
		s.BoxNewMS = append(s.BoxNewMS, time.Since(t0).Milliseconds())
		if _, err := b.boxCmd(ctx, "rm", "--force", name); err != nil {
			return s, err
		}
		ms, err := b.launch(ctx)
		if err != nil {
			return s, err
		}
		s.LaunchMS = append(s.LaunchMS, ms)
	}
	t0 := time.Now()
	if _, err := b.boxCmd(ctx, "list"); err != nil {
		return s, err
	}
	s.ListMS = time.Since(t0).Milliseconds()
	t0 = time.Now()
	// doctor exits 1 when it names something: its time is what counts,
	// and what it names of the host's limits is said.
	out, _ := b.boxCmd(ctx, "doctor")
	s.DoctorMS = time.Since(t0).Milliseconds()
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, "sysctl ") {
			s.Limits = append(s.Limits, strings.TrimSpace(l))
		}
	}
	for i := range b.round {
		ms, err := b.portEvent(fmt.Sprintf("fbv%d", i))
		if err != nil {
			return s, err
		}
		s.PortEventMS = append(s.PortEventMS, ms)
	}
	s.Load = append(s.Load, benchstat.LoadAvg())
	return s, nil
}

// report is what fleetbench reads of a drill report.
type report struct {
	ExitCode   int      `json:"exit_code"`
	DurationMS int64    `json:"duration_ms"`
	Problems   []string `json:"problems"`
	Summary    struct {
		Inconclusive int   `json:"inconclusive"`
		ProbePhaseMS int64 `json:"probe_phase_ms"`
		AgentsLateMS int64 `json:"agents_late_ms"`
		Phases       []struct {
			Phase string `json:"phase"`
			MS    int64  `json:"ms"`
		} `json:"phases"`
		Agents []struct {
			Place    string `json:"place"`
			ArmingMS int64  `json:"arming_ms"`
			SlackMS  int64  `json:"slack_ms"`
		} `json:"agents"`
	} `json:"summary"`
}

// drillRun runs the drill in the world and reads its report.
func (b *bench) drillRun(ctx context.Context) (*report, error) {
	cmd := exec.CommandContext(ctx, b.drill, "run", "--json")
	cmd.Env = append(os.Environ(), worldstate.StateEnv+"="+b.statePath)
	out, err := cmd.Output()
	var rep report
	if jerr := json.Unmarshal(out, &rep); jerr != nil {
		return nil, fmt.Errorf("drill run: %v; its output is no report: %w", err, jerr)
	}
	return &rep, nil
}

// boxCmd runs box in the world's host as root; it must succeed.
func (b *bench) boxCmd(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, b.box, args...)
	cmd.Env = b.env
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("box %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// fleet lists the fleet's boxes (fb-NNN), sorted.
func (b *bench) fleet(ctx context.Context) ([]string, error) {
	insts, err := b.c.Instances().All(ctx)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, i := range insts {
		if len(i.Name) == 6 && strings.HasPrefix(i.Name, "fb-") {
			out = append(out, i.Name)
		}
	}
	slices.Sort(out)
	return out, nil
}

// grow mints fb-NNN boxes until the fleet has n.
func (b *bench) grow(ctx context.Context, n int) error {
	have, err := b.fleet(ctx)
	if err != nil {
		return err
	}
	t0 := time.Now()
	for i := 0; len(have) < n; i++ {
		name := fmt.Sprintf("fb-%03d", i)
		if slices.Contains(have, name) {
			continue
		}
		if _, err := b.boxCmd(ctx, "new", "--name", name, "--image", image); err != nil {
			return fmt.Errorf("growing the fleet to %d boxes (it has %d): %w", n, len(have), err)
		}
		have = append(have, name)
	}
	fmt.Fprintf(b.log, "fleetbench: %d boxes (grown in %.0f s)\n", len(have), time.Since(t0).Seconds())
	return nil
}

// shrink removes fb-NNN boxes down to n.
func (b *bench) shrink(ctx context.Context, n int) {
	have, err := b.fleet(ctx)
	if err != nil {
		fmt.Fprintln(b.log, "fleetbench: listing the fleet:", err)
		return
	}
	for _, name := range have[min(n, len(have)):] {
		if _, err := b.boxCmd(ctx, "rm", "--force", name); err != nil {
			fmt.Fprintln(b.log, "fleetbench:", err)
		}
	}
}

// launch times incus launch of the image with box's profile and a free
// fixed address (boxnet's dnsmasq leases no other), to the instance
// running with that address; the instance is removed after.
func (b *bench) launch(ctx context.Context) (int64, error) {
	name := fmt.Sprintf("fb-launch-%d", b.launched)
	b.launched++
	addr, err := b.freeAddr(ctx)
	if err != nil {
		return 0, err
	}
	t0 := time.Now()
	cmd := exec.CommandContext(ctx, "incus", "launch", image, name, "--profile", model.Current.Profile, "-d", "eth0,ipv4.address="+addr.String())
	cmd.Env = append(os.Environ(), "INCUS_DIR="+b.st.IncusDir)
	if out, err := cmd.CombinedOutput(); err != nil {
		return 0, fmt.Errorf("incus launch: %w: %s", err, out)
	}
	defer func() {
		cmd := exec.Command("incus", "delete", "--force", name)
		cmd.Env = append(os.Environ(), "INCUS_DIR="+b.st.IncusDir)
		if out, err := cmd.CombinedOutput(); err != nil {
			fmt.Fprintf(b.log, "fleetbench: removing %s: %v: %s\n", name, err, out)
		}
	}()
	for deadline := time.Now().Add(2 * time.Minute); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		s, err := b.c.Instances().State(ctx, name)
		if err != nil || s.Status != "Running" {
			continue
		}
		for _, a := range s.Network["eth0"].Addresses {
			if a.Family == "inet" && a.Address == addr.String() {
				return time.Since(t0).Milliseconds(), nil
			}
		}
	}
	return 0, fmt.Errorf("%s launched, but not running at %s within 2 minutes", name, addr)
}

// freeAddr is the highest address of the bridge's /24 no instance holds.
func (b *bench) freeAddr(ctx context.Context) (netip.Addr, error) {
	n, _, err := b.c.Networks().Get(ctx, model.Current.Network)
	if err != nil {
		return netip.Addr{}, err
	}
	p, err := netip.ParsePrefix(n.Config["ipv4.address"])
	if err != nil {
		return netip.Addr{}, fmt.Errorf("%s's ipv4.address: %w", model.Current.Network, err)
	}
	insts, err := b.c.Instances().All(ctx)
	if err != nil {
		return netip.Addr{}, err
	}
	taken := map[string]bool{p.Addr().String(): true}
	for _, i := range insts {
		for _, d := range i.ExpandedDevices {
			taken[d["ipv4.address"]] = true
		}
	}
	a := p.Masked().Addr().As4()
	for last := 254; last > 1; last-- {
		a[3] = byte(last)
		if !taken[netip.AddrFrom4(a).String()] {
			return netip.AddrFrom4(a), nil
		}
	}
	return netip.Addr{}, errors.New("no free address left on the bridge")
}

// watcher makes sure box guard-and-serve runs in the world's host; what
// it returns stops the one it started.
func (b *bench) watcher() (func(), error) {
	if _, running, err := hostns.DaemonRunning(b.st.Names.HostNS); err != nil {
		return nil, err
	} else if running {
		return func() {}, nil
	}
	logf, err := os.CreateTemp("", "fleetbench-watcher-*.log")
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(b.box, "guard-and-serve")
	cmd.Env = b.env
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	fmt.Fprintf(b.log, "fleetbench: box guard-and-serve (pid %d) started; its log: %s\n", cmd.Process.Pid, logf.Name())
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if pid, running, err := hostns.DaemonRunning(b.st.Names.HostNS); err == nil && running && pid == cmd.Process.Pid {
			break
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			_ = cmd.Wait()
			return nil, fmt.Errorf("box guard-and-serve did not come up in 10 s: %s", logf.Name())
		}
	}
	return func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
		logf.Close()
	}, nil
}

// portEvent times one port's event: a veth pair put on the bridge, until
// its port is in the bridge drop's port set. The pair is removed after.
func (b *bench) portEvent(name string) (float64, error) {
	ns, err := netns.GetFromName(b.st.Names.HostNS)
	if err != nil {
		return 0, err
	}
	defer ns.Close()
	cfg := nft.Config{Table: model.Current.NFTTable, Bridge: model.Current.Network, NetNS: int(ns)}
	ip := func(args ...string) error {
		out, err := exec.Command("ip", append([]string{"-n", b.st.Names.HostNS}, args...)...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, out)
		}
		return nil
	}
	if err := ip("link", "add", name, "type", "veth", "peer", "name", name+"p"); err != nil {
		return 0, err
	}
	defer func() { _ = ip("link", "del", name) }()
	if err := ip("link", "set", name+"p", "up"); err != nil {
		return 0, err
	}
	t0 := time.Now()
	if err := ip("link", "set", name, "master", model.Current.Network, "up"); err != nil {
		return 0, err
	}
	for time.Since(t0) < 10*time.Second {
		ports, _, err := nft.PortSetMembers(cfg)
		if err == nil && slices.Contains(ports, name) {
			return float64(time.Since(t0).Microseconds()) / 1000, nil
		}
		time.Sleep(200 * time.Microsecond)
	}
	return 0, fmt.Errorf("port %s not in the port set 10 s after it joined", name)
}
