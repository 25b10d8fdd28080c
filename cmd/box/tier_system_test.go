package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"

	"github.com/box-isolation/box/fixtures/world"
	"github.com/box-isolation/box/internal/accounts"
	"github.com/box-isolation/box/internal/syncbuf"
	"github.com/box-isolation/box/internal/testenv"
	"github.com/box-isolation/box/internal/testenv/tier"
	"github.com/box-isolation/box/stack"
	"github.com/box-isolation/box/stack/access"
	"github.com/box-isolation/box/stack/hostns"
	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/model"
)

// The access tiers end to end in the world: throwaway local users (bxt
// and five random letters, made and removed here), box grant and box
// revoke run by root, and box run as the granted user, which reaches
// incusd only through incus-user's socket. A port watcher runs for the
// whole test, as box-guard-and-serve.service would on a host.

// tierEnv is what the tier tests share.
type tierEnv struct {
	r        runner        // root, in-process
	c        *incus.Client // incusd, as admin
	host     *stack.Host   // the admin's host, for AsUser
	incusDir string
	userSock string // incus-user's socket
	incusGID uint32 // the group incus-user serves
	exe      string // box, runnable by any local user
}

// tierWorld gates the tier tests and sets up what they share.
func tierWorld(t *testing.T) *tierEnv {
	t.Helper()
	st := testenv.World(t)
	if _, err := os.Stat(world.IncusUserBin); err != nil {
		tier.Unavailable(t, "needs incus-user at "+world.IncusUserBin+" (Debian's incus package ships it): "+err.Error())
	}
	gid, err := accounts.GroupGID(stack.DefaultTierGroup)
	if err != nil {
		tier.Unavailable(t, "needs the group "+stack.DefaultTierGroup+" that incus-user serves (Debian's incus package creates it): "+err.Error())
	}
	for _, tool := range []string{"useradd", "userdel", "gpasswd"} {
		testenv.Tool(t, tool, "passwd") // makes and removes the test's users
	}
	sock := world.IncusUserSocketPath(st.IncusDir)
	if fi, err := os.Stat(sock); err != nil || fi.Mode()&os.ModeSocket == 0 {
		tier.Unavailable(t, fmt.Sprintf("needs the world's incus-user activator listening on %s (%v): rebuild the world with `bin/drill world down && bin/drill world up`", sock, err))
	}
	r, c := worldBox(t)
	e := &tierEnv{r: r, c: c, host: &stack.Host{Incus: c, NetNS: st.Names.HostNS},
		incusDir: st.IncusDir, userSock: sock, incusGID: gid, exe: userExe(t)}
	portWatcher(t, st, c)
	return e
}

// userExe is the box binary at a path every user may traverse and run:
// testenv.Binary's, or a copy of it in a 0755 directory.
func userExe(t *testing.T) string {
	t.Helper()
	p := testenv.Binary(t, "box")
	if openToAll(p) {
		return p
	}
	dir, err := os.MkdirTemp("", "box-tier-exe-")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	require.NoError(t, os.Chmod(dir, 0o755))
	b, err := os.ReadFile(p)
	require.NoError(t, err)
	cp := filepath.Join(dir, "box")
	require.NoError(t, os.WriteFile(cp, b, 0o755))
	require.NoError(t, os.Chmod(cp, 0o755)) // past the umask
	require.True(t, openToAll(cp), "%s is not runnable by other users", cp)
	t.Logf("%s is not runnable by other users: they run a copy at %s", p, cp)
	return cp
}

// openToAll reports whether any user may run p: it is readable and
// executable by others, and every directory above it is traversable.
func openToAll(p string) bool {
	fi, err := os.Stat(p)
	if err != nil || fi.Mode().Perm()&0o005 != 0o005 {
		return false
	}
	for d := filepath.Dir(p); ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil || fi.Mode().Perm()&0o001 == 0 {
			return false
		}
		if d == "/" {
			return true
		}
	}
}

// portWatcher makes sure a port watcher runs for the world's namespace for
// the rest of the test: one started here as a plain process, or the one
// already running (a second is refused).
func portWatcher(t *testing.T, st *world.State, c *incus.Client) {
	t.Helper()
	h := &stack.Host{Incus: c, NetNS: st.Names.HostNS}
	if pid, running, err := hostns.DaemonRunning(h.NetNS); err != nil {
		t.Fatalf("asking for a port watcher: %v", err)
	} else if running {
		t.Logf("a port watcher (pid %d) already watches %s: the test uses it", pid, st.Names.HostNS)
		return
	}
	var logBuf syncbuf.Buffer
	cmd := exec.Command(testenv.Binary(t, "box"), "guard-and-serve")
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "INCUS_SOCKET=" + st.IncusSocket, "BOX_NETNS=" + st.Names.HostNS}
	cmd.Stdout, cmd.Stderr = &logBuf, &logBuf
	require.NoError(t, cmd.Start())
	done := make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		select {
		case <-done:
		default:
			_ = cmd.Process.Signal(syscall.SIGTERM)
			<-done
			assert.NoError(t, waitErr, "box guard-and-serve exits 0 on SIGTERM")
		}
		t.Logf("box guard-and-serve (pid %d) stopped; it said:\n%s", cmd.Process.Pid, logBuf.String())
	})
	deadline := time.Now().Add(10 * time.Second)
	for {
		pid, running, err := hostns.DaemonRunning(h.NetNS)
		if err == nil && running && pid == cmd.Process.Pid {
			t.Logf("started box guard-and-serve (pid %d) for %s", pid, st.Names.HostNS)
			return
		}
		select {
		case <-done:
			if strings.Contains(logBuf.String(), "already watches") {
				if pid, running, _ := hostns.DaemonRunning(h.NetNS); running {
					t.Logf("another port watcher (pid %d) took the namespace first: the test uses it", pid)
					return
				}
			}
			t.Fatalf("box guard-and-serve exited at once (%v): %s", waitErr, logBuf.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("box guard-and-serve (pid %d) did not take its lock within 10s: %s", cmd.Process.Pid, logBuf.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// tierUser is a throwaway local user.
type tierUser struct {
	accounts.User
	home string // a HOME of its own, for the incus CLI
}

// newUser makes a system user that cannot log in; cleanups registered on
// t end its processes, remove whatever of a tier it has, then the user.
func (e *tierEnv) newUser(t *testing.T) tierUser {
	t.Helper()
	b := make([]byte, 5)
	_, err := rand.Read(b)
	require.NoError(t, err)
	for i := range b {
		b[i] = 'a' + b[i]%26
	}
	name := "bxt" + string(b)
	out, err := exec.Command("useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name).CombinedOutput()
	require.NoError(t, err, "useradd %s: %s", name, out)
	u, err := accounts.Lookup(name)
	if err != nil {
		_ = exec.Command("userdel", name).Run()
		t.Fatalf("the user just made: %v", err)
	}
	home, err := os.MkdirTemp("", "bxt-home-")
	require.NoError(t, err)
	require.NoError(t, os.Chown(home, int(u.UID), int(u.GID)))
	tu := tierUser{User: u, home: home}
	t.Cleanup(func() { e.removeUser(t, tu) })
	t.Logf("made user %s (uid %d, gid %d)", u.Name, u.UID, u.GID)
	return tu
}

// removeUser leaves nothing of u behind: processes, group membership,
// project with its boxes, private bridge, trusted certificate, incus-user
// state or tombstone, home, account.
func (e *tierEnv) removeUser(t *testing.T, u tierUser) {
	t.Helper()
	if left, err := accounts.EndSessions(u.User, 5*time.Second); err != nil || len(left) > 0 {
		t.Errorf("ending %s's processes: %v (left: %v)", u.Name, err, left)
	}
	if left := e.tierLeft(t, u.User); len(left) > 0 {
		res := e.r.run(t, "revoke", "--purge", u.Name, "--json")
		if res.code != exitOK {
			t.Errorf("cleaning up %s: box revoke --purge: %s", u.Name, res.err)
		} else {
			t.Logf("cleanup: box revoke --purge %s removed what was left (%s): %s", u.Name, strings.Join(left, ", "), strings.TrimSpace(res.out))
		}
	}
	state := filepath.Join(e.incusDir, "users", fmt.Sprint(u.UID))
	if _, err := os.Lstat(state); err == nil {
		if err := os.RemoveAll(state); err != nil {
			t.Errorf("removing %s: %v", state, err)
		} else {
			t.Logf("cleanup: removed %s (incus-user's state or box's tombstone for uid %d)", state, u.UID)
		}
	}
	if left := e.tierLeft(t, u.User); len(left) > 0 {
		t.Errorf("cleanup left behind of %s (uid %d): %s", u.Name, u.UID, strings.Join(left, ", "))
	}
	if err := os.RemoveAll(u.home); err != nil {
		t.Errorf("removing %s: %v", u.home, err)
	}
	if out, err := exec.Command("userdel", u.Name).CombinedOutput(); err != nil {
		t.Errorf("userdel %s: %v: %s", u.Name, err, out)
	} else {
		t.Logf("cleanup: removed user %s (uid %d)", u.Name, u.UID)
	}
}

// tierLeft lists what of u's tier exists.
func (e *tierEnv) tierLeft(t *testing.T, u accounts.User) []string {
	t.Helper()
	ctx := context.Background()
	project, bridge := stack.TierProject(u.UID), stack.TierBridge(u.UID)
	var left []string
	if _, _, err := e.c.Projects().Get(ctx, project); err == nil {
		left = append(left, "project "+project)
	}
	if _, _, err := e.c.Networks().Get(ctx, bridge); err == nil {
		left = append(left, "network "+bridge)
	}
	certs, err := e.c.Certificates(ctx)
	require.NoError(t, err)
	for _, tc := range certs {
		if tc.Name == certName(u.UID) || slices.Contains(tc.Projects, project) {
			left = append(left, "trusted certificate "+tc.Name)
		}
	}
	if groupMembers(t, stack.DefaultTierGroup)[u.Name] {
		left = append(left, "membership of group "+stack.DefaultTierGroup)
	}
	return left
}

// certName is the trust store name incus-user gives uid's certificate.
func certName(uid uint32) string { return fmt.Sprintf("incus-user-%d", uid) }

// groupMembers reads a group's members from /etc/group itself.
func groupMembers(t *testing.T, group string) map[string]bool {
	t.Helper()
	f, err := os.Open("/etc/group")
	require.NoError(t, err)
	defer f.Close()
	out := map[string]bool{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Split(sc.Text(), ":")
		if len(fields) == 4 && fields[0] == group {
			for _, m := range strings.Split(fields[3], ",") {
				if m != "" {
					out[m] = true
				}
			}
		}
	}
	require.NoError(t, sc.Err())
	return out
}

// cred is u's credentials with the group incus-user serves, as a session
// opened after the grant holds them (and a stale one after the revoke).
func (e *tierEnv) cred(u tierUser) *syscall.Credential {
	return &syscall.Credential{Uid: u.UID, Gid: u.GID, Groups: []uint32{e.incusGID}}
}

// as is box run by u.
func (e *tierEnv) as(u tierUser) runner { return e.r.asUser(e.exe, e.cred(u)) }

// incusMessage is Incus's own text of an error (the client lowercases the
// first letter of what it prints).
func incusMessage(err error) string {
	var se *incus.StatusError
	if errors.As(err, &se) {
		return se.Message
	}
	var oe *incus.OperationError
	if errors.As(err, &oe) {
		return oe.Message
	}
	if err != nil {
		return err.Error()
	}
	return ""
}

// refusedFor asserts an attempt was refused with the reason want: a
// refusal for any other reason (not found, not authorised) fails.
func refusedFor(t *testing.T, what string, err error, want string) {
	t.Helper()
	if err == nil {
		t.Errorf("%s: allowed, but the tier must refuse it (%q)", what, want)
		return
	}
	if msg := incusMessage(err); !strings.Contains(msg, want) {
		t.Errorf("%s: refused, but not by the project's restriction: got %q, want a refusal saying %q", what, msg, want)
		return
	}
	t.Logf("%s: refused: %v", what, err)
}

// rawGet is GET path on a socket: the response's metadata as incusd
// encoded it, and its ETag.
func rawGet(t *testing.T, sock, path string) (json.RawMessage, string) {
	t.Helper()
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}}
	defer hc.CloseIdleConnections()
	resp, err := hc.Get("http://incus" + path)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, "GET %s: %s", path, body)
	var env struct {
		Metadata json.RawMessage `json:"metadata"`
	}
	require.NoError(t, json.Unmarshal(body, &env))
	return env.Metadata, resp.Header.Get("ETag")
}

// heldConns lists the connections between a process of uid and
// incus-user, as "pid (command)" of the user's end. sock_diag gives each
// connection's two socket inodes; /proc gives the inodes each process
// holds. (Not by the socket's path: the world's activator binds it under
// a temporary name.)
func heldConns(t *testing.T, h *stack.Host, uid uint32) []string {
	t.Helper()
	procs, err := accounts.Processes(uid)
	require.NoError(t, err)
	user := map[uint32]string{}
	for _, p := range procs {
		for _, ino := range socketInodes(p.PID) {
			user[ino] = fmt.Sprintf("%d (%s)", p.PID, p.Command)
		}
	}
	server := map[uint32]bool{}
	for _, p := range access.NewManager(h).IncusUsers() {
		for _, ino := range socketInodes(p.PID) {
			server[ino] = true
		}
	}
	socks, err := netlink.UnixSocketDiagInfo()
	require.NoError(t, err, "listing unix sockets (sock_diag)")
	var out []string
	for _, s := range socks {
		if s.Peer == nil || !server[s.DiagMsg.INode] {
			continue
		}
		if who, ok := user[*s.Peer]; ok {
			out = append(out, who)
		}
	}
	return out
}

// socketInodes are the inodes of the sockets a process holds open.
func socketInodes(pid int) []uint32 {
	fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	var out []uint32
	for _, fd := range fds {
		l, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()))
		var ino uint32
		if err == nil && strings.HasPrefix(l, "socket:[") {
			if _, err := fmt.Sscanf(l, "socket:[%d]", &ino); err == nil {
				out = append(out, ino)
			}
		}
	}
	return out
}

// grant runs box grant --json as root and returns its result.
func (e *tierEnv) grant(t *testing.T, u tierUser) (access.GrantResult, time.Duration) {
	t.Helper()
	start := time.Now()
	res := e.r.run(t, "grant", u.Name, "--json")
	took := time.Since(start)
	require.Equal(t, exitOK, res.code, "box grant %s: %s", u.Name, res.err)
	var g access.GrantResult
	require.NoError(t, json.Unmarshal([]byte(res.out), &g), res.out)
	return g, took
}

func TestSystemTier(t *testing.T) {
	e := tierWorld(t)
	ctx := context.Background()
	u1 := e.newUser(t)
	u2 := e.newUser(t)
	project1 := stack.TierProject(u1.UID)
	boxnet, _, err := e.c.Networks().Get(ctx, model.Current.Network)
	require.NoError(t, err)
	subnet, err := netip.ParsePrefix(boxnet.Config["ipv4.address"])
	require.NoError(t, err, "%s's ipv4.address", model.Current.Network)
	subnet = subnet.Masked()
	userBox := uniq(t)

	t.Run("GrantedUserMintsOnBoxnet", func(t *testing.T) {
		g, took := e.grant(t, u1)
		t.Logf("box grant %s: %s; did: %v", u1.Name, took.Round(time.Millisecond), g.Did)
		assert.Equal(t, project1, g.Project)
		assert.NotEmpty(t, g.Did, "a first grant does something")
		assert.True(t, groupMembers(t, stack.DefaultTierGroup)[u1.Name], "%s is in group %s after the grant", u1.Name, stack.DefaultTierGroup)

		ur := e.as(u1)
		start := time.Now()
		res := ur.run(t, "new", "--name", userBox)
		require.Equal(t, exitOK, res.code, "box new as %s: %s", u1.Name, res.err)
		t.Logf("box new as the granted user: %s", time.Since(start).Round(time.Millisecond))
		inst, _, err := e.c.Project(project1).Instances().Get(ctx, userBox)
		require.NoError(t, err, "the user's box is in project %s", project1)
		nics := 0
		for name, d := range inst.ExpandedDevices {
			if d["type"] == "nic" {
				nics++
				assert.Equal(t, model.Current.Network, d["network"], "NIC %s of the user's box", name)
			}
		}
		assert.Equal(t, 1, nics, "one NIC, on %s: %v", model.Current.Network, inst.ExpandedDevices)

		res = ur.run(t, "info", userBox, "--json")
		require.Equal(t, exitOK, res.code, "box info as %s: %s", u1.Name, res.err)
		var info infoResult
		require.NoError(t, json.Unmarshal([]byte(res.out), &info), res.out)
		require.Len(t, info.Addresses, 1, "box info as the user shows one address")
		addr, err := netip.ParseAddr(info.Addresses[0])
		require.NoError(t, err)
		assert.True(t, subnet.Contains(addr), "the user's box has %s, outside %s's subnet %s", addr, model.Current.Network, subnet)

		res = ur.run(t, "list", "--json")
		require.Equal(t, exitOK, res.code, res.err)
		assert.Contains(t, res.out, `"name": "`+userBox+`"`, "box list as the user shows their box")

		// No doors for a granted user's box: the project blocks proxies.
		res = ur.run(t, "expose", userBox, "8080")
		assert.Equal(t, exitFailed, res.code, "box expose as the granted user")
		assert.Contains(t, res.err, "restricted.devices.proxy=block")

		// An admin's box is unknown to the user.
		adminBox := uniq(t)
		t.Cleanup(func() {
			e.c.Instances().SetState(context.Background(), adminBox, "stop", 0, true) //nolint:errcheck
			if _, _, err := e.c.Instances().Get(context.Background(), adminBox); incus.IsNotFound(err) {
				return
			}
			if err := deleteEventually(e.c, adminBox); err != nil {
				t.Errorf("cleaning up %s: %v", adminBox, err)
			} else {
				t.Logf("cleanup: deleted the admin's box %s", adminBox)
			}
		})
		require.Equal(t, exitOK, e.r.run(t, "new", "--name", adminBox).code)
		res = ur.run(t, "info", adminBox)
		assert.Equal(t, exitFailed, res.code, "box info of an admin's box as the user")
		assert.Contains(t, res.err, "no box named "+adminBox, "refused as unknown, not for another reason")
		res = ur.run(t, "list", "--json")
		assert.NotContains(t, res.out, adminBox, "the user's list does not show the admin's box")
		res = e.r.run(t, "list", "--json")
		require.Equal(t, exitOK, res.code)
		assert.Contains(t, res.out, `"name": "`+adminBox+`"`, "the admin's list shows the admin's box")
		assert.NotContains(t, res.out, userBox, "the admin's list (project default) does not show the user's box")
		a, _, err := e.c.Instances().Get(ctx, adminBox)
		require.NoError(t, err)
		assert.Equal(t, "Running", a.Status, "the admin's box is untouched")
	})

	t.Run("GrantedUserShell", func(t *testing.T) {
		// box shell as the granted user, handed over for real: the incus
		// CLI, run as the user, reaches their box through incus-user's
		// socket and their project (incusd's socket is closed to them).
		ur := e.as(u1).with("HOME", u1.home)
		ur.stdin = "id -un; hostname\n"
		res := ur.run(t, "shell", userBox)
		require.Equal(t, exitOK, res.code, "box shell as %s: %s", u1.Name, res.err)
		assert.Contains(t, res.err, "+ incus --project "+project1+" exec local:"+userBox+" -- su -l ", "the handover names the remote and the user's project")
		assert.Equal(t, "dev\n"+userBox+"\n", res.out, "the shell ran as the template's user in the user's box")
		res = ur.run(t, "incus", userBox, "--", "exec", "{}", "--", "cat", "/proc/sys/kernel/hostname")
		require.Equal(t, exitOK, res.code, "box incus as %s: %s", u1.Name, res.err)
		assert.Equal(t, userBox+"\n", res.out)
	})

	t.Run("OtherNetworksRefused", func(t *testing.T) {
		decoy := "bxtd" + uniq(t)[len("t-cli-"):]
		require.NoError(t, e.c.Networks().Create(ctx, incus.NetworksPost{Name: decoy, Type: "bridge",
			Config: map[string]string{"ipv4.address": "none", "ipv6.address": "none"}}))
		t.Cleanup(func() {
			if err := e.c.Networks().Delete(context.Background(), decoy); err != nil {
				t.Errorf("deleting the decoy network %s: %v", decoy, err)
			} else {
				t.Logf("cleanup: deleted the decoy network %s", decoy)
			}
		})
		uc := e.host.AsUser(u1.User, e.incusGID)
		inst, etag, err := uc.Instances().Get(ctx, userBox)
		require.NoError(t, err, "as the user, their own box is readable (else the refusals below prove nothing)")

		put := inst.Writable()
		if put.Devices == nil {
			put.Devices = map[string]map[string]string{}
		}
		put.Devices["eth9"] = map[string]string{"type": "nic", "network": decoy}
		refusedFor(t, "a NIC on the managed network "+decoy, uc.Instances().Update(ctx, userBox, put, etag), "Network not allowed in project")

		stray := "bxtn" + uniq(t)[len("t-cli-"):]
		err = uc.Networks().Create(ctx, incus.NetworksPost{Name: stray, Type: "bridge",
			Config: map[string]string{"ipv4.address": "none", "ipv6.address": "none"}})
		if err == nil {
			t.Cleanup(func() { _ = e.c.Networks().Delete(context.Background(), stray) })
		}
		refusedFor(t, "creating the network "+stray, err, "Network not allowed in project")

		put = inst.Writable()
		if put.Devices == nil {
			put.Devices = map[string]map[string]string{}
		}
		put.Devices["eth8"] = map[string]string{"type": "nic", "nictype": "bridged", "parent": model.Current.Network}
		refusedFor(t, "a bridged NIC with parent "+model.Current.Network, uc.Instances().Update(ctx, userBox, put, ""), "Only managed network devices are allowed")

		after, _, err := e.c.Project(project1).Instances().Get(ctx, userBox)
		require.NoError(t, err)
		assert.Equal(t, inst.Devices, after.Devices, "the user's box has the devices it had")
		_, _, err = e.c.Networks().Get(ctx, stray)
		assert.True(t, incus.IsNotFound(err), "no network %s: %v", stray, err)
	})

	t.Run("GrantTwiceChangesNothing", func(t *testing.T) {
		e.grant(t, u1) // granted already, unless an earlier subtest failed
		before, etagBefore := rawGet(t, e.c.Socket(), "/1.0/projects/"+project1)
		g, took := e.grant(t, u1)
		after, etagAfter := rawGet(t, e.c.Socket(), "/1.0/projects/"+project1)
		t.Logf("the second box grant: %s", took.Round(time.Millisecond))
		assert.Empty(t, g.Did, "a second grant does nothing")
		assert.Empty(t, g.RestartedIncusUser, "nor restarts incus-user")
		var cb, ca struct {
			Config json.RawMessage `json:"config"`
		}
		require.NoError(t, json.Unmarshal(before, &cb))
		require.NoError(t, json.Unmarshal(after, &ca))
		assert.Equal(t, string(cb.Config), string(ca.Config), "the project's config is byte for byte the same")
		assert.Equal(t, etagBefore, etagAfter, "the project's ETag is the same")
		res := e.r.run(t, "grant", u1.Name)
		require.Equal(t, exitOK, res.code, res.err)
		assert.Contains(t, res.out, "already granted; nothing changed")
	})

	t.Run("FailedGrantIsBackedOut", func(t *testing.T) {
		// A directory the user may enter: the dial finds no socket there,
		// rather than being kept out.
		dir, err := os.MkdirTemp("", "bxt-nosock-")
		require.NoError(t, err)
		t.Cleanup(func() { os.RemoveAll(dir) })
		require.NoError(t, os.Chmod(dir, 0o755))
		dead := filepath.Join(dir, "nothing-listens.socket")
		start := time.Now()
		res := e.r.with("BOX_INCUS_USER_SOCKET", dead).run(t, "grant", u2.Name)
		t.Logf("the failed box grant: %s", time.Since(start).Round(time.Millisecond))
		assert.Equal(t, exitFailed, res.code, "a grant whose check as the user fails")
		assert.Contains(t, res.err, "no incus-user answers on "+dead, "it failed at its last step, the check as the user")
		assert.Contains(t, res.err, "the grant was backed out", "it says it was backed out")
		assert.False(t, groupMembers(t, stack.DefaultTierGroup)[u2.Name], "%s is not in group %s (/etc/group)", u2.Name, stack.DefaultTierGroup)
		_, _, err = e.c.Projects().Get(ctx, stack.TierProject(u2.UID))
		assert.True(t, incus.IsNotFound(err), "no project %s: %v", stack.TierProject(u2.UID), err)
		certs, err := e.c.Certificates(ctx)
		require.NoError(t, err)
		for _, tc := range certs {
			assert.NotEqual(t, certName(u2.UID), tc.Name, "no trusted certificate of uid %d", u2.UID)
		}
		state := filepath.Join(e.incusDir, "users", fmt.Sprint(u2.UID))
		_, err = os.Lstat(state)
		assert.True(t, errors.Is(err, os.ErrNotExist), "no %s: %v", state, err)
		assert.Empty(t, e.tierLeft(t, u2.User), "nothing of %s's tier", u2.Name)
	})

	t.Run("RevokeWarnsOfHeldSessions", func(t *testing.T) {
		res := e.r.run(t, "revoke", u1.Name)
		require.Equal(t, exitOK, res.code, res.err)
		assert.Contains(t, res.err, "keep the group", "the warning says held sessions keep the group")
		assert.Contains(t, res.err, "loginctl terminate-user "+u1.Name, "and how to end them")
		assert.False(t, groupMembers(t, stack.DefaultTierGroup)[u1.Name], "%s left group %s", u1.Name, stack.DefaultTierGroup)
		p, _, err := e.c.Projects().Get(ctx, project1)
		require.NoError(t, err, "a plain revoke keeps the project")
		assert.Equal(t, stack.TierRevoked, p.Config[stack.KeyTier])
		_, _, err = e.c.Project(project1).Instances().Get(ctx, userBox)
		assert.NoError(t, err, "and the user's box")
	})

	t.Run("PurgeEndsSessionsAndStaysPurged", func(t *testing.T) {
		g, took := e.grant(t, u1)
		t.Logf("box grant %s again after the revoke: %s; did: %v", u1.Name, took.Round(time.Millisecond), g.Did)

		// A session of the user's, holding incus-user's socket open.
		// The incus CLI holds a session on incus-user's socket.
		incusCLI := testenv.Tool(t, "incus", "incus-client")
		// incus monitor holds one connection for as long as it runs. Any
		// box grant on the host restarts incus-user, which drops every
		// connection it proxies (other tests share the world): the session
		// connects again, as a person's would, and lives on.
		var holderOut syncbuf.Buffer
		holder := exec.Command("/bin/sh", "-c", `while :; do "$0" monitor --project "$1"; sleep 0.2; done`, incusCLI, project1)
		holder.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "HOME=" + u1.home, "INCUS_DIR=" + e.incusDir}
		holder.Dir = u1.home
		holder.Stdout, holder.Stderr = &holderOut, &holderOut
		holder.SysProcAttr = &syscall.SysProcAttr{Credential: e.cred(u1)}
		require.NoError(t, holder.Start())
		exited := make(chan struct{})
		var holderErr error
		go func() { holderErr = holder.Wait(); close(exited) }()
		t.Cleanup(func() {
			select {
			case <-exited:
			default:
				_ = holder.Process.Kill()
				<-exited
				t.Logf("cleanup: killed the session holder (pid %d)", holder.Process.Pid)
			}
		})
		deadline := time.Now().Add(15 * time.Second)
		var held []string
		for len(held) == 0 {
			select {
			case <-exited:
				t.Fatalf("the session holder as %s exited (%v): %s", u1.Name, holderErr, holderOut.String())
			default:
			}
			if time.Now().After(deadline) {
				t.Fatalf("no process of %s holds a connection to incus-user (%v) 15s after starting incus monitor: %s", u1.Name, access.NewManager(e.host).IncusUsers(), holderOut.String())
			}
			time.Sleep(50 * time.Millisecond)
			held = heldConns(t, e.host, u1.UID)
		}
		t.Logf("as %s, %v holds a connection to incus-user through %s (session pid %d)", u1.Name, held, e.userSock, holder.Process.Pid)

		start := time.Now()
		res := e.r.run(t, "revoke", "--purge", u1.Name, "--json")
		purgeTook := time.Since(start)
		require.Equal(t, exitOK, res.code, "box revoke --purge %s: %s", u1.Name, res.err)
		t.Logf("box revoke --purge with a session held open: %s", purgeTook.Round(time.Millisecond))
		var rr access.RevokeResult
		require.NoError(t, json.Unmarshal([]byte(res.out), &rr), res.out)
		assert.True(t, slices.ContainsFunc(rr.Ended, func(p accounts.Process) bool { return p.PID == holder.Process.Pid }),
			"the purge names the holder (pid %d) among the processes it ended: %v", holder.Process.Pid, rr.Ended)
		select {
		case <-exited:
			t.Logf("the session holder exited: %v; it said: %s", holderErr, holderOut.String())
			var ee *exec.ExitError
			if assert.ErrorAs(t, holderErr, &ee, "the holder was ended, not finished") {
				ws, _ := ee.Sys().(syscall.WaitStatus)
				assert.True(t, ws.Signaled(), "the holder ended by a signal: %v", ws)
			}
		case <-time.After(10 * time.Second):
			t.Errorf("the session holder (pid %d) still runs 10s after the purge", holder.Process.Pid)
		}

		for _, what := range e.tierLeft(t, u1.User) {
			t.Errorf("after the purge: %s is left", what)
		}
		_, _, err = e.c.Project(project1).Instances().Get(ctx, userBox)
		assert.True(t, incus.IsNotFound(err), "no box %s: %v", userBox, err)
		all, err := e.c.Instances().All(ctx)
		require.NoError(t, err)
		for _, in := range all {
			assert.NotEqual(t, userBox, in.Name, "the user's box is in no project")
		}
		tomb := filepath.Join(e.incusDir, "users", fmt.Sprint(u1.UID))
		fi, err := os.Lstat(tomb)
		if assert.NoError(t, err, "the tombstone %s", tomb) {
			assert.True(t, fi.Mode().IsRegular(), "the tombstone %s is a regular file (%s)", tomb, fi.Mode())
		}

		// The trap: a stale session still holding the group touches
		// incus-user, whose stock setup must fail on the tombstone.
		stale := e.host.AsUser(u1.User, e.incusGID)
		sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		p, _, err := stale.Projects().Get(sctx, project1)
		cancel()
		t.Logf("a stale session of %s after the purge: GET project %s: %v", u1.Name, project1, err)
		assert.Error(t, err, "a stale session reached project %s after the purge: %+v", project1, p)
		time.Sleep(time.Second) // anything incus-user did, it did before answering; a margin all the same
		_, _, err = e.c.Projects().Get(ctx, project1)
		assert.True(t, incus.IsNotFound(err), "after the stale touch: no project %s: %v", project1, err)
		_, _, err = e.c.Networks().Get(ctx, stack.TierBridge(u1.UID))
		assert.True(t, incus.IsNotFound(err), "after the stale touch: no network %s: %v", stack.TierBridge(u1.UID), err)

		// The positive control: the same touch for a uid never granted and
		// never purged does reach incus-user's stock setup, so the trap
		// above could have failed.
		fresh := u2
		if left := e.tierLeft(t, u2.User); len(left) > 0 {
			t.Logf("%s has %v (an earlier subtest failed): a third user stands in", u2.Name, left)
			fresh = e.newUser(t)
		} else if _, err := os.Lstat(filepath.Join(e.incusDir, "users", fmt.Sprint(u2.UID))); err == nil {
			t.Logf("%s has incus-user state (an earlier subtest failed): a third user stands in", u2.Name)
			fresh = e.newUser(t)
		}
		fp, fb := stack.TierProject(fresh.UID), stack.TierBridge(fresh.UID)
		sctx, cancel = context.WithTimeout(ctx, 30*time.Second)
		_, _, err = e.host.AsUser(fresh.User, e.incusGID).Projects().Get(sctx, fp)
		cancel()
		t.Logf("the same touch for %s (uid %d, never granted): GET project %s: %v", fresh.Name, fresh.UID, fp, err)
		sp, _, err := e.c.Projects().Get(ctx, fp)
		require.NoError(t, err, "the touch for a fresh uid made incus-user set up its stock project %s: else the trap proves nothing", fp)
		assert.Empty(t, sp.Config[stack.KeyTier], "incus-user's stock project, never narrowed by box")
		if _, _, err := e.c.Networks().Get(ctx, fb); err == nil {
			t.Logf("incus-user's stock setup made the private bridge %s too", fb)
		}
		_, d := doctorOf(t, e.r)
		found := false
		for _, f := range d.Verification.Findings {
			if f.Layer == model.LayerTier && f.Object == "project "+fp {
				found = true
				t.Logf("doctor: %s: %s (fix: %s)", f.Object, f.Problem, f.Fix)
			}
		}
		assert.True(t, found, "box doctor names the stock project %s (layer %s): %v", fp, model.LayerTier, d.Verification.Findings)
		purged := false
		for _, tr := range d.Verification.Tiers {
			if tr.UID == u1.UID {
				purged = tr.State == stack.TierPurged
			}
		}
		assert.True(t, purged, "box doctor lists uid %d as purged: %+v", u1.UID, d.Verification.Tiers)

		start = time.Now()
		res = e.r.run(t, "revoke", "--purge", fresh.Name)
		require.Equal(t, exitOK, res.code, "box revoke --purge %s removes the stock project: %s", fresh.Name, res.err)
		t.Logf("box revoke --purge of a stock project: %s", time.Since(start).Round(time.Millisecond))
		for _, what := range e.tierLeft(t, fresh.User) {
			t.Errorf("after purging %s: %s is left", fresh.Name, what)
		}
	})
}
