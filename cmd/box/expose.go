package main

import (
	"cmp"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/box-isolation/box/stack/boxes"
	"github.com/box-isolation/box/stack/model"
)

// box expose: a door from the host's loopback to a TCP port in a box.

func setupExpose(fs *flag.FlagSet) action {
	list := fs.Bool("list", false, "list the box's doors")
	remove := fs.String("remove", "", "remove the door to the box's port PORT")
	listen := fs.String("listen", "", "a TCP door's address on the host: 127.0.0.1 (the default) or ::1, nothing else")
	unixDoor := fs.Bool("unix", false, "a unix socket in "+model.DoorDir+", yours only (mode "+model.DoorMode+"); the default where the host has granted users")
	tcp := fs.Bool("tcp", false, "a TCP door on the host's loopback, open to every local user; the default where no user is granted")
	asJSON := fs.Bool("json", false, "print JSON")
	return func(c *call) error {
		name := c.name()
		h, err := c.host()
		if err != nil {
			return err
		}
		switch {
		case *list && *remove != "":
			return usagef("expose: --list and --remove contradict each other; pick one")
		case (*list || *remove != "") && (len(c.args) > 1 || *listen != "" || *unixDoor || *tcp):
			return usagef("expose: --list and --remove take the box's name only\nusage: box %s", c.cmd.synopsis)
		case *list:
			doors, err := boxes.NewDoors(h).ListDoors(c.ctx, name)
			if err != nil {
				return err
			}
			if *asJSON {
				return c.printJSON(doors)
			}
			if len(doors) == 0 {
				fmt.Fprintf(c.err, "%s has no doors (box expose %s PORT makes one)\n", name, name)
				return nil
			}
			printDoors(c.out, doors)
			doorProblems(c, name, doors)
			return nil
		case *remove != "":
			port, err := parsePort("--remove", *remove)
			if err != nil {
				return err
			}
			if err := boxes.NewDoors(h).Unexpose(c.ctx, name, port); err != nil {
				return err
			}
			fmt.Fprintf(c.out, "%s: door to port %d removed\n", name, port)
			return nil
		}
		if len(c.args) < 2 {
			return usagef("expose: which port of %s? box expose %s PORT [HOSTPORT]", name, name)
		}
		spec := model.DoorSpec{}
		if spec.Port, err = parsePort("PORT", c.args[1]); err != nil {
			return err
		}
		if len(c.args) > 2 {
			if spec.HostPort, err = parsePort("HOSTPORT", c.args[2]); err != nil {
				return err
			}
		}
		switch {
		case *unixDoor && *tcp:
			return usagef("expose: --unix and --tcp contradict each other; pick one")
		case *unixDoor && (*listen != "" || spec.HostPort != 0):
			return usagef("expose: a unix door is a socket in %s: it has no --listen or HOSTPORT", model.DoorDir)
		case *unixDoor:
			spec.Kind = model.DoorUnix
		case *tcp:
			spec.Kind = model.DoorTCP
		}
		if *listen != "" {
			a, err := netip.ParseAddr(*listen)
			if err != nil {
				return usagef("expose: --listen %q: want 127.0.0.1 or ::1", *listen)
			}
			if err := model.CheckDoorListen(a); err != nil {
				return usagef("expose: %v", err)
			}
			spec.Listen = a
		}
		door, err := boxes.NewDoors(h).Expose(c.ctx, name, spec)
		if err != nil {
			return err
		}
		if *asJSON {
			return c.printJSON(door)
		}
		if door.Note != "" {
			fmt.Fprintf(c.err, "box: %s\n", door.Note)
		}
		switch door.Kind {
		case model.DoorTCP:
			fmt.Fprintf(c.out, "%s: port %d is at %s on the host (device %s)\n", name, door.Port, door.Host, door.Device)
			fmt.Fprintln(c.err, "box: a TCP door on the host's loopback is open to every local user of this host")
		default:
			fmt.Fprintf(c.out, "%s: port %d is at %s on the host (device %s; owner %s, mode %s)\n", name, door.Port, door.Host, door.Device, door.Owner, model.DoorMode)
		}
		if c.box.Status != "Running" {
			fmt.Fprintf(c.err, "box: %s is %s: the door opens when it starts (box start %s)\n", name, strings.ToLower(c.box.Status), name)
		}
		return nil
	}
}

// parsePort reads a TCP port, 1 to 65535.
func parsePort(what, s string) (uint16, error) {
	p, err := strconv.ParseUint(s, 10, 16)
	if err != nil || p == 0 {
		return 0, usagef("expose: %s %q: want a TCP port, 1 to 65535", what, s)
	}
	return uint16(p), nil
}

// printDoors is the table of `box expose N --list`.
func printDoors(w io.Writer, doors []model.Door) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PORT\tHOST\tKIND\tOWNER\tDEVICE")
	for _, d := range doors {
		kind, owner := d.Kind, d.Owner
		if d.Problem != "" {
			kind = "NOT BOX'S"
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\n", d.Port, d.Host, kind, cmp.Or(owner, "-"), d.Device)
	}
	tw.Flush()
}

// doorProblems says on stderr why a door-like device is not box's.
func doorProblems(c *call, name string, doors []model.Door) {
	for _, d := range doors {
		if d.Problem != "" {
			fmt.Fprintf(c.err, "box: %s's device %s is not one of box's doors: %s (box doctor names it)\n", name, d.Device, d.Problem)
		}
	}
}
