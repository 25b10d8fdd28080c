// Command guardstats measures, for scripts/guard-bench.sh, what the
// guard's programs (L-GUARD) cost per packet while a command runs: it has
// the kernel count their runs and run time (BPF_ENABLE_STATS, held only
// for the command's length: no sysctl is changed), runs the command, and
// prints what each attached program counted in between.
//
//	guardstats NETNS LINK... -- COMMAND [ARG...]
//	    one line per program attached to a LINK:
//	    "LINK HOOK runs=N run_time_ns=T ns_per_run=X"
package main

import (
	"fmt"
	"os"
	"os/exec"
	"slices"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/box-isolation/box/stack/guard"
	"github.com/box-isolation/box/stack/hostns"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "guardstats:", err)
		os.Exit(1)
	}
}

type hookStats struct {
	link, hook string
	prog       *ebpf.Program
	before     *ebpf.ProgramStats
}

func run(args []string) error {
	sep := slices.Index(args, "--")
	if sep < 2 || sep == len(args)-1 {
		return fmt.Errorf("usage: guardstats NETNS LINK... -- COMMAND [ARG...]")
	}
	g, err := hostns.Open(args[0])
	if err != nil {
		return err
	}
	defer g.Close()
	stats, err := ebpf.EnableStats(unix.BPF_STATS_RUN_TIME)
	if err != nil {
		return fmt.Errorf("enabling the kernel's BPF run statistics: %w", err)
	}
	defer stats.Close()
	var hooks []hookStats
	for _, link := range args[1:sep] {
		found, err := guard.Find(g.Netlink, link)
		if err != nil {
			return err
		}
		for _, a := range found {
			prog, err := ebpf.NewProgramFromID(ebpf.ProgramID(a.ID))
			if err != nil {
				return fmt.Errorf("opening program %d: %w", a.ID, err)
			}
			defer prog.Close()
			before, err := prog.Stats()
			if err != nil {
				return err
			}
			hooks = append(hooks, hookStats{link, a.Hook, prog, before})
		}
	}
	cmd := exec.Command(args[sep+1], args[sep+2:]...)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s: %w", args[sep+1], err)
	}
	for _, h := range hooks {
		after, err := h.prog.Stats()
		if err != nil {
			return err
		}
		runs := after.RunCount - h.before.RunCount
		ns := (after.Runtime - h.before.Runtime).Nanoseconds()
		per := 0.0
		if runs > 0 {
			per = float64(ns) / float64(runs)
		}
		fmt.Printf("%s %s runs=%d run_time_ns=%d ns_per_run=%.1f\n", h.link, h.hook, runs, ns, per)
	}
	return nil
}
