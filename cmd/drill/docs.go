package main

import (
	"context"
	"flag"
	"fmt"

	"github.com/box-isolation/box/internal/clidoc"
)

// program is the command table as the man page and the completions see
// it: the commands that are shown, with their flags.
func program() clidoc.Program {
	return clidoc.Program{
		Name:    "drill",
		Summary: "prove box's network isolation with raw probes from inside boxes",
		Version: version,
		Description: []string{
			"drill stands up (or verifies) box's isolation stack, mints probe boxes from an image built from busybox-static, " +
				"and fires raw probes from inside them (ARP, ICMP, TCP, UDP, DNS, IPv6) at each other, the host, the LAN and the internet. " +
				"Every isolation claim is judged where the packet would land, with a witness at the target; a probe nobody could have answered is inconclusive, never a pass.",
			"On development and CI machines the drill runs in a hermetic world of network namespaces that it builds itself (drill world up), " +
				"so that no probe leaves the machine. On a real Incus host, drill run --host --canary ADDR:PORT aims at the host's own addresses and routes.",
		},
		Commands: docCommands(commands()),
		Sections: []clidoc.Section{
			{Title: "Exit status", Paragraphs: []string{
				"drill run: 0 every claim holds; 1 a claim is violated (a failed baseline is one); 2 usage or tool error; 3 nothing failed but something is inconclusive, or a selected claim could not run here. " +
					"Other commands: 0 ok, 2 usage or tool error; world status exits 1 when no world is up.",
			}},
			{Title: "Environment", Paragraphs: []string{
				"BOX_SUBNET, BOX_DNS, BOX_POOL: the isolation stack's subnet, upstream resolvers and storage pool, as for box. " +
					"BOX_NETNS: with --host, the network namespace of a namespace world's host.",
			}},
			{Title: "Files", Paragraphs: []string{"/run/box-world: the hermetic world's state."}},
			{Title: "See also", Paragraphs: []string{"box(1), incus(1)"}},
		},
	}
}

// docCommands turns table rows into the documented commands, flags and
// all, leaving the hidden ones out.
func docCommands(cs []command) []clidoc.Command {
	var out []clidoc.Command
	for _, c := range cs {
		if c.hidden {
			continue
		}
		d := clidoc.Command{Name: c.name, Synopsis: c.synopsis, Help: c.help, Arg: c.arg, Values: c.values, Sub: docCommands(c.sub)}
		if c.setup != nil {
			fs := flag.NewFlagSet(c.name, flag.ContinueOnError)
			c.setup(fs)
			d.Flags = clidoc.FlagsOf(fs, nil, c.flagValues)
		}
		out = append(out, d)
	}
	return out
}

func setupCompletion(fs *flag.FlagSet) runner {
	return func(_ context.Context, s stdio, args []string) int {
		if len(args) != 1 {
			return fail(s, fmt.Errorf("completion needs a shell: drill completion bash|zsh|fish"))
		}
		if err := clidoc.Completion(s.out, program(), args[0]); err != nil {
			return fail(s, err)
		}
		return exitOK
	}
}

func setupMan(fs *flag.FlagSet) runner {
	return func(_ context.Context, s stdio, _ []string) int {
		if err := clidoc.Man(s.out, program()); err != nil {
			return fail(s, err)
		}
		return exitOK
	}
}
