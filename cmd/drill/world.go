package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/box-isolation/box/drill/image"
	"github.com/box-isolation/box/fixtures/world"
	"github.com/box-isolation/box/stack/incus"
)

const worldSynopsis = `world up [--bridge-netfilter] [--no-incus] [--json]
       drill world down [--purge]
       drill world status [--json]
       drill world image [--alias A] [--json]
       drill world check [--json]`

func runWorld(ctx context.Context, s stdio, args []string) int {
	if len(args) == 0 || args[0] == "--help" || args[0] == "-h" {
		fmt.Fprintf(s.out, "usage: drill %s\n", worldSynopsis)
		if len(args) == 0 {
			return exitUsage
		}
		return exitOK
	}
	sub := map[string]func(context.Context, stdio, []string) int{
		"up": worldUp, "down": worldDown, "status": worldStatus,
		"image": worldImage, "check": worldCheck, "serve": worldServe,
	}
	fn, ok := sub[args[0]]
	if !ok {
		fmt.Fprintf(s.err, "drill world: unknown subcommand %q (up, down, status, image, check)\n", args[0])
		return exitUsage
	}
	return fn(ctx, s, args[1:])
}

// worldUpReport is `world up --json`.
type worldUpReport struct {
	World   *world.State  `json:"world"`
	Image   *image.Result `json:"image,omitempty"`
	WorldNS int64         `json:"world_ns"` // time to build (or find) the world
	ImageNS int64         `json:"image_ns"` // time to ensure the probe image
}

func worldUp(ctx context.Context, s stdio, args []string) int {
	fs := newFlags(s, "world up", "world up [--bridge-netfilter] [--no-incus] [--json]")
	brnf := fs.Bool("bridge-netfilter", false, "turn br_netfilter's bridge-nf-call-* on in the host namespace (off, like a plain Incus host)")
	noIncus := fs.Bool("no-incus", false, "namespaces and services only, no incusd")
	asJSON := fs.Bool("json", false, "print the world's state as JSON")
	if code, ok := parse(fs, args, 0); !ok {
		return code
	}
	cfg := world.Config{BridgeNetfilter: *brnf, NoIncus: *noIncus}
	t0 := time.Now()
	st, err := world.Up(ctx, cfg, s.err)
	if err != nil {
		return fail(s, err)
	}
	rep := worldUpReport{World: st, WorldNS: int64(time.Since(t0))}
	if !*noIncus {
		t1 := time.Now()
		rep.Image, err = image.Ensure(ctx, incus.New(st.IncusSocket), image.DefaultAlias, image.Options{})
		if err != nil {
			return fail(s, fmt.Errorf("importing the probe image: %w (tear down with `drill world down`)", err))
		}
		rep.ImageNS = int64(time.Since(t1))
	}
	emit(s, *asJSON, rep, func(w io.Writer) {
		fmt.Fprintf(w, "world %s is up (%.2fs)\n", st.Name, time.Duration(rep.WorldNS).Seconds())
		if rep.Image != nil {
			fmt.Fprintf(w, "image %s %s: %s (%.2fs)\n", rep.Image.Alias, imageVerb(rep.Image), rep.Image.Fingerprint[:12], time.Duration(rep.ImageNS).Seconds())
			fmt.Fprintf(w, "incus: INCUS_DIR=%s incus list\n", st.IncusDir)
		}
		fmt.Fprintf(w, "tear down with: drill world down\n")
	})
	return exitOK
}

func worldDown(ctx context.Context, s stdio, args []string) int {
	fs := newFlags(s, "world down", "world down [--purge]")
	purge := fs.Bool("purge", false, "also delete the world's incusd data (imported images)")
	if code, ok := parse(fs, args, 0); !ok {
		return code
	}
	if os.Geteuid() != 0 {
		return fail(s, fmt.Errorf("tearing the world down needs root: run as root"))
	}
	if err := world.Down(context.WithoutCancel(ctx), world.Config{}, *purge, s.err); err != nil {
		return fail(s, err)
	}
	fmt.Fprintln(s.out, "world is down; nothing of it is left")
	return exitOK
}

// worldStatusReport is `world status --json`.
type worldStatusReport struct {
	Up        bool         `json:"up"`
	State     *world.State `json:"state,omitempty"`
	Error     string       `json:"error,omitempty"`
	Leftovers []string     `json:"leftovers"`
}

func worldStatus(ctx context.Context, s stdio, args []string) int {
	fs := newFlags(s, "world status", "world status [--json]")
	asJSON := fs.Bool("json", false, "print JSON")
	if code, ok := parse(fs, args, 0); !ok {
		return code
	}
	rep := worldStatusReport{Leftovers: world.Leftovers(world.Config{})}
	st, err := world.Load()
	if err == nil {
		rep.Up, rep.State = true, st
	} else {
		rep.Error = err.Error()
	}
	if rep.Leftovers == nil {
		rep.Leftovers = []string{}
	}
	emit(s, *asJSON, rep, func(w io.Writer) {
		if rep.Up {
			fmt.Fprintf(w, "world %s is up since %s (incusd pid %d, services pid %d)\n", st.Name, st.Created.Format(time.RFC3339), st.IncusdPID, st.ServicesPID)
			return
		}
		fmt.Fprintf(w, "no world is up: %s\n", rep.Error)
		if len(rep.Leftovers) > 0 {
			fmt.Fprintf(w, "leftovers: %s\nclean them with: drill world down\n", strings.Join(rep.Leftovers, ", "))
		}
	})
	if !rep.Up {
		return 1 // like `systemctl is-active`: scripts test "is a world up?"
	}
	return exitOK
}

func worldImage(ctx context.Context, s stdio, args []string) int {
	st, err := world.Load()
	if err != nil {
		return fail(s, err)
	}
	return ensureImage(ctx, s, "world image", incus.New(st.IncusSocket), args)
}

// runImage is `drill image`: the probe image imported into this host's
// Incus (INCUS_SOCKET or INCUS_DIR say which), built from the host's
// busybox-static with no image server, for an operator who wants to look
// before a run (`drill run --host` does the same when it is missing).
func runImage(ctx context.Context, s stdio, args []string) int {
	return ensureImage(ctx, s, "image", incus.New(""), args)
}

func ensureImage(ctx context.Context, s stdio, name string, c *incus.Client, args []string) int {
	fs := newFlags(s, name, name+" [--alias A] [--json]")
	alias := fs.String("alias", image.DefaultAlias, "image alias")
	asJSON := fs.Bool("json", false, "print JSON")
	if code, ok := parse(fs, args, 0); !ok {
		return code
	}
	res, err := image.Ensure(ctx, c, *alias, image.Options{})
	if err != nil {
		return fail(s, fmt.Errorf("the probe image: %w", err))
	}
	emit(s, *asJSON, res, func(w io.Writer) {
		fmt.Fprintf(w, "image %s %s: %s\n", res.Alias, imageVerb(res), res.Fingerprint[:12])
	})
	return exitOK
}

func worldCheck(ctx context.Context, s stdio, args []string) int {
	fs := newFlags(s, "world check", "world check [--json]")
	asJSON := fs.Bool("json", false, "print JSON")
	if code, ok := parse(fs, args, 0); !ok {
		return code
	}
	st, err := world.Load()
	if err != nil {
		return fail(s, err)
	}
	res, err := world.Check(ctx, st, incus.New(st.IncusSocket), image.DefaultAlias)
	if err != nil {
		return fail(s, fmt.Errorf("world check: %w", err))
	}
	emit(s, *asJSON, res, func(w io.Writer) {
		fmt.Fprintf(w, "box %s leased %s and reached the canary %s: %q, %q (%.2fs)\n",
			res.Instance, res.Lease, world.Canary, res.Greeting, res.Echo, res.Elapsed.Seconds())
	})
	return exitOK
}

// worldServe is the detached process that holds the world's services.
func worldServe(ctx context.Context, s stdio, args []string) int {
	fs := newFlags(s, "world serve", "world serve --state FILE")
	state := fs.String("state", "", "the world's state file")
	if code, ok := parse(fs, args, 0); !ok {
		return code
	}
	if *state == "" {
		fmt.Fprintln(s.err, "drill world serve: --state is required (this runs under `drill world up`)")
		return exitUsage
	}
	if err := world.Serve(ctx, *state, s.err); err != nil {
		return fail(s, err)
	}
	return exitOK
}

// imageVerb says what Ensure did to the probe image.
func imageVerb(r *image.Result) string {
	switch {
	case r.Imported:
		return "imported"
	case r.AliasMoved:
		return "already imported; alias moved to this build"
	default:
		return "already imported; nothing to do"
	}
}
