// Command pkgbuild packages built box and drill binaries: a .deb for each
// (with nfpm as a library), a tarball of both, and SHA256SUMS, into one
// directory. The man pages and completions are asked of the binaries
// themselves (`box man`, `box completion bash`...), and the systemd units
// come from the stack package, so nothing packaged can drift from the code.
// scripts/package.sh (make package) builds the binaries and runs it:
//
//	go run ./cmd/pkgbuild -bin bin -out dist -version 0.4.0
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"strconv"
	"time"

	"github.com/box-isolation/box/install"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

func run(args []string, out, errw io.Writer) int {
	fs := flag.NewFlagSet("pkgbuild", flag.ContinueOnError)
	fs.SetOutput(errw)
	var c config
	fs.StringVar(&c.bin, "bin", "bin", "the directory holding the built box and drill")
	fs.StringVar(&c.out, "out", "dist", "where the packages go")
	fs.StringVar(&c.version, "version", "", "the version the binaries were built with (git describe)")
	fs.StringVar(&c.arch, "arch", runtime.GOARCH, "the binaries' architecture, as GOARCH")
	fs.StringVar(&c.docbin, "docbin", "", "binaries for this machine to ask for the man pages and completions, when -bin's are cross-compiled (default: -bin)")
	fs.StringVar(&c.releaseKey, "release-key", "", "also write install.sh, rendered with this release key (its public part, as gpg --export writes it)")
	fs.StringVar(&c.releaseFpr, "release-fpr", "", "with -release-key: its fingerprint")
	fs.StringVar(&c.releaseRepo, "release-repo", install.DefaultRepo, "with -release-key: where install.sh fetches releases from by default")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if c.version == "" || fs.NArg() > 0 {
		fmt.Fprintln(errw, "usage: pkgbuild -version V [-bin DIR] [-out DIR] [-arch GOARCH] [-docbin DIR] [-release-key FILE -release-fpr FPR [-release-repo URL]]")
		return 2
	}
	if c.docbin == "" {
		c.docbin = c.bin
	}
	var err error
	if c.mtime, err = sourceDate(os.Getenv("SOURCE_DATE_EPOCH")); err != nil {
		fmt.Fprintf(errw, "pkgbuild: %v\n", err)
		return 2
	}
	built, err := build(c)
	if err != nil {
		fmt.Fprintf(errw, "pkgbuild: %v\n", err)
		return 1
	}
	for _, a := range built {
		fmt.Fprintf(out, "%s\t%d bytes\n", a.path, a.size)
	}
	return 0
}

// sourceDate is the time every packaged file carries: SOURCE_DATE_EPOCH
// when set (reproducible builds), else now.
func sourceDate(epoch string) (time.Time, error) {
	if epoch == "" {
		return time.Now().UTC().Truncate(time.Second), nil
	}
	n, err := strconv.ParseInt(epoch, 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("SOURCE_DATE_EPOCH=%q: want seconds since 1970", epoch)
	}
	return time.Unix(n, 0).UTC(), nil
}
