package boxes

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/box-isolation/box/stack"
	"github.com/box-isolation/box/stack/stacktest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/incus/incustest"
	"github.com/box-isolation/box/stack/model"
)

// unreachableServer is what incusd 6.0.4 says (measured in the world) when
// it is asked to pull an image from a server it cannot reach and has never
// fetched that server's index: it fails the create's operation with this,
// before any instance exists.
const unreachableServer = `Failed getting remote image info: Failed getting image: Failed parsing stream: Get "https://images.example.test:8443/streams/v1/index.json": Unable to connect to: images.example.test:8443 ([dial tcp 203.0.113.7:8443: connect: connection refused])`

// mintFake is a standalone fake incusd with the stack, whose creates
// succeed (Incus made the box from its cache, or pulled it) or fail as
// createErr says. It answers a pulled image's box with the fingerprint
// Incus resolved the alias to (volatile.base_image).
type mintFake struct {
	srv *incustest.Server
	// bridge is the fake stack bridge, with the user keys box writes.
	bridge *stacktest.Bridge
	mu     sync.Mutex
	// insts are the instances made so far.
	insts map[string]*incus.Instance
	// createErr fails the create's operation with incusd's message;
	// createErrOnce only the first create's.
	createErr     string
	createErrOnce bool
	// progress is what the create's operation reports while it runs:
	// each line is set and seen by the client before the next.
	progress []string
	seen     chan string
}

// pulledFP is the fingerprint the fake's image server resolves any alias
// to.
const pulledFP = "5eb1e0b7c0ffee5eb1e0b7c0ffee5eb1e0b7c0ffee5eb1e0b7c0ffee5eb1e0b7"

func newMintFake(t *testing.T) (*mintFake, *stack.Host) {
	t.Helper()
	f := &mintFake{srv: incustest.New(t), insts: map[string]*incus.Instance{}}
	s := f.srv
	s.Handle("GET /1.0", func(w http.ResponseWriter, r *http.Request) {
		incustest.Sync(w, map[string]any{"environment": map[string]any{"server_clustered": false, "server_name": "none", "driver": "lxc"}})
	})
	f.bridge = stacktest.ServeStaticBridge(s, map[string]string{"ipv4.address": "10.88.0.1/24"})
	s.Handle("GET /1.0/profiles", stacktest.ProfileList)
	s.Handle("GET /1.0/images/aliases/{name...}", func(w http.ResponseWriter, r *http.Request) {
		if r.PathValue("name") != "here" {
			incustest.Error(w, http.StatusNotFound, "Image alias not found")
			return
		}
		incustest.Sync(w, map[string]any{"name": "here", "target": "10ca1f"})
	})
	s.Handle("GET /1.0/instances/{name}", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		defer f.mu.Unlock()
		if i := f.found(w, r); i != nil {
			incustest.SyncETag(w, `"e1"`, i)
		}
	})
	s.Handle("GET /1.0/instances/{name}/state", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		defer f.mu.Unlock()
		if i := f.found(w, r); i != nil {
			incustest.Sync(w, map[string]any{"status": i.Status})
		}
	})
	s.Handle("POST /1.0/instances/{name}", func(w http.ResponseWriter, r *http.Request) {
		var post struct{ Name string }
		if err := json.NewDecoder(r.Body).Decode(&post); err != nil {
			incustest.Error(w, http.StatusBadRequest, err.Error())
			return
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		if i := f.found(w, r); i != nil {
			delete(f.insts, i.Name)
			i.Name = post.Name
			f.insts[i.Name] = i
			s.Async(w, incustest.Op{Description: "Renaming instance"})
		}
	})
	s.Handle("DELETE /1.0/instances/{name}", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		defer f.mu.Unlock()
		if i := f.found(w, r); i != nil {
			delete(f.insts, i.Name)
			s.Async(w, incustest.Op{Description: "Deleting instance"})
		}
	})
	s.Handle("GET /1.0/networks/boxnet/leases", func(w http.ResponseWriter, r *http.Request) { incustest.Sync(w, []any{}) })
	s.Handle("GET /1.0/instances", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		defer f.mu.Unlock()
		out := []*incus.Instance{}
		for _, name := range model.SortedKeys(f.insts) {
			out = append(out, f.insts[name])
		}
		incustest.Sync(w, out)
	})
	s.Handle("PUT /1.0/instances/{name}/state", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		defer f.mu.Unlock()
		if i, ok := f.insts[r.PathValue("name")]; ok {
			i.Status = "Running"
		}
		s.Async(w, incustest.Op{Description: "Starting instance"})
	})
	s.Handle("POST /1.0/instances", func(w http.ResponseWriter, r *http.Request) {
		var req incus.InstancesPost
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			incustest.Error(w, http.StatusBadRequest, err.Error())
			return
		}
		if f.createErr != "" {
			// Like incusd: the image is pulled inside the operation,
			// before the instance exists.
			s.Async(w, incustest.Op{Description: "Creating instance", Err: f.createErr})
			if f.createErrOnce {
				f.createErr = ""
			}
			return
		}
		base := req.Source.Fingerprint
		if req.Source.Server != "" {
			base = pulledFP
		}
		f.mu.Lock()
		cfg := maps.Clone(req.Config)
		cfg["volatile.base_image"] = base
		status := "Stopped"
		if req.Start {
			status = "Running"
		}
		f.insts[req.Name] = &incus.Instance{Name: req.Name, Type: req.Type, Status: status, Location: "none", Config: cfg,
			Devices: req.Devices, Profiles: req.Profiles}
		f.mu.Unlock()
		if len(f.progress) == 0 {
			s.Async(w, incustest.Op{Description: "Creating instance"})
			return
		}
		id := s.Async(w, incustest.Op{Description: "Creating instance", Hold: true})
		go func() {
			for _, p := range f.progress {
				s.SetMetadata(id, map[string]any{incus.DownloadProgress: p})
				<-f.seen
			}
			s.Release(id)
		}()
	})
	s.Handle("PUT /1.0/instances/{name}", func(w http.ResponseWriter, r *http.Request) {
		var put incus.InstancePut
		if err := json.NewDecoder(r.Body).Decode(&put); err != nil {
			incustest.Error(w, http.StatusBadRequest, err.Error())
			return
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		if i := f.found(w, r); i != nil {
			i.Config, i.Devices = put.Config, put.Devices
			s.Async(w, incustest.Op{Description: "Updating instance"})
		}
	})
	return f, &stack.Host{Incus: incus.New(s.Socket()), NoKernel: true}
}

// found is the instance the request names, or nil after answering 404 as
// incusd does. f.mu is held.
func (f *mintFake) found(w http.ResponseWriter, r *http.Request) *incus.Instance {
	i, ok := f.insts[r.PathValue("name")]
	if !ok {
		incustest.Error(w, http.StatusNotFound, "Instance not found")
		return nil
	}
	return i
}

// created is the create request box sent.
func (f *mintFake) created(t *testing.T) incus.InstancesPost {
	t.Helper()
	posts := f.srv.Find(http.MethodPost, "/1.0/instances")
	require.Len(t, posts, 1)
	var req incus.InstancesPost
	require.NoError(t, json.Unmarshal(posts[0].Body, &req))
	return req
}

// remotesDir writes an incus CLI config directory whose images remote is
// a private simplestreams server with a pinned certificate, beside an
// Incus remote.
func remotesDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "config.yml"), []byte(`default-remote: local
remotes:
  images:
    addr: https://images.example.test:8443
    protocol: simplestreams
    public: true
  other:
    addr: https://incus.example.test:8443
    public: false
`), 0o644))
	require.NoError(t, os.Mkdir(filepath.Join(dir, "servercerts"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "servercerts", "images.crt"), []byte(testCert), 0o644))
	return dir
}

// testCert is a PEM certificate's shape (its bytes are not checked).
const testCert = "-----BEGIN CERTIFICATE-----\nMIIBszCCAVmgAwIBAgIUYm94LWltYWdlLWNsaWVudC10ZXN0MAoGCCqGSM49BAMC\n-----END CERTIFICATE-----\n"

// A REMOTE:ALIAS image is pulled by incusd itself, from the server the
// incus CLI's remotes name, with their pinned certificate: box asks no
// image server and resolves no local alias first, and stamps the image,
// its server, and the fingerprint Incus resolved it to.
func TestMintPullsFromTheImageServer(t *testing.T) {
	for _, tc := range []struct {
		name, dir, image string
		want             incus.InstanceSource
	}{
		{name: "the built-in images remote", image: "images:debian/12/cloud",
			want: incus.InstanceSource{Type: "image", Mode: "pull", Server: incus.ImagesServer, Protocol: "simplestreams", Alias: "debian/12/cloud"}},
		{name: "the incus CLI's remotes", dir: remotesDir(t), image: "images:debian/12/cloud",
			want: incus.InstanceSource{Type: "image", Mode: "pull", Server: "https://images.example.test:8443", Protocol: "simplestreams", Alias: "debian/12/cloud", Certificate: testCert}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, h := newMintFake(t)
			h.IncusConfigDir = tc.dir
			b, err := (&Manager{host: h}).Mint(context.Background(), MintRequest{Name: "b", Image: tc.image})
			require.NoError(t, err)
			req := f.created(t)
			assert.Equal(t, tc.want, req.Source)
			assert.Empty(t, f.srv.Find(http.MethodGet, "/1.0/images/aliases/"+tc.image), "nothing of box's stands between Incus and its cache")
			assert.Empty(t, req.Config[model.StampFingerprint], "not known before Incus resolves it")
			assert.Equal(t, tc.want.Server, req.Config[model.StampImageServer])
			assert.Equal(t, tc.image, b.Stamps[model.StampImage])
			assert.Equal(t, pulledFP, b.Stamps[model.StampFingerprint], "read back from volatile.base_image")
			assert.Equal(t, tc.want.Server, b.Stamps[model.StampImageServer])
			assert.Empty(t, b.Notes)
		})
	}
}

// An image on the server (no remote, or local:) is resolved to its
// fingerprint first, as before.
func TestMintFromAnImageHere(t *testing.T) {
	for _, image := range []string{"here", "local:here"} {
		f, h := newMintFake(t)
		b, err := (&Manager{host: h}).Mint(context.Background(), MintRequest{Name: "b", Image: image})
		require.NoError(t, err, image)
		req := f.created(t)
		assert.Equal(t, incus.InstanceSource{Type: "image", Fingerprint: "10ca1f"}, req.Source, image)
		assert.Equal(t, "10ca1f", req.Config[model.StampFingerprint], image)
		assert.NotContains(t, req.Config, model.StampImageServer, image)
		assert.Equal(t, "10ca1f", b.Stamps[model.StampFingerprint], image)
		puts := f.srv.Find(http.MethodPut, "/1.0/instances/b")
		require.Len(t, puts, 1, "%s: one update, the fixed address; nothing to stamp afterwards", image)
		var put incus.InstancePut
		require.NoError(t, json.Unmarshal(puts[0].Body, &put))
		assert.Equal(t, "10.88.0.2", put.Devices["eth0"]["ipv4.address"], image)
	}
	f, h := newMintFake(t)
	_, err := (&Manager{host: h}).Mint(context.Background(), MintRequest{Name: "b", Image: "missing"})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "no image missing on this server")
	assert.Contains(t, err.Error(), "incus image import FILE --alias missing")
	assert.Empty(t, f.srv.Find(http.MethodPost, "/1.0/instances"))
}

// The server down and the image never fetched: incusd fails the create
// before any instance exists; box says which server, and the offline way,
// and leaves nothing behind.
func TestMintWhenTheImageServerIsUnreachable(t *testing.T) {
	f, h := newMintFake(t)
	f.srv.WaitLikeIncus60() // and answers the failed operation's wait as 6.0.4 does
	h.IncusConfigDir = remotesDir(t)
	f.createErr = unreachableServer
	_, err := (&Manager{host: h}).Mint(context.Background(), MintRequest{Name: "b", Image: "images:debian/12/cloud"})
	require.Error(t, err)
	var pe *ImagePullError
	require.ErrorAs(t, err, &pe)
	assert.Equal(t, "https://images.example.test:8443", pe.Server)
	var oe *incus.OperationError
	require.ErrorAs(t, err, &oe, "incusd's own failure, typed")
	assert.Equal(t, unreachableServer, oe.Message)
	for _, want := range []string{
		"minting b: incusd could not get images:debian/12/cloud from the image server https://images.example.test:8443",
		"connection refused",
		"incus image import FILE --alias NAME", "--image NAME", "BOX_IMAGE",
	} {
		assert.Contains(t, err.Error(), want)
	}
	assert.Empty(t, f.insts, "no instance")
	for _, r := range f.srv.Requests() {
		if r.Method != http.MethodGet && r.Path != "/1.0/networks/boxnet" {
			assert.Equal(t, "/1.0/instances", r.Path, "nothing but the create was asked to change: no alias, no delete (%s %s)", r.Method, r.Path)
		}
	}
	assert.NotContains(t, f.bridge.Config(), model.PolicyKey("", "b"), "the policy recorded before the create is taken back with it")
}

// Two pulls from one server at once can fail on incusd's cache of its
// index (Incus 6.0.4): the create is made once more, and the box is made.
func TestMintAgainAfterTheServerCacheRace(t *testing.T) {
	f, h := newMintFake(t)
	h.IncusConfigDir = remotesDir(t)
	f.createErr = `failed to connect to simple streams server "https://images.example.test:8443": mkdir /var/lib/incus/cache/64bfbd0d4068: file exists`
	f.createErrOnce = true
	b, err := (&Manager{host: h}).Mint(context.Background(), MintRequest{Name: "b", Image: "images:debian/12/cloud"})
	require.NoError(t, err)
	assert.Equal(t, pulledFP, b.Stamps[model.StampFingerprint])
	creates := 0
	for _, r := range f.srv.Requests() {
		if r.Method == http.MethodPost && r.Path == "/1.0/instances" {
			creates++
		}
	}
	assert.Equal(t, 2, creates, "made again once")

	// Any other failure of a pull is not tried again.
	f, h = newMintFake(t)
	h.IncusConfigDir = remotesDir(t)
	f.createErr, f.createErrOnce = unreachableServer, true
	_, err = (&Manager{host: h}).Mint(context.Background(), MintRequest{Name: "b", Image: "images:debian/12/cloud"})
	require.Error(t, err)
	assert.Empty(t, f.insts)
}

// A create that fails for another reason is not blamed on the server.
func TestMintFailureNotAPull(t *testing.T) {
	f, h := newMintFake(t)
	f.createErr = "Failed creating instance record: Storage pool is full"
	_, err := (&Manager{host: h}).Mint(context.Background(), MintRequest{Name: "b", Image: "images:debian/12/cloud"})
	require.Error(t, err)
	var pe *ImagePullError
	assert.False(t, errors.As(err, &pe), "%v", err)
	assert.Contains(t, err.Error(), "Storage pool is full")
}

// The server down but the image cached: Incus makes the box from its
// cache, and nothing of box's refuses first.
func TestMintWhenTheServerIsDownButTheImageIsCached(t *testing.T) {
	f, h := newMintFake(t)
	h.IncusConfigDir = remotesDir(t)
	b, err := (&Manager{host: h}).Mint(context.Background(), MintRequest{Name: "b", Image: "images:debian/12/cloud"})
	require.NoError(t, err)
	assert.Equal(t, pulledFP, b.Stamps[model.StampFingerprint])
	var before []string
	for _, r := range f.srv.Requests() {
		if r.Method == http.MethodPost {
			break
		}
		before = append(before, r.Path)
	}
	assert.Equal(t, []string{"/1.0/instances/b", "/1.0/networks/boxnet", "/1.0/profiles", "/1.0/networks/boxnet", "/1.0/networks/boxnet", "/1.0"}, before,
		"before the create box asks only about the name, the stack and the cluster, and records the box's policy on the bridge")
	assert.Contains(t, f.bridge.Config(), model.PolicyKey("", "b"), "the box's policy is recorded")
}

// A remote box cannot pull from is refused before anything is made, with
// the way to do it.
func TestMintRefusesRemotesItCannotPullFrom(t *testing.T) {
	for _, tc := range []struct{ image, want string }{
		{"other:debian/12", "remote other (https://incus.example.test:8443) is an Incus server: box pulls images only from simplestreams image servers for now; copy the image here first (incus image copy other:debian/12 local: --alias NAME) and pass --image NAME"},
		{"nowhere:debian/12", "image nowhere:debian/12: no remote named nowhere (the incus CLI's remotes here: images, local, other"},
		{"images:", "names no image after the remote"},
	} {
		f, h := newMintFake(t)
		h.IncusConfigDir = remotesDir(t)
		_, err := (&Manager{host: h}).Mint(context.Background(), MintRequest{Name: "b", Image: tc.image})
		require.Error(t, err, tc.image)
		assert.Contains(t, err.Error(), tc.want)
		assert.Empty(t, f.srv.Find(http.MethodPost, "/1.0/instances"), tc.image)
	}
}

// While Incus pulls the image, its download progress reaches Host.Progress,
// each new line once, in order.
func TestMintShowsTheDownload(t *testing.T) {
	f, h := newMintFake(t)
	f.progress = []string{"metadata: 100% (1.00MB/s)", "rootfs: 45% (12.34MB/s)", "rootfs: 100% (12.50MB/s)"}
	f.seen = make(chan string)
	var got []string
	h.Progress = func(format string, args ...any) {
		line := fmt.Sprintf(format, args...)
		got = append(got, line)
		f.seen <- line
	}
	_, err := (&Manager{host: h}).Mint(context.Background(), MintRequest{Name: "b", Image: "images:debian/12/cloud"})
	require.NoError(t, err)
	var want []string
	for _, p := range f.progress {
		want = append(want, "minting b from images:debian/12/cloud: "+p)
	}
	assert.Equal(t, want, got)
}

// Nesting is set on the instance, in the create request itself (so the
// box's first start already has it), never on the profile; without it no
// security.* key is sent at all.
func TestMintNesting(t *testing.T) {
	f, h := newMintFake(t)
	_, err := (&Manager{host: h}).Mint(context.Background(), MintRequest{Name: "d", Image: "here", Nesting: true})
	require.NoError(t, err)
	req := f.created(t)
	for k, v := range model.NestingConfig() {
		assert.Equal(t, v, req.Config[k], k)
	}
	assert.Equal(t, []string{model.Current.Profile}, req.Profiles, "the box-net profile only, unchanged")
	assert.Empty(t, f.srv.Find("PUT", "/1.0/profiles/"+model.Current.Profile))

	f, h = newMintFake(t)
	_, err = (&Manager{host: h}).Mint(context.Background(), MintRequest{Name: "p", Image: "here"})
	require.NoError(t, err)
	for k := range f.created(t).Config {
		assert.False(t, strings.HasPrefix(k, "security."), "%s sent without nesting", k)
	}
}

// TestNewBoxType: the server's drivers decide unless the operator chose,
// and a choice is made without asking the server.
func TestNewBoxType(t *testing.T) {
	for _, tc := range []struct {
		name, driver, want string
		wantType           string
		chosen             bool
		reason             string
	}{
		{name: "a host that can run VMs", driver: "lxc | qemu", wantType: model.TypeVM, reason: "this host can run VMs"},
		{name: "qemu alone", driver: "qemu", wantType: model.TypeVM, reason: "this host can run VMs"},
		{name: "a host that cannot", driver: "lxc", wantType: model.TypeContainer, reason: "this host cannot run VMs (incus drivers: lxc)"},
		{name: "no driver reported", driver: "", wantType: model.TypeContainer, reason: "this host cannot run VMs (incus drivers: )"},
		{name: "--container on a VM host", driver: "lxc | qemu", want: model.TypeContainer, wantType: model.TypeContainer, chosen: true, reason: "chosen by the operator"},
		{name: "--vm on a container host", driver: "lxc", want: model.TypeVM, wantType: model.TypeVM, chosen: true, reason: "chosen by the operator"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := incustest.New(t)
			srv.Drivers(tc.driver)
			h := &stack.Host{Incus: incus.New(srv.Socket())}
			d, err := (&Manager{host: h}).NewBoxType(context.Background(), tc.want)
			require.NoError(t, err)
			assert.Equal(t, model.TypeDecision{Type: tc.wantType, Reason: tc.reason, Chosen: tc.chosen}, d)
			asked := len(srv.Find("GET", "/1.0")) > 0
			assert.Equal(t, !tc.chosen, asked, "the server is asked only when the operator did not choose")
		})
	}
}

func TestMintRefusesAnUnknownType(t *testing.T) {
	srv := incustest.New(t)
	h := &stack.Host{Incus: incus.New(srv.Socket())}
	_, err := (&Manager{host: h}).Mint(context.Background(), MintRequest{Name: "b", Image: "img", Type: "vm"})
	require.ErrorContains(t, err, `minting b: instance type "vm"`)
	assert.Empty(t, srv.Requests(), "refused before incusd is asked")
}
