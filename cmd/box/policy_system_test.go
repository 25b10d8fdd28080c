package main

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/internal/testenv"
	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/model"
)

// policySpec is a box's policy as the policy test sets and reads it: its
// allowlist (nil: open), a TCP door to its port 8080, its CPUs and
// nesting.
type policySpec struct {
	allow   []string
	door    bool
	cpu     string
	nesting bool
}

func (p policySpec) String() string {
	s := "open"
	if p.allow != nil {
		s = "allow " + strings.Join(p.allow, ",")
	}
	return fmt.Sprintf("%s door=%v cpu=%s nesting=%v", s, p.door, p.cpu, p.nesting)
}

// TestSystemPolicyIsTheOperators (docs/design.md, "A box's policy is the
// operator's"): for each change of policy between a snapshot and now (an
// allowlist set, lifted or changed; a door added or removed; the CPUs
// raised or lowered; nesting on or off) and each verb (new --from the
// box, new --from its snapshot, export and import, rename, restore of
// the stopped box, restore of the running box, restore --with-policy),
// the box afterwards has the policy the rule says, proven from inside it
// where it can be (the allowed canary reached and the other refused, or
// both reached when open; the door answered, or refused, on the host's
// loopback; nproc in the box) and from its config for nesting, and box's
// output says what the other side held when it differed. An allowlisted
// box restored, running, to an open snapshot probes the other canary
// from its boot on and never reaches it (its control: open, the same
// probe does), nor after Incus alone stops and starts it, nor after Incus
// alone restores it (its allowlist is box's record's, whatever its config
// says).
func TestSystemPolicyIsTheOperators(t *testing.T) {
	r, c := worldBox(t)
	st := testenv.World(t)
	portWatcher(t, st, c)
	first, other := worldCanaries(st)
	cases := []struct {
		name      string
		then, now policySpec
		// bootProbe: the box probes the other canary from its boot on
		// (bootProbe), so a restore of the running box is watched from
		// inside: an allowlisted box restored to an open snapshot.
		bootProbe bool
	}{
		{"allowlist set, door added, cpu raised, nesting on",
			policySpec{cpu: "1"}, policySpec{allow: []string{first.name}, door: true, cpu: "2", nesting: true}, true},
		{"allowlist lifted, door removed, cpu lowered, nesting off",
			policySpec{allow: []string{first.name}, door: true, cpu: "2", nesting: true}, policySpec{cpu: "1"}, false},
		{"allowlist changed",
			policySpec{allow: []string{first.name}, cpu: "1"}, policySpec{allow: []string{other.name}, cpu: "1"}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			src, renamed, fromBox, fromSnap, imported := uniq(t), uniq(t), uniq(t), uniq(t), uniq(t)
			cleanup(t, c, src, renamed, fromBox, fromSnap, imported)
			hp := freeHostPort(t, st.Names.HostNS)
			set := policySetter(t, r, c, hp)
			require.Equal(t, exitOK, r.run(t, "new", "--name", src).code)
			if tc.bootProbe {
				bootProbe(t, c, src, other)
			}
			set(src, tc.then)
			if tc.bootProbe {
				// The probe's control: open, it reaches the other canary.
				assert.Positive(t, probed(t, r, src, other).Reached, "control: the open box's boot probe reaches %s", other.name)
			}
			require.Equal(t, exitOK, r.run(t, "snapshot", src, "s1").code)
			set(src, tc.now)
			check := policyChecker(t, r, c, st.Names.HostNS, hp, first, other)
			check(src, tc.now, "the source, now")
			now := tc.now
			now.door = false // a clone's and an import's doors stay behind

			res := r.run(t, "new", "--name", fromBox, "--from", src)
			require.Equal(t, exitOK, res.code, res.err)
			check(fromBox, now, "new --from the box")
			res = r.run(t, "new", "--name", fromSnap, "--from", src+"/s1")
			require.Equal(t, exitOK, res.code, res.err)
			assert.Contains(t, res.err, fromSnap+" took its source's current policy", "new --from the snapshot says so")
			check(fromSnap, now, "new --from the snapshot")

			file := filepath.Join(t.TempDir(), "b.tar.gz")
			require.Equal(t, exitOK, r.run(t, "export", src, file).code)
			res = r.run(t, "import", file, "--name", imported)
			require.Equal(t, exitOK, res.code, res.err)
			assert.Contains(t, res.out, imported+" took the file's policy: ")
			check(imported, now, "export and import")
			os.Remove(file) //nolint:errcheck

			require.Equal(t, exitOK, r.run(t, "down", src).code)
			require.Equal(t, exitOK, r.run(t, "rename", src, renamed).code)
			require.Equal(t, exitOK, r.run(t, "start", renamed).code)
			check(renamed, tc.now, "rename")
			stored, _, err := c.Networks().Get(context.Background(), model.Current.Network)
			require.NoError(t, err)
			assert.Contains(t, stored.Config, model.PolicyKey("", renamed), "the record follows the rename")
			assert.NotContains(t, stored.Config, model.PolicyKey("", src))

			require.Equal(t, exitOK, r.run(t, "down", renamed).code)
			res = r.run(t, "restore", renamed, "s1", "--force")
			require.Equal(t, exitOK, res.code, res.err)
			assert.Contains(t, res.out, renamed+" kept its current policy", "restore of the stopped box says so")
			require.Equal(t, exitOK, r.run(t, "start", renamed).code)
			check(renamed, tc.now, "restore of the stopped box")

			res = r.run(t, "restore", renamed, "s1", "--force")
			require.Equal(t, exitOK, res.code, res.err)
			assert.Contains(t, res.out, renamed+" kept its current policy", "restore of the running box says so")
			if tc.bootProbe {
				// From its boot on, the restored box never reached what its
				// policy does not allow: it never ran with the snapshot's.
				p := probed(t, r, renamed, other)
				assert.Zero(t, p.Reached, "the restored box reached %s from its boot on", other.name)
				assert.Positive(t, p.Refused, "its boot probe was answered (refused by the proxy)")
				// Stopped and started by Incus alone (incus start, as at the
				// host's boot): its current policy from its first frame on.
				ctx := context.Background()
				require.NoError(t, c.Instances().SetState(ctx, renamed, "stop", time.Minute, false))
				require.NoError(t, c.Instances().SetState(ctx, renamed, "start", 0, false))
				p = probed(t, r, renamed, other)
				assert.Zero(t, p.Reached, "started by Incus alone, the box reached %s from its boot on", other.name)
				assert.Positive(t, p.Refused, "its boot probe was answered (refused by the proxy)")
				// Restored by Incus alone, running, to its open snapshot
				// (incus snapshot restore): the box's config is the
				// snapshot's, its allowlist box's record's from its first
				// frame on; doctor names the difference, and box egress
				// puts the record's on the box.
				require.NoError(t, c.Instances().RestoreSnapshot(ctx, renamed, "s1"))
				inst, _, err := c.Instances().Get(ctx, renamed)
				require.NoError(t, err)
				require.Empty(t, inst.Config[model.KeyEgress], "the Incus-only restore rolled the box's config back to the open snapshot's")
				p = probed(t, r, renamed, other)
				assert.Zero(t, p.Reached, "restored by Incus alone, the box reached %s from its boot on", other.name)
				assert.Positive(t, p.Refused, "its boot probe was answered (refused by the proxy)")
				_, d := doctorOf(t, r)
				var named bool
				for _, f := range d.Verification.Findings {
					named = named || (f.Object == "box "+renamed && strings.Contains(f.Problem, "the record's is enforced"))
				}
				assert.True(t, named, "doctor names the box whose config says otherwise than its record: %v", d.Verification.Findings)
				set(renamed, tc.now)
				_, d = doctorOf(t, r)
				for _, f := range d.Verification.Findings {
					assert.NotEqual(t, "box "+renamed, f.Object, "after box egress, nothing of %s is named: %v", renamed, f)
				}
			}
			check(renamed, tc.now, "restore of the running box")

			res = r.run(t, "restore", renamed, "s1", "--with-policy", "--force")
			require.Equal(t, exitOK, res.code, res.err)
			assert.Contains(t, res.out, renamed+" took the snapshot's policy", "restore --with-policy says so")
			check(renamed, tc.then, "restore --with-policy")

			// box's record agrees with the box; a change through Incus
			// alone shows in box info as a difference from it.
			info := infoOf(t, r, renamed)
			require.NotNil(t, info.Recorded, "box info shows the record")
			assert.Empty(t, info.RecordDiffers, "the record is the box's policy")
			ctx := context.Background()
			inst, etag, err := c.Instances().Get(ctx, renamed)
			require.NoError(t, err)
			put := inst.Writable()
			put.Config["limits.processes"] = "77"
			require.NoError(t, c.Instances().Update(ctx, renamed, put, etag))
			info = infoOf(t, r, renamed)
			assert.Contains(t, info.RecordDiffers, "limits.processes: 2048 -> 77", "box info names a change through Incus alone")
		})
	}
}

// policySetter returns what sets a box's policy the ways an operator
// does: the allowlist and the door through box, the CPUs and nesting
// through Incus (box has no verb for them), the box stopped for those.
func policySetter(t *testing.T, r runner, c *incus.Client, hp int) func(name string, p policySpec) {
	return func(name string, p policySpec) {
		t.Helper()
		if p.allow == nil {
			require.Equal(t, exitOK, r.run(t, "egress", name, "open").code)
		} else {
			res := r.run(t, append([]string{"egress", name, "allow"}, p.allow...)...)
			require.Equal(t, exitOK, res.code, res.err)
		}
		doors := r.run(t, "expose", name, "--list")
		require.Equal(t, exitOK, doors.code, doors.err)
		has := strings.Contains(doors.out, "8080")
		switch {
		case p.door && !has:
			res := r.run(t, "expose", name, "8080", fmt.Sprint(hp), "--tcp")
			require.Equal(t, exitOK, res.code, res.err)
		case !p.door && has:
			require.Equal(t, exitOK, r.run(t, "expose", name, "--remove", "8080").code)
		}
		require.Equal(t, exitOK, r.run(t, "down", name).code)
		ctx := context.Background()
		inst, etag, err := c.Instances().Get(ctx, name)
		require.NoError(t, err)
		put := inst.Writable()
		put.Config = maps.Clone(put.Config)
		put.Config["limits.cpu"] = p.cpu
		delete(put.Config, "security.nesting")
		if p.nesting {
			model.WithNesting(put.Config)
		}
		require.NoError(t, c.Instances().Update(ctx, name, put, etag))
		require.Equal(t, exitOK, r.run(t, "start", name).code)
	}
}

// policyChecker returns what asserts a running box has policy p.
func policyChecker(t *testing.T, r runner, c *incus.Client, hostNS string, hp int, first, other canary) func(name string, p policySpec, after string) {
	return func(name string, p policySpec, after string) {
		t.Helper()
		// The source and what it became (renamed, restored) hold the
		// test's door port when they have a door; clones and imports never.
		sourceLine := !strings.HasPrefix(after, "new --from") && after != "export and import"
		inst, _, err := c.Instances().Get(context.Background(), name)
		require.NoError(t, err)
		got := model.PolicyOf(inst.Config, inst.Devices)
		t.Logf("%s: %s has %v (config: egress %s, limits.cpu=%s, doors %d, nesting %v)", after, name, p, got.EgressString(), got.Config["limits.cpu"], len(got.Doors), model.Nesting(inst.ExpandedConfig))
		assert.Equal(t, p.nesting, model.Nesting(inst.ExpandedConfig), "%s: nesting", after)
		// The CPUs, as the box's own kernel view has them.
		n := r.run(t, "exec", name, "--", "nproc")
		require.Equal(t, exitOK, n.code, n.err)
		assert.Equal(t, p.cpu, strings.TrimSpace(n.out), "%s: nproc in %s", after, name)
		// The allowlist, from inside.
		switch {
		case p.allow == nil:
			assert.True(t, reaches(t, r, name, first), "%s: open, %s reaches %s", after, name, first.name)
			assert.True(t, reaches(t, r, name, other), "%s: open, %s reaches %s", after, name, other.name)
		case p.allow[0] == first.name:
			blocked(t, r, name, other, first, after+": allowed "+first.name+" only")
		default:
			blocked(t, r, name, first, other, after+": allowed "+other.name+" only")
		}
		// The door, from the host's loopback: the test's host port is the
		// source's (renamed or restored), and no other box's.
		assert.Equal(t, p.door, len(got.Doors) == 1, "%s: %s's doors: %v", after, name, got.Doors)
		addr := fmt.Sprintf("127.0.0.1:%d", hp)
		switch {
		case p.door:
			hello := listenIn(t, r, name, 8080)
			greetSoon(t, hostNS, "tcp", addr, hello)
		case sourceLine:
			_, err := greet(hostNS, "tcp", addr, nil)
			assert.Error(t, err, "%s: no door to %s on %s", after, name, addr)
		}
	}
}

// bootProbe makes the box's PID 1 probe the canary c from its boot on
// (testenv.BootProbeInit), before the image's own init.
func bootProbe(t *testing.T, c *incus.Client, name string, cn canary) {
	t.Helper()
	ctx := context.Background()
	orig, err := c.Instances().PullFile(ctx, name, "/sbin/init")
	require.NoError(t, err)
	require.NoError(t, c.Instances().PushFile(ctx, name, "/sbin/init.orig", strings.NewReader(string(orig)), 0o755, 0, 0))
	require.NoError(t, c.Instances().PushFile(ctx, name, "/sbin/init", strings.NewReader(testenv.BootProbeInit(cn.name, cn.addr.String(), cn.name)), 0o755, 0, 0))
}

// probed reads the boot probe's log once it has a few answers.
func probed(t *testing.T, r runner, name string, cn canary) testenv.BootProbe {
	t.Helper()
	var p testenv.BootProbe
	for range 100 {
		res := r.run(t, "exec", name, "--", "cat", "/probe.log")
		require.Equal(t, exitOK, res.code, res.err)
		if p = testenv.ReadBootProbe(res.out, cn.greeting); p.Reached+p.Refused >= 3 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("%s's boot probe of %s: %s", name, cn.name, p)
	return p
}
