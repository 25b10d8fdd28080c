package probes

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/box-isolation/box/internal/mountinfo"
)

// A release_agent probe looks for the cgroup v1 release_agent as the box
// could reach it: the file the kernel runs as root on the host when a
// cgroup empties, so a box that can write it runs what it likes there.
// It exists only at a hierarchy's root. The probe opens for writing (and
// closes, writing nothing) every release_agent at the root of a cgroup v1
// mount the box has; then, as an attacker would, it makes a child in new
// user, mount and cgroup namespaces that mounts each of the box's
// hierarchies afresh and does the same there (its cgroup namespace roots
// them at the box's own cgroup, so no release_agent is there to find: that
// is what it checks). The child's mounts are private to it and go with it.

func probeReleaseAgent(ctx context.Context, obs Observation) Observation {
	ev := &ReleaseAgentEvidence{Mounted: []FileAttempt{}, Fresh: []CgroupTry{}}
	obs.Evidence.ReleaseAgent = ev
	mi, err := os.ReadFile(filepath.Join(procRoot, "self/mountinfo"))
	if err != nil {
		return fail(obs, fmt.Sprintf("reading mountinfo: %v", err))
	}
	for _, line := range strings.Split(string(mi), "\n") {
		pre, post, ok := strings.Cut(line, " - ")
		a, b := strings.Fields(pre), strings.Fields(post)
		if ok && len(a) >= 5 && len(b) >= 1 && b[0] == "cgroup" {
			ev.Mounted = append(ev.Mounted, openForWrite(filepath.Join(mountinfo.Unescape(a[4]), "release_agent")))
		}
	}
	ev.Fresh, err = freshCgroupMounts(ctx)
	if err != nil {
		ev.FreshError = err.Error()
	}
	if opened := ev.Opened(); len(opened) > 0 {
		return done(obs, Reached, "release_agent opened for writing: "+strings.Join(opened, ", "))
	}
	mounted := 0
	for _, c := range ev.Fresh {
		if c.Mounted {
			mounted++
		}
	}
	why := fmt.Sprintf("no release_agent opened for writing: %d cgroup v1 mount(s) of the box's, %d of %d hierarchies mounted afresh", len(ev.Mounted), mounted, len(ev.Fresh))
	if ev.FreshError != "" {
		why += " (the fresh mounts could not be tried: " + ev.FreshError + ")"
	}
	return done(obs, Rejected, why)
}

// freshCgroupMounts runs the child in new user, mount and cgroup
// namespaces (root in them is the agent's own uid) and reads its tries.
func freshCgroupMounts(ctx context.Context) ([]CgroupTry, error) {
	cmd := ChildCommand(childReleaseAgent)
	uid, gid := os.Geteuid(), os.Getegid()
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:  unix.CLONE_NEWUSER | unix.CLONE_NEWNS | unix.CLONE_NEWCGROUP,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: uid, Size: 1}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: gid, Size: 1}},
		Pdeathsig:   syscall.SIGKILL,
	}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Start(); err != nil {
		return []CgroupTry{}, fmt.Errorf("starting a child in new namespaces: %w", err)
	}
	stop := context.AfterFunc(ctx, func() { _ = cmd.Process.Kill() })
	defer stop()
	if err := cmd.Wait(); err != nil {
		return []CgroupTry{}, fmt.Errorf("the child: %v: %s", err, strings.TrimSpace(errb.String()))
	}
	tries := []CgroupTry{}
	if err := json.Unmarshal(out.Bytes(), &tries); err != nil {
		return []CgroupTry{}, fmt.Errorf("the child's answer: %w", err)
	}
	return tries, nil
}

// releaseAgentChild is the child's part: mount each cgroup v1 hierarchy
// this process is in, afresh, look for release_agent at the mount's root,
// and unmount it.
func releaseAgentChild(out io.Writer) error {
	// Nothing of the child's mounts may reach the box's namespace.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("making the child's mounts private: %w", err)
	}
	hs, err := v1Hierarchies(filepath.Join(procRoot, "self/cgroup"))
	if err != nil {
		return err
	}
	tries := []CgroupTry{}
	for _, h := range hs {
		t := CgroupTry{Hierarchy: h}
		dir, err := os.MkdirTemp("", "drill-cgroup-")
		if err != nil {
			return err
		}
		if err := unix.Mount("cgroup", dir, "cgroup", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, h); err != nil {
			t.Errno = attemptErr(dir, err).Errno
		} else {
			t.Mounted = true
			a := openForWrite(filepath.Join(dir, "release_agent"))
			a.Path = "release_agent"
			t.ReleaseAgent = &a
			_ = unix.Unmount(dir, unix.MNT_DETACH)
		}
		os.Remove(dir)
		tries = append(tries, t)
	}
	return json.NewEncoder(out).Encode(tries)
}

// v1Hierarchies reads /proc/self/cgroup's cgroup v1 hierarchies as mount
// options: "cpu,cpuacct", "none,name=systemd".
func v1Hierarchies(file string) ([]string, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 || parts[1] == "" {
			continue // cgroup v2's line has no controllers
		}
		opts := parts[1]
		if strings.HasPrefix(opts, "name=") {
			opts = "none," + opts
		}
		out = append(out, opts)
	}
	return out, sc.Err()
}
