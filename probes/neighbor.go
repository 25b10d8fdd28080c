package probes

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// PinNeighbors installs a permanent neighbour entry for each spec, so that
// IPv4 and IPv6 probes to those peers test the L3 path on their own: without
// them an ICMP, TCP or UDP probe to a sibling first needs an ARP (or NDP)
// answer, and would only repeat the ARP probe's result. The returned
// function removes exactly the entries this call installed.
func PinNeighbors(specs []NeighborSpec) ([]NeighborState, func() []NeighborState) {
	states := make([]NeighborState, len(specs))
	var added []*netlink.Neigh
	var addedIdx []int
	for i, s := range specs {
		st := &states[i]
		st.Address, st.MAC = s.Address.String(), s.MAC
		ifi, _, err := InterfaceForSubnet(s.Via)
		if err != nil {
			st.Error = err.Error()
			continue
		}
		st.Interface = ifi.Name
		mac, err := net.ParseMAC(s.MAC)
		if err != nil {
			st.Error = err.Error()
			continue
		}
		fam := netlink.FAMILY_V4
		if s.Address.Is6() {
			fam = netlink.FAMILY_V6
		}
		n := &netlink.Neigh{LinkIndex: ifi.Index, Family: fam, State: netlink.NUD_PERMANENT, IP: s.Address.AsSlice(), HardwareAddr: mac}
		if err := netlink.NeighSet(n); err != nil {
			st.Error = fmt.Sprintf("pin %s at %s on %s: %v", s.Address, s.MAC, ifi.Name, err)
			continue
		}
		st.Pinned = true
		added = append(added, n)
		addedIdx = append(addedIdx, i)
	}
	undo := func() []NeighborState {
		out := append([]NeighborState(nil), states...)
		for j, n := range added {
			st := &out[addedIdx[j]]
			if err := netlink.NeighDel(n); err != nil && !errors.Is(err, unix.ENOENT) {
				st.Error = fmt.Sprintf("remove the pinned entry for %s: %v", st.Address, err)
				continue
			}
			st.Removed = true
		}
		return out
	}
	return states, undo
}

// NeighborSpec asks the agent to pin a peer's address to its MAC on the
// interface holding Via, for the whole plan.
type NeighborSpec struct {
	Via     netip.Prefix `json:"via"`
	Address netip.Addr   `json:"address"`
	MAC     string       `json:"mac"`
}

// NeighborState says what the agent did about one pinned neighbour.
type NeighborState struct {
	Interface string `json:"interface,omitempty"`
	Address   string `json:"address"`
	MAC       string `json:"mac"`
	Pinned    bool   `json:"pinned"`
	Removed   bool   `json:"removed"`
	Error     string `json:"error,omitempty"`
}

func (n *NeighborSpec) validate() error {
	if !n.Via.IsValid() {
		return fmt.Errorf("via: a subnet is required")
	}
	if !n.Address.IsValid() || n.Address.Zone() != "" || n.Address.IsMulticast() || n.Address.IsUnspecified() {
		return fmt.Errorf("address %s is not a unicast address without a zone", n.Address)
	}
	if err := checkMAC(n.MAC); err != nil {
		return fmt.Errorf("mac: %w", err)
	}
	return nil
}
