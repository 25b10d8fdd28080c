// Package tier is the part of testenv that depends on nothing of box's:
// the privileged tier's gate, for packages the world itself imports
// (testenv imports the world, and through it those packages).
package tier

import (
	"os"
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
