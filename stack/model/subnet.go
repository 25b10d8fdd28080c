package model

import (
	"fmt"
	"net/netip"
	"strings"
)

// AddressUse is something on the host that already uses addresses: a
// route, a local address or the default gateway.
type AddressUse struct {
	Prefix netip.Prefix
	What   string // e.g. "route 10.88.0.0/16 dev eth1", "default gateway 10.88.0.1"
}

// SubnetChoice is the subnet Ensure builds on and why.
type SubnetChoice struct {
	Subnet netip.Prefix
	// Auto is set when the default was claimed and another /24 was picked;
	// the caller must say so loudly.
	Auto bool
	// Reason explains an auto pick or a pinned subnet.
	Reason string
}

// usedBy returns the first address use that overlaps p.
func usedBy(p netip.Prefix, uses []AddressUse) (AddressUse, bool) {
	for _, c := range uses {
		if c.Prefix.Bits() == 0 {
			continue // a default route uses no address in particular
		}
		if c.Prefix.Overlaps(p) {
			return c, true
		}
	}
	return AddressUse{}, false
}

// PickSubnet chooses the bridge's subnet (docs/design.md, "The layer map", L-NAT): a pinned subnet
// is honoured if free and refused if claimed; otherwise 10.88.0.0/24 when
// free, else the first free /24 from 10.89.0.0/24 to 10.127.0.0/24.
func PickSubnet(pin netip.Prefix, uses []AddressUse) (SubnetChoice, error) {
	if pin.IsValid() {
		if c, ok := usedBy(pin, uses); ok {
			return SubnetChoice{}, fmt.Errorf("BOX_SUBNET=%s is already claimed by %s: pick a free /24 or unset BOX_SUBNET", pin, c.What)
		}
		return SubnetChoice{Subnet: pin, Reason: "pinned by BOX_SUBNET"}, nil
	}
	c, ok := usedBy(DefaultSubnet, uses)
	if !ok {
		return SubnetChoice{Subnet: DefaultSubnet}, nil
	}
	for i := firstAuto; i <= lastAuto; i++ {
		p := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i), 0, 0}), 24)
		if _, taken := usedBy(p, uses); !taken {
			return SubnetChoice{Subnet: p, Auto: true,
				Reason: fmt.Sprintf("%s is claimed by %s; picked %s instead (pin one with BOX_SUBNET)", DefaultSubnet, c.What, p)}, nil
		}
	}
	var what []string
	for _, c := range uses {
		what = append(what, c.What)
	}
	return SubnetChoice{}, fmt.Errorf("no free /24 in 10.88.0.0 .. 10.127.0.0 (claimed: %s): set BOX_SUBNET to a free /24", strings.Join(what, "; "))
}
