package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/goreleaser/nfpm/v2"
	_ "github.com/goreleaser/nfpm/v2/deb" // registers the deb packager
	"github.com/goreleaser/nfpm/v2/files"

	"github.com/box-isolation/box/install"
	"github.com/box-isolation/box/stack/bootunits"
)

// config is one packaging run.
type config struct {
	bin, out string
	// docbin holds binaries this machine can run, to ask for the man
	// pages and completions (bin's, unless they are cross-compiled).
	docbin  string
	version string // as the binaries print it
	arch    string // GOARCH, which is Debian's name for amd64, arm64...
	mtime   time.Time
	// releaseKey, releaseFpr and releaseRepo, when releaseKey is set,
	// render install.sh for the release (install.Render): the release
	// key's public part (a file, binary OpenPGP), its fingerprint, and
	// where the releases are.
	releaseKey, releaseFpr, releaseRepo string
}

// artefact is one file written to the output directory.
type artefact struct {
	path string
	size int64
}

// Package metadata. The repository has no licence file yet: until it
// has one, the packages say so rather than name a licence nobody chose.
const (
	maintainer = "box maintainers <maintainers@users.noreply.a-seed-b922dd65.example>"
	homepage   = "https://github.com/box-isolation/box"
	license    = "UNLICENSED"
)

// file is one file of a package, with its path on the installed system.
type file struct {
	dst  string
	data []byte
	mode os.FileMode
}

// pkg is one .deb.
type pkg struct {
	name        string
	description string // a synopsis line, then the long description
	depends     []string
	recommends  []string
	files       []file
	// preinst, postinst and postrm are maintainer scripts; they only
	// print.
	preinst, postinst, postrm string
}

// Where the completions go: the directories Debian's bash-completion, zsh
// and fish read their vendors' completions from.
func completionPath(shell, prog string) string {
	switch shell {
	case "bash":
		return "/usr/share/bash-completion/completions/" + prog
	case "zsh":
		return "/usr/share/zsh/vendor-completions/_" + prog
	}
	return "/usr/share/fish/vendor_completions.d/" + prog + ".fish"
}

// unitDir is where packaged systemd units live. They are shipped but not
// enabled: box setup-host writes and enables its own copy (the same text)
// under /etc/systemd/system when it builds the stack.
const unitDir = "/usr/lib/systemd/system"

// docFiles asks a built binary for its man page and completions.
func docFiles(bin, prog string, mtime time.Time) ([]file, error) {
	exe := filepath.Join(bin, prog)
	ask := func(args ...string) ([]byte, error) {
		var out, errOut bytes.Buffer
		cmd := exec.Command(exe, args...)
		cmd.Stdout, cmd.Stderr = &out, &errOut
		if err := cmd.Run(); err != nil {
			return nil, fmt.Errorf("%s %s: %w: %s", exe, strings.Join(args, " "), err, strings.TrimSpace(errOut.String()))
		}
		return out.Bytes(), nil
	}
	page, err := ask("man")
	if err != nil {
		return nil, err
	}
	gz, err := gzipped(page, prog+".1", mtime)
	if err != nil {
		return nil, err
	}
	out := []file{{dst: "/usr/share/man/man1/" + prog + ".1.gz", data: gz, mode: 0o644}}
	for _, shell := range []string{"bash", "zsh", "fish"} {
		script, err := ask("completion", shell)
		if err != nil {
			return nil, err
		}
		out = append(out, file{dst: completionPath(shell, prog), data: script, mode: 0o644})
	}
	return out, nil
}

// gzipped compresses a man page as Debian does (maximum, no time in the
// header but the source date).
func gzipped(data []byte, name string, mtime time.Time) ([]byte, error) {
	var b bytes.Buffer
	zw, err := gzip.NewWriterLevel(&b, gzip.BestCompression)
	if err != nil {
		return nil, err
	}
	zw.Name, zw.ModTime = name, mtime
	if _, err := zw.Write(data); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// packages lays out the two packages from the built binaries.
func packages(c config) ([]pkg, error) {
	var out []pkg
	for _, prog := range []string{"box", "drill"} {
		exe, err := os.ReadFile(filepath.Join(c.bin, prog))
		if err != nil {
			return nil, fmt.Errorf("the built %s: %w (scripts/package.sh builds it)", prog, err)
		}
		docs, err := docFiles(c.docbin, prog, c.mtime)
		if err != nil {
			return nil, err
		}
		p := pkg{name: prog, files: append([]file{{dst: "/usr/bin/" + prog, data: exe, mode: 0o755}}, docs...),
			recommends: []string{"incus | incus-base"}}
		switch prog {
		case "box":
			p.description = "trust-less, network-isolated Incus boxes for coding agents\n" +
				"box mints Incus instances with a coding agent's CLI installed but\n" +
				"unauthenticated. A box reaches the public internet and nothing else:\n" +
				"not the host, not the LAN, not another box.\n" +
				"Installing the package changes nothing on the host's network: run\n" +
				"box setup-host to build the isolation stack."
			for _, u := range bootunits.BootUnits("/usr/bin/box") {
				p.files = append(p.files, file{dst: path.Join(unitDir, u.Name), data: []byte(u.Text), mode: 0o644})
			}
			p.preinst = preinstBox
			p.postinst = postinstBox
			p.postrm = postrmBox
		case "drill":
			p.description = "prove box's network isolation with raw probes from inside boxes\n" +
				"drill mints probe boxes from an image built from busybox-static and\n" +
				"fires raw ARP, ICMP, TCP, UDP, DNS and IPv6 probes between them, the\n" +
				"host, the LAN and the internet, judging every isolation claim where\n" +
				"the packet would land."
			// The probe image is built on the host from busybox-static's
			// binary (drill/image).
			p.depends = []string{"busybox-static"}
		}
		out = append(out, p)
	}
	return out, nil
}

// The maintainer scripts change nothing: no unit is enabled, no table or
// bridge touched. They say what to run instead.
// preinstBox names a box install.sh installed for root: it lies first on
// the PATH, before the package's.
const preinstBox = `#!/bin/sh
set -e
if [ -f /usr/local/share/box/installed ]; then
	echo "box: install.sh installed box for root too (/usr/local/bin, listed in /usr/local/share/box/installed): it comes first on the PATH and hides this one; remove it, as root, with: sh install.sh --uninstall"
fi
exit 0
`

const postinstBox = `#!/bin/sh
set -e
if [ "$1" = configure ]; then
	echo "box: installed; nothing on this host's network was changed."
	echo "box: to build the isolation stack, run as root: box setup-host (box doctor checks it)"
fi
exit 0
`

const postrmBox = `#!/bin/sh
set -e
case "$1" in
remove)
	echo "box: removed; the isolation stack, if box setup-host built one, is left as it was (boxes keep running)."
	echo "box: to remove it, reinstall box and run: box teardown-host"
	;;
esac
exit 0
`

// debVersion turns the binaries' version (git describe --always --dirty)
// into a Debian version: v0.4.0-3-gabc1234-dirty becomes
// 0.4.0+3.gabc1234.dirty (after 0.4.0, as it was built after it); a build
// with no tag to describe (a bare commit, or dev) 0.0.0~git.abc1234, which
// sorts before any release.
func debVersion(v string) string {
	v = strings.TrimPrefix(v, "v")
	if tagged.MatchString(v) {
		base, rest, _ := strings.Cut(v, "-")
		base = strings.Trim(unsafeChars.ReplaceAllString(base, "."), ".")
		if rest = strings.Trim(unsafeChars.ReplaceAllString(rest, "."), "."); rest != "" {
			return base + "+" + rest
		}
		return base
	}
	clean := strings.Trim(unsafeChars.ReplaceAllString(v, "."), ".")
	if clean == "" {
		clean = "dev"
	}
	return "0.0.0~git." + clean
}

var (
	// A tag has a dot (0.4.0); an abbreviated commit never does.
	tagged      = regexp.MustCompile(`^[0-9]+\.`)
	unsafeChars = regexp.MustCompile(`[^A-Za-z0-9]+`)
)

// build writes the debs, the tarball and SHA256SUMS into c.out.
func build(c config) ([]artefact, error) {
	pkgs, err := packages(c)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(c.out, 0o755); err != nil {
		return nil, err
	}
	stage, err := os.MkdirTemp("", "box-pkgbuild-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(stage)

	var built []artefact
	for _, p := range pkgs {
		a, err := deb(c, p, filepath.Join(stage, p.name))
		if err != nil {
			return nil, fmt.Errorf("packaging %s: %w", p.name, err)
		}
		built = append(built, a)
	}
	a, err := tarball(c, pkgs)
	if err != nil {
		return nil, err
	}
	built = append(built, a)
	a, err = sums(c.out, built)
	if err != nil {
		return nil, err
	}
	built = append(built, a)
	if c.releaseKey == "" {
		return built, nil
	}
	a, err = installScript(c)
	if err != nil {
		return nil, err
	}
	return append(built, a), nil
}

// installScript writes install.sh rendered with the release key: it is
// attached to the release beside what SHA256SUMS lists, not in it (it
// carries the key the sums are checked with).
func installScript(c config) (artefact, error) {
	key, err := os.ReadFile(c.releaseKey)
	if err != nil {
		return artefact{}, fmt.Errorf("reading the release key: %w", err)
	}
	s, err := install.Render(key, c.releaseFpr, c.releaseRepo)
	if err != nil {
		return artefact{}, err
	}
	path := filepath.Join(c.out, "install.sh")
	if err := os.WriteFile(path, []byte(s), 0o755); err != nil {
		return artefact{}, err
	}
	return artefact{path: path, size: int64(len(s))}, nil
}

// deb writes one package with nfpm; stage is a directory for its files.
func deb(c config, p pkg, stage string) (artefact, error) {
	var contents files.Contents
	for _, f := range p.files {
		src := filepath.Join(stage, "root", filepath.FromSlash(f.dst))
		if err := os.MkdirAll(filepath.Dir(src), 0o755); err != nil {
			return artefact{}, err
		}
		if err := os.WriteFile(src, f.data, f.mode); err != nil {
			return artefact{}, err
		}
		contents = append(contents, &files.Content{Source: src, Destination: f.dst,
			FileInfo: &files.ContentFileInfo{Mode: f.mode, MTime: c.mtime}})
	}
	script := func(name, text string) (string, error) {
		if text == "" {
			return "", nil
		}
		p := filepath.Join(stage, name)
		return p, os.WriteFile(p, []byte(text), 0o755)
	}
	var scripts nfpm.Scripts
	var err error
	if scripts.PreInstall, err = script("preinst", p.preinst); err != nil {
		return artefact{}, err
	}
	if scripts.PostInstall, err = script("postinst", p.postinst); err != nil {
		return artefact{}, err
	}
	if scripts.PostRemove, err = script("postrm", p.postrm); err != nil {
		return artefact{}, err
	}
	info := &nfpm.Info{
		Name: p.name, Arch: c.arch, Platform: "linux",
		Version: debVersion(c.version), VersionSchema: "none",
		Section: "admin", Priority: "optional",
		Maintainer: maintainer, Description: p.description, Homepage: homepage, License: license,
		MTime: c.mtime,
		Overridables: nfpm.Overridables{
			Depends: p.depends, Recommends: p.recommends, Contents: contents, Scripts: scripts,
			Deb: nfpm.Deb{Fields: map[string]string{"License": license}},
		},
	}
	info = nfpm.WithDefaults(info)
	packager, err := nfpm.Get("deb")
	if err != nil {
		return artefact{}, err
	}
	name := packager.(nfpm.PackagerWithExtension).ConventionalFileName(info)
	return writeFile(filepath.Join(c.out, name), func(w *os.File) error { return packager.Package(info, w) })
}

// tarball writes both packages' files, under one top directory as they
// would lie under /, into one .tar.gz.
func tarball(c config, pkgs []pkg) (artefact, error) {
	top := fmt.Sprintf("box-%s-linux-%s", c.version, c.arch)
	var all []file
	for _, p := range pkgs {
		all = append(all, p.files...)
	}
	slices.SortFunc(all, func(a, b file) int { return strings.Compare(a.dst, b.dst) })
	return writeFile(filepath.Join(c.out, top+".tar.gz"), func(w *os.File) error {
		zw := gzip.NewWriter(w)
		zw.ModTime = c.mtime
		tw := tar.NewWriter(zw)
		dirs := map[string]bool{}
		var addDir func(d string) error
		addDir = func(d string) error {
			if d == "." || d == "/" || dirs[d] {
				return nil
			}
			if err := addDir(path.Dir(d)); err != nil {
				return err
			}
			dirs[d] = true
			return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: 0o755, ModTime: c.mtime, Format: tar.FormatPAX})
		}
		for _, f := range all {
			name := top + f.dst
			if err := addDir(path.Dir(name)); err != nil {
				return err
			}
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: int64(f.mode), Size: int64(len(f.data)), ModTime: c.mtime, Format: tar.FormatPAX}); err != nil {
				return err
			}
			if _, err := tw.Write(f.data); err != nil {
				return err
			}
		}
		if err := tw.Close(); err != nil {
			return err
		}
		return zw.Close()
	})
}

// sums writes SHA256SUMS for what was built, as sha256sum -c reads it.
func sums(out string, built []artefact) (artefact, error) {
	var b strings.Builder
	for _, a := range built {
		data, err := os.ReadFile(a.path)
		if err != nil {
			return artefact{}, err
		}
		h := sha256.Sum256(data)
		fmt.Fprintf(&b, "%s  %s\n", hex.EncodeToString(h[:]), filepath.Base(a.path))
	}
	return writeFile(filepath.Join(out, "SHA256SUMS"), func(w *os.File) error {
		_, err := w.WriteString(b.String())
		return err
	})
}

// writeFile creates path, fills it with fill, and says how big it is.
func writeFile(path string, fill func(*os.File) error) (artefact, error) {
	f, err := os.Create(path)
	if err != nil {
		return artefact{}, err
	}
	if err := fill(f); err != nil {
		f.Close()
		os.Remove(path)
		return artefact{}, fmt.Errorf("writing %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return artefact{}, err
	}
	st, err := os.Stat(path)
	if err != nil {
		return artefact{}, err
	}
	return artefact{path: path, size: st.Size()}, nil
}
