package main

import (
	"archive/tar"
	"bufio"
	"context"
	"encoding/json"
	"errors"
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

	"github.com/box-isolation/box/fixtures/world"
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
