package boxes

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"maps"
	"strings"
	"testing"

	"github.com/box-isolation/box/stack/stacktest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/model"
)

// tarEntry is one member of a fixture tarball.
type tarEntry struct {
	name, body string
	typ        byte // tar.TypeReg when 0
}

// tarball builds a tarball of entries, gzip-compressed when gz.
func tarball(t *testing.T, gz bool, entries ...tarEntry) []byte {
	t.Helper()
	var buf bytes.Buffer
	var tw *tar.Writer
	var zw *gzip.Writer
	if gz {
		zw = gzip.NewWriter(&buf)
		tw = tar.NewWriter(zw)
	} else {
		tw = tar.NewWriter(&buf)
	}
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Mode: 0o400, Size: int64(len(e.body)), Typeflag: e.typ}
		if e.typ == 0 {
			h.Typeflag = tar.TypeReg
		}
		if h.Typeflag != tar.TypeReg {
			h.Size, h.Linkname = 0, "/etc/passwd"
		}
		require.NoError(t, tw.WriteHeader(h))
		_, err := tw.Write([]byte(e.body))
		require.NoError(t, err)
	}
	require.NoError(t, tw.Close())
	if zw != nil {
		require.NoError(t, zw.Close())
	}
	return buf.Bytes()
}

// boxDef is a box's definition as box mints it: everything from the
// box-net profile, the tag and a stamp.
func boxDef(name string) yamlInstance {
	return yamlInstance{Name: name, Type: "container", Architecture: "x86_64",
		Config:   map[string]string{model.Current.Tag: "1", model.StampOrigin: "image box-probe", "volatile.eth0.hwaddr": "10:66:6a:00:00:01"},
		Devices:  map[string]map[string]string{},
		Profiles: []string{"box-net"}}
}

// backupFixture is a box's backup with one snapshot, s1, as Incus 6.0.4
// lays it out; edit changes the definitions before they are written (the
// index's copy, backup.yaml's, and the snapshot's own), the way a tampered
// file would.
type backupFixture struct {
	index             yamlIndex
	backup, snapshot  yamlConfig
	extra             []tarEntry
	dropMain, noIndex bool
}

func newBackupFixture() *backupFixture {
	inst, snap := boxDef("work"), boxDef("s1")
	cfg := yamlConfig{Container: &inst, Snapshots: []yamlInstance{snap}}
	cp := func(c yamlConfig) yamlConfig {
		out := yamlConfig{}
		b, _ := yaml.Marshal(c)
		_ = yaml.Unmarshal(b, &out)
		return out
	}
	idxCfg := cp(cfg)
	own := boxDef("work")
	return &backupFixture{
		index:    yamlIndex{Name: "work", Backend: "dir", Pool: "default", Snapshots: []string{"s1"}, Type: "container", Config: &idxCfg},
		backup:   cp(cfg),
		snapshot: yamlConfig{Container: &own},
	}
}

func (f *backupFixture) bytes(t *testing.T, gz bool) []byte {
	t.Helper()
	y := func(v any) string {
		b, err := yaml.Marshal(v)
		require.NoError(t, err)
		return string(b)
	}
	var es []tarEntry
	if !f.noIndex {
		es = append(es, tarEntry{name: "backup/index.yaml", body: y(f.index)})
	}
	es = append(es,
		tarEntry{name: "backup/snapshots/s1/backup.yaml", body: y(f.snapshot)},
		tarEntry{name: "backup/snapshots/s1/rootfs/etc/hostname", body: "work\n"})
	if !f.dropMain {
		es = append(es, tarEntry{name: "backup/container/backup.yaml", body: y(f.backup)})
	}
	es = append(es, tarEntry{name: "backup/container/rootfs/etc/hostname", body: "work\n"})
	return tarball(t, gz, append(es, f.extra...)...)
}

func TestReadBackupFile(t *testing.T) {
	for _, gz := range []bool{true, false} {
		bf, err := ReadBackupFile(bytes.NewReader(newBackupFixture().bytes(t, gz)))
		require.NoError(t, err, "gzip %v", gz)
		assert.Equal(t, "work", bf.Name)
		assert.Equal(t, "container", bf.Type)
		assert.Equal(t, []string{"s1"}, bf.Snapshots)
		require.NotNil(t, bf.Instance)
		assert.Equal(t, "1", bf.Instance.Config[model.Current.Tag])
		var where []string
		for _, d := range bf.Definitions {
			where = append(where, d.File+" "+d.Label())
		}
		assert.ElementsMatch(t, []string{
			"backup/index.yaml the box", "backup/index.yaml snapshot s1",
			"backup/container/backup.yaml the box", "backup/container/backup.yaml snapshot s1",
			"backup/snapshots/s1/backup.yaml snapshot s1",
		}, where, "every definition in every file")
		assert.Empty(t, judgeBackup(bf, stacktest.HostProfiles()), "a box's own export is on the stack")
	}
}

func TestReadBackupFileRefusesWhatItCannotJudge(t *testing.T) {
	for _, tc := range []struct {
		name string
		file func(t *testing.T) []byte
		want string
	}{
		{"not a tarball", func(t *testing.T) []byte { return []byte("hello, this is not a backup at all") }, "neither a gzip-compressed nor a plain tar"},
		{"no index", func(t *testing.T) []byte { f := newBackupFixture(); f.noIndex = true; return f.bytes(t, true) }, "no backup/index.yaml"},
		{"no instance backup.yaml", func(t *testing.T) []byte { f := newBackupFixture(); f.dropMain = true; return f.bytes(t, true) }, "no backup/container/backup.yaml"},
		{"a second backup.yaml after the first", func(t *testing.T) []byte {
			f := newBackupFixture()
			f.extra = []tarEntry{{name: "./backup/container/backup.yaml", body: "container: {}\n"}}
			return f.bytes(t, true)
		}, "holds backup/container/backup.yaml twice"},
		{"a backup.yaml that is a link", func(t *testing.T) []byte {
			f := newBackupFixture()
			f.dropMain = true
			f.extra = []tarEntry{{name: "backup/container/backup.yaml", typ: tar.TypeSymlink}}
			return f.bytes(t, true)
		}, "backup/container/backup.yaml in it is not a regular file"},
		{"a YAML key twice", func(t *testing.T) []byte {
			return tarball(t, true, tarEntry{name: "backup/index.yaml", body: "name: a\nname: b\n"})
		}, "reading backup/index.yaml"},
		{"a truncated gzip", func(t *testing.T) []byte { b := newBackupFixture().bytes(t, true); return b[:len(b)/2] }, "unexpected EOF"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ReadBackupFile(bytes.NewReader(tc.file(t)))
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

func TestJudgeBackup(t *testing.T) {
	secondNIC := map[string]string{"type": "nic", "nictype": "macvlan", "parent": "eno1"}
	for _, tc := range []struct {
		name string
		edit func(f *backupFixture)
		want []string // each must be among the reasons
	}{
		{"a second NIC in backup.yaml, which Incus makes the box from", func(f *backupFixture) {
			f.backup.Container.Devices["eth1"] = secondNIC
		}, []string{"the box: has a second NIC eth1 on macvlan eno1: a path off the stack (in backup/container/backup.yaml)", "the box: has 2 NICs"}},
		{"a second NIC in index.yaml only", func(f *backupFixture) {
			f.index.Config.Container.Devices["eth1"] = secondNIC
		}, []string{"the box: has a second NIC eth1 on macvlan eno1: a path off the stack (in backup/index.yaml)"}},
		{"the same NIC in both is said once, naming both", func(f *backupFixture) {
			f.index.Config.Container.Devices["eth1"] = secondNIC
			f.backup.Container.Devices["eth1"] = secondNIC
		}, []string{"the box: has a second NIC eth1 on macvlan eno1: a path off the stack (in backup/container/backup.yaml, backup/index.yaml)"}},
		{"a snapshot that a restore would take off the stack", func(f *backupFixture) {
			f.backup.Snapshots[0].Devices["door"] = map[string]string{"type": "proxy", "listen": "tcp:0.0.0.0:2222", "connect": "tcp:127.0.0.1:22"}
		}, []string{"snapshot s1: proxy device door (listen tcp:0.0.0.0:2222, connect tcp:127.0.0.1:22)"}},
		{"the snapshot's own backup.yaml", func(f *backupFixture) {
			f.snapshot.Container.Config["raw.lxc"] = "lxc.mount.entry = / host none bind"
		}, []string{"snapshot s1: sets raw.lxc: raw configuration can add devices and mounts no census sees (in backup/snapshots/s1/backup.yaml)"}},
		{"port isolation off on the profile's NIC", func(f *backupFixture) {
			f.backup.Container.Devices["eth0"] = map[string]string{"type": "nic", "name": "eth0", "network": "boxnet", "security.port_isolation": "false"}
		}, []string{`the box: NIC eth0 has port isolation off (security.port_isolation="false")`}},
		{"privileged", func(f *backupFixture) { f.backup.Container.Config["security.privileged"] = "1" }, []string{"the box: is privileged"}},
		{"raw.qemu", func(f *backupFixture) { f.backup.Container.Config["raw.qemu"] = "-device foo" }, []string{"the box: sets raw.qemu"}},
		{"a host path", func(f *backupFixture) {
			f.backup.Container.Devices["home"] = map[string]string{"type": "disk", "source": "/home", "path": "/mnt"}
		}, []string{`the box: disk home passes host path "/home" through`}},
		{"a GPU", func(f *backupFixture) {
			f.backup.Container.Devices["gpu"] = map[string]string{"type": "gpu"}
		}, []string{"the box: device gpu (gpu) passes host hardware"}},
		{"this host's default profile puts the NIC on another bridge", func(f *backupFixture) {
			f.backup.Container.Profiles = []string{"default"}
		}, []string{"the box: has a second NIC eth0 on network incusbr0"}},
		{"a profile this host lacks", func(f *backupFixture) {
			f.backup.Container.Profiles = []string{"box-net", "gpu-passthrough"}
		}, []string{"the box: its profile gpu-passthrough does not exist on this host"}},
		{"not a box", func(f *backupFixture) { delete(f.backup.Container.Config, model.Current.Tag) }, []string{"it is not a box: its config has no user.box=1 tag"}},
		{"a legacy box", func(f *backupFixture) {
			delete(f.backup.Container.Config, model.Current.Tag)
			f.backup.Container.Config[model.Legacy.Tag] = "1"
		}, []string{"it is a legacy box (user.claudebox=1): move it to this stack first (box migrate-host --box work)"}},
		{"optimized", func(f *backupFixture) { f.index.Optimized = true }, []string{"optimized format"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newBackupFixture()
			tc.edit(f)
			bf, err := ReadBackupFile(bytes.NewReader(f.bytes(t, true)))
			require.NoError(t, err)
			reasons := judgeBackup(bf, stacktest.HostProfiles())
			all := strings.Join(reasons, "\n")
			for _, w := range tc.want {
				assert.Contains(t, all, w)
			}
			e := &ImportRefusedError{File: "work.tar.gz", Reasons: reasons}
			assert.Contains(t, e.Error(), "refusing to import work.tar.gz (nothing was created)")
		})
	}
}

func TestExpandWithIsIncus(t *testing.T) {
	inst := incus.Instance{Profiles: []string{"box-net", "extra"},
		Config:  map[string]string{"limits.cpu": "2"},
		Devices: map[string]map[string]string{"eth0": {"type": "nic", "network": "boxnet"}}}
	profiles := stacktest.HostProfiles()
	profiles["extra"] = incus.Profile{Config: map[string]string{"limits.cpu": "1", "security.nesting": "true"},
		Devices: map[string]map[string]string{"root": {"type": "disk", "path": "/", "pool": "fast"}}}
	got, missing := model.ExpandWith(inst, profiles)
	assert.Empty(t, missing)
	assert.Equal(t, map[string]string{"limits.cpu": "2", "security.nesting": "true"}, got.ExpandedConfig, "later profiles, then the instance, win")
	assert.Equal(t, map[string]string{"type": "nic", "network": "boxnet"}, got.ExpandedDevices["eth0"], "a device is replaced whole, not merged")
	assert.Equal(t, "fast", got.ExpandedDevices["root"]["pool"])
	assert.Nil(t, inst.ExpandedDevices, "the instance given is left alone")
	before := maps.Clone(profiles["box-net"].Devices["eth0"])
	got.ExpandedDevices["root"]["pool"] = "x"
	assert.Equal(t, before, profiles["box-net"].Devices["eth0"], "the profiles are left alone")
}
