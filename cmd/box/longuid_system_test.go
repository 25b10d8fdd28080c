package main

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/internal/accounts"
	"github.com/box-isolation/box/stack"
	"github.com/box-isolation/box/stack/incus"
)

// newUserUID is newUser with a uid of 8 digits, as LDAP and SSSD hand out.
func (e *tierEnv) newUserUID(t *testing.T) tierUser {
	t.Helper()
	var b [8]byte
	_, err := rand.Read(b[:])
	require.NoError(t, err)
	uid := 20000000 + binary.LittleEndian.Uint32(b[:4])%1000000
	name := "bxl"
	for _, c := range b[4:] {
		name += string(rune('a' + c%26))
	}
	out, err := exec.Command("useradd", "--uid", fmt.Sprint(uid), "--no-create-home", "--no-log-init", "--shell", "/usr/sbin/nologin", name).CombinedOutput()
	require.NoError(t, err, "useradd %s: %s", name, out)
	u, err := accounts.Lookup(name)
	if err != nil {
		_ = exec.Command("userdel", name).Run()
		t.Fatalf("the user just made: %v", err)
	}
	home, err := os.MkdirTemp("", "bxl-home-")
	require.NoError(t, err)
	require.NoError(t, os.Chown(home, int(u.UID), int(u.GID)))
	tu := tierUser{User: u, home: home}
	t.Cleanup(func() { e.removeUser(t, tu) })
	t.Logf("made user %s (uid %d, gid %d)", u.Name, u.UID, u.GID)
	return tu
}

// TestSystemTierLongUID: a user whose uid has 8 digits touches incus-user,
// whose stock setup names their private bridge user-<uid> (incusbr-<uid>
// would pass the kernel's 15 characters); the census names that bridge,
// box grant removes it, box revoke --purge leaves nothing of the user.
func TestSystemTierLongUID(t *testing.T) {
	e := tierWorld(t)
	ctx := context.Background()
	u := e.newUserUID(t)
	project, bridge := stack.TierProject(u.UID), stack.TierBridge(u.UID)
	require.Equal(t, fmt.Sprintf("user-%d", u.UID), bridge)

	// incus-user's stock setup, as the user's first touch runs it. The
	// first touch starts incus-user, whose own start asks incusd a few
	// things: on the slow 2-CPU machine incusd once answered nothing for
	// 30 s while this test waited 30 s (incus-user's log: started, then
	// "Setting up for uid" 30 s later), so it waits longer and says how
	// long it took.
	sctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	began := time.Now()
	_, _, err := e.host.AsUser(u.User, e.incusGID).Projects().Get(sctx, project)
	cancel()
	t.Logf("%s touches incus-user: GET project %s after %s: %v", u.Name, project, time.Since(began).Round(time.Millisecond), err)
	_, _, err = e.c.Projects().Get(ctx, project)
	require.NoError(t, err, "incus-user set up its stock project %s", project)
	_, _, err = e.c.Networks().Get(ctx, bridge)
	require.NoError(t, err, "incus-user named %s's private bridge %s", u.Name, bridge)
	_, _, err = e.c.Networks().Get(ctx, fmt.Sprintf("incusbr-%d", u.UID))
	assert.True(t, incus.IsNotFound(err), "no bridge incusbr-%d (16 characters): %v", u.UID, err)

	_, d := doctorOf(t, e.r)
	found := false
	for _, f := range d.Verification.Findings {
		if f.Object == "project "+project {
			t.Logf("doctor: %s: %s (fix: %s)", f.Object, f.Problem, f.Fix)
			found = found || strings.Contains(f.Problem, "private NAT bridge "+bridge)
		}
	}
	assert.True(t, found, "doctor names the stock project's private bridge %s: %v", bridge, d.Verification.Findings)

	g, _ := e.grant(t, u)
	t.Logf("box grant %s: %s", u.Name, strings.Join(g.Did, "; "))
	assert.Equal(t, bridge, g.Bridge)
	assert.Contains(t, g.Did, "deleted the private bridge "+bridge)
	_, _, err = e.c.Networks().Get(ctx, bridge)
	assert.True(t, incus.IsNotFound(err), "after the grant: no network %s: %v", bridge, err)

	res := e.r.run(t, "revoke", "--purge", u.Name, "--json")
	require.Equal(t, exitOK, res.code, "box revoke --purge %s: %s", u.Name, res.err)
	for _, what := range e.tierLeft(t, u.User) {
		t.Errorf("after the purge: %s is left", what)
	}
}
