package drill

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/box-isolation/box/stack"
)

// C-FLEET: the probes meet only the drill's own fresh boxes, the census
// meets every instance and port on the bridge (stack.Census). Its findings
// fail the claim through the stack channel; a pass also needs the census
// to have met the drill's own boxes on their ports, for a census blind to
// them proves nothing about the rest.

// ChannelCensus is the channel of C-FLEET's liveness control.
const ChannelCensus = "census"

// fleetResults judges C-FLEET from the census taken once the drill's
// boxes ran (census), the boxes (place -> instance) of project, and every
// finding of the run.
func fleetResults(c Claim, census *stack.Census, project string, boxes map[string]string, findings []stack.Finding) []Result {
	a := Action{ID: "f-" + c.ID, Claim: c.ID, Channel: ChannelCensus, From: "verify", Target: "every instance and port on " + stack.Current.Network,
		TargetKey: ChannelCensus, Expect: ExpectPresent}
	r := Result{Action: a, Verdict: Pass, Observed: "met the drill's own boxes"}
	places := make([]string, 0, len(boxes))
	for p := range boxes {
		places = append(places, p)
	}
	sort.Strings(places)
	var met, missed []string
	for _, p := range places {
		name := boxes[p]
		s, ok := stack.Sibling{}, false
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
func censusSummary(c *stack.Census) string {
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
