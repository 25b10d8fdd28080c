// Package tier is the part of testenv that depends on nothing of box's:
// the privileged tier's gate, for packages the world itself imports
// (testenv imports the world, and through it those packages).
//
// Every skip in the tree goes through Unavailable (TestSkipsGoThroughTier
// holds the tree to it), so BOX_REQUIRE_TIERS=1 turns each into a failure.
package tier

import (
	"os"
	"os/exec"
	"testing"
)

// RequireEnv makes a missing tier fail instead of skip.
const RequireEnv = "BOX_REQUIRE_TIERS"

// Unavailable skips with why, or fails when RequireEnv is 1.
func Unavailable(t testing.TB, why string) {
	t.Helper()
	if os.Getenv(RequireEnv) == "1" {
		t.Fatalf("%s (%s=1 says every tier must run)", why, RequireEnv)
	}
	t.Skip(why)
}

// Root skips (or fails) unless the test runs as root: the privileged tier
// (namespaces, veths, raw sockets, nftables).
func Root(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		Unavailable(t, "needs root for namespaces and raw sockets: run `make test` as root")
	}
}

// Tool returns the path of the program name (looked up on PATH, or the
// file itself when name is a path), or skips (fails under RequireEnv=1)
// saying which Debian package installs it; scripts/deps.sh installs every
// package a test names here.
func Tool(t testing.TB, name, debianPackage string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		Unavailable(t, "needs "+name+": apt-get install "+debianPackage+" (scripts/deps.sh installs it)")
	}
	return p
}

// Long skips (fails under RequireEnv=1) in `go test -short`: for a test
// too slow for a quick run, saying why.
func Long(t testing.TB, why string) {
	t.Helper()
	if testing.Short() {
		Unavailable(t, why+"; not in -short")
	}
}
