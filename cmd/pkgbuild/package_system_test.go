package main

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/install/installtest"
	"github.com/box-isolation/box/internal/testenv/tier"
	"github.com/box-isolation/box/stack/bootunits"
)

// TestSystemPackageInstall builds the packages with scripts/package.sh
// (make package), signed with a throwaway release key, installs both .debs
// into a throwaway root with dpkg --root, runs the installed binaries,
// purges the packages and checks nothing of them is left; then installs
// the release with its own install.sh (as root, into a /usr/local of its
// own) and uninstalls it. It uses no hermetic world and never touches the
// machine's own root or dpkg database (it checks that the database is
// unchanged). The maintainer scripts run outside the throwaway root
// (--force-script-chrootless): they only print, which
// TestMaintainerScriptsOnlyTalk holds them to.
func TestSystemPackageInstall(t *testing.T) {
	if os.Geteuid() != 0 {
		tier.Unavailable(t, "dpkg --root wants root for the packages' owners and modes: run as root")
	}
	dpkg := tier.Tool(t, "dpkg", "dpkg")      // installs the .debs
	goTool := tier.Tool(t, "go", "golang-go") // scripts/package.sh builds with it
	realStatus := fileHash(t, "/var/lib/dpkg/status")

	repo, err := filepath.Abs("../..")
	require.NoError(t, err)
	out := t.TempDir()
	key := installtest.NewSigner(t, "release")
	pack := exec.Command(filepath.Join(repo, "scripts", "package.sh"), out)
	pack.Dir = repo
	pack.Env = append(os.Environ(), "VERSION=v0.9.0-test", "PATH="+filepath.Dir(goTool)+string(os.PathListSeparator)+os.Getenv("PATH"),
		"GNUPGHOME="+key.Home, "BOX_RELEASE_KEY="+key.Fpr)
	b, err := pack.CombinedOutput()
	require.NoError(t, err, "%s", b)
	t.Logf("scripts/package.sh:\n%s", b)
	sums := exec.Command("sha256sum", "-c", "SHA256SUMS")
	sums.Dir = out
	b, err = sums.CombinedOutput()
	require.NoError(t, err, "%s", b)
	boxDeb := filepath.Join(out, "box_0.9.0+test_"+goArch(t)+".deb")
	drillDeb := filepath.Join(out, "drill_0.9.0+test_"+goArch(t)+".deb")
	require.FileExists(t, boxDeb)
	require.FileExists(t, drillDeb)

	root := t.TempDir()
	admin := filepath.Join(root, "var", "lib", "dpkg")
	for _, d := range []string{"info", "updates", "triggers"} {
		require.NoError(t, os.MkdirAll(filepath.Join(admin, d), 0o755))
	}
	for _, f := range []string{"status", "available"} {
		require.NoError(t, os.WriteFile(filepath.Join(admin, f), nil, 0o644))
	}
	dpkgIn := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(dpkg, append([]string{"--root=" + root, "--admindir=" + admin, "--log=" + filepath.Join(root, "dpkg.log"),
			"--force-not-root", "--force-script-chrootless"}, args...)...)
		b, err := cmd.CombinedOutput()
		require.NoError(t, err, "dpkg %s: %s", strings.Join(args, " "), b)
		return string(b)
	}

	// drill depends on busybox-static (its probe image is built from it).
	// Where apt's cache has that package (or BOX_BUSYBOX_DEB names one,
	// e.g. from apt-get download busybox-static), it goes into the same
	// root first; otherwise the dependency is forced (--force-depends),
	// and drill runs all the same: only its image building needs busybox.
	install := []string{"--install"}
	purge := []string{"box", "drill"}
	debs, _ := filepath.Glob("/var/cache/apt/archives/busybox-static_*.deb")
	if d := os.Getenv("BOX_BUSYBOX_DEB"); d != "" {
		debs = []string{d}
	}
	if len(debs) > 0 {
		dpkgIn("--install", debs[0])
		purge = append(purge, "busybox-static")
	} else {
		t.Log("no busybox-static .deb in /var/cache/apt/archives (nor BOX_BUSYBOX_DEB): installing with --force-depends")
		install = append(install, "--force-depends")
	}
	installed := dpkgIn(append(install, boxDeb, drillDeb)...)
	assert.Contains(t, installed, "box setup-host", "the postinst says what to run next")

	runIn := func(prog string, args ...string) string {
		t.Helper()
		cmd := exec.Command(filepath.Join(root, "usr", "bin", prog), args...)
		cmd.Env = []string{"PATH=/usr/bin:/bin", "INCUS_SOCKET=/nonexistent/box-package-test.socket"}
		var o, e bytes.Buffer
		cmd.Stdout, cmd.Stderr = &o, &e
		require.NoError(t, cmd.Run(), "%s %s: %s", prog, strings.Join(args, " "), e.String())
		return o.String()
	}
	assert.Equal(t, "box v0.9.0-test\n", runIn("box", "version"))
	assert.Contains(t, runIn("box", "help"), "\n  setup-host ")
	assert.Contains(t, runIn("drill", "list"), "C-SIBLING")
	assert.Equal(t, "drill v0.9.0-test\n", runIn("drill", "version"))
	for _, prog := range []string{"box", "drill"} {
		shipped, err := os.ReadFile(filepath.Join(root, "usr/share/bash-completion/completions", prog))
		require.NoError(t, err)
		assert.Equal(t, runIn(prog, "completion", "bash"), string(shipped), "%s's shipped completion is its own", prog)
		for _, f := range []string{"usr/share/zsh/vendor-completions/_" + prog, "usr/share/fish/vendor_completions.d/" + prog + ".fish", "usr/share/man/man1/" + prog + ".1.gz"} {
			assert.FileExists(t, filepath.Join(root, f))
		}
	}
	for _, u := range bootunits.BootUnits("/usr/bin/box") {
		b, err := os.ReadFile(filepath.Join(root, "usr/lib/systemd/system", u.Name))
		require.NoError(t, err)
		assert.Equal(t, u.Text, string(b), "%s is the unit box setup-host writes", u.Name)
	}
	assert.NoDirExists(t, filepath.Join(root, "etc"), "installing enables nothing and writes no configuration")
	listed := dpkgIn("--listfiles", "box")
	assert.Contains(t, listed, "/usr/bin/box\n")

	dpkgIn(append([]string{"--purge"}, purge...)...)
	info, err := os.ReadDir(filepath.Join(admin, "info"))
	require.NoError(t, err)
	for _, e := range info {
		assert.Equal(t, "format", e.Name(), "dpkg's database keeps nothing of the packages")
	}
	status, err := os.ReadFile(filepath.Join(admin, "status"))
	require.NoError(t, err)
	assert.Empty(t, strings.TrimSpace(string(status)), "no package is left in the status file")
	var left []string
	require.NoError(t, filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if !d.IsDir() && !strings.HasPrefix(rel, "var/lib/dpkg/") && rel != "dpkg.log" {
			left = append(left, rel)
		}
		return nil
	}))
	assert.Empty(t, left, "files left after the purge")
	assert.NoDirExists(t, filepath.Join(root, "usr"), "the directories the packages made are gone too")

	assert.Equal(t, realStatus, fileHash(t, "/var/lib/dpkg/status"), "the machine's own dpkg database is untouched")

	// The same release through its own install.sh, from the directory
	// it was built in (BOX_REPO/BOX_REF), as root.
	require.FileExists(t, filepath.Join(out, "SHA256SUMS.asc"))
	const listing = "find /usr/local -xdev | sort"
	lists := t.TempDir()
	got, err := installtest.Sandbox(t, true, "", fmt.Sprintf(`set -e
%[1]s > %[2]s/before
sh %[3]s/install.sh
box version; drill version
sh %[3]s/install.sh --uninstall
%[1]s > %[2]s/after
`, listing, lists, out), "BOX_REPO="+filepath.Dir(out), "BOX_REF="+filepath.Base(out))
	require.NoError(t, err, "%s", got)
	assert.Contains(t, got, "box-install: verified box-v0.9.0-test-linux-"+goArch(t)+".tar.gz: signed by box's release key "+key.Fpr)
	assert.Contains(t, got, "box v0.9.0-test\ndrill v0.9.0-test\n")
	assert.Contains(t, got, "box-install: installed box v0.9.0-test and drill into /usr/local/bin")
	assert.Equal(t, string(readFile(t, filepath.Join(lists, "before"))), string(readFile(t, filepath.Join(lists, "after"))), "the uninstall leaves /usr/local as it found it")
}

func fileHash(t *testing.T, path string) [32]byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return [32]byte{}
	}
	require.NoError(t, err)
	return sha256.Sum256(b)
}

// goArch is the architecture package.sh builds for (go env GOARCH).
func goArch(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "env", "GOARCH").Output()
	require.NoError(t, err)
	return strings.TrimSpace(string(out))
}
