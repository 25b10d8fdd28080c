package rootonly

import (
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/box-isolation/box/internal/testenv/tier"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fakeFS is a file system of Owners by path; a path it lacks does not
// exist.
type fakeFS map[string]Owner

func (f fakeFS) stat(p string) (Owner, error) {
	o, ok := f[p]
	if !ok {
		return Owner{}, &fs.PathError{Op: "lstat", Path: p, Err: fs.ErrNotExist}
	}
	return o, nil
}

var (
	dir  = Owner{Mode: fs.ModeDir | 0o755}
	file = Owner{Mode: 0o755}
)

func TestCheck(t *testing.T) {
	base := fakeFS{"/": dir, "/usr": dir, "/usr/local": dir, "/usr/local/bin": dir, "/usr/local/bin/box": file}
	with := func(edit fakeFS) fakeFS {
		out := fakeFS{}
		for k, v := range base {
			out[k] = v
		}
		for k, v := range edit {
			out[k] = v
		}
		return out
	}
	for _, tc := range []struct {
		name, path string
		fs         fakeFS
		bad        string // the path named, "" when it passes
		why        string
	}{
		{name: "root's alone", path: "/usr/local/bin/box", fs: base},
		{name: "the file a user's", path: "/usr/local/bin/box", fs: with(fakeFS{"/usr/local/bin/box": {UID: 1000, Mode: 0o755}}), bad: "/usr/local/bin/box", why: "owned by uid 1000, not root"},
		{name: "the file group-writable", path: "/usr/local/bin/box", fs: with(fakeFS{"/usr/local/bin/box": {Mode: 0o775}}), bad: "/usr/local/bin/box", why: "writable by others (mode 0775)"},
		{name: "a directory on the way a user's", path: "/usr/local/bin/box", fs: with(fakeFS{"/usr/local": {UID: 1000, Mode: fs.ModeDir | 0o755}}), bad: "/usr/local", why: "owned by uid 1000"},
		{name: "a sticky directory anyone may write", path: "/tmp/box", fs: fakeFS{"/": dir, "/tmp": {Mode: fs.ModeDir | fs.ModeSticky | 0o777}, "/tmp/box": file}, bad: "/tmp", why: "writable by others (mode 1777)"},
		{name: "a user's home", path: "/home/u/.local/bin/box", fs: fakeFS{"/": dir, "/home": dir, "/home/u": {UID: 1000, Mode: fs.ModeDir | 0o700}}, bad: "/home/u", why: "owned by uid 1000"},
		{name: "a root link into a user's directory", path: "/usr/local/bin/box",
			fs:  with(fakeFS{"/usr/local/bin/box": {Mode: fs.ModeSymlink | 0o777, Link: "../../../home/u/box"}, "/home": dir, "/home/u": {UID: 1000, Mode: fs.ModeDir | 0o755}, "/home/u/box": file}),
			bad: "/home/u", why: "owned by uid 1000"},
		{name: "a root link to root's file", path: "/usr/local/bin/box",
			fs: with(fakeFS{"/usr/local/bin/box": {Mode: fs.ModeSymlink | 0o777, Link: "/opt/box/box"}, "/opt": dir, "/opt/box": dir, "/opt/box/box": file})},
		{name: "a directory on the way a link", path: "/usr/local/bin/box",
			fs:  with(fakeFS{"/usr/local": {Mode: fs.ModeSymlink | 0o777, Link: "/srv/l"}, "/srv": dir, "/srv/l": {UID: 7, Mode: fs.ModeDir | 0o755}, "/srv/l/bin": dir, "/srv/l/bin/box": file}),
			bad: "/srv/l", why: "owned by uid 7"},
		{name: "a link a user owns", path: "/usr/local/bin/box",
			fs: with(fakeFS{"/usr/local/bin/box": {UID: 1000, Mode: fs.ModeSymlink | 0o777, Link: "/usr/bin/box"}, "/usr/bin": dir, "/usr/bin/box": file}), bad: "/usr/local/bin/box", why: "owned by uid 1000"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := Check(tc.path, tc.fs.stat)
			if tc.bad == "" {
				assert.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.True(t, IsNotRootOnly(err), "%v", err)
			assert.Equal(t, tc.bad, err.(*NotRootOnly).Path)
			assert.Contains(t, err.Error(), tc.why)
		})
	}
	assert.ErrorIs(t, Check("/usr/local/bin/nothing", base.stat), fs.ErrNotExist, "a missing file is an error, not a pass")
	assert.Error(t, Check("bin/box", base.stat), "a relative path")
	loop := with(fakeFS{"/usr/local/bin/box": {Mode: fs.ModeSymlink | 0o777, Link: "/usr/local/bin/box"}})
	assert.ErrorContains(t, Check("/usr/local/bin/box", loop.stat), "too many symbolic links")
}

// TestCheckOnDisk: the same on the real file system, as root (chown).
func TestCheckOnDisk(t *testing.T) {
	tier.Root(t) // it makes files owned by root and by another user
	// Under /run: /tmp is anyone's to write, so nothing under it passes.
	base, err := os.MkdirTemp("/run", "rootonly-")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(base) })
	require.NoError(t, os.Chmod(base, 0o755))
	exe := filepath.Join(base, "box")
	require.NoError(t, os.WriteFile(exe, []byte("#!/bin/sh\n"), 0o755))
	assert.NoError(t, Check(exe, Lstat))

	require.NoError(t, os.Chown(exe, 65534, 65534))
	err = Check(exe, Lstat)
	require.Error(t, err)
	assert.Equal(t, exe+" is owned by uid 65534, not root", err.Error())
	require.NoError(t, os.Chown(exe, 0, 0))

	link := filepath.Join(base, "link")
	require.NoError(t, os.Symlink(exe, link))
	assert.NoError(t, Check(link, Lstat))
	require.NoError(t, os.Chmod(base, 0o777))
	err = Check(link, Lstat)
	require.Error(t, err)
	assert.Contains(t, err.Error(), base+" is writable by others")

	tmp := t.TempDir()
	assert.True(t, IsNotRootOnly(Check(filepath.Join(tmp, "x"), Lstat)), "nothing under a temporary directory passes")
}
