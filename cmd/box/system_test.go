package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/drill/image"
	"github.com/box-isolation/box/fixtures/world"
	"github.com/box-isolation/box/internal/testenv"
	"github.com/box-isolation/box/stack"
	"github.com/box-isolation/box/stack/boxes"
	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/model"
	"github.com/box-isolation/box/templates"
)

// The system tier: box end to end against the hermetic world's incusd,
// with the local busybox image (users box 1000 and dev 1001, no
// cloud-init). Every box a test makes is named t-cli-<random> and removed
// by that test; the stack itself is only ever set up, never torn down:
// other packages' tests share the world.

var (
	memOnce sync.Once
	memOK   bool
)

// worldBox returns a runner aimed at the world, with the stack set up.
func worldBox(t *testing.T) (runner, *incus.Client) {
	t.Helper()
	st, c := testenv.Incus(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, err := image.Ensure(ctx, c, image.DefaultAlias, image.Options{})
	require.NoError(t, err)
	r := runner{env: map[string]string{
		"INCUS_SOCKET": st.IncusSocket,
		"BOX_NETNS":    st.Names.HostNS,
		"BOX_DNS":      world.Resolver.String(),
		"BOX_IMAGE":    image.DefaultAlias,
		// The world's own record of template images (its host namespace's),
		// shared by every test aimed at the world.
		"BOX_TEMPLATE_IMAGES": "",
	}}
	// A start that fails leaves its NIC's veth pair on the bridge (Incus
	// 6.0): find out first, so setup-host below sweeps it away.
	memOnce.Do(func() { memOK = memoryLimitsWork(t, c) })
	// Other packages' tests share the world and may be changing the stack
	// at this moment (dnsmasq restarting under us): converge again.
	setup := r.run(t, "setup-host")
	for try := 0; setup.code != exitOK && try < 4; try++ {
		time.Sleep(2 * time.Second)
		setup = r.run(t, "setup-host")
	}
	require.Equal(t, exitOK, setup.code, "setup-host: %s", setup.err)
	if !memOK {
		// Every template has a memory limit; where the host cannot apply
		// one, no box would start.
		t.Log("this host's incusd cannot apply limits.memory (lxc: Failed to setup cgroup limits): minting with BOX_MEMORY=none")
		r = r.with("BOX_MEMORY", templates.NoLimit)
	}
	return r, c
}

// memoryLimitsWork starts a throwaway container with a memory limit.
func memoryLimitsWork(t *testing.T, c *incus.Client) bool {
	t.Helper()
	ctx := context.Background()
	name := uniq(t)
	err := c.Instances().Create(ctx, incus.InstancesPost{
		Name: name, Type: "container", Start: true,
		Config: map[string]string{"limits.memory": "256MiB"},
		Source: incus.InstanceSource{Type: "image", Alias: image.DefaultAlias},
	})
	c.Instances().SetState(ctx, name, "stop", 0, true) //nolint:errcheck
	require.NoError(t, deleteEventually(c, name))
	return err == nil
}

// deleteEventually deletes an instance; right after a failed start incusd
// can briefly fail to read its state.
func deleteEventually(c *incus.Client, name string) error {
	var err error
	for range 20 {
		if err = c.Instances().Delete(context.Background(), name); err == nil || incus.IsNotFound(err) {
			return nil
		}
		time.Sleep(250 * time.Millisecond)
	}
	return err
}

func uniq(t *testing.T) string {
	t.Helper()
	b := make([]byte, 3)
	_, err := rand.Read(b)
	require.NoError(t, err)
	return "t-cli-" + hex.EncodeToString(b)
}

// cleanup removes the named instances (if they still exist) at the end.
func cleanup(t *testing.T, c *incus.Client, names ...string) {
	t.Cleanup(func() {
		for _, n := range names {
			c.Instances().SetState(context.Background(), n, "stop", 0, true) //nolint:errcheck
			if err := deleteEventually(c, n); err != nil {
				t.Errorf("cleaning up %s: %v", n, err)
			}
		}
	})
}

func infoOf(t *testing.T, r runner, name string) infoResult {
	t.Helper()
	res := r.run(t, "info", name, "--json")
	require.Equal(t, exitOK, res.code, res.err)
	var info infoResult
	require.NoError(t, json.Unmarshal([]byte(res.out), &info))
	return info
}

func TestSystemBoxLifecycle(t *testing.T) {
	r, c := worldBox(t)
	a, b, cl := uniq(t), uniq(t), uniq(t)
	cleanup(t, c, a, b, cl)

	// Mint with the default template.
	start := time.Now()
	res := r.run(t, "new", "--name", a)
	require.Equal(t, exitOK, res.code, res.err)
	assert.Contains(t, res.err, "making a container", "the type is said out loud")
	assert.Contains(t, res.out, a+": container running at 10.")
	ex := r.run(t, "exec", a, "--", "id", "-u")
	t.Logf("box new to a box that answers exec: %s", time.Since(start))
	require.Equal(t, exitOK, ex.code)
	assert.Equal(t, "1001\n", ex.out, "exec runs as the template's user (dev)")
	ex = r.run(t, "exec", a, "--", "sh", "-c", "pwd; echo oops >&2; exit 7")
	assert.Equal(t, 7, ex.code, "the command's exit code")
	assert.Equal(t, "/home/dev\n", ex.out)
	assert.Equal(t, "oops\n", ex.err)

	// list and info show the stamps.
	res = r.run(t, "list", "--json")
	require.Equal(t, exitOK, res.code)
	var boxes []stack.Box
	require.NoError(t, json.Unmarshal([]byte(res.out), &boxes))
	var mine *stack.Box
	for i := range boxes {
		if boxes[i].Name == a {
			mine = &boxes[i]
		}
	}
	require.NotNil(t, mine, "list shows the box")
	assert.Equal(t, "blank", mine.Stamps[model.StampTemplate])
	res = r.run(t, "list")
	assert.Regexp(t, a+`\s+Running\s+container\s+on\s+blank\s+dev\s`, res.out, "a fresh box is on the stack")
	info := infoOf(t, r, a)
	for k, want := range map[string]string{
		model.StampTemplate: "blank", model.StampUser: "dev", model.StampVersion: version,
		model.StampImage: image.DefaultAlias, model.StampType: "container", model.StampOrigin: "image " + image.DefaultAlias,
	} {
		assert.Equal(t, want, info.Stamps[k], k)
	}
	assert.Len(t, info.Stamps[model.StampFingerprint], 64)
	assert.NotEmpty(t, info.Stamps[model.StampMinted])
	require.Len(t, info.Addresses, 1)
	inst, _, err := c.Instances().Get(context.Background(), a)
	require.NoError(t, err)
	assert.Equal(t, "2", inst.Config["limits.cpu"], "the template's CPUs")

	// Snapshot: this host cannot freeze a running container.
	res = r.run(t, "snapshot", a, "s1")
	if res.code == exitOK {
		t.Log("this host can snapshot a running box")
		require.Equal(t, exitOK, r.run(t, "down", a).code)
	} else {
		assert.Equal(t, exitFailed, res.code)
		assert.Contains(t, res.err, "stop it first (box down "+a+")")
		// Rename refuses a running box and names the fix.
		res = r.run(t, "rename", a, b)
		assert.Equal(t, exitFailed, res.code)
		assert.Contains(t, res.err, "stop it first (box down "+a+")")
		require.Equal(t, exitOK, r.run(t, "down", a).code)
		res = r.run(t, "snapshot", a, "s1")
		require.Equal(t, exitOK, res.code, res.err)
	}
	assert.Equal(t, a+"/s1\n", res.out)

	// Rename after down; the snapshot follows.
	res = r.run(t, "rename", a, b)
	require.Equal(t, exitOK, res.code, res.err)
	res = r.run(t, "info", a)
	assert.Equal(t, exitFailed, res.code)
	assert.Contains(t, res.err, "no box named "+a)
	info = infoOf(t, r, b)
	require.Len(t, info.Snapshots, 1)
	assert.Equal(t, "s1", info.Snapshots[0].Name)

	// A clone of the renamed box's snapshot works and has its own address.
	res = r.run(t, "new", "--name", cl, "--from", b+"/s1")
	require.Equal(t, exitOK, res.code, res.err)
	assert.Contains(t, res.out, "clone of "+b+"/s1")
	assert.Contains(t, res.out, "inherited")
	assert.Contains(t, res.out, "template=blank")
	ex = r.run(t, "exec", cl, "--", "id", "-u")
	assert.Equal(t, "1001\n", ex.out)
	require.Equal(t, exitOK, r.run(t, "start", b).code)
	_, err = (&stack.Host{Incus: c}).Addresses().Wait(context.Background(), b, 30*time.Second)
	require.NoError(t, err)
	ib, ic := infoOf(t, r, b), infoOf(t, r, cl)
	require.Len(t, ib.Addresses, 1)
	require.Len(t, ic.Addresses, 1)
	assert.NotEqual(t, ib.Addresses, ic.Addresses, "source and clone never share an address")
	assert.Equal(t, "clone of "+b+"/s1", ic.Stamps[model.StampOrigin])

	// Restore asks; without a terminal and --force it refuses.
	res = r.run(t, "restore", b, "s1")
	assert.Equal(t, exitUsage, res.code)
	assert.Contains(t, res.err, "--force")
	res = r.run(t, "restore", b, "nosuch", "--force")
	assert.Equal(t, exitFailed, res.code)
	assert.Contains(t, res.err, "has no snapshot nosuch")
	res = r.run(t, "restore", b, "s1", "--force")
	assert.Equal(t, exitOK, res.code, res.err)
	res = runner{env: r.env, tty: true, stdin: "n\n"}.run(t, "restore", b, "s1")
	assert.Equal(t, exitFailed, res.code, "a person said no")
	assert.Contains(t, res.err, "nothing was changed")

	// teardown-host asks first, and without a terminal refuses unless
	// --yes; with --yes it still refuses while boxes exist (the --force
	// path is never taken here: the world is shared).
	res = r.run(t, "teardown-host")
	assert.Equal(t, exitUsage, res.code)
	assert.Contains(t, res.err, "pass --yes")
	res = r.run(t, "teardown-host", "--yes")
	assert.Equal(t, exitFailed, res.code)
	assert.Contains(t, res.err, "boxes still exist")
	assert.Contains(t, res.err, b)
	_, _, err = c.Networks().Get(context.Background(), model.Current.Network)
	assert.NoError(t, err, "the stack is still there")

	// rm without a terminal and --force removes nothing.
	res = r.run(t, "rm", b)
	assert.Equal(t, exitUsage, res.code)
	assert.Contains(t, res.err, "no terminal to ask; pass --force")
	_, _, err = c.Instances().Get(context.Background(), b)
	require.NoError(t, err, "still there")

	// rm --force removes the box and its snapshots.
	res = r.run(t, "rm", b, "--force")
	require.Equal(t, exitOK, res.code, res.err)
	assert.Contains(t, res.out, "with 1 snapshots")
	_, _, err = c.Instances().Get(context.Background(), b)
	assert.True(t, incus.IsNotFound(err), "box gone: %v", err)
	_, err = c.Instances().Snapshots(context.Background(), b)
	assert.True(t, incus.IsNotFound(err), "snapshots gone: %v", err)

	// stack.Remove refreshes the bridge drop's port set: doctor is clean.
	res = r.run(t, "doctor")
	assert.Equal(t, exitOK, res.code, "the stack is healthy: %s", res.out)
}

func TestSystemResourceFlagsBeatTheEnvironment(t *testing.T) {
	r, c := worldBox(t)
	ctx := context.Background()

	// The environment beats the template.
	n1 := uniq(t)
	cleanup(t, c, n1)
	res := r.with("BOX_CPU", "1").run(t, "new", "--name", n1)
	require.Equal(t, exitOK, res.code, res.err)
	inst, _, err := c.Instances().Get(ctx, n1)
	require.NoError(t, err)
	assert.Equal(t, "1", inst.Config["limits.cpu"])

	// Flags beat the environment.
	forgetMemoryLimits(t, c)
	n2 := uniq(t)
	cleanup(t, c, n2)
	env := r.with("BOX_CPU", "2", "BOX_MEMORY", "1GiB")
	res = env.run(t, "new", "--name", n2, "--cpu", "1", "--memory", "256MiB")
	if memOK {
		require.Equal(t, exitOK, res.code, res.err)
		inst, _, err = c.Instances().Get(ctx, n2)
		require.NoError(t, err, "the box was created")
		assert.Equal(t, "1", inst.Config["limits.cpu"], "--cpu beats BOX_CPU")
		assert.Equal(t, "256MiB", inst.Config["limits.memory"], "--memory beats BOX_MEMORY")
		return
	}
	// Here the limit cannot be applied: box tried the one asked for, then
	// minted without it and says so.
	require.Equal(t, exitOK, res.code, res.err)
	inst, _, err = c.Instances().Get(ctx, n2)
	require.NoError(t, err, "the box was created")
	assert.Equal(t, "1", inst.Config["limits.cpu"], "--cpu beats BOX_CPU")
	assert.NotContains(t, inst.Config, "limits.memory")
	assert.Contains(t, res.err, "limits.memory=256MiB failed", "--memory beat BOX_MEMORY: it is the limit tried")
}

// forgetMemoryLimits takes the stack's record of a host that cannot apply
// memory limits away, now and after the test.
func forgetMemoryLimits(t *testing.T, c *incus.Client) {
	t.Helper()
	forget := func() {
		n, etag, err := c.Networks().Get(context.Background(), model.Current.Network)
		require.NoError(t, err)
		if _, ok := n.Config[boxes.KeyMemoryLimits]; !ok {
			return
		}
		delete(n.Config, boxes.KeyMemoryLimits)
		require.NoError(t, c.Networks().Update(context.Background(), model.Current.Network, incus.NetworkPut{Description: n.Description, Config: n.Config}, etag))
	}
	forget()
	t.Cleanup(forget)
}

func TestSystemBoundary(t *testing.T) {
	r, c := worldBox(t)
	ctx := context.Background()
	name := uniq(t)
	require.NoError(t, c.Instances().Create(ctx, incus.InstancesPost{
		Name: name, Type: "container", Start: true, Profiles: []string{model.Current.Profile},
		Config: map[string]string{"user.other": "1"},
		Source: incus.InstanceSource{Type: "image", Alias: image.DefaultAlias},
	}))
	cleanup(t, c, name)
	before, _, err := c.Instances().Get(ctx, name)
	require.NoError(t, err)

	for _, args := range [][]string{
		{"down", name}, {"down", name, "--force"}, {"rm", name}, {"rm", name, "--force"},
		{"rename", name, name + "-x"}, {"snapshot", name, "s"}, {"restore", name, "s", "--force"},
		{"incus", name, "--", "config", "show"}, {"exec", name, "--", "id"}, {"info", name},
		{"shell", name}, {"tmux", name}, {"start", name}, {"new", "--name", name + "-c", "--from", name},
	} {
		res := r.run(t, args...)
		assert.Equal(t, exitFailed, res.code, "%v", args)
		assert.Contains(t, res.err, name+" is not a box", "%v", args)
		assert.Contains(t, res.err, "no user.box=1 tag", "%v: the reason", args)
		assert.Nil(t, res.handedOver, "%v: nothing was handed to incus", args)
	}
	after, _, err := c.Instances().Get(ctx, name)
	require.NoError(t, err)
	assert.Equal(t, "Running", after.Status, "still running")
	assert.Equal(t, before.Config, after.Config, "untouched")
	snaps, err := c.Instances().Snapshots(ctx, name)
	require.NoError(t, err)
	assert.Empty(t, snaps)
	_, _, err = c.Instances().Get(ctx, name+"-c")
	assert.True(t, incus.IsNotFound(err), "no clone of it")
	res := r.run(t, "list")
	assert.NotContains(t, res.out, name)

	res = r.run(t, "exec", "t-cli-nosuchbox", "--", "id")
	assert.Equal(t, exitFailed, res.code)
	assert.Contains(t, res.err, "no box named t-cli-nosuchbox (box list shows yours)")
}

func TestSystemHandovers(t *testing.T) {
	r, c := worldBox(t)
	name := uniq(t)
	local := "local:" + name // the remote is always named
	cleanup(t, c, name)
	require.Equal(t, exitOK, r.run(t, "new", "--name", name).code)

	for _, tc := range []struct {
		args, want []string
		warn       string
	}{
		{[]string{"incus", name, "--", "config", "show"}, []string{"incus", "--project", "default", "config", "show", local}, ""},
		{[]string{"incus", name, "config", "show", "--", "--expanded"}, []string{"incus", "--project", "default", "config", "show", "--expanded", local}, ""},
		{[]string{"incus", name, "--", "exec", "{}", "--", "id"}, []string{"incus", "--project", "default", "exec", local, "--", "id"}, ""},
		{[]string{"incus", name, "--", "config", "device", "add", "{}", "eth9", "nic", "nictype=bridged", "parent=lxdbr0"},
			[]string{"incus", "--project", "default", "config", "device", "add", local, "eth9", "nic", "nictype=bridged", "parent=lxdbr0"}, "a device"},
		{[]string{"incus", name, "--", "profile", "add", "{}", "default"}, []string{"incus", "--project", "default", "profile", "add", local, "default"}, "a profile"},
		{[]string{"incus", name, "--", "config", "set", "{}", "security.privileged=true"}, []string{"incus", "--project", "default", "config", "set", local, "security.privileged=true"}, "a security.* key"},
		{[]string{"shell", name}, []string{"incus", "--project", "default", "exec", local, "--", "su", "-l", "dev"}, ""},
		{[]string{"tmux", name}, []string{"incus", "--project", "default", "exec", local, "--", "su", "-l", "dev", "-c", "tmux new-session -A -s main"}, ""},
		{[]string{"tmux", name, "work"}, []string{"incus", "--project", "default", "exec", local, "--", "su", "-l", "dev", "-c", "tmux new-session -A -s work"}, ""},
	} {
		res := r.run(t, tc.args...)
		require.Equal(t, exitOK, res.code, "%v", tc.args)
		assert.Equal(t, tc.want, res.handedOver, "%v", tc.args)
		assert.Contains(t, res.err, "+ "+shellQuote(tc.want)+"\n", "%v: the command is echoed", tc.args)
		assert.Contains(t, res.env, "INCUS_SOCKET="+r.env["INCUS_SOCKET"], "the CLI talks to the same incusd")
		if tc.warn != "" {
			assert.Contains(t, res.err, "WARNING: these arguments touch "+tc.warn)
			assert.Contains(t, res.err, "off the isolation stack")
		} else {
			assert.NotContains(t, res.err, "WARNING")
		}
	}
	res := r.run(t, "incus", name)
	assert.Equal(t, exitUsage, res.code)
	assert.Nil(t, res.handedOver)

	require.Equal(t, exitOK, r.run(t, "down", name).code)
	res = r.run(t, "shell", name)
	assert.Equal(t, exitFailed, res.code)
	assert.Contains(t, res.err, "start it first (box start "+name+")")
	assert.Nil(t, res.handedOver)
}

func TestSystemHostVerbs(t *testing.T) {
	r, _ := worldBox(t)
	res := r.run(t, "setup-host")
	require.Equal(t, exitOK, res.code)
	assert.Contains(t, res.out, "nothing to change: the host already matches")
	res = r.run(t, "setup-host", "--json")
	require.Equal(t, exitOK, res.code)
	var rep stack.Report
	require.NoError(t, json.Unmarshal([]byte(res.out), &rep))
	assert.Empty(t, rep.Changes)
	res = r.run(t, "doctor", "--json")
	require.Equal(t, exitOK, res.code, res.out)
	var dr doctorResult
	require.NoError(t, json.Unmarshal([]byte(res.out), &dr))
	assert.Empty(t, dr.Verification.Findings)
	res = r.run(t, "doctor", "--fix")
	assert.Equal(t, exitOK, res.code)
	assert.Contains(t, res.out, "ok: the host matches")
	res = r.run(t, "migrate-host", "--retire-legacy")
	assert.Equal(t, exitOK, res.code, res.err)
}

// TestSystemListIsOneRequest mints 20 boxes and proves `box list` asks
// incusd once, whatever the number of boxes; it logs the timings.
func TestSystemListIsOneRequest(t *testing.T) {
	testenv.Long(t, "mints 20 boxes")
	r, c := worldBox(t)
	var names []string
	var mint time.Duration
	for range 20 {
		n := uniq(t)
		names = append(names, n)
		cleanup(t, c, n)
		start := time.Now()
		require.Equal(t, exitOK, r.run(t, "new", "--name", n).code)
		mint += time.Since(start)
	}
	t.Logf("box new, mean of 20: %s", mint/20)

	sock, count := countingProxy(t, r.env["INCUS_SOCKET"])
	counted := r.with("INCUS_SOCKET", sock)
	start := time.Now()
	res := counted.run(t, "list", "--json")
	took := time.Since(start)
	require.Equal(t, exitOK, res.code)
	for _, n := range names {
		assert.Contains(t, res.out, `"name": "`+n+`"`)
	}
	assert.Contains(t, res.out, `"on_stack": true`, "the fleet census marked them from the same listing")
	assert.Equal(t, int64(1), count.Load(), "one API call for the whole list, the fleet census included")
	const rounds = 20
	start = time.Now()
	for range rounds {
		require.Equal(t, exitOK, r.run(t, "list").code)
	}
	t.Logf("box list with %d+ boxes: first %s, mean of %d: %s (%d request)", len(names), took, rounds, time.Since(start)/rounds, count.Load())
}

// countingProxy serves incusd's API on a socket of its own and counts the
// requests it forwards.
func countingProxy(t *testing.T, target string) (string, *atomic.Int64) {
	t.Helper()
	var n atomic.Int64
	sock := filepath.Join(t.TempDir(), "incus.socket")
	l, err := net.Listen("unix", sock)
	require.NoError(t, err)
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			n.Add(1)
			pr.SetURL(&url.URL{Scheme: "http", Host: "incus"})
		},
		Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", target)
		}},
	}
	srv := &http.Server{Handler: rp}
	go srv.Serve(l) //nolint:errcheck
	t.Cleanup(func() { srv.Close() })
	return sock, &n
}

// TestSystemChosenSettingsStay: BOX_DNS given at setup-host is stored with
// the stack, so doctor run with no environment finds nothing to fix (it
// used to call the operator's resolver drift and --fix would replace it).
func TestSystemChosenSettingsStay(t *testing.T) {
	r, _ := worldBox(t) // setup-host with BOX_DNS set
	bare := runner{env: map[string]string{"INCUS_SOCKET": r.env["INCUS_SOCKET"], "BOX_NETNS": r.env["BOX_NETNS"], "BOX_TEMPLATE_IMAGES": ""}}
	res := bare.run(t, "doctor", "--json")
	require.Equal(t, exitOK, res.code, "no finding without BOX_DNS: %s", res.out)
	var d doctorResult
	require.NoError(t, json.Unmarshal([]byte(res.out), &d))
	assert.Empty(t, d.Verification.Findings)
	res = bare.run(t, "doctor", "--fix")
	require.Equal(t, exitOK, res.code)
	assert.NotContains(t, res.out, "raw.dnsmasq", "--fix leaves the chosen resolver alone")
}

// TestSystemMemoryLimitFallback: on a host that cannot apply a memory
// limit (the world's), box new mints without one and says so, and
// remembers it on the stack so the next mint skips it at once; the failed
// start leaves nothing on the bridge. On a host that applies limits, the
// box gets its limit and nothing falls back.
func TestSystemMemoryLimitFallback(t *testing.T) {
	r, c := worldBox(t)
	ctx := context.Background()
	forgetMemoryLimits(t, c)
	withMemory := r.with("BOX_MEMORY", "")
	first, second := uniq(t), uniq(t)
	cleanup(t, c, first, second)
	res := withMemory.run(t, "new", "--name", first)
	require.Equal(t, exitOK, res.code, res.err)
	if memOK {
		assert.NotContains(t, res.err, "no memory limit", "this host applies limits: nothing falls back")
		inst, _, err := c.Instances().Get(ctx, first)
		require.NoError(t, err)
		assert.Equal(t, "4GiB", inst.Config["limits.memory"], "the template's limit, applied")
		n, _, err := c.Networks().Get(ctx, model.Current.Network)
		require.NoError(t, err)
		assert.NotEqual(t, "unsupported", n.Config[boxes.KeyMemoryLimits], "nothing to remember")
		return
	}
	assert.Contains(t, res.err, "no memory limit: this host cannot apply one (the start with limits.memory=4GiB failed")
	assert.Contains(t, res.out, "unlimited memory", "the summary says what was made")
	inst, _, err := c.Instances().Get(ctx, first)
	require.NoError(t, err)
	assert.NotContains(t, inst.Config, "limits.memory")
	n, _, err := c.Networks().Get(ctx, model.Current.Network)
	require.NoError(t, err)
	assert.Equal(t, "unsupported", n.Config[boxes.KeyMemoryLimits], "remembered on the stack")

	res = withMemory.run(t, "new", "--name", second)
	require.Equal(t, exitOK, res.code, res.err)
	assert.Contains(t, res.err, "found at an earlier mint", "the next mint skips the limit at once")
	d := r.run(t, "doctor", "--json")
	assert.Equal(t, exitOK, d.code, "the failed start left nothing on the bridge: %s", d.out)
}

// TestSystemStatus: box status is the stack in one line, then the boxes.
func TestSystemStatus(t *testing.T) {
	r, c := worldBox(t)
	name := uniq(t)
	cleanup(t, c, name)
	require.Equal(t, exitOK, r.run(t, "new", "--name", name).code)
	res := r.run(t, "status")
	require.Equal(t, exitOK, res.code, res.err)
	first, rest, _ := strings.Cut(res.out, "\n")
	assert.True(t, strings.HasPrefix(first, "stack: ok: subnet "), first)
	assert.Regexp(t, name+`\s+Running\s+container\s+on\s`, rest)
	var st statusResult
	res = r.run(t, "status", "--json")
	require.NoError(t, json.Unmarshal([]byte(res.out), &st))
	assert.True(t, st.Stack.OK)
	assert.NotEmpty(t, st.Boxes)
}

// TestSystemTeardownPurgeIncus: teardown-host --purge-incus removes the
// stack, then the probe image; without a terminal it needs --yes. The
// stack and the image are put back for the tests after it.
func TestSystemTeardownPurgeIncus(t *testing.T) {
	r, c := worldBox(t)
	ctx := context.Background()
	t.Cleanup(func() {
		_, err := image.Ensure(ctx, c, image.DefaultAlias, image.Options{})
		assert.NoError(t, err, "the probe image back")
		assert.Equal(t, exitOK, r.run(t, "setup-host").code, "the stack back")
	})
	res := r.run(t, "teardown-host", "--purge-incus")
	assert.Equal(t, exitUsage, res.code, "no terminal, no --yes: refused")
	res = r.run(t, "teardown-host", "--purge-incus", "--yes")
	require.Equal(t, exitOK, res.code, res.err)
	assert.Contains(t, res.out, "network boxnet")
	assert.Contains(t, res.out, "removed image ")
	imgs, err := c.Images().List(ctx)
	require.NoError(t, err)
	for _, img := range imgs {
		assert.NotContains(t, img.Properties["description"], stack.ProbeImagePrefix, "the probe image is gone")
	}
}
