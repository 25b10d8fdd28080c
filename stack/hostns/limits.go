package hostns

import (
	"bufio"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/box-isolation/box/stack/model"
)

// The host's limits: global kernel settings a host with many boxes needs
// raised, which Incus's production settings (its "server settings"
// reference) ask more of than a kernel's defaults. box names each one below
// what the instances on the host need (doctor's and setup-host's notes:
// capacity, not isolation, so no claim rests on them) and raises it only
// when asked (box doctor --fix, on a real host).
// docs/design.md, "The host's limits".

// hostLimit is one such setting.
type hostLimit struct {
	key        string // sysctl name
	production int64  // Incus's production value
}

// The keyring quotas of a non-root user: every container's init joins a
// session keyring of its own, owned by the boxes' shared root user (the
// host's uid 1000000 under Incus's default idmap), so the boxes of a host
// share one user's quota: one key (and its few bytes) per box, measured
// (docs/measurements.md, "A busy host"). Incus asks for more on a host
// with many instances; the kernel here (6.18) let that user past the
// quota (measured), so box names a low one and fails nothing on it.
var (
	limitMaxKeys  = hostLimit{"kernel.keys.maxkeys", 2000}
	limitMaxBytes = hostLimit{"kernel.keys.maxbytes", 2000000}
)

// KeyUse is what the busiest non-root user of the host's keyrings holds
// (/proc/key-users).
type KeyUse struct {
	Keys, Bytes int64
}

// readKeyUse reads /proc/key-users' busiest non-root user.
func readKeyUse(path string) (KeyUse, error) {
	f, err := os.Open(path)
	if err != nil {
		return KeyUse{}, err
	}
	defer f.Close()
	return parseKeyUsers(bufio.NewScanner(f))
}

// parseKeyUsers reads lines of /proc/key-users ("  uid:  usage
// nkeys/nikeys qnkeys/maxkeys qnbytes/maxbytes").
func parseKeyUsers(sc *bufio.Scanner) (KeyUse, error) {
	var u KeyUse
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 5 || f[0] == "0:" {
			continue
		}
		keys, _, _ := strings.Cut(f[3], "/")
		bytes, _, _ := strings.Cut(f[4], "/")
		k, kerr := strconv.ParseInt(keys, 10, 64)
		b, berr := strconv.ParseInt(bytes, 10, 64)
		if kerr != nil || berr != nil {
			return KeyUse{}, fmt.Errorf("reading key users: %q", sc.Text())
		}
		if k > u.Keys {
			u = KeyUse{Keys: k, Bytes: b}
		}
	}
	return u, sc.Err()
}

// limitNeeds is what n instances need of each limit, given the keys in use:
// a key per instance or as many as the busiest user holds, whichever is
// more, and room for a quarter more (at least 20), at the bytes per key in
// use (25 when none is).
func limitNeeds(n int, use KeyUse) map[hostLimit]int64 {
	keys := max(int64(n), use.Keys)
	keys += max(20, keys/4)
	perKey := int64(25)
	if use.Keys > 0 {
		perKey = max(1, (use.Bytes+use.Keys-1)/use.Keys)
	}
	return map[hostLimit]int64{limitMaxKeys: keys, limitMaxBytes: keys * perKey}
}

// lowLimit is a limit below what the instances need, and what to raise
// it to: Incus's production value, or the need where that is more.
type lowLimit struct {
	key             string
	value, need, to int64
	production      int64
}

// lowLimits lists the limits below what n instances need.
func lowLimits(n int, use KeyUse, value func(key string) (int64, error)) []lowLimit {
	needs := limitNeeds(n, use)
	var out []lowLimit
	for _, l := range []hostLimit{limitMaxKeys, limitMaxBytes} {
		v, err := value(l.key)
		if err != nil || v >= needs[l] {
			continue // no such setting here, or enough
		}
		out = append(out, lowLimit{key: l.key, value: v, need: needs[l], to: max(l.production, needs[l]), production: l.production})
	}
	return out
}

// limitNotes names each limit below what n instances need, with what
// fixes it.
func limitNotes(n int, use KeyUse, low []lowLimit) []string {
	var out []string
	for _, l := range low {
		out = append(out, fmt.Sprintf("sysctl %s is %d, below what the %d instances on this host need (%d: a session keyring per box, of the boxes' shared root user, which holds %d keys and %d bytes now, and room for more); Incus's production settings ask for %d. Fix: box doctor --fix raises it to %d, on this host's kernel and in %s for its next boot (it is global: every user's); or by hand: sysctl -w %s=%d",
			l.key, l.value, n, l.need, use.Keys, use.Bytes, l.production, l.to, DefaultSysctlFile, l.key, l.to))
	}
	return out
}

// DefaultSysctlFile is where doctor --fix keeps the limits it raised for
// the host's next boot.
const DefaultSysctlFile = "/etc/sysctl.d/60-box.conf"

// sysctlPath is a setting's file under /proc/sys.
func sysctlPath(key string) string {
	return filepath.Join("/proc/sys", strings.ReplaceAll(key, ".", "/"))
}

// readSysctl reads an integer setting.
func readSysctl(key string) (int64, error) {
	b, err := os.ReadFile(sysctlPath(key))
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
}

// LimitNotes names the host's limits below what n instances need, read
// from this kernel (/proc/key-users, /proc/sys): doctor's and setup-host's
// notes. None when the keyrings cannot be read.
func LimitNotes(n int) []string {
	use, err := readKeyUse("/proc/key-users")
	if err != nil {
		return nil
	}
	return limitNotes(n, use, lowLimits(n, use, readSysctl))
}

// RaiseLimits raises each limit below what n instances need, on the
// kernel and in file (the host's sysctl file for its next boot), and says
// what it changed. A real host only:
// a world's kernel is the machine's, not its own.
func RaiseLimits(file string, n int) ([]model.Change, error) {
	use, err := readKeyUse("/proc/key-users")
	if err != nil {
		return nil, fmt.Errorf("reading the keyrings' use: %w", err)
	}
	low := lowLimits(n, use, readSysctl)
	if len(low) == 0 {
		return nil, nil
	}
	kept := map[string]string{}
	if b, err := os.ReadFile(file); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(l, "="); ok && !strings.HasPrefix(strings.TrimSpace(l), "#") {
				kept[strings.TrimSpace(k)] = strings.TrimSpace(v)
			}
		}
	}
	var changes []model.Change
	for _, l := range low {
		if err := os.WriteFile(sysctlPath(l.key), []byte(strconv.FormatInt(l.to, 10)), 0o644); err != nil {
			return changes, fmt.Errorf("raising %s to %d: %w", l.key, l.to, err)
		}
		kept[l.key] = strconv.FormatInt(l.to, 10)
		changes = append(changes, model.Change{Object: "sysctl " + l.key, Action: "raised", Detail: fmt.Sprintf("from %d to %d (and in %s)", l.value, l.to, file)})
	}
	var b strings.Builder
	b.WriteString("# Written by box doctor --fix: the limits a host with many boxes needs\n# (box's docs/design.md, \"The host's limits\").\n")
	for _, k := range slices.Sorted(maps.Keys(kept)) {
		fmt.Fprintf(&b, "%s = %s\n", k, kept[k])
	}
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		return changes, err
	}
	if err := os.WriteFile(file, []byte(b.String()), 0o644); err != nil {
		return changes, fmt.Errorf("keeping the raised limits in %s: %w", file, err)
	}
	return changes, nil
}
