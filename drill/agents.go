package drill

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/box-isolation/box/drill/verdicts"
	"github.com/box-isolation/box/probes"
	"github.com/box-isolation/box/stack/incus"
)

// pushAgents puts the agent binary into every probe box.
func (r *run) pushAgents(ctx context.Context) error {
	r.cfg.logf("agent: pushing %s into the boxes", filepath.Base(r.cfg.Agent))
	actx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := pushAgent(actx, r.boxClient, r.cfg.Agent, r.names); err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	return nil
}

// boxClient is the admin's client for the project a probe box lives in.
func (r *run) boxClient(place Place) *incus.Client {
	if p, ok := r.projects[place]; ok {
		return r.cfg.Host.Incus.Project(p)
	}
	return r.cfg.Host.Incus
}

func pushAgent(ctx context.Context, client func(place Place) *incus.Client, agent string, names map[Place]string) error {
	var wg sync.WaitGroup
	errs := make([]error, 0, 4)
	var mu sync.Mutex
	pushed := map[string]bool{}
	for _, p := range slices.Sorted(maps.Keys(names)) {
		// A box that several places share (a nested workload's) gets it once.
		if pushed[names[p]] {
			continue
		}
		pushed[names[p]] = true
		c := client(p)
		wg.Add(1)
		go func() {
			defer wg.Done()
			f, err := os.Open(agent)
			if err == nil {
				defer f.Close()
				err = c.Instances().PushFile(ctx, names[p], agentPath, f, 0o755, 0, 0)
			}
			if err != nil {
				mu.Lock()
				errs = append(errs, fmt.Errorf("pushing the agent into %s: %w", names[p], err))
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// runPlans runs every place's plan at once and collects the observations.
// It returns how long after their agreed start the latest agent began.
func runPlans(ctx context.Context, cfg Config, client func(place Place) *incus.Client, names map[Place]string, plans map[Place]*probes.Plan) (observations, map[Place]string, time.Duration, []verdicts.AgentTiming) {
	obs := observations{}
	agentErr := map[Place]string{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	// Every agent starts its clocks at the same instant, agentLead from
	// now: the host's agents start at once, the boxes' only after a plan
	// push and an exec through incusd each, and the controls the host
	// sends must outlast the last probe a box's witness judges.
	var startAt time.Time
	if len(plans) > 1 {
		startAt = time.Now().Add(agentLead)
	}
	var late []string
	var timings []verdicts.AgentTiming
	latest := time.Duration(0)
	for _, place := range slices.Sorted(maps.Keys(plans)) {
		plan := *plans[place]
		plan.StartAt = startAt
		wg.Add(1)
		go func() {
			defer wg.Done()
			rep, err := runPlan(ctx, cfg, client(place), names, place, &plan)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				agentErr[place] = err.Error()
			}
			if rep == nil {
				return
			}
			timings = append(timings, verdicts.AgentTiming{Place: string(place), ArmingMS: rep.ArmingMS, SlackMS: rep.SlackMS})
			if d := rep.StartedAt.Sub(startAt); !startAt.IsZero() && d > lateBy {
				why := "its plan reached it late (the exec through incusd)"
				if rep.SlackMS < 0 {
					why = fmt.Sprintf("it armed late: arming took %d ms", rep.ArmingMS)
				}
				late = append(late, fmt.Sprintf("%s %d ms (%s)", place, d.Milliseconds(), why))
				latest = max(latest, d)
			}
			if rep.Error != "" {
				agentErr[place] = rep.Error
			}
			m := map[string]probes.Observation{}
			for _, o := range rep.Observations {
				m[o.ID] = o
			}
			for _, n := range rep.Neighbors {
				if a, err := netip.ParseAddr(n.Address); err == nil {
					m[pinID(a)] = pinObservation(pinID(a), n)
				}
				if n.Pinned && !n.Removed {
					agentErr[place] = strings.TrimPrefix(agentErr[place]+"; ", "; ") + "a pinned neighbour was left behind: " + n.Error
				}
			}
			obs[place] = m
		}()
	}
	wg.Wait()
	if len(late) > 0 {
		slices.Sort(late)
		cfg.logf("agents: %d of %d started after the agreed start (%s lead), the latest %d ms: %s", len(late), len(plans), agentLead, latest.Milliseconds(), strings.Join(late, ", "))
	}
	slices.SortFunc(timings, func(a, b verdicts.AgentTiming) int { return strings.Compare(a.Place, b.Place) })
	return obs, agentErr, latest, timings
}

// pinObservation turns an agent's account of a pinned neighbour into an
// observation the judge can look up.
func pinObservation(id string, n probes.NeighborState) probes.Observation {
	o := probes.Observation{ID: id, Kind: "neighbor", Target: n.Address, Outcome: probes.Reached,
		Reason: "pinned to " + n.MAC + " on " + n.Interface}
	if !n.Pinned {
		o.Outcome, o.Reason = probes.Error, n.Error
	}
	return o
}

func runPlan(ctx context.Context, cfg Config, c *incus.Client, names map[Place]string, place Place, plan *probes.Plan) (*probes.Report, error) {
	data, err := json.Marshal(plan)
	if err != nil {
		return nil, err
	}
	limit := time.Until(plan.Start(time.Now())) + plan.Deadline() + 20*time.Second
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	var stdout, stderr []byte
	if m := memberOfPlace(place); m != "" && !isMemberBox(place) {
		// Another member's agent runs in that member's namespace.
		mh, ok := cfg.Host.ForMember(m)
		if !ok {
			return nil, fmt.Errorf("member %s's namespace is not known here", m)
		}
		place, cfg.Host = PlaceHost, mh
	}
	switch place {
	case PlaceHost, PlaceLAN, PlaceInet:
		// The host's agent runs in the namespace the bridge lives in (the
		// world's host namespace, BOX_NETNS, or the drill's own), the LAN's
		// in the topology's LAN namespace, the internet's in the world's.
		ns := cfg.Host.NetNS
		switch place {
		case PlaceLAN:
			ns = cfg.Topology.LANNS
		case PlaceInet:
			ns = cfg.Topology.Allow.InetNS
		}
		cmd := exec.CommandContext(ctx, cfg.Agent, "agent")
		if ns != "" {
			cmd = exec.CommandContext(ctx, "ip", "netns", "exec", ns, cfg.Agent, "agent")
		}
		cmd.Stdin = bytes.NewReader(data)
		var eb bytes.Buffer
		cmd.Stderr = &eb
		stdout, err = cmd.Output()
		stderr = eb.Bytes()
	default:
		box := names[place]
		// One file a place: a box may hold several (a nested workload's).
		planPath := "/tmp/drill-plan-" + strings.NewReplacer("/", "-", "@", "-").Replace(string(place)) + ".json"
		if err := c.Instances().PushFile(ctx, box, planPath, bytes.NewReader(data), 0o600, 0, 0); err != nil {
			return nil, fmt.Errorf("pushing the plan: %w", err)
		}
		var res *incus.ExecResult
		res, err = c.Instances().Exec(ctx, box, incus.ExecRequest{Command: []string{agentPath, "agent", "--plan", planPath}})
		if res != nil {
			stdout, stderr = res.Stdout, res.Stderr
			if err == nil && res.ExitCode != 0 {
				err = fmt.Errorf("the agent exited %d", res.ExitCode)
			}
		}
	}
	rep, derr := probes.DecodeReport(bytes.NewReader(stdout))
	if derr != nil {
		return nil, errors.Join(err, fmt.Errorf("reading the agent's report: %w (stderr: %.300s)", derr, stderr))
	}
	// A report came back, but whatever went wrong around it is kept.
	if err != nil {
		err = fmt.Errorf("%w (stderr: %.300s)", err, stderr)
	}
	return rep, err
}
