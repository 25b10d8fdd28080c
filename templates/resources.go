package templates

import (
	"errors"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
)

// Resources are a box's limits, kept in the strings Incus takes
// (limits.cpu, limits.memory, the root disk's size) so they round-trip into
// instance config unchanged.
type Resources struct {
	CPU    string `yaml:"cpu" json:"cpu"`       // a positive whole number of CPUs
	Memory string `yaml:"memory" json:"memory"` // a size like 4GiB or 512MiB
	Disk   string `yaml:"disk" json:"disk"`     // a size like 20GiB or 20GB
	// Processes is limits.processes: the most processes and threads the
	// box may have at once (a fork bomb stops there). CPUAllowance is
	// limits.cpu.allowance: a share under contention ("50%") or a hard
	// cap of CPU time per period ("50ms/100ms"); on a small host the CPU
	// count alone limits nothing. Both optional: empty is no limit.
	Processes    string `yaml:"processes,omitempty" json:"processes,omitempty"`
	CPUAllowance string `yaml:"cpu_allowance,omitempty" json:"cpu_allowance,omitempty"`
}

// The floors are where cloud-init, apt and npm stop fitting; below them a
// box would mint and then fail in a way that looks like a network problem.
const (
	minMemory = 128 << 20 // 128MiB
	minDisk   = 1 << 30   // 1GiB
)

// Validate checks that every field is present and well formed.
func (r Resources) Validate() error {
	if _, err := ParseCPU(r.CPU); err != nil {
		return err
	}
	if err := validSize("memory", r.Memory, minMemory); err != nil {
		return err
	}
	if err := validSize("disk", r.Disk, minDisk); err != nil {
		return err
	}
	if r.Processes != "" {
		if err := validProcesses(r.Processes); err != nil {
			return err
		}
	}
	if r.CPUAllowance != "" {
		return validAllowance(r.CPUAllowance)
	}
	return nil
}

// NoLimit, as a resource value from the environment or a flag, leaves that
// limit unset: for hosts that cannot apply one (a memory cgroup that will not
// take a limit makes every box fail to start). A template cannot say it.
const NoLimit = "none"

// MergeResources merges a box's resources: the template's default,
// overridden by BOX_CPU, BOX_MEMORY and BOX_DISK from env, overridden by
// non-empty flags. Each value that wins is validated, and an error names where
// it came from. NoLimit winning leaves that field empty: no limit (for the
// disk, the pool's default size). (It cannot be called Resources: that is
// the type's name.)
func MergeResources(t *Template, env func(string) string, flags Resources) (Resources, error) {
	if t == nil {
		return Resources{}, errors.New("resources: no template")
	}
	if env == nil {
		env = func(string) string { return "" }
	}
	var out Resources
	for _, f := range []struct {
		def, envKey, flag, flagName string
		valid                       func(string) error
		out                         *string
		optional                    bool // a template may leave it out
	}{
		{t.Resources.CPU, "BOX_CPU", flags.CPU, "cpu", func(v string) error { _, err := ParseCPU(v); return err }, &out.CPU, false},
		{t.Resources.Memory, "BOX_MEMORY", flags.Memory, "memory", func(v string) error { return validSize("memory", v, minMemory) }, &out.Memory, false},
		{t.Resources.Disk, "BOX_DISK", flags.Disk, "disk", func(v string) error { return validSize("disk", v, minDisk) }, &out.Disk, false},
		{t.Resources.Processes, "BOX_PROCESSES", flags.Processes, "processes", validProcesses, &out.Processes, true},
		{t.Resources.CPUAllowance, "BOX_CPU_ALLOWANCE", flags.CPUAllowance, "cpu-allowance", validAllowance, &out.CPUAllowance, true},
	} {
		v, from := f.def, "" // from is empty for the template's default
		// Whitespace around an environment value is a shell accident, not
		// part of the value.
		if e := strings.TrimSpace(env(f.envKey)); e != "" {
			v, from = e, f.envKey
		}
		if f.flag != "" {
			v, from = f.flag, "--"+f.flagName
		}
		if v == NoLimit && from != "" || v == "" && f.optional {
			continue
		}
		if from == "" {
			from = fmt.Sprintf("template %q", t.Name)
		}
		if err := f.valid(v); err != nil {
			return Resources{}, fmt.Errorf("%s: %w", from, err)
		}
		*f.out = v
	}
	return out, nil
}

// String says the resources for people, an empty field being no limit:
// "2 CPU, 4GiB memory, unlimited disk".
func (r Resources) String() string {
	shown := func(v string) string {
		if v == "" {
			return "unlimited"
		}
		return v
	}
	out := fmt.Sprintf("%s CPU, %s memory, %s disk", shown(r.CPU), shown(r.Memory), shown(r.Disk))
	if r.Processes != "" {
		out += ", " + r.Processes + " processes"
	}
	if r.CPUAllowance != "" {
		out += ", CPU allowance " + r.CPUAllowance
	}
	return out
}

// minProcesses is where a box's own init, cloud-init and a shell stop
// fitting.
const minProcesses = 64

// validProcesses checks a limits.processes value: a whole number of at
// least minProcesses.
func validProcesses(s string) error {
	n, err := strconv.Atoi(s)
	if err != nil || strings.HasPrefix(s, "+") || strings.HasPrefix(s, "0") {
		return fmt.Errorf("processes %q: want a whole number like 2048", s)
	}
	if n < minProcesses {
		return fmt.Errorf("processes %q is below the %d a box needs to provision", s, minProcesses)
	}
	return nil
}

var allowanceRE = regexp.MustCompile(`^(?:([1-9][0-9]*)%|([1-9][0-9]*)ms/([1-9][0-9]*)ms)$`)

// validAllowance checks a limits.cpu.allowance value as Incus takes one:
// a share "N%" (1 to 100) or a cap "Nms/Mms" (the period 10 to 1000 ms).
func validAllowance(s string) error {
	m := allowanceRE.FindStringSubmatch(s)
	if m == nil {
		return fmt.Errorf("cpu allowance %q: want a share like 50%% or a cap like 50ms/100ms", s)
	}
	if m[1] != "" {
		if n, _ := strconv.Atoi(m[1]); n > 100 {
			return fmt.Errorf("cpu allowance %q: a share is at most 100%%", s)
		}
		return nil
	}
	if p, _ := strconv.Atoi(m[3]); p < 10 || p > 1000 {
		return fmt.Errorf("cpu allowance %q: the period must be 10ms to 1000ms", s)
	}
	return nil
}

// ParseCPU parses a CPU count: a positive whole number. Incus also takes CPU
// ranges and pinning in limits.cpu; a box does not, so that boxes sharing a
// host are not pinned onto the same cores by accident.
func ParseCPU(s string) (int, error) {
	if s == "" {
		return 0, errors.New("cpu is missing")
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 || strings.HasPrefix(s, "+") || strings.HasPrefix(s, "0") {
		return 0, fmt.Errorf("cpu %q: want a positive whole number like 2", s)
	}
	return n, nil
}

var sizeRE = regexp.MustCompile(`^([1-9][0-9]*)(kB|MB|GB|TB|KiB|MiB|GiB|TiB)$`)

var sizeUnits = map[string]uint64{
	"kB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12,
	"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40,
}

// ParseSize parses a size the way Incus writes one, like "4GiB", "512MiB" or
// "20GB", into bytes. A bare number is refused: Incus reads it as bytes,
// which is never what "memory: 4" meant.
func ParseSize(s string) (uint64, error) {
	m := sizeRE.FindStringSubmatch(s)
	if m == nil {
		return 0, fmt.Errorf("size %q: want a whole number and a unit (kB, MB, GB, TB, KiB, MiB, GiB, TiB), like 4GiB", s)
	}
	n, err := strconv.ParseUint(m[1], 10, 64)
	unit := sizeUnits[m[2]]
	if err != nil || n > math.MaxUint64/unit {
		return 0, fmt.Errorf("size %q is too large", s)
	}
	return n * unit, nil
}

func validSize(what, s string, floor uint64) error {
	if s == "" {
		return fmt.Errorf("%s is missing", what)
	}
	n, err := ParseSize(s)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	if n < floor {
		return fmt.Errorf("%s %q is below the %s a box needs to provision", what, s, humanSize(floor))
	}
	return nil
}

func humanSize(n uint64) string {
	switch {
	case n%(1<<30) == 0:
		return fmt.Sprintf("%dGiB", n>>30)
	case n%(1<<20) == 0:
		return fmt.Sprintf("%dMiB", n>>20)
	}
	return fmt.Sprintf("%d bytes", n)
}
