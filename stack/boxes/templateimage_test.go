package boxes

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/stack"
	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/incus/incustest"
	"github.com/box-isolation/box/stack/model"
	"github.com/box-isolation/box/templates"
)

// imageFake is a fake incusd's image store: images by fingerprint and
// aliases by name, as the template images read and change them.
type imageFake struct {
	srv     *incustest.Server
	mu      sync.Mutex
	images  map[string]incus.Image
	aliases map[string]string
	insts   []incus.Instance
}

const (
	builtFP = "b0117b0117b0117b0117b0117b0117b0117b0117b0117b0117b0117b0117b011"
	otherFP = "07e507e507e507e507e507e507e507e507e507e507e507e507e507e507e507e5"
)

func newImageFake(t *testing.T) (*imageFake, *TemplateImages) {
	t.Helper()
	f := &imageFake{srv: incustest.New(t), images: map[string]incus.Image{}, aliases: map[string]string{}}
	s := f.srv
	s.Handle("GET /1.0/images", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		defer f.mu.Unlock()
		out := []incus.Image{}
		for _, img := range f.images {
			out = append(out, img)
		}
		incustest.Sync(w, out)
	})
	s.Handle("GET /1.0/instances", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		defer f.mu.Unlock()
		incustest.Sync(w, append([]incus.Instance{}, f.insts...))
	})
	s.Handle("GET /1.0/images/{fp}", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		defer f.mu.Unlock()
		img, ok := f.images[r.PathValue("fp")]
		if !ok {
			incustest.Error(w, http.StatusNotFound, "Image not found")
			return
		}
		incustest.Sync(w, img)
	})
	s.Handle("DELETE /1.0/images/{fp}", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		delete(f.images, r.PathValue("fp"))
		f.mu.Unlock()
		s.Async(w, incustest.Op{Description: "Deleting image"})
	})
	s.Handle("GET /1.0/images/aliases/{name...}", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		defer f.mu.Unlock()
		target, ok := f.aliases[r.PathValue("name")]
		if !ok {
			incustest.Error(w, http.StatusNotFound, "Image alias not found")
			return
		}
		incustest.Sync(w, incus.ImageAlias{Name: r.PathValue("name"), Target: target})
	})
	s.Handle("DELETE /1.0/images/aliases/{name...}", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		defer f.mu.Unlock()
		delete(f.aliases, r.PathValue("name"))
		incustest.Sync(w, nil)
	})
	s.Handle("POST /1.0/images/aliases", func(w http.ResponseWriter, r *http.Request) {
		var a incus.ImageAlias
		require.NoError(t, json.NewDecoder(r.Body).Decode(&a))
		f.mu.Lock()
		defer f.mu.Unlock()
		if _, ok := f.aliases[a.Name]; ok {
			incustest.Error(w, http.StatusConflict, "Alias already exists")
			return
		}
		f.aliases[a.Name] = a.Target
		incustest.Sync(w, nil)
	})
	ims := NewTemplateImages(&stack.Host{Incus: incus.New(s.Socket()), NoKernel: true})
	ims.File = filepath.Join(t.TempDir(), "template-images.json")
	return f, ims
}

// add puts an image box built for template into the store.
func (f *imageFake) add(fp, template, hash string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.images[fp] = incus.Image{Fingerprint: fp, Properties: map[string]string{
		"description": "box template " + template, "user.box.template": template, "user.box.template_hash": hash}}
}

func blank(t *testing.T) (*templates.Template, string) {
	t.Helper()
	tpl, err := templates.Get("blank")
	require.NoError(t, err)
	hash, err := tpl.Hash()
	require.NoError(t, err)
	return tpl, hash
}

// writeRecord records images as box would have after building them.
func writeRecord(t *testing.T, ims *TemplateImages, images ...TemplateImage) {
	t.Helper()
	rec := map[string]TemplateImage{}
	for _, ti := range images {
		rec[ti.Template] = ti
	}
	require.NoError(t, writeTemplateImages(ims.File, rec))
}

// A template's image stands as its record and the store say: none before
// a build, current when the hash is the template's as it is, stale when
// it is another's, missing when Incus lost it, and base outdated when
// incusd has since cached a newer base from the same server and alias.
func TestTemplateImageState(t *testing.T) {
	tpl, hash := blank(t)
	built := time.Now().Add(-time.Hour)
	for _, tc := range []struct {
		name   string
		record *TemplateImage
		images func(f *imageFake)
		want   ImageState
	}{
		{"never built", nil, func(*imageFake) {}, ImageNone},
		{"built from the template as it is", &TemplateImage{Template: "blank", Fingerprint: builtFP, Hash: hash},
			func(f *imageFake) { f.add(builtFP, "blank", hash) }, ImageCurrent},
		{"built from another version of it", &TemplateImage{Template: "blank", Fingerprint: builtFP, Hash: "an older template"},
			func(f *imageFake) { f.add(builtFP, "blank", "an older template") }, ImageStale},
		{"deleted behind box's back", &TemplateImage{Template: "blank", Fingerprint: builtFP, Hash: hash},
			func(*imageFake) {}, ImageMissing},
		{"a newer base cached since", &TemplateImage{Template: "blank", Fingerprint: builtFP, Hash: hash, Built: built,
			Base: "images:debian/12/cloud", BaseFingerprint: "01d", BaseServer: "https://images.example.test"},
			func(f *imageFake) {
				f.add(builtFP, "blank", hash)
				f.images["4e3"] = incus.Image{Fingerprint: "4e3", Cached: true, CreatedAt: time.Now(),
					UpdateSource: &incus.ImageSource{Alias: "debian/12/cloud", Server: "https://images.example.test", Protocol: "simplestreams"}}
			}, ImageBaseOutdated},
		{"the same base, or another server's", &TemplateImage{Template: "blank", Fingerprint: builtFP, Hash: hash, Built: built,
			Base: "images:debian/12/cloud", BaseFingerprint: "01d", BaseServer: "https://images.example.test"},
			func(f *imageFake) {
				f.add(builtFP, "blank", hash)
				f.images["01d"] = incus.Image{Fingerprint: "01d", Cached: true, CreatedAt: built.Add(-time.Hour),
					UpdateSource: &incus.ImageSource{Alias: "debian/12/cloud", Server: "https://images.example.test"}}
				f.images["e15e"] = incus.Image{Fingerprint: "e15e", Cached: true, CreatedAt: time.Now(),
					UpdateSource: &incus.ImageSource{Alias: "debian/12/cloud", Server: "https://elsewhere.example.test"}}
			}, ImageCurrent},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, ims := newImageFake(t)
			if tc.record != nil {
				writeRecord(t, ims, *tc.record)
			}
			tc.images(f)
			_, state, err := ims.Of(context.Background(), tpl)
			require.NoError(t, err)
			assert.Equal(t, tc.want, state)
			assert.Equal(t, tc.want == ImageCurrent || tc.want == ImageBaseOutdated, state.Usable())
		})
	}
}

// A current image is what Ensure returns without building (nothing is
// created); a granted user or a remote is refused a build.
func TestTemplateImageEnsureCurrent(t *testing.T) {
	tpl, hash := blank(t)
	f, ims := newImageFake(t)
	f.add(builtFP, "blank", hash)
	writeRecord(t, ims, TemplateImage{Template: "blank", Fingerprint: builtFP, Hash: hash})
	ti, state, err := ims.Ensure(context.Background(), tpl, ImageBuild{})
	require.NoError(t, err)
	assert.Equal(t, builtFP, ti.Fingerprint)
	assert.Equal(t, ImageCurrent, state)
	assert.Empty(t, f.srv.Find(http.MethodPost, "/1.0/instances"), "no builder")

	for _, h := range []*stack.Host{{Incus: ims.host.Incus, Tier: stack.TierConfig{Granted: true}}, {Incus: ims.host.Incus, Remote: "far"}} {
		other := &TemplateImages{host: h, File: filepath.Join(t.TempDir(), "none.json")}
		_, _, err := other.Ensure(context.Background(), tpl, ImageBuild{})
		require.Error(t, err)
		assert.Contains(t, err.Error(), "built by root on the host itself")
	}
}

// Recording a new image writes the record for everyone to read (root
// writes it), points the alias people read at it, and removes the image
// it replaces; RepairAlias puts a moved alias back.
func TestTemplateImageRecord(t *testing.T) {
	_, hash := blank(t)
	f, ims := newImageFake(t)
	f.add(otherFP, "blank", "older")
	f.add(builtFP, "blank", hash)
	f.aliases[ImageAlias("blank")] = otherFP
	writeRecord(t, ims, TemplateImage{Template: "blank", Fingerprint: otherFP, Hash: "older"})

	ti := TemplateImage{Template: "blank", Fingerprint: builtFP, Hash: hash}
	require.NoError(t, ims.record(context.Background(), ti))
	rec, err := ReadTemplateImages(ims.File)
	require.NoError(t, err)
	assert.Equal(t, map[string]TemplateImage{"blank": ti}, rec)
	fi, err := os.Stat(ims.File)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o644), fi.Mode().Perm())
	assert.Equal(t, builtFP, f.aliases[ImageAlias("blank")], "the alias moved")
	assert.NotContains(t, f.images, otherFP, "the image it replaces is gone")

	f.aliases[ImageAlias("blank")] = otherFP
	require.NoError(t, ims.RepairAlias(context.Background(), ti))
	assert.Equal(t, builtFP, f.aliases[ImageAlias("blank")])
	n := len(f.srv.Requests())
	require.NoError(t, ims.RepairAlias(context.Background(), ti))
	assert.Len(t, f.srv.Requests(), n+1, "an alias in place is read, not rewritten")
}

// Doctor's notes: an alias moved or gone, an image deleted or edited
// behind box's back, one past the age, one of a template box no longer
// has, one box published that the record does not name, and standby
// boxes short of the number kept (one of an older image). A host whose
// images are as box left them has none.
func TestTemplateImageNotes(t *testing.T) {
	_, hash := blank(t)
	f, ims := newImageFake(t)
	f.add(builtFP, "blank", hash)
	f.aliases[ImageAlias("blank")] = builtFP
	writeRecord(t, ims, TemplateImage{Template: "blank", Fingerprint: builtFP, Hash: hash, Built: time.Now()})
	notes, err := ims.Notes(context.Background(), DefaultImageMaxAge)
	require.NoError(t, err)
	assert.Empty(t, notes, "as box left them")

	f.aliases[ImageAlias("blank")] = otherFP
	f.images[builtFP].Properties["user.box.template_hash"] = "edited"
	f.add(otherFP, "claude", "whatever")
	f.insts = []incus.Instance{{Name: "box-standby-blank-000000", Type: model.TypeContainer, Status: "Stopped",
		Config: map[string]string{model.StampStandby: "blank", model.StampFingerprint: otherFP}}}
	writeRecord(t, ims, TemplateImage{Template: "blank", Fingerprint: builtFP, Hash: hash, Built: time.Now().Add(-40 * 24 * time.Hour), Standby: 2},
		TemplateImage{Template: "gone-template", Fingerprint: "9099"},
		TemplateImage{Template: "claude", Fingerprint: "dead"})
	notes, err = ims.Notes(context.Background(), DefaultImageMaxAge)
	require.NoError(t, err)
	all := strings.Join(notes, "\n")
	for _, want := range []string{
		"the alias box/template/blank points at 07e507e507e5, not at the image box built and mints from (b0117b0117b0): someone moved it",
		"template blank's image b0117b0117b0 has had its properties changed behind box's back",
		"template blank's image b0117b0117b0 is 40 days old",
		"box templates build --refresh blank rebuilds it",
		"9099 is the image of template gone-template, which this box no longer has: incus image delete 9099 removes it",
		"template claude's image dead is gone from Incus (deleted behind box's back): the next mint builds it again",
		"image 07e507e507e5 says it is template claude's, but box's record does not name it",
		"template blank has 0 of the 2 standby boxes box templates warm keeps ready to take, and 1 others (of an older image, or started by hand): box templates warm blank makes them up",
	} {
		assert.Contains(t, all, want)
	}
	assert.Len(t, notes, 7)

	delete(f.aliases, ImageAlias("blank"))
	notes, err = ims.Notes(context.Background(), 0)
	require.NoError(t, err)
	assert.Contains(t, strings.Join(notes, "\n"), "the alias box/template/blank is gone (box mints by fingerprint, so mints are unaffected): box templates build blank puts it back")
	assert.NotContains(t, strings.Join(notes, "\n"), "days old", "no age limit")
}

// A copy of a template's image is minted by its fingerprint, exactly: an
// alias named as the fingerprint (a granted user can make one) is never
// looked up.
func TestMintByFingerprint(t *testing.T) {
	f, h := newMintFake(t)
	tpl, _ := blank(t)
	req, err := (&TemplateImages{}).Mint(tpl, TemplateImage{Template: "blank", Fingerprint: builtFP}, "b", "test")
	require.NoError(t, err)
	_, err = (&Manager{host: h}).Mint(context.Background(), req)
	require.NoError(t, err)
	created := f.created(t)
	assert.Equal(t, incus.InstanceSource{Type: "image", Fingerprint: builtFP}, created.Source)
	assert.Equal(t, builtFP, created.Config[model.StampFingerprint])
	assert.Equal(t, "template blank's image b0117b0117b0", created.Config[model.StampOrigin])
	assert.Equal(t, ImageAlias("blank"), created.Config[model.StampImage], "what people read")
	for _, r := range f.srv.Requests() {
		assert.False(t, strings.HasPrefix(r.Path, "/1.0/images/aliases"), "an alias was looked up: %s %s", r.Method, r.Path)
	}
	ud := created.Config["cloud-init.user-data"]
	assert.NotContains(t, ud, "npm install", "a copy installs nothing")
}

// A builder removed or stopped behind box's back ends the wait for its
// provisioning at once, naming what happened, instead of waiting out the
// half hour a build may take.
func TestWaitMarkersNoticesABuilderGone(t *testing.T) {
	for name, status := range map[string]string{"removed": "", "stopped": "Stopped"} {
		t.Run(name, func(t *testing.T) {
			srv := incustest.New(t)
			srv.Handle("GET /1.0/instances/{name}/files", func(w http.ResponseWriter, r *http.Request) {
				incustest.Error(w, http.StatusNotFound, "not found")
			})
			srv.Handle("GET /1.0/instances/{name}", func(w http.ResponseWriter, r *http.Request) {
				if status == "" {
					incustest.Error(w, http.StatusNotFound, "Instance not found")
					return
				}
				incustest.SyncETag(w, `"e"`, incus.Instance{Name: r.PathValue("name"), Status: status})
			})
			start := time.Now()
			err := waitMarkers(context.Background(), incus.New(srv.Socket()), "box-build-blank-000000", nil)
			require.Error(t, err)
			assert.Less(t, time.Since(start), 10*time.Second, "not the half hour")
			if status == "" {
				assert.Contains(t, err.Error(), "box-build-blank-000000 is gone: something removed it while it was being provisioned")
			} else {
				assert.Contains(t, err.Error(), "box-build-blank-000000 is stopped: it stopped while it was being provisioned")
			}
		})
	}
}
