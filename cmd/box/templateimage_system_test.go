package main

import (
	"archive/tar"
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
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

// Template images in the world (docs/images.md): built once, every box a
// copy, two mints at once building once, a stale image rebuilt, and what
// a copy must not share with another.

// recordedImage is template tpl's image as the record at path names it.
func recordedImage(t *testing.T, path, tpl string) boxes.TemplateImage {
	t.Helper()
	rec, err := boxes.ReadTemplateImages(path)
	require.NoError(t, err)
	ti, ok := rec[tpl]
	require.True(t, ok, "the record %s names no image of template %s: %v", path, tpl, rec)
	return ti
}

// lifecycle is incusd's lifecycle events while a test runs (incus
// monitor): what was created, whatever box says about it.
type lifecycle struct {
	mu      sync.Mutex
	created []string // instance names, in order
	done    chan struct{}
}

// watchLifecycle starts watching; the watch ends with the test. It
// returns once incus monitor is connected (its first event is seen: an
// instance this makes and deletes).
func watchLifecycle(t *testing.T, st *world.State, c *incus.Client) *lifecycle {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, "incus", "monitor", "--type=lifecycle", "--format=json")
	cmd.Env = append(os.Environ(), "INCUS_DIR="+st.IncusDir)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	l := &lifecycle{done: make(chan struct{})}
	ready := make(chan struct{})
	var once sync.Once
	marker := uniq(t)
	go func() {
		defer close(l.done)
		dec := json.NewDecoder(bufio.NewReader(out))
		for {
			var ev struct {
				Metadata struct {
					Action string `json:"action"`
					Name   string `json:"name"`
				} `json:"metadata"`
			}
			if err := dec.Decode(&ev); err != nil {
				return
			}
			if ev.Metadata.Action != "instance-created" {
				continue
			}
			if ev.Metadata.Name == marker {
				once.Do(func() { close(ready) })
				continue
			}
			l.mu.Lock()
			l.created = append(l.created, ev.Metadata.Name)
			l.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		cancel()
		_ = cmd.Wait()
		<-l.done
	})
	// The watch is on once it sees an instance made after it started.
	for range 50 {
		require.NoError(t, c.Instances().Create(context.Background(), incus.InstancesPost{Name: marker, Type: model.TypeContainer,
			Source: incus.InstanceSource{Type: "none"}, Profiles: []string{},
			Devices: map[string]map[string]string{"root": {"type": "disk", "path": "/", "pool": "default"}}}))
		require.NoError(t, c.Instances().Delete(context.Background(), marker))
		select {
		case <-ready:
			return l
		case <-l.done:
			t.Fatal("incus monitor ended before it saw anything")
		case <-time.After(100 * time.Millisecond):
		}
	}
	t.Fatal("incus monitor saw nothing in 5 s")
	return nil
}

// builders are the builder boxes made so far of template tpl (not the
// build's never-started unpack instance).
func (l *lifecycle) builders(tpl string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, n := range l.created {
		if strings.HasPrefix(n, "box-build-"+tpl+"-") && !strings.Contains(n, "-unpack-") {
			out = append(out, n)
		}
	}
	return out
}

// noBuilders asserts no builder box (nor unpack instance) is left.
func noBuilders(t *testing.T, c *incus.Client) {
	t.Helper()
	insts, err := c.Instances().List(context.Background(), nil)
	require.NoError(t, err)
	for _, i := range insts {
		assert.False(t, strings.HasPrefix(i.Name, "box-build-"), "a builder left: %s", i.Name)
	}
}

// imageLeftovers reads a template image's rootfs from its exported
// tarball (not from a box made of it) and returns each path that should
// not be in an anonymous image: cloud-init's instance state, the builder's
// markers, SSH host keys, a machine-id with content, package and npm
// caches, apt lists and archives, logs with content, shell histories,
// DHCP leases. It also returns how many files it read, so an empty or
// unreadable image cannot pass.
func imageLeftovers(t *testing.T, c *incus.Client, fp string) (left []string, files int) {
	t.Helper()
	rc, err := c.Images().Export(context.Background(), fp)
	require.NoError(t, err)
	defer rc.Close()
	forbidden := []*regexp.Regexp{
		regexp.MustCompile(`^var/lib/cloud/instances/.+`),
		regexp.MustCompile(`^var/lib/cloud/instance$`),
		regexp.MustCompile(`^var/lib/box/(ready|failed)$`),
		regexp.MustCompile(`^etc/ssh/ssh_host_`),
		regexp.MustCompile(`^var/lib/dbus/machine-id$`),
		regexp.MustCompile(`^(root|home/[^/]+)/\.(npm|cache)/.`),
		regexp.MustCompile(`^var/lib/apt/lists/[^/]*[^k]$`), // lists/lock and lists/partial/ may be remade by apt
		regexp.MustCompile(`^var/cache/apt/archives/.+\.deb$`),
		regexp.MustCompile(`^var/cache/apt/.+\.bin$`),
		regexp.MustCompile(`^(root|home/[^/]+)/\.(bash_history|lesshst)$`),
		regexp.MustCompile(`^var/lib/(dhcp|dhclient)/.+`),
		regexp.MustCompile(`^var/log/journal/.+/.+`),
	}
	tr := tar.NewReader(rc)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err, "reading the image's tarball")
		name, ok := strings.CutPrefix(strings.TrimPrefix(hdr.Name, "./"), "rootfs/")
		if !ok {
			continue
		}
		name = strings.TrimSuffix(name, "/")
		if hdr.Typeflag == tar.TypeReg {
			files++
		}
		for _, re := range forbidden {
			if re.MatchString(name) && !(strings.HasPrefix(name, "var/lib/apt/lists/partial") && hdr.Typeflag == tar.TypeDir) {
				left = append(left, name)
			}
		}
		switch {
		case name == "etc/machine-id" && hdr.Size > 0:
			left = append(left, name+" (not empty)")
		case strings.HasPrefix(name, "var/log/") && hdr.Typeflag == tar.TypeReg && hdr.Size > 0:
			left = append(left, name+" (a log with content)")
		}
	}
	return left, files
}

// identity is what must differ between two copies of one image.
type identity struct{ machineID, mac, addr, hostKeys, instanceID string }

func identityOf(t *testing.T, r runner, c *incus.Client, name string) identity {
	t.Helper()
	inst, _, err := c.Instances().Get(context.Background(), name)
	require.NoError(t, err)
	info := infoOf(t, r, name)
	require.Len(t, info.Addresses, 1, "%s's addresses", name)
	return identity{
		machineID:  asRoot(t, c, name, "cat /etc/machine-id"),
		mac:        inst.Config["volatile.eth0.hwaddr"],
		addr:       info.Addresses[0],
		hostKeys:   asRoot(t, c, name, "cat /etc/ssh/ssh_host_*_key.pub 2>/dev/null | sha256sum | cut -c1-16"),
		instanceID: asRoot(t, c, name, "cat /var/lib/cloud/data/instance-id"),
	}
}

// TestSystemTemplateImage builds template blank's image into a record of
// its own: two mints at once build once (incusd made one builder box) and
// make two boxes of one image with identities of their own; the image's
// rootfs holds nothing of the builder's; the builder is gone; then the
// record says the template changed (its hash is another's, as after an
// upgrade of box's templates): box templates says stale, and the next
// mint rebuilds, replacing the old image.
func TestSystemTemplateImage(t *testing.T) {
	r, c, st := debianWorld(t)
	ctx := context.Background()
	rec := filepath.Join(t.TempDir(), "template-images.json")
	r = r.with("BOX_TEMPLATE_IMAGES", rec)
	watch := watchLifecycle(t, st, c)

	a, b := uniq(t), uniq(t)
	cleanup(t, c, a, b)
	var wg sync.WaitGroup
	results := make([]result, 2)
	for i, name := range []string{a, b} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = r.run(t, "new", "--name", name, "--template", "blank")
		}()
	}
	wg.Wait()
	for _, res := range results {
		require.Equal(t, exitOK, res.code, res.err)
	}
	ti := recordedImage(t, rec, "blank")
	t.Cleanup(func() { purgeRecord(t, c, rec) })
	assert.Len(t, watch.builders("blank"), 1, "one builder box ever: %v", watch.builders("blank"))
	building, waited := 0, 0
	for _, res := range results {
		if strings.Contains(res.err, "building template blank's image: minting the builder") {
			building++
		}
		if strings.Contains(res.err, "box: waiting for another build of template blank's image") {
			waited++
		}
	}
	assert.Equal(t, 1, building, "one mint built")
	assert.Equal(t, 1, waited, "the other waited for that build")
	noBuilders(t, c)

	ids := map[string]identity{}
	for _, name := range []string{a, b} {
		info := infoOf(t, r, name)
		assert.Equal(t, ti.Fingerprint, info.Stamps[model.StampFingerprint], "%s is a copy of the image", name)
		assert.Equal(t, "blank", asRoot(t, c, name, "cat "+templates.ReadyMarker))
		ids[name] = identityOf(t, r, c, name)
		assert.Len(t, ids[name].machineID, 32, "%s has a machine-id", name)
		assert.Equal(t, name, ids[name].instanceID, "a cloud-init instance of its own")
	}
	ia, ib := ids[a], ids[b]
	assert.NotEqual(t, ia.machineID, ib.machineID, "machine-ids")
	assert.NotEqual(t, ia.mac, ib.mac, "MACs")
	assert.NotEqual(t, ia.addr, ib.addr, "fixed addresses")
	assert.NotEqual(t, ia.hostKeys, ib.hostKeys, "SSH host keys")

	left, files := imageLeftovers(t, c, ti.Fingerprint)
	assert.Greater(t, files, 1000, "the image's rootfs was read")
	assert.Empty(t, left, "the image holds what belonged to its builder")

	// The template "changed": the record's hash is another's.
	stale := ti
	stale.Hash = "a template of an older box"
	b2, err := json.Marshal(map[string]boxes.TemplateImage{"blank": stale})
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(rec, b2, 0o644))
	res := r.run(t, "templates", "--json")
	require.Equal(t, exitOK, res.code, res.err)
	var rows []boxes.TemplateStatus
	require.NoError(t, json.Unmarshal([]byte(res.out), &rows))
	states := map[string]boxes.ImageState{}
	for _, row := range rows {
		states[row.Name] = row.State
	}
	assert.Equal(t, map[string]boxes.ImageState{"blank": boxes.ImageStale, "claude": boxes.ImageNone, "codex": boxes.ImageNone, "grok": boxes.ImageNone}, states)
	res = r.run(t, "templates")
	assert.Regexp(t, `blank \(default\)\s+dev\s+.*stale `+ti.Fingerprint[:12], res.out)

	n := uniq(t)
	cleanup(t, c, n)
	res = r.run(t, "new", "--name", n, "--template", "blank")
	require.Equal(t, exitOK, res.code, res.err)
	assert.Contains(t, res.err, "building template blank's image: minting the builder")
	assert.Len(t, watch.builders("blank"), 2, "rebuilt")
	again := recordedImage(t, rec, "blank")
	hash, err := mustTemplate(t, "blank").Hash()
	require.NoError(t, err)
	assert.Equal(t, hash, again.Hash)
	assert.NotEqual(t, ti.Fingerprint, again.Fingerprint)
	assert.Equal(t, again.Fingerprint, infoOf(t, r, n).Stamps[model.StampFingerprint])
	_, err = c.Images().Get(ctx, ti.Fingerprint)
	assert.True(t, incus.IsNotFound(err), "the image it replaced is gone: %v", err)
	noBuilders(t, c)
}

func mustTemplate(t *testing.T, name string) *templates.Template {
	t.Helper()
	tp, err := templates.Get(name)
	require.NoError(t, err)
	return tp
}

// purgeRecord removes what a test's own record names (its images and
// their aliases), as teardown-host --purge-incus would.
func purgeRecord(t *testing.T, c *incus.Client, rec string) {
	t.Helper()
	ims := boxes.NewTemplateImages(&stack.Host{Incus: c})
	ims.File, ims.AliasPrefix = rec, recordAliasPrefix(rec)
	changes, err := ims.Purge(context.Background())
	assert.NoError(t, err)
	t.Logf("cleanup: %v", changes)
}

// TestSystemTemplateImageAliasDrift: a granted user's mint is a copy of
// the image root built (by fingerprint, through incus-user, from another
// project). The user cannot move box's alias, but once it is gone they
// can make one of that name pointing at another image: root's next mint
// is still a copy of the image box recorded, box doctor names the drift,
// and box templates build puts the alias back.
func TestSystemTemplateImageAliasDrift(t *testing.T) {
	e := tierWorld(t)
	st := testenv.World(t)
	if st.DebianImage == "" || st.IncusConf == "" {
		testenv.Unavailable(t, "needs the world's Debian image on its image server: run `bin/drill world image --debian` (minutes, once per machine)")
	}
	ctx := context.Background()
	root := e.r.with("BOX_IMAGE", "", "INCUS_CONF", st.IncusConf)
	res := root.run(t, "templates", "build", "blank")
	require.Equal(t, exitOK, res.code, res.err)
	ti := recordedImage(t, boxes.TemplateImagesFile(st.Names.HostNS), "blank")
	alias := boxes.ImageAlias("blank")

	u := e.newUser(t)
	e.grant(t, u)
	ur := e.as(u).with("BOX_IMAGE", "", "HOME", u.home)
	ub := uniq(t)
	res = ur.run(t, "new", "--name", ub, "--template", "blank")
	require.Equal(t, exitOK, res.code, "box new as the granted user: %s", res.err)
	inst, _, err := e.c.Project(stack.TierProject(u.UID)).Instances().Get(ctx, ub)
	require.NoError(t, err)
	assert.Equal(t, ti.Fingerprint, inst.Config[model.StampFingerprint], "the user's box is a copy of root's image")
	assert.NotContains(t, res.err, "provisioned in itself")

	// The user cannot move box's alias: Incus 6.0.4 refuses them the
	// default project's alias (their project shares its images, and an
	// alias change made there is the default project's). But they can
	// create one where there is none: once box's is gone (an operator
	// cleaning up by hand), the user points box's name at an image of the
	// host's they can see.
	probe, err := e.c.Images().Alias(ctx, image.DefaultAlias)
	require.NoError(t, err)
	uc := e.host.AsUser(u.User, e.incusGID).Project(stack.TierProject(u.UID))
	refusedFor(t, "the granted user deleting "+alias, uc.Images().DeleteAlias(ctx, alias), "does not have permission")
	unmoved, err := e.c.Images().Alias(ctx, alias)
	require.NoError(t, err)
	require.Equal(t, ti.Fingerprint, unmoved.Target)
	require.NoError(t, e.c.Images().DeleteAlias(ctx, alias), "the operator, by hand")
	require.NoError(t, uc.Images().CreateAlias(ctx, alias, probe.Target, "the user's"), "as the granted user, where box's alias was")
	t.Cleanup(func() { root.run(t, "templates", "build", "blank") })
	moved, err := e.c.Images().Alias(ctx, alias)
	require.NoError(t, err)
	require.Equal(t, probe.Target, moved.Target, "the user's alias is the default project's, the one people read (else this proves nothing)")

	rb := uniq(t)
	cleanup(t, e.c, rb)
	res = root.run(t, "new", "--name", rb, "--template", "blank")
	require.Equal(t, exitOK, res.code, res.err)
	assert.Equal(t, ti.Fingerprint, infoOf(t, root, rb).Stamps[model.StampFingerprint], "root's mint is a copy of the image box recorded, not the alias's")

	res = root.run(t, "doctor")
	assert.Contains(t, res.err, "the alias "+alias+" points at "+probe.Target[:12]+", not at the image box built and mints from ("+ti.Fingerprint[:12]+")")

	res = root.run(t, "templates", "build", "blank")
	require.Equal(t, exitOK, res.code, res.err)
	back, err := e.c.Images().Alias(ctx, alias)
	require.NoError(t, err)
	assert.Equal(t, ti.Fingerprint, back.Target, "box templates build put it back")
	res = root.run(t, "doctor")
	assert.NotContains(t, res.err, "the alias "+alias)
}

// TestSystemStandbyBoxes: box templates warm keeps standby boxes of a
// template's image (booted once, stopped); box new takes one instead of
// making a copy: renamed, answering to its new hostname (Incus renders
// none at a rename: without box's rewrite it keeps the standby's), on the
// standby's fixed address, its identity its own, ready, isolated as any
// box. With none left the next mint is a copy; warm 0 removes the rest.
func TestSystemStandbyBoxes(t *testing.T) {
	r, c, _ := debianWorld(t)
	ctx := context.Background()
	rec := filepath.Join(t.TempDir(), "template-images.json")
	r = r.with("BOX_TEMPLATE_IMAGES", rec)
	t.Cleanup(func() { purgeRecord(t, c, rec) })
	t.Cleanup(func() { r.run(t, "templates", "warm", "blank", "0") })

	res := r.run(t, "templates", "warm", "blank", "2", "--json")
	require.Equal(t, exitOK, res.code, res.err)
	var w boxes.WarmResult
	require.NoError(t, json.Unmarshal([]byte(res.out), &w))
	require.Len(t, w.Made, 2, "two standby boxes made")
	cleanup(t, c, w.Made...)
	ti := recordedImage(t, rec, "blank")
	assert.Equal(t, 2, ti.Standby, "the number kept is recorded")
	addrs := map[string]string{}
	for _, n := range w.Made {
		inst, _, err := c.Instances().Get(ctx, n)
		require.NoError(t, err)
		assert.Equal(t, "Stopped", inst.Status, "%s waits stopped", n)
		assert.Equal(t, ti.Fingerprint, inst.Config[model.StampFingerprint])
		addrs[n] = model.FixedAddressOf(inst).String()
		require.NotEqual(t, "invalid IP", addrs[n], "%s holds a fixed address", n)
	}
	res = r.run(t, "templates", "--json")
	require.Equal(t, exitOK, res.code, res.err)
	var rows []boxes.TemplateStatus
	require.NoError(t, json.Unmarshal([]byte(res.out), &rows))
	for _, row := range rows {
		if row.Name == "blank" {
			assert.Equal(t, 2, row.Standby, "box templates says two are ready")
		}
	}

	ids := map[string]identity{}
	takenFrom := map[string]bool{}
	for i, name := range []string{uniq(t), uniq(t)} {
		cleanup(t, c, name)
		res := r.run(t, "new", "--name", name, "--template", "blank", "--json")
		require.Equal(t, exitOK, res.code, res.err)
		var nr newResult
		require.NoError(t, json.Unmarshal([]byte(res.out), &nr))
		t.Logf("%s: made in %.2f s, address %.2f s, provisioned %.2f s", name, nr.Seconds.Made, nr.Seconds.Address, nr.Seconds.Provisioned)
		taken := ""
		for _, n := range w.Made {
			if strings.Contains(strings.Join(nr.Box.Notes, "\n"), boxes.NoteStandbyTaken+n+",") {
				taken = n
			}
		}
		require.NotEmpty(t, taken, "taken from one of the standby boxes %v: %v", w.Made, nr.Box.Notes)
		require.False(t, takenFrom[taken], "%s taken twice", taken)
		takenFrom[taken] = true
		assert.Contains(t, res.err, fmt.Sprintf("box: %d standby boxes of template blank left", 1-i))
		_, _, err := c.Instances().Get(ctx, taken)
		assert.True(t, incus.IsNotFound(err), "the standby %s is the box now: %v", taken, err)
		assert.Equal(t, name, asRoot(t, c, name, "hostname"), "it answers to its own name")
		assert.Contains(t, asRoot(t, c, name, "cat /etc/hosts"), "127.0.1.1\t"+name+"\n")
		assert.Equal(t, "blank", asRoot(t, c, name, "cat "+templates.ReadyMarker))
		assert.Equal(t, addrs[taken], nr.Address, "the standby's fixed address")
		info := infoOf(t, r, name)
		assert.NotContains(t, info.Stamps, model.StampStandby)
		assert.Equal(t, ti.Fingerprint, info.Stamps[model.StampFingerprint])
		ids[name] = identityOf(t, r, c, name)
		assert.Equal(t, taken, ids[name].instanceID, "cloud-init's instance stays the standby's (a new one would rerun its first boot)")
	}
	var both []identity
	for _, id := range ids {
		both = append(both, id)
	}
	assert.NotEqual(t, both[0].machineID, both[1].machineID, "machine-ids")
	assert.NotEqual(t, both[0].mac, both[1].mac, "MACs")
	assert.NotEqual(t, both[0].addr, both[1].addr, "fixed addresses")
	assert.NotEqual(t, both[0].hostKeys, both[1].hostKeys, "SSH host keys")

	// Taken boxes are isolated as any box: doctor names none of them.
	res = r.run(t, "doctor", "--json")
	var d doctorResult
	require.NoError(t, json.Unmarshal([]byte(res.out), &d), res.out)
	for _, f := range d.Verification.Findings {
		for name := range ids {
			assert.NotContains(t, f.Object+" "+f.Problem, name, "a finding about a taken box")
		}
	}

	copyName := uniq(t)
	cleanup(t, c, copyName)
	res = r.run(t, "new", "--name", copyName, "--template", "blank")
	require.Equal(t, exitOK, res.code, res.err)
	assert.NotContains(t, res.err, "taken from", "none left: a copy")
	assert.Equal(t, copyName, asRoot(t, c, copyName, "cat /var/lib/cloud/data/instance-id"), "a copy is a cloud-init instance of its own")

	res = r.run(t, "templates", "warm", "blank", "1")
	require.Equal(t, exitOK, res.code, res.err)
	ims := boxes.NewTemplateImages(&stack.Host{Incus: c})
	ims.File = rec
	ready, _, err := ims.Standbys(ctx, "blank", ti.Fingerprint)
	require.NoError(t, err)
	require.Len(t, ready, 1, "made up to one")
	cleanup(t, c, ready[0].Name)
	res = r.run(t, "templates", "warm", "blank", "0")
	require.Equal(t, exitOK, res.code, res.err)
	ready, other, err := ims.Standbys(ctx, "blank", ti.Fingerprint)
	require.NoError(t, err)
	assert.Empty(t, append(ready, other...), "warm 0 removes them")
}
