package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/box-isolation/box/drill/image"
	"github.com/box-isolation/box/fixtures/debimage"
	"github.com/box-isolation/box/fixtures/world"
	"github.com/box-isolation/box/stack/incus"
)

// worldCommands are world's subcommands.
func worldCommands() []command {
	return []command{
		{name: "up", synopsis: "world up [--name W] [--bridge-netfilter] [--no-incus] [--cluster N] [--without-debian] [--machine [--debs DIR]] [--json]", help: "build the world (or find it up), its stand-ins and the Debian image they offer, and import the probe image; --machine: and the world's machine (Debian with systemd and Incus, the .debs installed)", setup: setupWorldUp},
		{name: "down", synopsis: "world down [--name W] [--purge]", help: "tear the world down, leaving nothing of it", setup: setupWorldDown},
		{name: "status", synopsis: "world status [--name W] [--json]", help: "say whether a world is up (exit 1 when not), and what is left of one that is not", setup: setupWorldStatus},
		{name: "image", synopsis: "world image [--alias A] [--debian] [--json]", help: "import the probe image into the world's incusd (built from busybox-static); --debian: build the Debian image and offer it in the world as images:debian/12/cloud", setup: setupWorldImage},
		{name: "check", synopsis: "world check [--json]", help: "mint a box in the world and prove it leases an address and reaches the canary", setup: setupWorldCheck},
		{name: "serve", synopsis: "world serve --state FILE", help: "hold the world's services (runs under world up)", hidden: true, setup: setupWorldServe},
		{name: "incus-user", synopsis: "world incus-user --state FILE", help: "hold the world's incus-user socket, starting incus-user on demand (runs under world up)", hidden: true, setup: setupWorldIncusUser},
	}
}

// worldUpReport is `world up --json`.
type worldUpReport struct {
	World   *world.State  `json:"world"`
	Image   *image.Result `json:"image,omitempty"`
	WorldNS int64         `json:"world_ns"` // time to build (or find) the world
	ImageNS int64         `json:"image_ns"` // time to ensure the probe image
}

func setupWorldUp(fs *flag.FlagSet) runner {
	brnf := fs.Bool("bridge-netfilter", false, "turn br_netfilter's bridge-nf-call-* on in the host namespace (off, like a plain Incus host)")
	noIncus := fs.Bool("no-incus", false, "namespaces and services only, no incusd")
	name := fs.String("name", world.DefaultName, "the world's `name` (at most 6 characters): its namespaces, links and state are named after it")
	cluster := fs.Int("cluster", 0, "build an Incus cluster of `N` members (3 is the usual), each its own host namespace and incusd")
	withoutDebian := fs.Bool("without-debian", false, "do not build the world's Debian image when this machine has none (a build takes minutes, once per machine); one already built is still offered")
	machine := fs.Bool("machine", false, "also bring up the world's machine: Debian bookworm with systemd, Incus from bookworm-backports, the project's .debs installed and box setup-host run (built once per machine, minutes)")
	debs := fs.String("debs", "dist", "with --machine: the `folder` holding box's and drill's .debs (make package)")
	asJSON := fs.Bool("json", false, "print the world's state as JSON")
	return func(ctx context.Context, s stdio, _ []string) int {
		cfg := world.Config{Name: *name, BridgeNetfilter: *brnf, NoIncus: *noIncus, Cluster: *cluster, BuildDebian: !*withoutDebian}
		if *machine {
			found, err := world.MachineDebsIn(*debs)
			if err != nil {
				return fail(s, err)
			}
			cfg.Machine, cfg.MachineDebs, cfg.BuildMachine = true, found, true
		}
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
			if st.IncusConf != "" {
				fmt.Fprintf(w, "image server: %s (%s), pinned in INCUS_CONF=%s (use it inside %s only)\n",
					world.ImageServerURL(), world.ImageServerAddr, st.IncusConf, st.Names.HostNS)
				debian := "none (drill world image --debian builds it)"
				if st.DebianImage != "" {
					debian = st.DebianImage
				}
				fmt.Fprintf(w, "images: %s:%s, %s:debian/12/cloud from %s\n", world.ImagesRemote, world.ProbeRemoteAlias, world.ImagesRemote, debian)
			}
			for _, m := range st.Members {
				fmt.Fprintf(w, "member %s: %s:%d, INCUS_DIR=%s\n", m.Name, m.ClusterAddr, world.ClusterPort, m.IncusDir)
			}
			if m := st.Machine; m != nil {
				fmt.Fprintf(w, "machine %s: uplink %s, LAN %s, cached in %s; a shell: ip netns exec %s env INCUS_DIR=%s incus exec %s -- bash -l\n",
					m.Instance, m.Uplink, m.LAN, m.Cache, st.Names.HostNS, st.IncusDir, m.Instance)
			}
			if st.Name != world.DefaultName {
				fmt.Fprintf(w, "drill run in it: BOX_WORLD_STATE=%s drill run\n", world.StatePath(st.StateDir))
				fmt.Fprintf(w, "tear down with: drill world down --name %s\n", st.Name)
				return
			}
			fmt.Fprintf(w, "tear down with: drill world down\n")
		})
		return exitOK
	}
}

func setupWorldDown(fs *flag.FlagSet) runner {
	purge := fs.Bool("purge", false, "also delete the world's incusd data (imported images)")
	name := fs.String("name", world.DefaultName, "the world's `name`")
	return func(ctx context.Context, s stdio, _ []string) int {
		if os.Geteuid() != 0 {
			return fail(s, fmt.Errorf("tearing the world down needs root: run as root"))
		}
		if err := world.Down(context.WithoutCancel(ctx), world.Config{Name: *name}, *purge, s.err); err != nil {
			return fail(s, err)
		}
		kept, err := world.Kept(world.Config{Name: *name})
		if err != nil {
			return fail(s, err)
		}
		if len(kept) == 0 {
			fmt.Fprintln(s.out, "world is down; nothing of it is left")
			return exitOK
		}
		fmt.Fprintf(s.out, "world is down; kept for the next up (incusd's database, images and pool, the CA and image server files): %s\n", strings.Join(kept, ", "))
		fmt.Fprintf(s.out, "remove them with: drill world down --purge --name %s\n", *name)
		return exitOK
	}
}

// worldStatusReport is `world status --json`.
type worldStatusReport struct {
	Up        bool         `json:"up"`
	State     *world.State `json:"state,omitempty"`
	Error     string       `json:"error,omitempty"`
	Leftovers []string     `json:"leftovers"`
}

func setupWorldStatus(fs *flag.FlagSet) runner {
	asJSON := fs.Bool("json", false, "print JSON")
	name := fs.String("name", "", "the world's `name` (default: $BOX_WORLD_STATE's, else "+world.DefaultName+")")
	return func(ctx context.Context, s stdio, _ []string) int {
		rep := worldStatusReport{Leftovers: world.Leftovers(world.Config{Name: *name})}
		load := world.Load
		if *name != "" {
			load = func() (*world.State, error) {
				return world.LoadFile(world.StatePath(filepath.Join(world.StateRoot, *name)))
			}
		}
		st, err := load()
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
				for _, m := range st.Members {
					fmt.Fprintf(w, "member %s: %s:%d, incusd pid %d\n", m.Name, m.ClusterAddr, world.ClusterPort, m.IncusdPID)
				}
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
}

// worldDebianReport is `world image --debian --json`.
type worldDebianReport struct {
	Image *debimage.Manifest     `json:"image"`
	Repo  *debimage.RepoManifest `json:"repo"`
	NS    int64                  `json:"ns"` // time to ensure and publish it
}

func setupWorldImage(fs *flag.FlagSet) runner {
	debian := fs.Bool("debian", false, "build the Debian image when this machine has none (minutes, once per machine) and offer it in the world as images:debian/12/cloud")
	alias, asJSON := imageFlags(fs)
	probe := imageRunner(alias, asJSON, func() (*incus.Client, error) {
		st, err := world.Load()
		if err != nil {
			return nil, err
		}
		return incus.New(st.IncusSocket), nil
	})
	return func(ctx context.Context, s stdio, args []string) int {
		if !*debian {
			return probe(ctx, s, args)
		}
		st, err := world.Load()
		if err != nil {
			return fail(s, err)
		}
		t0 := time.Now()
		img, err := world.PublishDebian(ctx, st, true, s.err)
		if err != nil {
			return fail(s, fmt.Errorf("the Debian image: %w", err))
		}
		repo, err := img.Repo()
		if err != nil {
			return fail(s, err)
		}
		rep := worldDebianReport{Image: &img.Manifest, Repo: repo, NS: int64(time.Since(t0))}
		emit(s, *asJSON, rep, func(w io.Writer) {
			fmt.Fprintf(w, "images:debian/12/cloud is %s: root %.0f MB, built in %s (%s)\n", img.Serial,
				float64(img.RootBytes)/1e6, time.Duration(img.TotalNS).Round(time.Second), img.Dir)
			fmt.Fprintf(w, "repository: %d packages (%.0f MB) for %s, indexes valid until %s\n", len(repo.Closure),
				float64(repo.Bytes)/1e6, strings.Join(repo.Packages, " "), validUntil(repo.ValidUntil))
		})
		return exitOK
	}
}

func validUntil(t time.Time) string {
	if t.IsZero() {
		return "forever"
	}
	return t.Format(time.RFC3339)
}

// setupImage is `drill image`: the probe image imported into this host's
// Incus (INCUS_SOCKET or INCUS_DIR say which), built from the host's
// busybox-static with no image server, for an operator who wants to look
// before a run (`drill run --host` does the same when it is missing).
func setupImage(fs *flag.FlagSet) runner {
	alias, asJSON := imageFlags(fs)
	return imageRunner(alias, asJSON, func() (*incus.Client, error) { return incus.New(""), nil })
}

func imageFlags(fs *flag.FlagSet) (alias *string, asJSON *bool) {
	return fs.String("alias", image.DefaultAlias, "image alias"), fs.Bool("json", false, "print JSON")
}

func imageRunner(alias *string, asJSON *bool, client func() (*incus.Client, error)) runner {
	return func(ctx context.Context, s stdio, _ []string) int {
		c, err := client()
		if err != nil {
			return fail(s, err)
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
}

func setupWorldCheck(fs *flag.FlagSet) runner {
	asJSON := fs.Bool("json", false, "print JSON")
	return func(ctx context.Context, s stdio, _ []string) int {
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
}

// worldServe is the detached process that holds the world's services.
func setupWorldServe(fs *flag.FlagSet) runner {
	state := fs.String("state", "", "the world's state file")
	return func(ctx context.Context, s stdio, _ []string) int {
		if *state == "" {
			fmt.Fprintln(s.err, "drill world serve: --state is required (this runs under `drill world up`)")
			return exitUsage
		}
		if err := world.Serve(ctx, *state, s.err); err != nil {
			return fail(s, err)
		}
		return exitOK
	}
}

// setupWorldIncusUser is the detached process that socket-activates the
// world's incus-user, until SIGTERM.
func setupWorldIncusUser(fs *flag.FlagSet) runner {
	state := fs.String("state", "", "the world's state file")
	return func(ctx context.Context, s stdio, _ []string) int {
		if *state == "" {
			fmt.Fprintln(s.err, "drill world incus-user: --state is required (this runs under `drill world up`)")
			return exitUsage
		}
		st, err := world.LoadFile(*state)
		if err != nil {
			return fail(s, err)
		}
		if err := world.ServeIncusUser(ctx, world.ActivatorConfig{IncusDir: st.IncusDir, Log: s.err}); err != nil {
			return fail(s, err)
		}
		return exitOK
	}
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
