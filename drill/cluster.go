package drill

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"net/netip"
	"strings"

	"github.com/box-isolation/box/drill/topo"
	"github.com/box-isolation/box/internal/hostscan"
	"github.com/box-isolation/box/internal/nsrun"
	"github.com/box-isolation/box/stack"
	"github.com/box-isolation/box/stack/nft"
)

// On an Incus cluster the drill runs its usual probe boxes (box-a, box-b,
// clone-a, box-t, box-w) on the member it talks to, and one more probe box
// on every other member whose network namespace it can enter (the world's
// members; Host.Members.NetNS). Each member's bridge is its own L2 segment
// with the same subnet and gateway address, so a box can reach another
// member only through routing: from its own member's bridge, NATed to that
// member's cluster address, to another member's cluster address. Those are
// the cross-member pairs that could really be reached if isolation broke
// (the ACL drops private ranges on every member's bridge, and a member's
// host firewall drops only what arrives on its own boxnet, so another
// member's box arrives on the cluster interface): every member's box
// probes every other member's cluster address, the cluster API port among
// the listeners found there, each judged by that member's witnesses (the
// drill's listeners, the member's own probes of them, and a counting chain
// in that member's namespace keyed by the probe's source port, which the
// NAT keeps). A member's box also probes its own member's host addresses,
// as box-a does, so a member whose host layers are gone fails for that
// member.
//
// Box to box across members is not probed: box-a's and another member's
// box's addresses are in the same subnet, so box-a's kernel looks for the
// peer on its own member's bridge, where it is not; no route, NAT or
// bridge joins two members' bridges. A probe there could not fail whatever
// the stack did, so it would prove nothing (docs/claims.md, "Evidence rules").

// MemberScene is one cluster member as the scenario knows it.
type MemberScene struct {
	Name        string     `json:"name"`
	NetNS       string     `json:"netns"`
	Local       bool       `json:"local,omitempty"`
	ClusterAddr netip.Addr `json:"cluster_addr"`
	// Box is its probe box (box-a plays it on the local member); zero
	// when none runs there.
	Box BoxEnd `json:"box"`
	// HostAddrs, Listeners and Forwards are read in its namespace.
	HostAddrs []HostAddr          `json:"-"`
	Listeners []hostscan.Listener `json:"-"`
	Forwards  []hostscan.Forward  `json:"-"`
}

// Place names of another member's probe box, agent and counting chain.
func memberBoxPlace(m string) Place    { return Place("box@" + m) }
func memberHostPlace(m string) Place   { return Place("host@" + m) }
func memberFilterPlace(m string) Place { return Place("filter@" + m) }

// hostPlace, filterPlace and boxPlace are where the member's host agent,
// counting chain and probe box are.
func (m MemberScene) hostPlace() Place {
	if m.Local {
		return PlaceHost
	}
	return memberHostPlace(m.Name)
}

func (m MemberScene) filterPlace() Place {
	if m.Local {
		return PlaceFilter
	}
	return memberFilterPlace(m.Name)
}

// isMemberBox says whether a place is another member's probe box.
func isMemberBox(place Place) bool { return strings.HasPrefix(string(place), "box@") }

// memberOfPlace is the member a member place names ("" for any other).
func memberOfPlace(place Place) string {
	if _, m, ok := strings.Cut(string(place), "@"); ok {
		return m
	}
	return ""
}

// cluster is the members of the Incus cluster a run drills, the local one
// among them; empty off a cluster.
type cluster []MemberScene

// readCluster reads the cluster the drill runs on: every member with its
// namespace (where known) and cluster address, and a note for each member
// it cannot enter; nil off a cluster.
func readCluster(ctx context.Context, h *stack.Host) (cluster, []string, error) {
	ci, err := h.Cluster(ctx)
	if err != nil || !ci.Clustered() {
		return nil, nil, err
	}
	var out cluster
	var notes []string
	for _, ma := range ci.MemberAddrs() {
		m := MemberScene{Name: ma.Name, ClusterAddr: ma.Addr, Local: ma.Name == ci.Local}
		if m.Local {
			m.NetNS = h.NetNS
		} else if ns, ok := h.Members.NetNS[ma.Name]; ok {
			m.NetNS = ns
		} else {
			notes = append(notes, fmt.Sprintf("cluster: member %s's namespace is not known here (another machine): no probe box runs there and nothing there witnesses, so its cluster address is not a target", ma.Name))
			continue
		}
		out = append(out, m)
	}
	return out, notes, nil
}

// read reads a member's addresses, listeners and forwarding rules in its
// namespace, as buildScene reads the local host's.
func (m *MemberScene) read(subnet netip.Prefix, gw netip.Addr) error {
	addrs, _, err := topo.ReadInterfaces(m.NetNS)
	if err != nil {
		return fmt.Errorf("member %s: %w", m.Name, err)
	}
	m.HostAddrs = topo.HostAddrs(addrs, subnet, gw)
	return nsrun.Do(m.NetNS, func() error {
		var err error
		if m.Listeners, err = hostscan.Listeners(); err != nil {
			return fmt.Errorf("member %s: %w", m.Name, err)
		}
		if fw, err := hostscan.Forwards(); err == nil {
			m.Forwards = fw.Forwards
		}
		return nil
	})
}

// clusterAddrOf is a member's host address entry for its cluster address.
func (m MemberScene) clusterAddrOf() (HostAddr, bool) {
	for _, h := range m.HostAddrs {
		if h.Addr == m.ClusterAddr {
			return h, true
		}
	}
	return HostAddr{}, false
}

// srcPort is the source port of the next probe a counting chain past a
// NAT keys on: each probe its own (two probes of one box on one port:
// "address already in use"), below Linux's ephemeral range (32768 and
// up by default), where the kernel picks the other probes' ports, and
// from a random start, so two runs' counts are never confused.
func (b *builder) srcPort() int {
	if b.sport == 0 {
		var r [2]byte
		_, _ = rand.Read(r[:])
		b.sport = firstSrcPort + int(binary.BigEndian.Uint16(r[:]))%srcPortSpread
	}
	b.sport++
	return b.sport
}

// The source ports srcPort hands out: from firstSrcPort plus a random
// offset below srcPortSpread, a run's few hundred probes upward, all
// under 32768.
const (
	firstSrcPort  = 20000
	srcPortSpread = 8000
)

// crossMember adds a claim's cross-member probes (see the top of this
// file): every other member's box to its own member's host, and every
// member's box to every other member's cluster address.
func (b *builder) crossMember(claim ClaimID) {
	t := b.t
	for _, m := range t.Members {
		if m.Local || !m.Box.IP.IsValid() {
			continue
		}
		// Its member's counting chain counts its DNS question to its own
		// gateway (a C-DNS probe), so that chain's zeros mean something.
		k := nft.CountKey{Src: m.Box.IP, Dst: t.Gateway, Proto: "udp", Port: 53}
		b.countAt(m.filterPlace(), k)
		b.sc.CountControls[m.filterPlace()] = k
		// Its own member's host, as box-a probes the local one.
		b.hostAt(claim, m.Box, m, m.HostAddrs, m.Box.IP, false)
	}
	for _, from := range t.Members {
		box := from.Box
		if from.Local {
			box = t.A
		}
		if !box.IP.IsValid() {
			continue
		}
		for _, to := range t.Members {
			if to.Name == from.Name {
				continue
			}
			h, ok := to.clusterAddrOf()
			if !ok {
				continue
			}
			// Past from's NAT the packet comes from from's cluster address.
			b.hostAt(claim, box, to, []HostAddr{h}, from.ClusterAddr, true)
		}
	}
}

// countAt has a member's counting chain count k.
func (b *builder) countAt(place Place, k nft.CountKey) {
	if place == PlaceFilter {
		b.sc.Counters = append(b.sc.Counters, k)
		return
	}
	if b.sc.MemberCounters == nil {
		b.sc.MemberCounters = map[Place][]nft.CountKey{}
	}
	b.sc.MemberCounters[place] = append(b.sc.MemberCounters[place], k)
}

// local is the member the drill talks to ("" off a cluster).
func (c cluster) local() string {
	for _, m := range c {
		if m.Local {
			return m.Name
		}
	}
	return ""
}

// boxPlaces are the other members' probe boxes' places, sorted.
func (c cluster) boxPlaces() []Place {
	var out []Place
	for _, m := range c {
		if !m.Local {
			out = append(out, memberBoxPlace(m.Name))
		}
	}
	return out
}

// memberSuffix names a member's probe box after the member's last
// characters (instance names are short, members' names are not).
func memberSuffix(member string) string {
	s := strings.ToLower(member)
	s = strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			return r
		}
		return -1
	}, s)
	if len(s) > 12 {
		s = s[len(s)-12:]
	}
	return "m" + s
}

// checkPlacement makes sure every probe box (ends) is where the scenario
// says: box-a, box-b and the clone on the local member, each member's box
// on its member. A box elsewhere would be judged against the wrong host.
func checkPlacement(local string, ends map[Place]*BoxEnd) error {
	if local == "" {
		return nil
	}
	var wrong []string
	for place, e := range ends {
		want := local
		if m := memberOfPlace(place); m != "" {
			want = m
		}
		if e.Member != want {
			wrong = append(wrong, fmt.Sprintf("%s (%s) is on %s, not %s", place, e.Instance, e.Member, want))
		}
	}
	if len(wrong) > 0 {
		return fmt.Errorf("probe boxes placed on the wrong member: %s", strings.Join(wrong, "; "))
	}
	return nil
}
