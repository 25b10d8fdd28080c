// Package testenv gates the privileged and system test tiers (docs/world.md,
// "The test tiers"). A test that needs more than the unit tier calls Root or World first;
// without what it needs it is skipped with a message saying how to enable
// it, except when BOX_REQUIRE_TIERS=1 (set by `make test`), where a missing
// tier is a failure, so CI can never pass by skipping.
package testenv

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/box-isolation/box/fixtures/world"
	"github.com/box-isolation/box/internal/testenv/tier"
	"github.com/box-isolation/box/stack/incus"
)

// RequireEnv makes a missing tier fail instead of skip.
const RequireEnv = tier.RequireEnv

// Root skips (or fails) unless the test runs as root: the privileged tier
// (namespaces, veths, raw sockets, nftables).
func Root(t testing.TB) {
	t.Helper()
	tier.Root(t)
}

// Unavailable skips with why, or fails under BOX_REQUIRE_TIERS=1: the one
// way for a test to skip (see tier.Unavailable).
func Unavailable(t testing.TB, why string) {
	t.Helper()
	tier.Unavailable(t, why)
}

// Tool returns the path of program name, or skips (fails under
// BOX_REQUIRE_TIERS=1) saying which Debian package installs it.
func Tool(t testing.TB, name, debianPackage string) string {
	t.Helper()
	return tier.Tool(t, name, debianPackage)
}

// Long skips (fails under BOX_REQUIRE_TIERS=1) in `go test -short`.
func Long(t testing.TB, why string) {
	t.Helper()
	tier.Long(t, why)
}

// World returns the running hermetic world, or skips (or fails) when none
// is up: the system tier.
func World(t testing.TB) *world.State {
	t.Helper()
	Root(t)
	st, err := world.Load()
	if err != nil {
		Unavailable(t, "needs the hermetic world with incusd: run `make test` (it builds one) or `bin/drill world up`: "+err.Error())
	}
	if st.IncusSocket == "" {
		Unavailable(t, "the hermetic world was built without incusd (--no-incus): rebuild it with `bin/drill world down && bin/drill world up`")
	}
	return st
}

// Incus returns the world and a client of its incusd.
func Incus(t testing.TB) (*world.State, *incus.Client) {
	t.Helper()
	st := World(t)
	return st, incus.New(st.IncusSocket)
}

var (
	buildMu sync.Mutex
	built   = map[string]string{}
)

// Binary builds one of the project's commands (cmd/NAME) once per test
// process, CGO_ENABLED=0 as released, and returns its path.
func Binary(t testing.TB, name string) string {
	t.Helper()
	buildMu.Lock()
	defer buildMu.Unlock()
	if p, ok := built[name]; ok {
		return p
	}
	sweepBinaries()
	dir, err := os.MkdirTemp("", fmt.Sprintf("box-test-%s-%d-", name, os.Getpid()))
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, name)
	cmd := exec.Command("go", "build", "-o", p, "github.com/box-isolation/box/cmd/"+name)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building %s: %v: %s", name, err, out)
	}
	built[name] = p
	return p
}

// sweepBinaries removes the binaries Binary built for test processes that
// have ended (a test process cannot remove its own: every test of it may
// use them until it exits), so a run leaves at most its last process's.
func sweepBinaries() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), "box-test-*-*-*"))
	for _, d := range dirs {
		parts := strings.Split(filepath.Base(d), "-")
		if len(parts) < 5 {
			continue
		}
		pid, err := strconv.Atoi(parts[len(parts)-2])
		if err != nil || pid == os.Getpid() {
			continue
		}
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			os.RemoveAll(d)
		}
	}
}

// Drill is the drill binary: the agent a drill run pushes into its boxes.
func Drill(t testing.TB) string { return Binary(t, "drill") }

// ClusterStateEnv names the state file of the cluster world the cluster
// tests use; ClusterWorld's default otherwise.
const ClusterStateEnv = "BOX_CLUSTER_STATE"

// ClusterWorld is the default name of the cluster world the tests use
// (`drill world up --name boxc --cluster 3`, which `make test` builds).
const ClusterWorld = "boxc"

// Cluster returns the running cluster world (a world of 3 or more members)
// or skips (or fails) when none is up: the system tier, on a cluster.
func Cluster(t testing.TB) *world.State {
	t.Helper()
	Root(t)
	path := os.Getenv(ClusterStateEnv)
	if path == "" {
		path = world.StatePath(filepath.Join(world.StateRoot, ClusterWorld))
	}
	st, err := world.LoadFile(path)
	if err != nil {
		Unavailable(t, "needs a cluster world of 3 members: run `make test` (it builds one) or `bin/drill world up --name "+ClusterWorld+" --cluster 3`: "+err.Error())
	}
	if len(st.Members) < 3 {
		Unavailable(t, "the world at "+path+" is not a cluster of 3 members: rebuild it with `bin/drill world down --name "+st.Name+" && bin/drill world up --name "+st.Name+" --cluster 3`")
	}
	holdCluster(t, st.StateDir)
	return st
}

// clusterHold is this process's hold on the cluster world: `make test`
// runs the drill package beside the others (each in a standalone world
// of its own) but has one cluster world, so a test that uses it holds a
// lock file in the world's state directory until it ends, and another
// process's cluster test waits. The first test of this process to ask
// takes the lock and the last to end lets it go (subtests share it).
var clusterHold struct {
	sync.Mutex
	n int
	f *os.File
}

func holdCluster(t testing.TB, stateDir string) {
	t.Helper()
	clusterHold.Lock()
	defer clusterHold.Unlock()
	if clusterHold.n == 0 {
		f, err := os.OpenFile(filepath.Join(stateDir, "tests.lock"), os.O_CREATE|os.O_RDWR, 0o600)
		if err != nil {
			t.Fatalf("holding the cluster world for this test: %v", err)
		}
		start := time.Now()
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
			f.Close()
			t.Fatalf("holding the cluster world for this test: %v", err)
		}
		if waited := time.Since(start); waited > time.Second {
			t.Logf("waited %s for another process's tests to be done with the cluster world", waited.Round(time.Second))
		}
		clusterHold.f = f
	}
	clusterHold.n++
	t.Cleanup(func() {
		clusterHold.Lock()
		defer clusterHold.Unlock()
		if clusterHold.n--; clusterHold.n == 0 {
			clusterHold.f.Close() // lets the lock go
			clusterHold.f = nil
		}
	})
}
