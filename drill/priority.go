package drill

import (
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// runNice is the drill's own scheduling priority during a run. Its
// host-side witnesses, listeners and controls must keep up with every
// box's agent at once; at the default priority, with C-KERNEL's checks
// and load running in a dozen boxes on two busy cores, the host's and the
// LAN's agents were late for their collection in most full runs
// (docs/measurements.md, "The kernel boundary"). Raising it needs root,
// which a run has; without it the run goes on as it is.
const runNice = -10

// raisePriority sets every thread of this process to runNice (Linux
// keeps a nice value per thread; threads made later inherit their
// creator's) and returns what puts them back as they were.
func raisePriority() (restore func()) {
	old := map[int]int{}
	for _, tid := range threads() {
		// getpriority's raw answer is 20 - nice.
		p, err := unix.Getpriority(unix.PRIO_PROCESS, tid)
		if err != nil {
			continue
		}
		if unix.Setpriority(unix.PRIO_PROCESS, tid, runNice) == nil {
			old[tid] = 20 - p
		}
	}
	return func() {
		prev := 0
		for _, v := range old {
			prev = v
			break
		}
		for _, tid := range threads() {
			n, ok := old[tid]
			if !ok {
				n = prev // a thread made during the run
			}
			_ = unix.Setpriority(unix.PRIO_PROCESS, tid, n)
		}
	}
}

// threads are this process's thread ids.
func threads() []int {
	ents, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return nil
	}
	var ids []int
	for _, e := range ents {
		if id, err := strconv.Atoi(e.Name()); err == nil {
			ids = append(ids, id)
		}
	}
	return ids
}
