package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/install/installtest"
	"github.com/box-isolation/box/internal/testenv/tier"
	"github.com/box-isolation/box/stack/bootunits"
)

func TestDebVersion(t *testing.T) {
	for in, want := range map[string]string{
		"v0.4.0":                   "0.4.0",
		"v0.4.0-3-gabc1234":        "0.4.0+3.gabc1234",
		"v0.4.0-3-gabc1234-dirty":  "0.4.0+3.gabc1234.dirty",
		"0.4.0-dirty":              "0.4.0+dirty",
		"v1.2.0-rc1":               "1.2.0+rc1",
		"e51ae38":                  "0.0.0~git.e51ae38",
		"1234abc-dirty":            "0.0.0~git.1234abc.dirty", // a commit that starts with a digit is no tag
		"dev":                      "0.0.0~git.dev",
		"":                         "0.0.0~git.dev",
		"feature/x_y":              "0.0.0~git.feature.x.y",
		"v2.0.0-1-g0123456-dirty!": "2.0.0+1.g0123456.dirty",
	} {
		got := debVersion(in)
		assert.Equal(t, want, got, in)
		assert.Regexp(t, `^[0-9][A-Za-z0-9.+~]*$`, got, "%q is a Debian version", got)
	}
}

// The maintainer scripts change nothing: every line is shell structure
// or an echo (no systemctl, nft, ip, incus, no unit enabled).
func TestMaintainerScriptsOnlyTalk(t *testing.T) {
	allowed := regexp.MustCompile(`^(#!/bin/sh|set -e|if \[ "\$1" = configure \]; then|if \[ -f /usr/local/share/box/installed \]; then|case "\$1" in|remove\)|;;|esac|fi|exit 0|echo "[^"$` + "`" + `]*")$`)
	for name, script := range map[string]string{"preinst": preinstBox, "postinst": postinstBox, "postrm": postrmBox} {
		for _, line := range strings.Split(strings.TrimSpace(script), "\n") {
			assert.Regexp(t, allowed, strings.TrimSpace(line), "%s: only shell structure and echo", name)
		}
		out, err := exec.Command(tier.Tool(t, "sh", "dash"), "-n", "-c", script).CombinedOutput()
		assert.NoError(t, err, "%s: %s", name, out)
	}
}

// TestPrivilegedPreinstNamesAScriptInstall: the box package's preinst
// names a box install.sh installed for root, and says nothing without one
// (each in a /usr/local of its own).
func TestPrivilegedPreinstNamesAScriptInstall(t *testing.T) {
	tier.Root(t)
	tier.Tool(t, "unshare", "util-linux")
	out, err := installtest.Sandbox(t, true, "", "sh -c '"+preinstBox+"' preinst install")
	require.NoError(t, err, "%s", out)
	assert.Empty(t, out, "no script install: nothing said")
	out, err = installtest.Sandbox(t, true, "", "mkdir -p /usr/local/share/box && touch /usr/local/share/box/installed && sh -c '"+preinstBox+"' preinst install")
	require.NoError(t, err, "%s", out)
	assert.Contains(t, out, "box: install.sh installed box for root too")
	assert.Contains(t, out, "sh install.sh --uninstall")
}

// stubBins writes box and drill stand-ins that answer `man` and
// `completion SHELL` as the real ones do.
func stubBins(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for _, prog := range []string{"box", "drill"} {
		script := "#!/bin/sh\ncase \"$1\" in\nman) echo '.TH " + strings.ToUpper(prog) + " 1' ;;\ncompletion) echo \"# $2 completion for " + prog + "\" ;;\n*) exit 2 ;;\nesac\n"
		require.NoError(t, os.WriteFile(filepath.Join(dir, prog), []byte(script), 0o755))
	}
	return dir
}

func TestBuild(t *testing.T) {
	bin := stubBins(t)
	out := filepath.Join(t.TempDir(), "dist")
	c := config{bin: bin, docbin: bin, out: out, version: "v0.4.0-3-gabc1234", arch: "amd64", mtime: time.Unix(1700000000, 0).UTC()}
	built, err := build(c)
	require.NoError(t, err)
	var names []string
	for _, a := range built {
		names = append(names, filepath.Base(a.path))
		assert.Positive(t, a.size)
	}
	assert.Equal(t, []string{"box_0.4.0+3.gabc1234_amd64.deb", "drill_0.4.0+3.gabc1234_amd64.deb",
		"box-v0.4.0-3-gabc1234-linux-amd64.tar.gz", "SHA256SUMS"}, names)

	// With a release key, install.sh too, rendered with it, beside what
	// SHA256SUMS lists.
	key := filepath.Join(t.TempDir(), "release.gpg")
	require.NoError(t, os.WriteFile(key, []byte{0x99, 1, 2}, 0o644))
	c.out, c.releaseKey, c.releaseFpr, c.releaseRepo = filepath.Join(t.TempDir(), "signed"), key, strings.Repeat("AB12", 10), "https://releases.example/box"
	signed, err := build(c)
	require.NoError(t, err)
	require.Len(t, signed, 5)
	assert.Equal(t, filepath.Join(c.out, "install.sh"), signed[4].path)
	script, err := os.ReadFile(signed[4].path)
	require.NoError(t, err)
	assert.Contains(t, string(script), "RELEASE_KEY='mQEC'\nRELEASE_FPR='"+c.releaseFpr+"'\nDEFAULT_REPO='https://releases.example/box'\n")
	assert.NotContains(t, string(readFile(t, filepath.Join(c.out, "SHA256SUMS"))), "install.sh")

	// SHA256SUMS lists the other three, as sha256sum -c reads it.
	sums, err := os.ReadFile(filepath.Join(out, "SHA256SUMS"))
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSpace(string(sums)), "\n")
	require.Len(t, lines, 3)
	for i, line := range lines {
		data, err := os.ReadFile(filepath.Join(out, names[i]))
		require.NoError(t, err)
		h := sha256.Sum256(data)
		assert.Equal(t, hex.EncodeToString(h[:])+"  "+names[i], line)
	}

	// The tarball holds both packages' files under one directory.
	f, err := os.Open(filepath.Join(out, names[2]))
	require.NoError(t, err)
	defer f.Close()
	zr, err := gzip.NewReader(f)
	require.NoError(t, err)
	tr := tar.NewReader(zr)
	got := map[string]string{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
		assert.Equal(t, c.mtime, h.ModTime.UTC(), h.Name)
		if h.Typeflag == tar.TypeReg {
			b, err := io.ReadAll(tr)
			require.NoError(t, err)
			got[strings.TrimPrefix(h.Name, "box-v0.4.0-3-gabc1234-linux-amd64")] = string(b)
		}
	}
	units := bootunits.BootUnits("/usr/bin/box")
	want := []string{"/usr/bin/box", "/usr/bin/drill",
		"/usr/share/man/man1/box.1.gz", "/usr/share/man/man1/drill.1.gz",
		"/usr/share/bash-completion/completions/box", "/usr/share/zsh/vendor-completions/_box", "/usr/share/fish/vendor_completions.d/box.fish",
		"/usr/share/bash-completion/completions/drill", "/usr/share/zsh/vendor-completions/_drill", "/usr/share/fish/vendor_completions.d/drill.fish",
		"/usr/lib/systemd/system/" + units[0].Name, "/usr/lib/systemd/system/" + units[1].Name}
	assert.ElementsMatch(t, want, keys(got))
	assert.Equal(t, "# zsh completion for box\n", got["/usr/share/zsh/vendor-completions/_box"])
	for _, u := range units {
		assert.Equal(t, u.Text, got["/usr/lib/systemd/system/"+u.Name], "the unit is the stack's own text")
	}
	zr, err = gzip.NewReader(strings.NewReader(got["/usr/share/man/man1/drill.1.gz"]))
	require.NoError(t, err)
	page, err := io.ReadAll(zr)
	require.NoError(t, err)
	assert.Equal(t, ".TH DRILL 1\n", string(page))

	dpkgDeb := tier.Tool(t, "dpkg-deb", "dpkg") // reads the debs' control fields
	field := func(deb, name string) string {
		out, err := exec.Command(dpkgDeb, "-f", filepath.Join(out, deb), name).Output()
		require.NoError(t, err)
		return strings.TrimSpace(string(out))
	}
	for _, tc := range []struct{ deb, field, want string }{
		{names[0], "Package", "box"},
		{names[0], "Version", "0.4.0+3.gabc1234"},
		{names[0], "Depends", ""},
		{names[0], "Recommends", "incus | incus-base"},
		{names[0], "Maintainer", maintainer},
		{names[0], "License", license},
		{names[1], "Package", "drill"},
		{names[1], "Depends", "busybox-static"},
		{names[1], "Recommends", "incus | incus-base"},
	} {
		assert.Equal(t, tc.want, field(tc.deb, tc.field), "%s %s", tc.deb, tc.field)
	}
	contents, err := exec.Command(dpkgDeb, "-c", filepath.Join(out, names[0])).Output()
	require.NoError(t, err)
	for _, p := range []string{"./usr/bin/box", "./usr/lib/systemd/system/box-firewall.service", "./usr/share/zsh/vendor-completions/_box"} {
		assert.Contains(t, string(contents), " "+p+"\n")
	}
	assert.NotContains(t, string(contents), "/etc/", "box ships nothing enabled and no conffiles")
}

func keys(m map[string]string) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func TestBuildSaysWhatIsMissing(t *testing.T) {
	var errOut bytes.Buffer
	code := run([]string{"-bin", t.TempDir(), "-out", t.TempDir(), "-version", "v1.0.0"}, io.Discard, &errOut)
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut.String(), "pkgbuild: the built box: ")
	assert.Contains(t, errOut.String(), "scripts/package.sh builds it")
	errOut.Reset()
	assert.Equal(t, 2, run(nil, io.Discard, &errOut))
	assert.Contains(t, errOut.String(), "usage: pkgbuild -version V")
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return b
}
