package install

import (
	"bytes"
	"cmp"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/install/installtest"
	"github.com/box-isolation/box/internal/testenv/tier"
)

func TestRender(t *testing.T) {
	fpr := strings.Repeat("AB12", 10)
	out, err := Render([]byte{0x99, 1, 2}, fpr, "https://releases.example/box")
	require.NoError(t, err)
	assert.Contains(t, out, "RELEASE_KEY='mQEC'\n")
	assert.Contains(t, out, "RELEASE_FPR='"+fpr+"'\n")
	assert.Contains(t, out, "DEFAULT_REPO='https://releases.example/box'\n")
	assert.NotContains(t, out, "@BOX_")
	for _, bad := range []struct {
		key       []byte
		fpr, repo string
	}{{nil, fpr, "x"}, {[]byte{1}, "abc", "x"}, {[]byte{1}, strings.ToLower(fpr), "x"}, {[]byte{1}, fpr, ""}, {[]byte{1}, fpr, "x' ; rm -rf /"}} {
		_, err := Render(bad.key, bad.fpr, bad.repo)
		assert.Error(t, err, "%+v", bad)
	}
}

// TestPrivilegedInstallScript runs install.sh, rendered with a throwaway
// release key, against releases laid out in a directory (BOX_REPO):
// installs as root (into a /usr/local of its own) and as a user, upgrades,
// uninstalls back to the file system it found, and refuses, installing
// nothing, a release whose tarball, sums or signature were tampered with or
// that another key signed.
func TestPrivilegedInstallScript(t *testing.T) {
	tier.Root(t)
	tier.Tool(t, "gpgv", "gpgv")
	tier.Tool(t, "unshare", "util-linux")
	tier.Tool(t, "setpriv", "util-linux")
	key, other := installtest.NewSigner(t, "release"), installtest.NewSigner(t, "another")
	// Readable by nobody too: no 0700 directory on the way.
	dir, err := os.MkdirTemp("", "box-install-")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	require.NoError(t, os.Chmod(dir, 0o755))
	repo := filepath.Join(dir, "releases")
	installtest.Release(t, repo, "v1.0.0", "1.0.0", key)
	installtest.Release(t, repo, "v1.1.0", "1.1.0", key)
	script := filepath.Join(dir, "install.sh")
	rendered, err := Render(key.Pub, key.Fpr, repo)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(script, []byte(rendered), 0o644))

	// find -xdev over /usr/local before the install, after it and after
	// the uninstall, in one sandbox.
	const listing = "find /usr/local -xdev | sort"
	t.Run("root", func(t *testing.T) {
		out, err := installtest.Sandbox(t, true, "", fmt.Sprintf(`set -e
%[1]s > %[2]s/before
BOX_REF=v1.0.0 sh %[3]s
box version; drill version
ls /usr/local/share/man/man1 /usr/local/share/bash-completion/completions /usr/local/share/zsh/site-functions /usr/local/share/fish/vendor_completions.d
cat /usr/local/share/box/installed
BOX_REF=v1.1.0 sh %[3]s
box version
BOX_REF=v1.1.0 sh %[3]s
%[1]s > %[2]s/installed
sh %[3]s --uninstall
%[1]s > %[2]s/after
! test -e /usr/local/share/box
`, listing, dir, script), "BOX_REPO="+repo)
		require.NoError(t, err, "%s", out)
		assert.Contains(t, out, "box-install: verified box-1.0.0-linux-amd64.tar.gz: signed by box's release key "+key.Fpr+" (this guards against a tampered mirror or cache, not against a compromised release host)")
		assert.Contains(t, out, "box 1.0.0\ndrill 1.0.0\n")
		assert.Contains(t, out, "box 1.1.0\n", "the upgrade")
		for _, f := range []string{"box.1.gz", "drill.1.gz", "_box", "_drill", "box.fish", "drill.fish"} {
			assert.Contains(t, out, f+"\n")
		}
		assert.Contains(t, out, "f /usr/local/bin/box\n")
		assert.Contains(t, out, "d /usr/local/share/box\n", "what it made is recorded")
		assert.NotContains(t, out, "d /usr/local/bin\n", "what was there is not")
		assert.Contains(t, out, "box-install: next: box setup-host")
		assert.Contains(t, out, "box-install: removed box and drill from /usr/local/bin")
		before, after := read(t, dir, "before"), read(t, dir, "after")
		assert.Equal(t, before, after, "the uninstall leaves /usr/local as it found it")
		assert.NotEqual(t, before, read(t, dir, "installed"))
		assert.NotContains(t, out, "systemd", "no unit: setup-host writes them")
	})

	t.Run("user", func(t *testing.T) {
		home := nobodysHome(t)
		out, err := installtest.Sandbox(t, false, home, fmt.Sprintf(`set -e
sh %[1]s
~/.local/bin/box version
cat ~/.local/share/box/installed
sh %[1]s --uninstall
find ~ | sort
`, script), "BOX_REPO="+repo, "BOX_REF=v1.1.0")
		require.NoError(t, err, "%s", out)
		assert.Contains(t, out, "box 1.1.0\n")
		assert.Contains(t, out, "f "+home+"/.local/bin/box\n")
		assert.Contains(t, out, "box-install: "+home+"/.local/bin is not on your PATH")
		assert.Contains(t, out, "box-install: next: the host's stack needs box installed for root too")
		assert.True(t, strings.HasSuffix(out, home+"\n"), "the uninstall leaves the home as it found it (empty):\n%s", out)
	})

	// Over the original tool's installs, as they laid themselves out: the
	// Bash box's tree in ~/.local/share/box (BOX_HOME's default) with its
	// command a link into it, the claudebox-era tree and command, a
	// CLAUDEBOX_ setting, and the legacy stack on the host (its bridge
	// claudenet: ip here a stand-in that shows it).
	t.Run("over the original tool", func(t *testing.T) {
		home := nobodysHome(t)
		fake := filepath.Join(dir, "ip-standin")
		require.NoError(t, os.MkdirAll(fake, 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(fake, "ip"), []byte("#!/bin/sh\n[ \"$*\" = \"-o link show claudenet\" ] && echo '7: claudenet: <BROADCAST,MULTICAST,UP> mtu 1500'\n"), 0o755))
		out, err := installtest.Sandbox(t, false, home, fmt.Sprintf(`set -e
mkdir -p ~/.local/share/box/bin ~/.local/share/box/host ~/.local/share/claudebox/bin ~/.local/bin ~/boxes-data
printf '#!/usr/bin/env bash\necho old bash box\n' > ~/.local/share/box/bin/box
printf '#!/usr/bin/env bash\n' > ~/.local/share/box/host/setup-host.sh
printf '#!/usr/bin/env bash\necho claudebox\n' > ~/.local/share/claudebox/bin/claudebox
chmod +x ~/.local/share/box/bin/box ~/.local/share/claudebox/bin/claudebox
ln -s ../share/box/bin/box ~/.local/bin/box
ln -s ../share/claudebox/bin/claudebox ~/.local/bin/claudebox
printf 'export CLAUDEBOX_REPO=me/claudebox\nexport CLAUDEBOX_REF=main\n' > ~/.bashrc
echo keep > ~/boxes-data/notes
export PATH=%[2]s:$PATH
sh %[1]s
~/.local/bin/box version
first=$(mktemp) second=$(mktemp)
find ~ | sort > $first
echo ---again
sh %[1]s
find ~ | sort > $second
cmp $first $second && echo SAME
echo ---listing
cat $second
`, script, fake), "BOX_REPO="+repo, "BOX_REF=v1.1.0")
		require.NoError(t, err, "%s", out)
		first, again, _ := strings.Cut(out, "---again\n")
		assert.Contains(t, first, "box-install: replaced the original tool's install: the Bash box in "+home+"/.local/share/box; the claudebox-era tree "+home+"/.local/share/claudebox; the claudebox command "+home+"/.local/bin/claudebox (your boxes and their data stay)")
		assert.Contains(t, first, "box-install: "+home+"/.bashrc still sets CLAUDEBOX_REF CLAUDEBOX_REPO (box reads BOX_* now)")
		assert.Contains(t, first, "box-install: this host still runs the legacy stack (claudenet): move its boxes with box migrate-host --all-boxes")
		assert.Contains(t, first, "box 1.1.0\n", "the command is the new box")
		assert.NotContains(t, again, "replaced the original tool", "a second run finds nothing of it")
		assert.Contains(t, again, "SAME", "a second run changes nothing")
		_, listing, _ := strings.Cut(again, "---listing\n")
		assert.NotContains(t, listing, "claudebox")
		assert.NotContains(t, listing, "/.local/share/box/host")
		assert.Contains(t, listing, home+"/boxes-data/notes", "what is not the tool's stays")
		assert.Contains(t, listing, home+"/.local/share/box/installed")
	})

	t.Run("a release key that signs with a subkey", func(t *testing.T) {
		sub := installtest.NewSigner(t, "offline").AddSigningSubkey(t)
		r := filepath.Join(dir, "subkey")
		installtest.Release(t, r, "v1.0.0", "1.0.0", sub)
		s, err := Render(sub.Pub, sub.Fpr, r)
		require.NoError(t, err)
		path := filepath.Join(dir, "subkey-install.sh")
		require.NoError(t, os.WriteFile(path, []byte(s), 0o644))
		out, err := installtest.Sandbox(t, true, "", "sh "+path+" && box version", "BOX_REF=v1.0.0")
		require.NoError(t, err, "%s", out)
		assert.Contains(t, out, "signed by box's release key "+sub.Fpr)
		assert.Contains(t, out, "box 1.0.0\n")
	})

	t.Run("an unknown tree in BOX_HOME", func(t *testing.T) {
		home := nobodysHome(t)
		out, err := installtest.Sandbox(t, false, home, fmt.Sprintf("mkdir -p ~/.local/share/box && echo mine > ~/.local/share/box/notes && sh %s; ls ~/.local/share/box", script), "BOX_REPO="+repo, "BOX_REF=v1.1.0")
		require.NoError(t, err, "%s", out)
		assert.Contains(t, out, "box-install: "+home+"/.local/share/box (BOX_HOME) holds something this script did not install and does not know")
		assert.Contains(t, out, "\nnotes\n", "left as it was")
	})

	// Each refusal installs nothing: /usr/local is as it was.
	for _, tc := range []struct {
		name, ref, want string
		spoil           func(t *testing.T, at string)
		script          string
	}{
		{name: "tampered tarball", want: "box-1.0.0-linux-amd64.tar.gz does not match its checksum in the signed SHA256SUMS", spoil: func(t *testing.T, at string) {
			appendTo(t, filepath.Join(at, "box-1.0.0-linux-amd64.tar.gz"), "x")
		}},
		{name: "wrong checksum", want: "SHA256SUMS does not match it: the release was altered", spoil: func(t *testing.T, at string) {
			sums := filepath.Join(at, "SHA256SUMS")
			b, err := os.ReadFile(sums)
			require.NoError(t, err)
			require.NoError(t, os.WriteFile(sums, bytes.Replace(b, []byte(b[:4]), []byte("0000"), -1), 0o644))
		}},
		{name: "bad signature", want: "SHA256SUMS.asc is no valid signature by box's release key", spoil: func(t *testing.T, at string) {
			require.NoError(t, os.WriteFile(filepath.Join(at, "SHA256SUMS.asc"), []byte("-----BEGIN PGP SIGNATURE-----\n\nnonsense\n-----END PGP SIGNATURE-----\n"), 0o644))
		}},
		{name: "another key", want: "is signed by another key than box's release key (" + key.Fpr + ")", spoil: func(t *testing.T, at string) {
			other.Sign(t, filepath.Join(at, "SHA256SUMS"))
		}},
		{name: "no signature", want: "has no signature (SHA256SUMS.asc): refusing to install an unsigned release", spoil: func(t *testing.T, at string) {
			require.NoError(t, os.Remove(filepath.Join(at, "SHA256SUMS.asc")))
		}},
		{name: "no such release", ref: "v9", want: "could not fetch SHA256SUMS from " + repo + "/v9: check BOX_REPO and BOX_REF"},
		{name: "no key rendered", script: Script(), want: "this install.sh carries no release key: take the install.sh attached to a release"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ref := cmp.Or(tc.ref, "v1.0.0")
			r := repo
			if tc.spoil != nil {
				r = filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "-"))
				tc.spoil(t, installtest.Release(t, r, ref, "1.0.0", key))
			}
			s := script
			if tc.script != "" {
				s = filepath.Join(dir, "unrendered.sh")
				require.NoError(t, os.WriteFile(s, []byte(tc.script), 0o644))
			}
			out, err := installtest.Sandbox(t, true, "", fmt.Sprintf("%[1]s > %[2]s/b; if sh %[3]s; then echo INSTALLED; fi; %[1]s > %[2]s/a", listing, dir, s), "BOX_REPO="+r, "BOX_REF="+ref)
			require.NoError(t, err, "%s", out)
			assert.Contains(t, out, tc.want)
			assert.Equal(t, 1, strings.Count(out, "\n"), "one line, the refusal:\n%s", out)
			assert.True(t, strings.HasPrefix(out, "box-install: "), "every message starts with box-install:")
			assert.Equal(t, read(t, dir, "b"), read(t, dir, "a"), "nothing installed")
		})
	}

	t.Run("a box from its Debian package", func(t *testing.T) {
		// dpkg-query, as it answers where box's .deb is installed.
		fake := filepath.Join(dir, "fakebin")
		require.NoError(t, os.MkdirAll(fake, 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(fake, "dpkg-query"), []byte("#!/bin/sh\nprintf 'install ok installed'\n"), 0o755))
		out, err := installtest.Sandbox(t, true, "", fmt.Sprintf("PATH=%s:$PATH; if sh %s; then echo INSTALLED; fi; ls /usr/local/bin", fake, script), "BOX_REPO="+repo, "BOX_REF=v1.0.0")
		require.NoError(t, err, "%s", out)
		assert.Contains(t, out, "box-install: box is installed from its Debian package (/usr/bin/box): upgrade it with apt-get install --only-upgrade box drill")
		assert.NotContains(t, out, "INSTALLED")
	})
}

func read(t *testing.T, dir, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, name))
	require.NoError(t, err)
	return string(b)
}

func appendTo(t *testing.T, path, s string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = f.WriteString(s)
	require.NoError(t, err)
	require.NoError(t, f.Close())
}

// nobodysHome is an empty home directory for the user nobody.
func nobodysHome(t *testing.T) string {
	t.Helper()
	home, err := os.MkdirTemp("", "box-install-home-")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(home) })
	require.NoError(t, os.Chown(home, 65534, 65534))
	return home
}
