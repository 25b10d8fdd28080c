// Package benchstat holds what the benchmark scripts (scripts/mintbench,
// scripts/fleetbench) share: the machine's load average, read beside each
// measurement on a shared machine, and the middle of a sample.
package benchstat

import (
	"cmp"
	"os"
	"slices"
	"strings"
)

// LoadAvg is the 1-, 5- and 15-minute load average ("?" when unread).
func LoadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	return strings.Join(f[:min(3, len(f))], " ")
}

// Middle is the middle value of v (the upper one of an even count), the
// zero value for none.
func Middle[T cmp.Ordered](v []T) T {
	var zero T
	if len(v) == 0 {
		return zero
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}
