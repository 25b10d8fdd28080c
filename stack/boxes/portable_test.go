package boxes

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/box-isolation/box/stack"
	"github.com/box-isolation/box/stack/stacktest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/incus/incustest"
	"github.com/box-isolation/box/stack/model"
)

// stackFake is a fake incusd with the stack (boxnet, box-net and a
// default profile) and the instances in insts, which a backup import adds
// to as made (madeFrom may change what Incus makes of the file).
type stackFake struct {
	srv      *incustest.Server
	mu       sync.Mutex
	insts    map[string]map[string]any
	madeFrom func(name string) map[string]any
}

func newStackFake(t *testing.T) (*stackFake, *stack.Host) {
	t.Helper()
	f := &stackFake{srv: incustest.New(t), insts: map[string]map[string]any{}}
	profiles := stacktest.HostProfiles()
	stacktest.ServeStaticBridge(f.srv, map[string]string{"ipv4.address": "10.88.0.1/24"})
	f.srv.Handle("GET /1.0/profiles/{name}", func(w http.ResponseWriter, r *http.Request) {
		p, ok := profiles[r.PathValue("name")]
		if !ok {
			incustest.Error(w, http.StatusNotFound, "Profile not found")
			return
		}
		incustest.Sync(w, p)
	})
	f.srv.Handle("GET /1.0/profiles", stacktest.ProfileList)
	f.srv.Handle("GET /1.0/instances/{name}", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		i, ok := f.insts[r.PathValue("name")]
		f.mu.Unlock()
		if !ok {
			incustest.Error(w, http.StatusNotFound, "Instance not found")
			return
		}
		incustest.SyncETag(w, `"e1"`, i)
	})
	f.srv.Handle("GET /1.0/instances/{name}/snapshots", func(w http.ResponseWriter, r *http.Request) {
		incustest.Sync(w, []map[string]any{})
	})
	f.srv.Handle("POST /1.0/instances", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		name := r.Header.Get("X-Incus-name")
		f.mu.Lock()
		f.insts[name] = f.madeFrom(name)
		f.mu.Unlock()
		f.srv.Async(w, incustest.Op{Description: "Creating instance"})
	})
	f.srv.Handle("DELETE /1.0/instances/{name}", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		delete(f.insts, r.PathValue("name"))
		f.mu.Unlock()
		f.srv.Async(w, incustest.Op{Description: "Deleting instance"})
	})
	f.madeFrom = func(name string) map[string]any {
		p := stacktest.HostProfiles()["box-net"]
		return map[string]any{"name": name, "status": "Stopped", "type": "container", "profiles": []string{"box-net"},
			"config": map[string]string{model.Current.Tag: "1"}, "devices": map[string]any{}, "expanded_devices": p.Devices,
			"expanded_config": map[string]string{model.Current.Tag: "1"}}
	}
	return f, &stack.Host{Incus: incus.New(f.srv.Socket())}
}

// writes lists the requests that change something.
func (f *stackFake) writes() []string {
	var out []string
	for _, r := range f.srv.Requests() {
		if r.Method != http.MethodGet {
			out = append(out, r.Method+" "+r.Path)
		}
	}
	return out
}

func fixtureFile(t *testing.T, f *backupFixture) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "work.tar.gz")
	require.NoError(t, os.WriteFile(p, f.bytes(t, true), 0o600))
	return p
}

func TestImportRefusesBeforeCreatingAnything(t *testing.T) {
	f, h := newStackFake(t)
	tampered := newBackupFixture()
	tampered.backup.Container.Devices["eth1"] = map[string]string{"type": "nic", "nictype": "macvlan", "parent": "eno1"}
	_, err := (&Manager{host: h}).Import(context.Background(), fixtureFile(t, tampered), "copy")
	var refused *ImportRefusedError
	require.ErrorAs(t, err, &refused)
	assert.Contains(t, err.Error(), "second NIC eth1")
	assert.Empty(t, f.writes(), "nothing reached incusd but reads")

	notABox := newBackupFixture()
	delete(notABox.backup.Container.Config, model.Current.Tag)
	_, err = (&Manager{host: h}).Import(context.Background(), fixtureFile(t, notABox), "copy")
	require.ErrorAs(t, err, &refused)
	assert.Contains(t, err.Error(), "it is not a box")
	assert.Empty(t, f.writes())
}

func TestImportRefusesATakenName(t *testing.T) {
	f, h := newStackFake(t)
	f.insts["work"] = f.madeFrom("work")
	_, err := (&Manager{host: h}).Import(context.Background(), fixtureFile(t, newBackupFixture()), "")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "an instance named work already exists (it is the box this file was exported from, or another import of it: pass --name NEW)")
	assert.Empty(t, f.writes())
}

// What Incus made of the file is judged again, before it ever starts: a
// file that reads one way and imports another is undone.
func TestImportUndoesWhatIncusMadeOffTheStack(t *testing.T) {
	f, h := newStackFake(t)
	made := f.madeFrom
	f.madeFrom = func(name string) map[string]any {
		i := made(name)
		devs := map[string]map[string]string{"eth1": {"type": "nic", "nictype": "macvlan", "parent": "eno1"}}
		for k, d := range stacktest.HostProfiles()["box-net"].Devices {
			devs[k] = d
		}
		i["expanded_devices"] = devs
		return i
	}
	_, err := (&Manager{host: h}).Import(context.Background(), fixtureFile(t, newBackupFixture()), "copy")
	var refused *ImportRefusedError
	require.ErrorAs(t, err, &refused)
	assert.Contains(t, err.Error(), "as Incus made it, the box: has a second NIC eth1")
	assert.Contains(t, err.Error(), "(it was imported, found off the stack as Incus made it, and removed before it ever started)")
	assert.Equal(t, []string{"POST /1.0/instances", "DELETE /1.0/instances/copy"}, f.writes(), "imported, then removed: never re-tagged, never started")
	assert.Empty(t, f.insts)
	post := f.srv.Find(http.MethodPost, "/1.0/instances")[0]
	assert.Equal(t, "copy", post.Header.Get("X-Incus-name"))
	assert.Equal(t, "default", post.Header.Get("X-Incus-pool"), "the stack's pool")
	assert.Equal(t, "application/octet-stream", post.Header.Get("Content-Type"))
}

func TestExportAStoppedBox(t *testing.T) {
	f, h := newStackFake(t)
	f.insts["work"] = f.madeFrom("work")
	var backupReq incus.BackupsPost
	f.srv.Handle("POST /1.0/instances/{name}/backups", func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewDecoder(r.Body).Decode(&backupReq)
		f.srv.Async(w, incustest.Op{Description: "Backing up instance"})
	})
	failExport := false
	f.srv.Handle("GET /1.0/instances/{name}/backups/{backup}/export", func(w http.ResponseWriter, r *http.Request) {
		if failExport {
			incustest.Error(w, http.StatusInternalServerError, "Failed to open backup")
			return
		}
		_, _ = io.WriteString(w, "the tarball")
	})
	f.srv.Handle("DELETE /1.0/instances/{name}/backups/{backup}", func(w http.ResponseWriter, r *http.Request) {
		f.srv.Async(w, incustest.Op{Description: "Removing backup"})
	})
	var out bytes.Buffer
	start := time.Now()
	res, err := (&Manager{host: h}).Export(context.Background(), "work", &out)
	require.NoError(t, err)
	assert.Equal(t, "the tarball", out.String())
	assert.Equal(t, int64(len("the tarball")), res.Bytes)
	assert.False(t, res.SourceStopped, "a stopped box is not touched")
	assert.Equal(t, []string{}, res.Snapshots)
	assert.Empty(t, res.Notes)
	assert.True(t, strings.HasPrefix(backupReq.Name, "box-export-"), backupReq.Name)
	assert.Equal(t, "gzip", backupReq.CompressionAlgorithm)
	assert.False(t, backupReq.InstanceOnly, "with its snapshots")
	assert.False(t, backupReq.OptimizedStorage, "a tarball anyone can read")
	assert.WithinDuration(t, start.Add(backupExpiry), backupReq.ExpiresAt, time.Minute, "incusd drops it by itself if box cannot")
	assert.Equal(t, []string{"POST /1.0/instances/work/backups", "DELETE /1.0/instances/work/backups/" + backupReq.Name}, f.writes(),
		"backed up, copied, deleted: the box itself is not touched")

	// A copy that fails still deletes incusd's backup.
	failExport = true
	_, err = (&Manager{host: h}).Export(context.Background(), "work", io.Discard)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "exporting work")
	w := f.writes()
	assert.True(t, strings.HasPrefix(w[len(w)-1], "DELETE /1.0/instances/work/backups/"), "%v", w)
}

func TestExportFailsCleanly(t *testing.T) {
	f, h := newStackFake(t)
	f.insts["work"] = f.madeFrom("work")
	f.srv.Handle("POST /1.0/instances/{name}/backups", func(w http.ResponseWriter, r *http.Request) {
		f.srv.Async(w, incustest.Op{Description: "Backing up instance", Err: "Create backup: no space left on device"})
	})
	_, err := (&Manager{host: h}).Export(context.Background(), "work", io.Discard)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "no space left on device")
	assert.False(t, errors.Is(err, context.Canceled))
	assert.Equal(t, []string{"POST /1.0/instances/work/backups"}, f.writes(), "no backup was made, so none is deleted")
}

func TestNewUUID(t *testing.T) {
	a, err := newUUID()
	require.NoError(t, err)
	b, _ := newUUID()
	assert.NotEqual(t, a, b)
	assert.Regexp(t, `^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`, a)
}

// An import on a cluster lands on the member that received it and gets a
// fixed address of that member's slice before it starts, whatever address
// its file carries (here the one its source, on the same member, holds);
// off a cluster it gets one of the subnet (L-DHCP), never the file's.
func TestImportOnAClusterGetsAnAddressOfItsMember(t *testing.T) {
	for _, clustered := range []bool{true, false} {
		t.Run(fmt.Sprintf("clustered %v", clustered), func(t *testing.T) {
			f, h := newClusterFake(t)
			f.Clustered = clustered
			f.Add("work", "m1", "Running", "10.88.0.32")
			fixture := newBackupFixture()
			fixture.backup.Container.Devices["eth0"] = model.FixedNIC(netip.MustParseAddr("10.88.0.32"))
			f.ImportFile = func(name string) *incus.Instance {
				return &incus.Instance{Name: name, Type: "container", Status: "Stopped", Profiles: []string{"box-net"},
					Config:  map[string]string{model.Current.Tag: "1", "volatile.eth0.hwaddr": "10:66:6a:00:00:01"},
					Devices: map[string]map[string]string{"eth0": model.FixedNIC(netip.MustParseAddr("10.88.0.32"))}}
			}
			res, err := (&Manager{host: h}).Import(context.Background(), fixtureFile(t, fixture), "copy")
			require.NoError(t, err)
			c := f.Inst(t, "copy")
			assert.Equal(t, "Running", c.Status)
			if clustered {
				assert.Equal(t, "m1", res.Box.Member)
				a := model.FixedAddressOf(c)
				stacktest.InSlice(t, "m1", a)
				assert.NotEqual(t, "10.88.0.32", a.String(), "not the address in the file")
				return
			}
			a := model.FixedAddressOf(c)
			assert.True(t, a.IsValid(), "a fixed address of this host's")
			assert.NotEqual(t, "10.88.0.32", a.String(), "not the address in the file, which work holds")
			assert.Contains(t, strings.Join(res.Notes, "\n"), "its fixed address 10.88.0.32 was the host's it came from: it gets one of this host's")
		})
	}
}
