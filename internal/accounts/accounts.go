// Package accounts reads and changes the local accounts an access tier
// rests on: users, the group incus-user serves, and a user's processes.
//
// Group membership goes through gpasswd (it locks /etc/group and keeps
// /etc/gshadow in step); reading is done from /etc/group directly. A
// process's supplementary groups are fixed at login, so removing a user
// from a group does nothing to what they already run: EndProcesses is how
// that access really ends, on a machine with or without logind.
package accounts

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// User is a local account.
type User struct {
	Name string `json:"name"`
	UID  uint32 `json:"uid"`
	GID  uint32 `json:"gid"`
	Home string `json:"home"`
}

// Lookup finds a local user by name or numeric uid.
func Lookup(nameOrUID string) (User, error) {
	u, err := user.Lookup(nameOrUID)
	if err != nil {
		if _, nerr := strconv.ParseUint(nameOrUID, 10, 32); nerr == nil {
			u, err = user.LookupId(nameOrUID)
		}
	}
	if err != nil {
		return User{}, fmt.Errorf("no local user %q: create the account first (useradd)", nameOrUID)
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return User{}, fmt.Errorf("user %s has uid %q: %w", u.Username, u.Uid, err)
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return User{}, fmt.Errorf("user %s has gid %q: %w", u.Username, u.Gid, err)
	}
	return User{Name: u.Username, UID: uint32(uid), GID: uint32(gid), Home: u.HomeDir}, nil
}

// GroupPath is the group database read by GroupGID and Members.
var GroupPath = "/etc/group"

// group reads one group's line from the group database.
func group(name string) (gid uint32, members []string, err error) {
	f, err := os.Open(GroupPath)
	if err != nil {
		return 0, nil, fmt.Errorf("reading %s: %w", GroupPath, err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Split(sc.Text(), ":")
		if len(fields) != 4 || fields[0] != name {
			continue
		}
		g, err := strconv.ParseUint(fields[2], 10, 32)
		if err != nil {
			return 0, nil, fmt.Errorf("group %s in %s has gid %q", name, GroupPath, fields[2])
		}
		for _, m := range strings.Split(fields[3], ",") {
			if m = strings.TrimSpace(m); m != "" {
				members = append(members, m)
			}
		}
		return uint32(g), members, nil
	}
	if err := sc.Err(); err != nil {
		return 0, nil, fmt.Errorf("reading %s: %w", GroupPath, err)
	}
	return 0, nil, &NoGroupError{Group: name}
}

// NoGroupError is a group the machine does not have.
type NoGroupError struct{ Group string }

func (e *NoGroupError) Error() string {
	return fmt.Sprintf("there is no group %s: install incus (its package creates the group incus-user serves) or name the group with --group", e.Group)
}

// GroupGID is the gid of a group.
func GroupGID(name string) (uint32, error) {
	gid, _, err := group(name)
	return gid, err
}

// Members lists a group's supplementary members (not users whose primary
// group it is).
func Members(name string) ([]string, error) {
	_, m, err := group(name)
	return m, err
}

// InGroup reports whether user is a supplementary member of the group.
func InGroup(userName, groupName string) (bool, error) {
	m, err := Members(groupName)
	if err != nil {
		return false, err
	}
	return slices.Contains(m, userName), nil
}

// AddToGroup makes the user a member of the group (gpasswd -a).
func AddToGroup(userName, groupName string) error {
	return gpasswd("-a", userName, groupName)
}

// RemoveFromGroup takes the user out of the group (gpasswd -d); a user who
// is not a member is left as is.
func RemoveFromGroup(userName, groupName string) error {
	in, err := InGroup(userName, groupName)
	if err != nil || !in {
		return err
	}
	return gpasswd("-d", userName, groupName)
}

func gpasswd(flag, userName, groupName string) error {
	out, err := exec.Command("gpasswd", flag, userName, groupName).CombinedOutput()
	if err != nil {
		return fmt.Errorf("gpasswd %s %s %s: %w: %s", flag, userName, groupName, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// Process is a live process that runs as a user.
type Process struct {
	PID     int    `json:"pid"`
	Command string `json:"command"`
}

// Processes lists the live processes any of whose uids (real, effective,
// saved, filesystem) is uid. Zombies hold nothing and are left out.
func Processes(uid uint32) ([]Process, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, fmt.Errorf("listing processes: %w", err)
	}
	want := strconv.FormatUint(uint64(uid), 10)
	var out []Process
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "status"))
		if err != nil {
			continue // gone meanwhile
		}
		var name string
		mine, zombie := false, false
		for _, line := range strings.Split(string(b), "\n") {
			k, v, _ := strings.Cut(line, ":")
			switch k {
			case "Name":
				name = strings.TrimSpace(v)
			case "State":
				zombie = strings.HasPrefix(strings.TrimSpace(v), "Z")
			case "Uid":
				mine = slices.Contains(strings.Fields(v), want)
			}
		}
		if mine && !zombie {
			out = append(out, Process{PID: pid, Command: name})
		}
	}
	return out, nil
}

// LogindRunning reports whether systemd-logind manages sessions here.
func LogindRunning() bool {
	_, err := os.Stat("/run/systemd/seats")
	return err == nil
}

// EndSessions ends everything the user runs: their logind sessions first
// where logind runs, then every process left, stopped (so none can fork
// while the rest are found) and killed, until none is left or limit
// passes. It returns the processes that would not end.
func EndSessions(u User, limit time.Duration) ([]Process, error) {
	if u.UID == 0 {
		return nil, errors.New("refusing to end root's processes")
	}
	if LogindRunning() {
		// Not being logged in is no failure: the signals below still run.
		_ = exec.Command("loginctl", "terminate-user", u.Name).Run()
	}
	deadline := time.Now().Add(limit)
	for {
		procs, err := Processes(u.UID)
		if err != nil {
			return nil, err
		}
		if len(procs) == 0 {
			return nil, nil
		}
		if time.Now().After(deadline) {
			return procs, nil
		}
		for _, p := range procs {
			_ = syscall.Kill(p.PID, syscall.SIGSTOP)
		}
		for _, p := range procs {
			_ = syscall.Kill(p.PID, syscall.SIGKILL)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
