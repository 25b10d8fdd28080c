package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/fixtures/npmreg"
	"github.com/box-isolation/box/fixtures/simplestreams"
	"github.com/box-isolation/box/fixtures/world"
	"github.com/box-isolation/box/internal/testenv"
	"github.com/box-isolation/box/stack/boxes"
	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/model"
	"github.com/box-isolation/box/templates"
)

// The boxes people use, end to end in the world: each template built once
// into its image (docs/images.md), from its images: alias, which incusd
// pulls from the world's image server (the Debian bookworm cloud image
// built from Debian's packages), provisioned by cloud-init from the
// world's Debian mirror and npm registry stand-ins
// (docs/world-stand-ins.md); every box a copy of its template's image.

// debianAlias is the templates' image on the world's image server.
const debianAlias = "debian/12/cloud"

// debianWorld is worldBox aimed at the world's image server (its
// INCUS_CONF) with no BOX_IMAGE, so a template mints from its own image;
// it skips (fails under BOX_REQUIRE_TIERS) when the world serves no
// Debian image.
func debianWorld(t *testing.T) (runner, *incus.Client, *world.State) {
	t.Helper()
	st := testenv.World(t)
	if st.DebianImage == "" || st.IncusConf == "" {
		testenv.Unavailable(t, "needs the world's Debian image on its image server: run `bin/drill world image --debian` (minutes, once per machine) with BOX_WORLD_STATE="+world.StatePath(st.StateDir))
	}
	r, c := worldBox(t)
	return r.with("BOX_IMAGE", "", "INCUS_CONF", st.IncusConf), c, st
}

// served is the fingerprint the world's image server gives alias: the
// one incusd stores a pulled image under.
func served(t *testing.T, st *world.State, alias string) string {
	t.Helper()
	_, prods, err := (&simplestreams.Server{Dir: st.ImageDir}).Catalog()
	require.NoError(t, err)
	best, fp := "", ""
	for _, p := range prods.Products {
		if !strings.Contains(","+p.Aliases+",", ","+alias+",") {
			continue
		}
		for serial, v := range p.Versions {
			if serial > best {
				best, fp = serial, v.Items[simplestreams.MetaFile].CombinedSquashfsSHA256
			}
		}
	}
	require.NotEmpty(t, fp, "the image server has no product with alias %s", alias)
	return fp
}

// forgetImage removes image fp from incusd's store, if it is there: the
// next mint of its alias downloads it.
func forgetImage(t *testing.T, c *incus.Client, fp string) {
	t.Helper()
	if _, err := c.Images().Get(context.Background(), fp); err == nil {
		require.NoError(t, c.Images().Delete(context.Background(), fp))
	} else if !incus.IsNotFound(err) {
		require.NoError(t, err)
	}
}

// serviceLog reads the world's services log (every stand-in request is a
// line) from offset from; logEnd is its end now.
func serviceLog(t *testing.T, st *world.State, from int64) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(st.StateDir, "services.log"))
	require.NoError(t, err)
	return string(b[min(from, int64(len(b))):])
}

func logEnd(t *testing.T, st *world.State) int64 {
	t.Helper()
	fi, err := os.Stat(filepath.Join(st.StateDir, "services.log"))
	require.NoError(t, err)
	return fi.Size()
}

// asRoot runs a shell command in a box as root (not as its user, which
// box exec is) and returns its stdout; it must succeed.
func asRoot(t *testing.T, c *incus.Client, name, script string) string {
	t.Helper()
	out, err := c.Instances().Exec(context.Background(), name, incus.ExecRequest{Command: []string{"sh", "-c", script}})
	require.NoError(t, err, script)
	require.Equal(t, 0, out.ExitCode, "%s: stdout %q stderr %q", script, out.Stdout, out.Stderr)
	return strings.TrimSpace(string(out.Stdout))
}

// downloads matches the image server's log line for one download of the
// Debian image's root.
var downloads = regexp.MustCompile(`simplestreams: GET https? /images/debian/\S+/root\.squashfs 200`)

// progressLine is box new's download progress, drawn on a terminal.
var progressLine = regexp.MustCompile(`from images:` + regexp.QuoteMeta(debianAlias) + `: rootfs: \d+%`)

// TestSystemDebianBoxes mints every template from an uncached
// images:debian/12/cloud through the world's image server, all at once,
// beside a nesting box running Docker: each template's image is built
// once (incusd downloads the base once; the others wait for it) and every
// box is a copy of it. Then, with the image server, mirror and registry
// all stopped, a mint from the current image succeeds and asks none of
// them; a build in a record of its own fails with the mirror down,
// naming the failure and leaving neither image nor builder; a clone of the
// claude box is not provisioned again.
func TestSystemDebianBoxes(t *testing.T) {
	r, c, st := debianWorld(t)
	ctx := context.Background()
	fp := served(t, st, debianAlias)
	rec := boxes.TemplateImagesFile(st.Names.HostNS)
	// A base of its own for this run: every image here is built again
	// (the record names images built from the base being forgotten).
	if images, err := boxes.ReadTemplateImages(rec); err == nil {
		for _, ti := range images {
			forgetImage(t, c, ti.Fingerprint)
		}
	}
	forgetImage(t, c, fp)
	from := logEnd(t, st)
	start := time.Now()

	var mu sync.Mutex
	minted := map[string]string{}   // template -> box
	progress := map[string]string{} // template -> box new's stderr
	// Every box is removed at the end of the whole test: the clone needs
	// the claude box.
	top := t
	mint := func(t *testing.T, r runner, tpl string, args ...string) (string, result) {
		name := uniq(t)
		cleanup(top, c, name)
		res := r.withErrTTY().run(t, append([]string{"new", "--name", name, "--template", tpl}, args...)...)
		mu.Lock()
		progress[tpl+strings.Join(args, "")] = res.err
		mu.Unlock()
		return name, res
	}

	// All five at once: go test's -parallel (GOMAXPROCS, 2 here) would
	// run two at a time, and provisioning waits on the stand-ins more
	// than on the CPU (docs/measurements.md).
	var wg sync.WaitGroup
	at := func(name string, f func(t *testing.T)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t.Run(name, f)
		}()
	}
	for _, tpl := range []string{"blank", "claude", "codex", "grok"} {
		at(tpl, func(t *testing.T) {
			name, res := mint(t, r, tpl)
			require.Equal(t, exitOK, res.code, res.err)
			mu.Lock()
			minted[tpl] = name
			mu.Unlock()
			ti := recordedImage(t, rec, tpl)
			assert.Equal(t, fp, ti.BaseFingerprint, "built from the base the server gives")
			checkTemplateBox(t, r, c, st, tpl, name, ti, res)
		})
	}
	at("nesting", func(t *testing.T) {
		name, res := mint(t, r, "blank", "--nesting")
		require.Equal(t, exitOK, res.code, res.err)
		checkDocker(t, r, c, st, name, res)
	})
	wg.Wait()
	t.Logf("the four templates' images built and the four boxes and the nesting box minted at once from an uncached base: %s", time.Since(start).Round(time.Second))

	log := serviceLog(t, st, from)
	assert.Len(t, downloads.FindAllString(log, -1), 1, "incusd downloaded the base once, for all four builds:\n%s", strings.Join(downloads.FindAllString(log, -1), "\n"))
	shown := 0
	for _, e := range progress {
		if progressLine.MatchString(e) {
			shown++
		}
	}
	assert.GreaterOrEqual(t, shown, 1, "the download's progress was shown")
	noBuilders(t, c)
	if t.Failed() {
		return
	}

	t.Run("the claude image's rootfs", func(t *testing.T) {
		left, files := imageLeftovers(t, c, recordedImage(t, rec, "claude").Fingerprint)
		assert.Greater(t, files, 1000, "the image's rootfs was read")
		assert.Empty(t, left, "the image holds what belonged to its builder")
	})

	t.Run("offline, from the current image", func(t *testing.T) {
		for _, addr := range []netip.Addr{world.ImageServerAddr, world.MirrorAddr, world.NPMRegistryAddr} {
			restart, err := st.StopStandIn(addr)
			require.NoError(t, err)
			defer func() { require.NoError(t, restart()) }()
		}
		from := logEnd(t, st)
		name, res := mint(t, r, "claude")
		require.Equal(t, exitOK, res.code, "the image server, mirror and registry down: %s", res.err)
		assert.NotContains(t, res.err, "building")
		assert.Equal(t, recordedImage(t, rec, "claude").Fingerprint, infoOf(t, r, name).Stamps[model.StampFingerprint])
		ex := r.run(t, "exec", name, "--", "claude", "--version")
		assert.Equal(t, npmreg.VersionLine("claude")+"\n", ex.out)
		assert.NotRegexp(t, `(simplestreams|debrepo|npmreg): GET`, serviceLog(t, st, from), "asked no stand-in for anything")
	})

	t.Run("a build that fails", func(t *testing.T) {
		// The mirror stopped: apt cannot install nodejs, so npm is not
		// there and the agent never is. No image is published, the
		// builder goes, and the error says why.
		startMirror, err := st.StopStandIn(world.MirrorAddr)
		require.NoError(t, err)
		defer func() { require.NoError(t, startMirror()) }()
		own := filepath.Join(t.TempDir(), "template-images.json")
		before, err := c.Images().List(ctx)
		require.NoError(t, err)
		name, res := mint(t, r.with("BOX_TEMPLATE_IMAGES", own), "claude")
		assert.Equal(t, exitFailed, res.code)
		assert.Contains(t, res.err, "box: building template claude's image: provisioning failed: agent command claude is not in /usr/local/bin (npm install -g @anthropic-ai/claude-code failed?)")
		assert.Contains(t, res.err, "the end of its /var/log/cloud-init-output.log:")
		after, err := c.Images().List(ctx)
		require.NoError(t, err)
		assert.Len(t, after, len(before), "no image left")
		noBuilders(t, c)
		_, _, err = c.Instances().Get(ctx, name)
		assert.True(t, incus.IsNotFound(err), "no box made: %v", err)
		_, err = os.Stat(own)
		assert.True(t, os.IsNotExist(err), "nothing recorded: %v", err)
	})

	t.Run("clone", func(t *testing.T) {
		checkClone(t, r, c, st, minted["claude"])
	})
}

// checkTemplateBox checks a box minted from template tpl: pulled through
// the world's image server, cloud-init ran the template's user-data
// unmodified and wrote the ready marker, the agent answers, the context
// file and the user with passwordless sudo exist, and box shell hands
// over to a login shell in the user's home.
func checkTemplateBox(t *testing.T, r runner, c *incus.Client, st *world.State, tpl, name string, ti boxes.TemplateImage, res result) {
	t.Helper()
	tp, err := templates.Get(tpl)
	require.NoError(t, err)
	assert.Contains(t, res.out, name+": container running at 10.")
	assert.Regexp(t, `made in [0-9.ms]+, provisioned [0-9.ms]+ later\)\n$`, res.out)

	info := infoOf(t, r, name)
	for k, want := range map[string]string{
		model.StampTemplate: tpl, model.StampUser: tp.User, model.StampImage: boxes.ImageAlias(tpl),
		model.StampImageServer: "", model.StampFingerprint: ti.Fingerprint, model.StampOrigin: "template " + tpl + "'s image " + ti.Fingerprint[:12],
	} {
		assert.Equal(t, want, info.Stamps[k], k)
	}

	// cloud-init ran the copy's user-data as box rendered it: the user
	// and the checks, nothing installed.
	want, err := tp.CopyUserData(name, version)
	require.NoError(t, err)
	inst, _, err := c.Instances().Get(context.Background(), name)
	require.NoError(t, err)
	assert.Equal(t, want, inst.Config["cloud-init.user-data"])
	assert.Equal(t, strings.TrimSpace(want), asRoot(t, c, name, "cat /var/lib/cloud/seed/nocloud-net/user-data"), "the seed Incus rendered is the user-data, unmodified")
	assert.Equal(t, "status: done", asRoot(t, c, name, "cloud-init status"))
	assert.Equal(t, name, asRoot(t, c, name, "cat /var/lib/cloud/data/instance-id"), "a cloud-init instance of its own")
	assert.Equal(t, tpl, asRoot(t, c, name, "cat "+templates.ReadyMarker))
	assert.Equal(t, "no", asRoot(t, c, name, "test -e "+templates.FailedMarker+" && echo yes || echo no"))

	// The user, passwordless sudo, and box shell's handover.
	ex := r.run(t, "exec", name, "--", "id", "-un")
	assert.Equal(t, tp.User+"\n", ex.out)
	ex = r.run(t, "exec", name, "--", "sudo", "-n", "id", "-u")
	assert.Equal(t, exitOK, ex.code, ex.err)
	assert.Equal(t, "0\n", ex.out, "sudo without a password")
	sh := r.run(t, "shell", name)
	require.Equal(t, exitOK, sh.code, sh.err)
	argv := []string{"incus", "--project", "default", "exec", "local:" + name, "--", "su", "-l", tp.User}
	assert.Equal(t, argv, sh.handedOver)
	// What the incus CLI then runs in the box: a login shell as the user.
	assert.Equal(t, tp.Home()+"\n"+tp.Home()+"\n"+tp.User, asRoot(t, c, name, "su -l "+tp.User+` -c 'pwd; echo "$HOME"; id -un'`))

	if tp.Agent == nil {
		ex = r.run(t, "exec", name, "--", "sh", "-c", "command -v claude codex grok node npm || echo none")
		assert.Equal(t, "none\n", ex.out, "blank installs no agent")
		return
	}
	ex = r.run(t, "exec", name, "--", tp.Agent.Command, "--version")
	assert.Equal(t, exitOK, ex.code, ex.err)
	assert.Equal(t, npmreg.VersionLine(tpl)+"\n", ex.out, "the agent answers")
	// Written into the image, for every box of the template.
	ctxWant, err := tp.ContextFile(templates.RenderOptions{BoxVersion: version, Image: true})
	require.NoError(t, err)
	ex = r.run(t, "exec", name, "--", "cat", tp.ContextPath())
	assert.Equal(t, ctxWant, ex.out, "the context file")
	ex = r.run(t, "exec", name, "--", "stat", "-c", "%U %a", tp.ContextPath(), filepath.Dir(tp.ContextPath()))
	assert.Equal(t, tp.User+" 644\n"+tp.User+" 755\n", ex.out, "the user's, and its folder too")
}

// checkDocker: a nesting box has exactly what NestingConfig sets, the
// census accepts it with the reason, and Debian's docker.io in it runs a
// container of an image built from the box's own files (no registry)
// that reaches the world's canary, stops, and pauses (the freezer).
func checkDocker(t *testing.T, r runner, c *incus.Client, st *world.State, name string, res result) {
	t.Helper()
	assert.Contains(t, res.out, "(template blank, ")
	assert.Contains(t, res.out, ", nesting; made in ")
	inst, _, err := c.Instances().Get(context.Background(), name)
	require.NoError(t, err)
	sec := map[string]string{}
	for k, v := range inst.ExpandedConfig {
		if strings.HasPrefix(k, "security.") {
			sec[k] = v
		}
	}
	want := model.NestingConfig()
	want[model.GuestAPIKey] = "false" // box-net's own
	assert.Equal(t, want, sec, "the nesting keys, on the instance, and the profile's guest API off")
	assert.NotContains(t, inst.Profiles, "docker")
	assert.Equal(t, []string{model.Current.Profile}, inst.Profiles)
	list := r.run(t, "list")
	assert.Regexp(t, name+`\s+Running\s+container\s+on\s`, list.out, "the census keeps it on the stack")

	// An image of the box's own bash and its libraries.
	build := `set -e; files="/bin/bash $(ldd /bin/bash | awk '/=>/ {print $3} /ld-linux/ {print $1}')"; ` +
		`tar -ch $files 2>/dev/null | docker import - box-local:bash >/dev/null; docker image ls --format '{{.Repository}}:{{.Tag}}' box-local`
	ex := r.run(t, "exec", name, "--", "sudo", "-n", "sh", "-c", build)
	require.Equal(t, exitOK, ex.code, ex.err)
	assert.Equal(t, "box-local:bash\n", ex.out)

	greet := `exec 3<>/dev/tcp/` + world.Canary.String() + `/` + fmt.Sprint(world.CanaryTCPPort) + `; read -r line <&3; echo "$line"`
	ex = r.run(t, "exec", name, "--", "sudo", "-n", "docker", "run", "--rm", "box-local:bash", "/bin/bash", "-c", greet)
	require.Equal(t, exitOK, ex.code, ex.err)
	assert.Equal(t, st.Greeting("canary")+"\n", ex.out, "the container reached the canary, through Docker's NAT and the box's")
	ex = r.run(t, "exec", name, "--", "sudo", "-n", "docker", "ps", "-aq")
	assert.Equal(t, "", ex.out, "--rm: it stopped and is gone")

	// A long one: paused (the freezer cgroup), then stopped.
	ex = r.run(t, "exec", name, "--", "sudo", "-n", "sh", "-c", `set -e
docker run -d --name long box-local:bash /bin/bash -c 'trap "exit 0" TERM; while :; do read -t 1 < /dev/zero || :; done' >/dev/null
docker pause long >/dev/null; docker inspect -f '{{.State.Status}}' long
docker unpause long >/dev/null; docker stop -t 10 long >/dev/null; docker inspect -f '{{.State.Status}} {{.State.ExitCode}}' long
docker rm long >/dev/null`)
	require.Equal(t, exitOK, ex.code, ex.err)
	assert.Equal(t, "paused\nexited 0\n", ex.out, "paused by the freezer, then stopped by its TERM")
}

// checkClone clones a provisioned box the operator has logged the agent
// in: the clone is not provisioned again (no apt, no npm; the login and
// the operator's change to the context file come with it), reports ready
// from its own cloud-init, and its agent answers.
func checkClone(t *testing.T, r runner, c *incus.Client, st *world.State, src string) {
	t.Helper()
	require.NotEmpty(t, src, "the claude box")
	tp, err := templates.Get("claude")
	require.NoError(t, err)
	login := filepath.Join(tp.Home(), ".claude", ".credentials.json")
	ex := r.run(t, "exec", src, "--", "sh", "-c", "echo logged-in > "+login+"; echo '# the operator was here' >> "+tp.ContextPath())
	require.Equal(t, exitOK, ex.code, ex.err)
	require.Equal(t, exitOK, r.run(t, "down", src).code)

	name := uniq(t)
	cleanup(t, c, name)
	from := logEnd(t, st)
	res := r.run(t, "new", "--name", name, "--from", src)
	require.Equal(t, exitOK, res.code, res.err)
	assert.Contains(t, res.out, "not provisioned again (its user and agent checked only)")
	log := serviceLog(t, st, from)
	assert.NotRegexp(t, `(debrepo|npmreg): GET`, log, "the clone asked neither the mirror nor the registry for anything")

	inst, _, err := c.Instances().Get(context.Background(), name)
	require.NoError(t, err)
	want, ok := templates.ForClone(mustConfig(t, c, src, "cloud-init.user-data"), name)
	require.True(t, ok)
	assert.Equal(t, want, inst.Config["cloud-init.user-data"])
	assert.Equal(t, "status: done", asRoot(t, c, name, "cloud-init status"))
	assert.Equal(t, name, asRoot(t, c, name, "cat /var/lib/cloud/data/instance-id"), "a cloud-init instance of its own")
	assert.Equal(t, "claude", asRoot(t, c, name, "cat "+templates.ReadyMarker), "its own report")
	assert.Equal(t, "logged-in", asRoot(t, c, name, "cat "+login), "the login came with it")
	assert.Contains(t, asRoot(t, c, name, "cat "+tp.ContextPath()), "# the operator was here", "the context file is not written again")
	ex = r.run(t, "exec", name, "--", "claude", "--version")
	assert.Equal(t, npmreg.VersionLine("claude")+"\n", ex.out)
	assert.NotEqual(t, asRoot(t, c, name, "cat /etc/machine-id"), mustMachineID(t, c, src))
}

func mustConfig(t *testing.T, c *incus.Client, name, key string) string {
	t.Helper()
	inst, _, err := c.Instances().Get(context.Background(), name)
	require.NoError(t, err)
	return inst.Config[key]
}

// mustMachineID reads a stopped box's machine-id from its disk.
func mustMachineID(t *testing.T, c *incus.Client, name string) string {
	t.Helper()
	b, err := c.Instances().PullFile(context.Background(), name, "/etc/machine-id")
	require.NoError(t, err)
	return strings.TrimSpace(string(b))
}

// TestSystemImageServerDown stops the world's image server. With the image
// already here (and the server's index, which incusd keeps and falls back
// to when the server does not answer) a mint succeeds; with neither, as on
// a host that never reached the server, it fails naming the server and the
// offline way, and leaves nothing: no box, no image. The probe image on
// the same server (images:box-probe) keeps it quick.
func TestSystemImageServerDown(t *testing.T) {
	r, c, st := debianWorld(t)
	ctx := context.Background()
	image := "images:" + world.ProbeRemoteAlias
	fp := served(t, st, world.ProbeRemoteAlias)
	t.Cleanup(func() { forgetImage(t, c, fp) })

	// Here: pulled once while the server is up.
	a := uniq(t)
	cleanup(t, c, a)
	res := r.run(t, "new", "--name", a, "--image", image)
	require.Equal(t, exitOK, res.code, res.err)
	_, err := c.Images().Get(ctx, fp)
	require.NoError(t, err, "the image is here")

	startServer, err := st.StopStandIn(world.ImageServerAddr)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, startServer()) })

	b := uniq(t)
	cleanup(t, c, b)
	res = r.run(t, "new", "--name", b, "--image", image)
	require.Equal(t, exitOK, res.code, "down, with the image here: %s", res.err)
	assert.Equal(t, fp, infoOf(t, r, b).Stamps[model.StampFingerprint])

	// Never fetched: no image, and no index of the server's (Incus keeps
	// it under INCUS_DIR/cache/sha256(URL)).
	forgetImage(t, c, fp)
	sum := sha256.Sum256([]byte(world.ImageServerURL()))
	require.NoError(t, os.RemoveAll(filepath.Join(st.IncusDir, "cache", hex.EncodeToString(sum[:]))))
	before, err := c.Images().List(ctx)
	require.NoError(t, err)
	n := uniq(t)
	cleanup(t, c, n)
	res = r.run(t, "new", "--name", n, "--image", image)
	assert.Equal(t, exitFailed, res.code)
	assert.Contains(t, res.err, "box: minting "+n+": incusd could not get "+image+" from the image server "+world.ImageServerURL()+", and has no copy of it: ")
	assert.Contains(t, res.err, "connection refused", "incusd's reason")
	assert.Contains(t, res.err, "import an image file (incus image import FILE --alias NAME) and mint with --image NAME")
	_, _, err = c.Instances().Get(ctx, n)
	assert.True(t, incus.IsNotFound(err), "no box left: %v", err)
	after, err := c.Images().List(ctx)
	require.NoError(t, err)
	assert.Equal(t, len(before), len(after), "no image left")
}
