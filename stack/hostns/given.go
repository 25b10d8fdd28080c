package hostns

import (
	"net/netip"
	"sync"
	"time"
)

// An address set on a box that has not started yet is in no pin and no
// lease, so a pick from the kernel alone would hand it out again and
// Incus would refuse the second box ("already defined on another NIC"):
// beside many boxes each such refusal costs a read of the whole fleet.
// This process remembers what it handed out (under AddressLock) for
// givenFor, by the bridge's namespace; another process's picks are
// still caught by Incus's refusal.

// givenFor is how long a handed-out address is remembered: longer than
// any start takes to pin it.
var givenFor = 2 * time.Minute

var given = struct {
	sync.Mutex
	at map[string]map[netip.Addr]time.Time // namespace -> address -> when
}{at: map[string]map[netip.Addr]time.Time{}}

// NoteGiven remembers that this process set addr on a box of the bridge
// in namespace ns ("" is this process's own).
func NoteGiven(ns string, addr netip.Addr) {
	given.Lock()
	defer given.Unlock()
	if given.at[ns] == nil {
		given.at[ns] = map[netip.Addr]time.Time{}
	}
	given.at[ns][addr] = time.Now()
}

// Given is the set of addresses this process set on boxes of the bridge
// in namespace ns within givenFor, forgetting older ones.
func Given(ns string) map[netip.Addr]bool {
	given.Lock()
	defer given.Unlock()
	out := map[netip.Addr]bool{}
	for a, t := range given.at[ns] {
		if time.Since(t) > givenFor {
			delete(given.at[ns], a)
			continue
		}
		out[a] = true
	}
	return out
}

// ForgetGiven forgets what this process handed out on the bridge in
// namespace ns, as if another process had: for tests of the pick that
// does not know.
func ForgetGiven(ns string) {
	given.Lock()
	defer given.Unlock()
	delete(given.at, ns)
}
