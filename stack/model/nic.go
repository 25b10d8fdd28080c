package model

import (
	"maps"
	"net/netip"
	"slices"
	"sort"

	"github.com/box-isolation/box/stack/incus"
)

// BoxNIC is the profile's NIC as a box's own device, without a fixed
// address: what a copy or an import gets before fixAddress gives it one.
func BoxNIC() map[string]string {
	return map[string]string{"type": "nic", "network": Current.Network, "name": "eth0", "security.port_isolation": "true"}
}

// FixedNIC is the profile's NIC with a fixed address.
func FixedNIC(addr netip.Addr) map[string]string {
	d := BoxNIC()
	d["ipv4.address"] = addr.String()
	return d
}

// FixedAddressOf is the fixed address of an instance's NIC on the bridge
// (invalid when it has none).
func FixedAddressOf(inst *incus.Instance) netip.Addr {
	for _, d := range inst.ExpandedDevices {
		if IsNIC(d) && OnBridge(Current.Network, d) {
			if a, err := netip.ParseAddr(d["ipv4.address"]); err == nil {
				return a
			}
		}
	}
	return netip.Addr{}
}

// BridgeNICOf is an instance's NIC on the bridge, as Incus expands it
// ("" when it has none).
func BridgeNICOf(inst *incus.Instance) (string, map[string]string) {
	for _, name := range SortedKeys(inst.ExpandedDevices) {
		if d := inst.ExpandedDevices[name]; IsNIC(d) && OnBridge(Current.Network, d) {
			return name, d
		}
	}
	return "", nil
}

func IsNIC(d map[string]string) bool { return d["type"] == "nic" }

func OnBridge(bridge string, d map[string]string) bool {
	return d["network"] == bridge || d["parent"] == bridge
}

func SortedKeys[V any](m map[string]V) []string {
	ks := slices.Collect(maps.Keys(m))
	sort.Strings(ks)
	return ks
}

// ExpandWith expands an instance's config and devices with profiles as
// Incus does (each profile in order, then the instance's own; a device
// replaces one of the same name whole) and returns the profiles it names
// that are not there.
func ExpandWith(inst incus.Instance, profiles map[string]incus.Profile) (incus.Instance, []string) {
	cfg := map[string]string{}
	devs := map[string]map[string]string{}
	var missing []string
	for _, name := range inst.Profiles {
		p, ok := profiles[name]
		if !ok {
			missing = append(missing, name)
			continue
		}
		maps.Copy(cfg, p.Config)
		for k, d := range p.Devices {
			devs[k] = maps.Clone(d)
		}
	}
	maps.Copy(cfg, inst.Config)
	for k, d := range inst.Devices {
		devs[k] = maps.Clone(d)
	}
	inst.ExpandedConfig, inst.ExpandedDevices = cfg, devs
	return inst, missing
}
