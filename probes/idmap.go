package probes

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// An id_map probe reads the box's user namespace's id maps: which host ids
// its ids are. Root in a box that is root on the host is the end of every
// other boundary.

// HostID is the host id an id in the box is, and whether it is mapped.
func HostID(m []IDRange, inside uint32) (uint32, bool) {
	for _, r := range m {
		if inside >= r.Inside && uint64(inside) < uint64(r.Inside)+uint64(r.Count) {
			return r.Outside + (inside - r.Inside), true
		}
	}
	return 0, false
}

// HostHolds reports whether any id in the box is host id h.
func HostHolds(m []IDRange, h uint32) bool {
	for _, r := range m {
		if h >= r.Outside && uint64(h) < uint64(r.Outside)+uint64(r.Count) {
			return true
		}
	}
	return false
}

// Overlap reports whether two maps share a host id, and the first shared.
func Overlap(a, b []IDRange) (uint32, bool) {
	for _, x := range a {
		for _, y := range b {
			lo := max(uint64(x.Outside), uint64(y.Outside))
			hi := min(uint64(x.Outside)+uint64(x.Count), uint64(y.Outside)+uint64(y.Count))
			if lo < hi {
				return uint32(lo), true
			}
		}
	}
	return 0, false
}

func probeIDMap(obs Observation) Observation {
	ev := &IDMapEvidence{}
	var err error
	if ev.UID, err = readIDMap(filepath.Join(procRoot, "self/uid_map")); err != nil {
		return fail(obs, err.Error())
	}
	if ev.GID, err = readIDMap(filepath.Join(procRoot, "self/gid_map")); err != nil {
		return fail(obs, err.Error())
	}
	obs.Evidence.IDMap = ev
	root, ok := HostID(ev.UID, 0)
	switch {
	case !ok:
		return done(obs, Reached, "root in the box is mapped to no host uid")
	case root == 0:
		return done(obs, Reached, "root in the box is host uid 0")
	}
	return done(obs, Reached, fmt.Sprintf("root in the box is host uid %d", root))
}

// readIDMap parses an id map as the kernel writes it.
func readIDMap(file string) ([]IDRange, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", file, err)
	}
	return parseIDMap(string(b))
}

func parseIDMap(s string) ([]IDRange, error) {
	var out []IDRange
	for _, line := range strings.Split(strings.TrimSpace(s), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if len(f) != 3 {
			return nil, fmt.Errorf("id map line %q: want three numbers", line)
		}
		var n [3]uint32
		for i := range f {
			v, err := strconv.ParseUint(f[i], 10, 32)
			if err != nil {
				return nil, fmt.Errorf("id map line %q: %w", line, err)
			}
			n[i] = uint32(v)
		}
		out = append(out, IDRange{Inside: n[0], Outside: n[1], Count: n[2]})
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("the id map is empty")
	}
	return out, nil
}
