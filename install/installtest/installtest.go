// Package installtest is what install.sh's tests share: throwaway release
// keys, releases laid out as a release host serves them, and a sandbox
// that gives a root install a /usr/local of its own.
package installtest

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/box-isolation/box/internal/testenv/tier"
	"github.com/stretchr/testify/require"
)

// Signer is a throwaway OpenPGP key made for one test run.
type Signer struct {
	Home, Fpr string
	Pub       []byte
}

// NewSigner makes a key in a GnuPG home of its own, removed (its agent
// stopped) after the test.
func NewSigner(t *testing.T, name string) Signer {
	t.Helper()
	tier.Tool(t, "gpg", "gpg")
	tier.Tool(t, "gpg-agent", "gpg-agent")
	home, err := os.MkdirTemp("", "gpg-")
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = exec.Command("gpgconf", "--homedir", home, "--kill", "gpg-agent").Run()
		os.RemoveAll(home)
	})
	gpg := func(args ...string) []byte {
		out, err := exec.Command("gpg", append([]string{"--batch", "--homedir", home}, args...)...).Output()
		require.NoError(t, err, "gpg %v", args)
		return out
	}
	gpg("--passphrase", "", "--quick-gen-key", "box test "+name+" <test@box.invalid>", "ed25519", "sign", "never")
	s := Signer{Home: home}
	for _, l := range strings.Split(string(gpg("--with-colons", "--list-keys")), "\n") {
		if f := strings.Split(l, ":"); len(f) > 9 && f[0] == "fpr" && s.Fpr == "" {
			s.Fpr = f[9]
		}
	}
	require.Len(t, s.Fpr, 40)
	s.Pub = gpg("--export", s.Fpr)
	return s
}

// AddSigningSubkey gives the key a signing subkey, which gpg then signs
// with (as a release key kept offline does), and returns the key with its
// public part as it now is.
func (s Signer) AddSigningSubkey(t *testing.T) Signer {
	t.Helper()
	out, err := exec.Command("gpg", "--batch", "--homedir", s.Home, "--passphrase", "", "--quick-add-key", s.Fpr, "ed25519", "sign", "never").CombinedOutput()
	require.NoError(t, err, "%s", out)
	s.Pub, err = exec.Command("gpg", "--batch", "--homedir", s.Home, "--export", s.Fpr).Output()
	require.NoError(t, err)
	return s
}

// Sign writes file.asc, a detached signature of file.
func (s Signer) Sign(t *testing.T, file string) {
	t.Helper()
	out, err := exec.Command("gpg", "--batch", "--homedir", s.Home, "--yes", "--local-user", s.Fpr, "--armor", "--detach-sign", "-o", file+".asc", file).CombinedOutput()
	require.NoError(t, err, "%s", out)
}

// Release lays a release out as a release host serves it, in dir/ref:
// the tarball (box and drill are scripts that say their version), its
// SHA256SUMS and, signed by s, SHA256SUMS.asc.
func Release(t *testing.T, dir, ref, version string, s Signer) string {
	t.Helper()
	at := filepath.Join(dir, ref)
	require.NoError(t, os.MkdirAll(at, 0o755))
	top := "box-" + version + "-linux-amd64/"
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	add := func(name, body string, mode int64) {
		require.NoError(t, tw.WriteHeader(&tar.Header{Name: top + name, Mode: mode, Size: int64(len(body)), Typeflag: tar.TypeReg}))
		_, err := tw.Write([]byte(body))
		require.NoError(t, err)
	}
	for _, p := range []string{"box", "drill"} {
		add("usr/bin/"+p, fmt.Sprintf("#!/bin/sh\necho %s %s\n", p, version), 0o755)
		add("usr/share/man/man1/"+p+".1.gz", "man "+p, 0o644)
		add("usr/share/bash-completion/completions/"+p, "bash "+p, 0o644)
		add("usr/share/zsh/vendor-completions/_"+p, "zsh "+p, 0o644)
		add("usr/share/fish/vendor_completions.d/"+p+".fish", "fish "+p, 0o644)
	}
	add("usr/lib/systemd/system/box-firewall.service", "[Unit]\n", 0o644)
	require.NoError(t, tw.Close())
	require.NoError(t, gz.Close())
	name := "box-" + version + "-linux-amd64.tar.gz"
	require.NoError(t, os.WriteFile(filepath.Join(at, name), buf.Bytes(), 0o644))
	sum := sha256.Sum256(buf.Bytes())
	sums := filepath.Join(at, "SHA256SUMS")
	require.NoError(t, os.WriteFile(sums, []byte(hex.EncodeToString(sum[:])+"  box_"+version+"_amd64.deb\n"+hex.EncodeToString(sum[:])+"  "+name+"\n"), 0o644))
	s.Sign(t, sums)
	return at
}

// Sandbox runs shell commands as root with a /usr/local of their own (a
// tmpfs laid out as Debian's), or as the unprivileged user nobody with
// home as HOME; it returns what they printed, and their error.
func Sandbox(t *testing.T, asRoot bool, home, script string, env ...string) (string, error) {
	t.Helper()
	var cmd *exec.Cmd
	if asRoot {
		wrapped := "mount -t tmpfs tmpfs /usr/local && mkdir -p /usr/local/bin /usr/local/etc /usr/local/games /usr/local/include /usr/local/lib /usr/local/sbin /usr/local/share/man /usr/local/src && " + script
		cmd = exec.Command("unshare", "-m", "--propagation", "private", "sh", "-c", wrapped)
	} else {
		cmd = exec.Command("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "sh", "-c", script)
		env = append(env, "HOME="+home)
	}
	cmd.Env = append([]string{"PATH=/usr/local/bin:/usr/bin:/bin"}, env...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}
