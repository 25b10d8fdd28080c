package drill

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/box-isolation/box/stack/model"
)

// FleetID is C-FLEET: every box on the host, not only the drill's fresh
// ones, is on the stack.
const FleetID ClaimID = "C-FLEET"

var claimFleet = Claim{
	ID: FleetID, From: "every instance on boxnet (any project, tagged or not, running or stopped) and every port on it", To: "the stack",
	Channels: []Channel{ChannelCensus},
	Expect:   "exactly one NIC, on boxnet, isolated (config and kernel flag), in the bridge drop's port set; no other NIC, no proxy but box's own loopback doors, no host path or device passed through, no raw.lxc/raw.qemu, not privileged",
	Layers:   []model.LayerID{model.LayerFleet},
	Why:      "the boxes people work in were minted weeks ago and changed since: a re-plugged NIC or a device added by hand takes one off the stack while fresh probe boxes pass",
	Modes:    everywhere, Evidence: []Evidence{EvidenceCensus},
	judge: judgeFleet,
}

// judgeFleet judges C-FLEET from the census taken once the drill's boxes
// ran. box-t lives in its user's project, and its isolation is off on
// purpose: C-TIER judges it.
func judgeFleet(r *run, c Claim, _ []Result) []Result {
	var census *model.Census
	if r.v != nil {
		census = r.v.Fleet
	}
	own := maps.Clone(r.names)
	delete(own, PlaceT)
	// Places that run in another place's box are not boxes of their own.
	delete(own, PlaceNestNAT)
	delete(own, PlaceNestMAC)
	return fleetResults(c, census, r.cfg.Host.Incus.ProjectName(), own, r.findings)
}

// C-FLEET: the probes meet only the drill's own fresh boxes, the census
// meets every instance and port on the bridge (stack.Census). Its findings
// fail the claim through the stack channel; a pass also needs the census
// to have met the drill's own boxes on their ports, for a census blind to
// them proves nothing about the rest.

// fleetResults judges C-FLEET from the census taken once the drill's
// boxes ran (census), the boxes (place -> instance) of project, and every
// finding of the run.
func fleetResults(c Claim, census *model.Census, project string, boxes map[Place]string, findings []model.Finding) []Result {
	a := Action{ID: "f-" + string(c.ID), Claim: c.ID, Channel: ChannelCensus, From: PlaceVerify, Target: "every instance and port on " + model.Current.Network,
		TargetKey: string(ChannelCensus), Expect: ExpectPresent}
	r := Result{Action: a, Verdict: Pass, Observed: "met the drill's own boxes"}
	places := slices.Sorted(maps.Keys(boxes))
	var met, missed []string
	for _, p := range places {
		name := boxes[p]
		s, ok := model.Sibling{}, false
		if census != nil {
			s, ok = census.Sibling(project, name)
		}
		switch {
		case !ok:
			missed = append(missed, name+" (not met)")
		case s.Port == "":
			missed = append(missed, name+" (met, but on no port)")
		case !slices.Contains(census.Ports, s.Port):
			missed = append(missed, fmt.Sprintf("%s (its port %s is not among the bridge's)", name, s.Port))
		default:
			met = append(met, name+" on "+s.Port)
		}
	}
	switch {
	case census == nil:
		r.Verdict, r.Observed, r.Evidence = Inconclusive, "no census", "no census was taken once the boxes ran"
	case len(boxes) == 0:
		r.Verdict, r.Observed, r.Evidence = Inconclusive, "no boxes", "the drill minted no box for the census to meet"
	case len(missed) > 0:
		r.Verdict, r.Observed = Inconclusive, "blind"
		r.Evidence = "the census did not see the drill's own boxes as they are: " + strings.Join(missed, ", ") + "; a census blind to them proves nothing about the rest"
	default:
		r.Evidence = censusSummary(census) + "; it met the drill's own boxes " + strings.Join(met, ", ")
	}
	return append([]Result{r}, stackResults(c, findings)...)
}

// censusSummary says what the census covered.
func censusSummary(c *model.Census) string {
	running, stopped, off := 0, 0, 0
	projects := map[string]bool{}
	for _, s := range c.Siblings {
		if s.Name == "" {
			off++
			continue
		}
		projects[s.Project] = true
		if s.Status == "Running" {
			running++
		} else {
			stopped++
		}
	}
	set := "port-set membership not checked (bridge-meta mode, or no table)"
	if c.SetChecked {
		set = "port-set membership checked"
	}
	return fmt.Sprintf("census of %s: %d instances (%d running, %d not) in %d project(s), %d ports, %d unclaimed; %s",
		c.Bridge, running+stopped, running, stopped, len(projects), len(c.Ports), off, set)
}
