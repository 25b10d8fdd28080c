package boxes

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/incus/incustest"
	"github.com/box-isolation/box/stack/model"
)

// withStandbys gives the mint fake file pushes (recorded; failing with
// pushed["fail"]'s text when set), and standby boxes of template blank: one of the image builtFP and one of another
// image, both stopped, and one of builtFP that is running.
func withStandbys(t *testing.T, f *mintFake) map[string]string {
	t.Helper()
	pushed := map[string]string{}
	s := f.srv
	s.Handle("POST /1.0/instances/{name}/files", func(w http.ResponseWriter, r *http.Request) {
		if pushed["fail"] != "" {
			incustest.Error(w, http.StatusInternalServerError, pushed["fail"])
			return
		}
		b, _ := io.ReadAll(r.Body)
		f.mu.Lock()
		pushed[r.PathValue("name")+":"+r.URL.Query().Get("path")] = string(b)
		f.mu.Unlock()
		incustest.Sync(w, nil)
	})
	standby := func(name, fp, status string) {
		nic := map[string]string{"type": "nic", "network": model.Current.Network, "ipv4.address": "10.88.0.9"}
		f.insts[name] = &incus.Instance{Name: name, Type: model.TypeContainer, Status: status, Location: "none",
			Config: map[string]string{model.Current.Tag: "1", model.StampStandby: "blank", model.StampFingerprint: fp,
				model.StampTemplate: "blank", "volatile.eth0.hwaddr": "00:16:3e:00:00:09", "image.os": "Debian"},
			Devices:         map[string]map[string]string{"eth0": nic, "root": {"type": "disk", "path": "/", "pool": "default", "size": "20GiB"}},
			ExpandedDevices: map[string]map[string]string{"eth0": nic}}
	}
	standby("box-standby-blank-000000", otherFP, "Stopped")
	standby("box-standby-blank-111111", builtFP, "Running")
	standby("box-standby-blank-222222", builtFP, "Stopped")
	return pushed
}

// A mint that may take a standby box takes the stopped one of its image:
// no instance is created; the standby is renamed, its config made the
// mint's (its own MAC and Incus's keys kept, the standby stamp gone), its
// hostname moved (cloud-init's instance-id kept), and started.
func TestMintTakesAStandbyBox(t *testing.T) {
	f, h := newMintFake(t)
	pushed := withStandbys(t, f)
	tpl, _ := blank(t)
	req, err := (&TemplateImages{}).Mint(tpl, TemplateImage{Template: "blank", Fingerprint: builtFP}, "b", "test")
	require.NoError(t, err)
	req.Standby, req.Disk, req.CPU = "blank", "30GiB", "3"
	b, err := (&Manager{host: h}).Mint(context.Background(), req)
	require.NoError(t, err)
	assert.Empty(t, f.srv.Find(http.MethodPost, "/1.0/instances"), "no copy was made")
	require.Contains(t, f.insts, "b")
	assert.NotContains(t, f.insts, "box-standby-blank-222222")
	assert.Contains(t, f.insts, "box-standby-blank-111111", "a running standby is not taken")
	assert.Contains(t, f.insts, "box-standby-blank-000000", "one of another image is not taken")
	got := f.insts["b"]
	assert.Equal(t, "Running", got.Status)
	assert.NotContains(t, got.Config, model.StampStandby)
	assert.Equal(t, "00:16:3e:00:00:09", got.Config["volatile.eth0.hwaddr"], "its own MAC")
	assert.Equal(t, "Debian", got.Config["image.os"])
	assert.Equal(t, "3", got.Config["limits.cpu"], "the mint's limits")
	assert.Equal(t, "30GiB", got.Devices["root"]["size"])
	assert.Equal(t, "template blank's image b0117b0117b0", got.Config[model.StampOrigin])
	assert.Contains(t, got.Config["cloud-init.user-data"], `for the box "b"`)
	assert.Equal(t, "b\n", pushed["b:/etc/hostname"])
	assert.Contains(t, pushed["b:/etc/hosts"], "127.0.1.1\tb\n")
	assert.Equal(t, "instance-id: box-standby-blank-222222\nlocal-hostname: b\n", pushed["b:"+standbyMetaData])
	require.NotEmpty(t, b.Notes)
	assert.True(t, strings.HasPrefix(b.Notes[0], NoteStandbyTaken+"box-standby-blank-222222"), b.Notes[0])

	// None left of the image: the next is a copy.
	req.Name = "c"
	_, err = (&Manager{host: h}).Mint(context.Background(), req)
	require.NoError(t, err)
	assert.Len(t, f.srv.Find(http.MethodPost, "/1.0/instances"), 1, "a copy")
	assert.Equal(t, builtFP, f.insts["c"].Config[model.StampFingerprint])
}

// A mint that does not ask for a standby box (a granted user's, a
// remote's, a VM, another image) makes a copy even where one is there.
func TestMintTakesNoStandbyUnasked(t *testing.T) {
	for name, edit := range map[string]func(*MintRequest){
		"not asked": func(r *MintRequest) { r.Standby = "" },
		"a VM":      func(r *MintRequest) { r.Type = model.TypeVM },
		"a target":  func(r *MintRequest) { r.Target = "m1" },
	} {
		t.Run(name, func(t *testing.T) {
			f, h := newMintFake(t)
			withStandbys(t, f)
			tpl, _ := blank(t)
			req, err := (&TemplateImages{}).Mint(tpl, TemplateImage{Template: "blank", Fingerprint: builtFP}, "b", "test")
			require.NoError(t, err)
			req.Standby = "blank"
			edit(&req)
			taken, note, err := (&Manager{host: h}).take(context.Background(), req)
			require.NoError(t, err)
			assert.Empty(t, note)
			assert.Nil(t, taken)
			assert.Contains(t, f.insts, "box-standby-blank-222222")
		})
	}
}

// A take that fails half way (here the hostname's files cannot be
// written) leaves nothing of the standby box: it is removed, a copy of the
// image is made instead, and the box's notes say so.
func TestMintFallsBackToACopy(t *testing.T) {
	f, h := newMintFake(t)
	pushed := withStandbys(t, f)
	pushed["fail"] = "the fake writes no file"
	tpl, _ := blank(t)
	req, err := (&TemplateImages{}).Mint(tpl, TemplateImage{Template: "blank", Fingerprint: builtFP}, "b", "test")
	require.NoError(t, err)
	req.Standby = "blank"
	b, err := (&Manager{host: h}).Mint(context.Background(), req)
	require.NoError(t, err)
	assert.Len(t, f.srv.Find(http.MethodPost, "/1.0/instances"), 1, "a copy was made")
	assert.NotContains(t, f.insts, "box-standby-blank-222222", "the standby box is gone")
	assert.Equal(t, builtFP, f.insts["b"].Config[model.StampFingerprint])
	assert.NotContains(t, f.insts["b"].Config, model.StampStandby, "the box is the copy, not the standby renamed")
	assert.Contains(t, strings.Join(b.Notes, "\n"), "the standby box box-standby-blank-222222 could not be taken")
}
