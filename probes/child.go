package probes

import (
	"fmt"
	"io"
	"os"
	"os/exec"
)

// Some kernel and load probes run a part of themselves in a child process
// of the agent: in namespaces of its own (release_agent), or where the
// kernel may kill it (load_memory), or as one of many (load_processes).
// The child is this binary's agent again, told its part by ChildEnv
// rather than by a plan, so a plan can never ask for one.

// ChildEnv names the part a child agent plays.
const ChildEnv = "DRILL_AGENT_CHILD"

// The parts a child plays.
const (
	childReleaseAgent = "release_agent" // mount the box's cgroup v1 hierarchies afresh, look for release_agent
	childMemory       = "memory"        // touch memory until told to stop or killed
	childHold         = "hold"          // be one more process, for a while
)

// ChildCommand is the command a probe starts a child with: this binary's
// agent, with ChildEnv set. Tests point it at their own binary.
var ChildCommand = func(part string, env ...string) *exec.Cmd {
	cmd := exec.Command("/proc/self/exe", "agent")
	cmd.Env = append(append(os.Environ(), ChildEnv+"="+part), env...)
	return cmd
}

// RunChild plays the part ChildEnv names, if it names one: ok is false
// when this process is no child. RunAgent calls it first.
func RunChild(in io.Reader, out io.Writer) (ok bool, err error) {
	part := os.Getenv(ChildEnv)
	switch part {
	case "":
		return false, nil
	case childReleaseAgent:
		return true, releaseAgentChild(out)
	case childMemory:
		return true, memoryChild(in, out)
	case childHold:
		return true, holdChild()
	}
	return true, fmt.Errorf("%s=%q is no part a child plays", ChildEnv, part)
}
