package probes

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// A capabilities probe reads the agent's capability sets and no_new_privs
// from /proc/self/status, with every capability named. In a box with its
// own user namespace the sets are over that namespace only; what they
// reach on the host depends on the id map (id_map).

// capNames are the capabilities by number (linux/capability.h).
var capNames = []string{
	"chown", "dac_override", "dac_read_search", "fowner", "fsetid", "kill", "setgid", "setuid",
	"setpcap", "linux_immutable", "net_bind_service", "net_broadcast", "net_admin", "net_raw",
	"ipc_lock", "ipc_owner", "sys_module", "sys_rawio", "sys_chroot", "sys_ptrace", "sys_pacct",
	"sys_admin", "sys_boot", "sys_nice", "sys_resource", "sys_time", "sys_tty_config", "mknod",
	"lease", "audit_write", "audit_control", "setfcap", "mac_override", "mac_admin", "syslog",
	"wake_alarm", "block_suspend", "audit_read", "perfmon", "bpf", "checkpoint_restore",
}

// CapNames names the capabilities of a mask ("cap_41" past the known).
func CapNames(mask uint64) []string {
	out := []string{}
	for i := 0; i < 64; i++ {
		if mask&(1<<i) == 0 {
			continue
		}
		if i < len(capNames) {
			out = append(out, capNames[i])
		} else {
			out = append(out, "cap_"+strconv.Itoa(i))
		}
	}
	return out
}

func probeCapabilities(obs Observation) Observation {
	ev, err := readCaps(filepath.Join(procRoot, "self/status"))
	if err != nil {
		return fail(obs, err.Error())
	}
	obs.Evidence.Caps = ev
	return done(obs, Reached, fmt.Sprintf("%d effective, %d bounding capabilities", len(ev.Effective), len(ev.Bounding)))
}

func readCaps(file string) (*CapsEvidence, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", file, err)
	}
	defer f.Close()
	ev := &CapsEvidence{}
	sets := map[string]*[]string{"CapEff": &ev.Effective, "CapPrm": &ev.Permitted, "CapInh": &ev.Inheritable, "CapBnd": &ev.Bounding, "CapAmb": &ev.Ambient}
	seen := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		v = strings.TrimSpace(v)
		if set, ok := sets[k]; ok {
			mask, err := strconv.ParseUint(v, 16, 64)
			if err != nil {
				return nil, fmt.Errorf("%s: %s %q: %w", file, k, v, err)
			}
			*set = CapNames(mask)
			seen++
		}
		if k == "NoNewPrivs" {
			ev.NoNewPrivs = v == "1"
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if seen != len(sets) {
		return nil, fmt.Errorf("%s has %d of the %d capability sets", file, seen, len(sets))
	}
	return ev, nil
}
