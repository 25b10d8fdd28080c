package model

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// ClusterSliceBits is the size of a member's address slice in a /24.
const ClusterSliceBits = 27

// KeySlice prefixes a member's slice on the bridge's config.
const KeySlice = "user.box.slice."

// MaxMembers is how many members a /24 has slices for: the first slice is
// the gateway's and the dynamic range's.
const MaxMembers = 1<<(ClusterSliceBits-24) - 1

// SlicesOf reads the members' slices stored on the bridge's config.
func SlicesOf(cfg map[string]string) (map[string]netip.Prefix, error) {
	out := map[string]netip.Prefix{}
	for k, v := range cfg {
		if m, ok := strings.CutPrefix(k, KeySlice); ok {
			p, err := netip.ParsePrefix(v)
			if err != nil || p.Bits() != ClusterSliceBits {
				return nil, fmt.Errorf("the bridge's %s=%q is not a /%d: fix it with box setup-host after removing the key", k, v, ClusterSliceBits)
			}
			out[m] = p
		}
	}
	return out, nil
}

// AssignSlices gives every member without a slice the first free one of
// subnet, keeping every slice already given (boxes hold addresses in it).
func AssignSlices(subnet netip.Prefix, have map[string]netip.Prefix, members []string) (map[string]netip.Prefix, error) {
	out := map[string]netip.Prefix{}
	taken := map[netip.Prefix]bool{}
	for m, p := range have {
		out[m] = p
		taken[p] = true
	}
	all := AllSlices(subnet)
	for _, m := range slices.Sorted(slices.Values(members)) {
		if _, ok := out[m]; ok {
			continue
		}
		i := slices.IndexFunc(all[1:], func(p netip.Prefix) bool { return !taken[p] })
		if i < 0 {
			return nil, fmt.Errorf("member %s: every address slice of %s is given (a /24 has slices for %d members)", m, subnet, MaxMembers)
		}
		out[m] = all[1+i]
		taken[all[1+i]] = true
	}
	return out, nil
}

// AllSlices cuts subnet into its /27s.
func AllSlices(subnet netip.Prefix) []netip.Prefix {
	var out []netip.Prefix
	a := subnet.Masked().Addr()
	for i := 0; i < 1<<(ClusterSliceBits-subnet.Bits()); i++ {
		out = append(out, netip.PrefixFrom(a, ClusterSliceBits))
		for range 1 << (32 - ClusterSliceBits) {
			a = a.Next()
		}
	}
	return out
}

// DynamicRange is ipv4.dhcp.ranges on a cluster: the first slice after
// the gateway.
func DynamicRange(subnet netip.Prefix) string {
	first := AllSlices(subnet)[0]
	lo := first.Addr().Next().Next() // .1 is the gateway
	hi := LastOf(first)
	return lo.String() + "-" + hi.String()
}

// FreeAddress is the first address of slice that is not the bridge's
// own (gw), its subnet's network or broadcast address, or used.
func FreeAddress(slice, gw netip.Prefix, used map[netip.Addr]bool) (netip.Addr, bool) {
	for a := slice.Addr(); slice.Contains(a); a = a.Next() {
		if a == gw.Addr() || a == gw.Masked().Addr() || a == LastOf(gw) || used[a] {
			continue
		}
		return a, true
	}
	return netip.Addr{}, false
}

// LastOf is the last address of p.
func LastOf(p netip.Prefix) netip.Addr {
	a := p.Masked().Addr()
	for range 1<<(32-p.Bits()) - 1 {
		a = a.Next()
	}
	return a
}
