package probes

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// probeDHCPLease reports the address the box holds on its subnet (Via),
// found by subnet and never by interface name, with what tells a clone from
// its source: MAC, machine-id and hostname.
//
//   - reached: an interface holds an address in the subnet;
//   - silent: no interface does (no lease);
//   - error: more than one interface does, or the state could not be read.
//
// evidence.lease.dynamic is true when the kernel holds the address with a
// finite lifetime, as most DHCP clients install it; busybox udhcpc installs
// leases as permanent addresses, so dynamic=false does not mean static.
func probeDHCPLease(_ context.Context, spec ProbeSpec, obs Observation) Observation {
	ifi, p, err := InterfaceForSubnet(spec.Via)
	if err != nil {
		if errors.Is(err, ErrNoInterface) {
			return done(obs, Silent, fmt.Sprintf("no interface holds an address in %s: no lease", spec.Via.Masked()))
		}
		return fail(obs, fmt.Sprintf("dhcp lease: %v", err))
	}
	ev := &LeaseEvidence{Address: p.String(), MAC: ifi.HardwareAddr.String()}
	obs.Evidence.Lease = ev
	obs.Evidence.Interface = ifi.Name
	if link, err := netlink.LinkByIndex(ifi.Index); err == nil {
		if addrs, err := netlink.AddrList(link, netlink.FAMILY_V4); err == nil {
			for _, a := range addrs {
				if addrOf(a.IP) == p.Addr() {
					ev.Dynamic = a.Flags&unix.IFA_F_PERMANENT == 0
					if ev.Dynamic {
						ev.ValidLftSec = a.ValidLft
					}
				}
			}
		}
		if routes, err := netlink.RouteList(link, netlink.FAMILY_V4); err == nil {
			for _, r := range routes {
				if (r.Dst == nil || prefixLen(r.Dst) == 0) && r.Gw != nil {
					ev.DefaultRoute = r.Gw.String()
				}
			}
		}
	}
	if b, err := os.ReadFile("/etc/machine-id"); err == nil {
		ev.MachineID = printable([]byte(strings.TrimSpace(string(b))), 64)
	}
	if h, err := os.Hostname(); err == nil {
		ev.Hostname = printable([]byte(h), 64)
	}
	return done(obs, Reached, fmt.Sprintf("%s holds %s", ifi.Name, p))
}
