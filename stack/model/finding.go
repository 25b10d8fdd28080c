package model

import (
	"fmt"
	"strings"
)

// Change is one thing Ensure (or Teardown) did to the host.
type Change struct {
	Object string `json:"object"` // e.g. "network boxnet"
	Action string `json:"action"` // created, updated, removed
	Detail string `json:"detail,omitempty"`
}

func (c Change) String() string {
	if c.Detail == "" {
		return c.Action + " " + c.Object
	}
	return c.Action + " " + c.Object + ": " + c.Detail
}

// Finding is one way the live host differs from the desired stack.
type Finding struct {
	Layer   LayerID `json:"layer"`   // one of Layers
	Object  string  `json:"object"`  // what is wrong, e.g. "network boxnet"
	Problem string  `json:"problem"` // how
	Fix     string  `json:"fix"`     // the command that fixes it
	// Member is, on a cluster, the member whose host layers the finding is
	// about (empty for the cluster's own objects).
	Member string `json:"member,omitempty"`
	// Advisory findings do not remove the layer they name: another
	// firewall's forward policy (the egress probes show its effect), the
	// legacy generation's leftovers. A drill fails no claim on them.
	Advisory bool `json:"advisory,omitempty"`
}

func (f Finding) String() string {
	if f.Member != "" {
		fix := f.Fix
		if !strings.Contains(fix, f.Member) {
			fix += ", on " + f.Member
		}
		return fmt.Sprintf("%s %s on member %s: %s (fix: %s)", f.Layer, f.Object, f.Member, f.Problem, fix)
	}
	return fmt.Sprintf("%s %s: %s (fix: %s)", f.Layer, f.Object, f.Problem, f.Fix)
}

const FixEnsure = "box doctor --fix"
