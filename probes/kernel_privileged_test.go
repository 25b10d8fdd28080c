package probes

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// agentAs runs the test binary as the agent under uid/gid with one plan
// of kernel probes and returns its report.
func agentAs(t *testing.T, uid uint32, probes ...ProbeSpec) *Report {
	t.Helper()
	exe := exeFor(t, uid)
	plan, err := json.Marshal(Plan{Version: PlanVersion, DeadlineMS: 5000, Probes: probes})
	require.NoError(t, err)
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), agentEnv+"=1", "GORACE=atexit_sleep_ms=0")
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid}}
	cmd.Stdin = bytes.NewReader(plan)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	require.NoError(t, cmd.Run(), "agent: %s", errb.String())
	rep, err := DecodeReport(&out)
	require.NoError(t, err)
	return rep
}

// exeFor copies the test binary where uid may run it (the build's own
// folder is root's alone).
func exeFor(t *testing.T, uid uint32) string {
	t.Helper()
	exe, err := os.Executable()
	require.NoError(t, err)
	dir, err := os.MkdirTemp("", "drill-probes-")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	require.NoError(t, os.Chmod(dir, 0o755))
	b, err := os.ReadFile(exe)
	require.NoError(t, err)
	out := filepath.Join(dir, "probes.test")
	require.NoError(t, os.WriteFile(out, b, 0o755))
	return out
}

// TestPrivilegedKernelProbesRefused: as a user who is not root, the
// host's own sysctls are refused to a writer at open, and a file of the
// user's own is not (the control: the same open does succeed where the
// kernel allows it); nothing is written.
func TestPrivilegedKernelProbesRefused(t *testing.T) {
	requireRoot(t)
	before, err := os.ReadFile("/proc/sys/kernel/core_pattern")
	require.NoError(t, err)
	rep := agentAs(t, 65534,
		ProbeSpec{ID: "host", Kind: KindWriteOpen, DeadlineMS: 1000, Paths: []string{"/proc/sys/kernel/core_pattern", "/proc/sys/vm/drop_caches"}},
		ProbeSpec{ID: "own", Kind: KindWriteOpen, DeadlineMS: 1000, Paths: []string{"/proc/self/comm"}},
		ProbeSpec{ID: "ids", Kind: KindIDMap, DeadlineMS: 1000},
		ProbeSpec{ID: "caps", Kind: KindCapabilities, DeadlineMS: 1000})
	require.Len(t, rep.Observations, 4)
	host, own, ids, caps := rep.Observations[0], rep.Observations[1], rep.Observations[2], rep.Observations[3]
	assert.Equal(t, Rejected, host.Outcome, host.Reason)
	for _, f := range host.Evidence.Files {
		assert.True(t, f.Refused(), "%s", f)
	}
	assert.Equal(t, Reached, own.Outcome, own.Reason)
	assert.Equal(t, Reached, ids.Outcome)
	assert.Equal(t, "root in the box is host uid 0", ids.Reason, "no user namespace here: the initial map")
	assert.Empty(t, caps.Evidence.Caps.Effective, "a plain user has no capability")
	after, err := os.ReadFile("/proc/sys/kernel/core_pattern")
	require.NoError(t, err)
	assert.Equal(t, before, after, "nothing written")
}

// TestPrivilegedReleaseAgent: the probe's child makes its own user, mount
// and cgroup namespaces and mounts each of this process's cgroup v1
// hierarchies afresh. Its cgroup namespace roots each mount at this
// process's own cgroup, so it finds release_agent exactly where that is
// the hierarchy's root; nothing of its mounts is left.
func TestPrivilegedReleaseAgent(t *testing.T) {
	requireRoot(t)
	hs, err := v1Hierarchies("/proc/self/cgroup")
	require.NoError(t, err)
	if len(hs) == 0 {
		// A cgroup v2 host: nothing for the child to mount afresh.
		o := RunProbe(context.Background(), ProbeSpec{ID: "ra", Kind: KindReleaseAgent, DeadlineMS: 3000})
		require.NotNil(t, o.Evidence.ReleaseAgent, o.Reason)
		assert.Empty(t, o.Evidence.ReleaseAgent.Fresh, "no v1 hierarchy, no fresh mount")
		return
	}
	atRoot := map[string]bool{}
	b, _ := os.ReadFile("/proc/self/cgroup")
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		p := strings.SplitN(line, ":", 3)
		if len(p) == 3 && p[1] != "" {
			h := p[1]
			if strings.HasPrefix(h, "name=") {
				h = "none," + h
			}
			atRoot[h] = p[2] == "/"
		}
	}
	mountsBefore, _ := os.ReadFile("/proc/self/mountinfo")
	o := RunProbe(context.Background(), ProbeSpec{ID: "ra", Kind: KindReleaseAgent, DeadlineMS: 3000})
	ev := o.Evidence.ReleaseAgent
	require.NotNil(t, ev, o.Reason)
	require.Empty(t, ev.FreshError)
	require.Len(t, ev.Fresh, len(hs))
	for _, c := range ev.Fresh {
		require.True(t, c.Mounted, "%s: %s", c.Hierarchy, c.Errno)
		require.NotNil(t, c.ReleaseAgent)
		assert.Equal(t, !atRoot[c.Hierarchy], c.ReleaseAgent.Absent, "%s: release_agent is there exactly at a hierarchy's root", c.Hierarchy)
	}
	mountsAfter, _ := os.ReadFile("/proc/self/mountinfo")
	assert.Equal(t, string(mountsBefore), string(mountsAfter), "the child's mounts went with it")
	left, _ := filepath.Glob(filepath.Join(os.TempDir(), "drill-cgroup-*"))
	assert.Empty(t, left, "its mount points are removed")
}

// TestPrivilegedLoadsStopped: a load the kernel stops says so. The fork
// bomb runs as a user whose process limit (RLIMIT_NPROC, inherited) it
// meets; the disk fill writes into a 4 MiB tmpfs.
func TestPrivilegedLoadsStopped(t *testing.T) {
	requireRoot(t)
	// The soft limit only: the hard one may not be raised again without
	// CAP_SYS_RESOURCE. root itself is not held to it; the agent's user
	// is, counting its threads too.
	var old unix.Rlimit
	require.NoError(t, unix.Getrlimit(unix.RLIMIT_NPROC, &old))
	require.NoError(t, unix.Setrlimit(unix.RLIMIT_NPROC, &unix.Rlimit{Cur: 64, Max: old.Max}))
	t.Cleanup(func() { _ = unix.Setrlimit(unix.RLIMIT_NPROC, &old) })
	rep := agentAs(t, 65534, ProbeSpec{ID: "bomb", Kind: KindLoadProcs, Max: 200, DeadlineMS: 2000})
	require.NoError(t, unix.Setrlimit(unix.RLIMIT_NPROC, &old))
	bomb := rep.Observations[0]
	require.Equal(t, Rejected, bomb.Outcome, bomb.Reason)
	assert.Equal(t, "EAGAIN", bomb.Evidence.Load.StoppedBy)
	assert.Less(t, bomb.Evidence.Load.Reached, 64)
	assert.Positive(t, bomb.Evidence.Load.Tasks)

	dir := t.TempDir()
	require.NoError(t, unix.Mount("tmpfs", dir, "tmpfs", 0, "size=4m"))
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	fill := RunProbe(context.Background(), ProbeSpec{ID: "fill", Kind: KindLoadDisk, Max: 64, Paths: []string{dir}, DeadlineMS: 1500})
	require.Equal(t, Rejected, fill.Outcome, fill.Reason)
	assert.Equal(t, "ENOSPC", fill.Evidence.Load.StoppedBy)
	assert.LessOrEqual(t, fill.Evidence.Load.Reached, 4)
	left, _ := os.ReadDir(dir)
	assert.Empty(t, left, "its file is removed")
}
