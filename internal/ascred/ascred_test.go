package ascred

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/box-isolation/box/internal/testenv/tier"
)

// peer accepts one connection on ln and returns the credentials the
// kernel recorded for its peer.
func peer(t *testing.T, ln *net.UnixListener) *syscall.Ucred {
	t.Helper()
	c, err := ln.AcceptUnix()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	raw, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var cred *syscall.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
	}); err != nil {
		t.Fatal(err)
	}
	if cerr != nil {
		t.Fatal(cerr)
	}
	return cred
}

// listen makes a unix socket the borrowed identity can walk to.
func listen(t *testing.T) (string, *net.UnixListener) {
	t.Helper()
	dir := t.TempDir()
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	path := filepath.Join(dir, "s")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return path, ln
}

func TestDialUnixAsAnotherUser(t *testing.T) {
	if os.Geteuid() != 0 {
		tier.Unavailable(t, "needs root (CAP_SETUID) to connect as another user: run as root")
	}
	path, ln := listen(t)
	// Group 4242 only: a socket owned by it with mode 0660 admits the
	// borrowed identity only through the supplementary group.
	if err := os.Chown(path, 0, 4242); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, 0o660); err != nil {
		t.Fatal(err)
	}

	cred := Cred{UID: 4241, GID: 4241, Groups: []uint32{4242}}
	conn, err := DialUnix(context.Background(), path, cred)
	if err != nil {
		t.Fatalf("dialling as %s: %v", cred, err)
	}
	got := peer(t, ln)
	conn.Close()
	if got.Uid != cred.UID || got.Gid != cred.GID {
		t.Errorf("peer is uid %d gid %d, want %d/%d", got.Uid, got.Gid, cred.UID, cred.GID)
	}

	// Without the group the mode keeps the user out.
	if c, err := DialUnix(context.Background(), path, Cred{UID: 4241, GID: 4241}); err == nil {
		c.Close()
		t.Error("a user outside the socket's group connected")
	}

	// This process kept its own identity: only the retired thread changed.
	if os.Geteuid() != 0 || os.Getegid() != 0 {
		t.Errorf("the process itself changed identity: euid %d egid %d", os.Geteuid(), os.Getegid())
	}
	if groups, err := os.Getgroups(); err == nil && slices.Contains(groups, 4242) {
		t.Errorf("the process itself gained group 4242: %v", groups)
	}
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	if got := peer(t, ln); got.Uid != 0 {
		t.Errorf("a later plain dial was uid %d, want 0", got.Uid)
	}
	c.Close()
}

// TestNoThreadKeepsTheIdentity: after dials, no thread of the process,
// the main thread included, is the borrowed user. The runtime only parks
// a retired main thread; parked as the user, it made /proc show the whole
// process as theirs (and a purge of that user killed it).
func TestNoThreadKeepsTheIdentity(t *testing.T) {
	if os.Geteuid() != 0 {
		tier.Unavailable(t, "needs root (CAP_SETUID) to connect as another user: run as root")
	}
	path, ln := listen(t)
	if err := os.Chmod(path, 0o666); err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	cred := Cred{UID: 4241, GID: 4241, Groups: []uint32{4242}}
	for i := range 50 {
		c, err := DialUnix(context.Background(), path, cred)
		if err != nil {
			t.Fatalf("dial %d: %v", i, err)
		}
		c.Close()
	}
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	for _, task := range tasks {
		b, err := os.ReadFile(filepath.Join("/proc/self/task", task.Name(), "status"))
		if err != nil {
			continue // ended meanwhile
		}
		for _, line := range strings.Split(string(b), "\n") {
			k, v, _ := strings.Cut(line, ":")
			if (k == "Uid" || k == "Gid" || k == "Groups") && slices.ContainsFunc(strings.Fields(v), func(f string) bool { return f == "4241" || f == "4242" }) {
				t.Errorf("thread %s kept the borrowed identity: %s:%s", task.Name(), k, v)
			}
		}
	}
}
