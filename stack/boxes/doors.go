package boxes

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/box-isolation/box/internal/hostscan"
	"github.com/box-isolation/box/internal/nsrun"
	"github.com/box-isolation/box/stack"
	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/model"
)

// ListDoors lists a box's doors, and every proxy device on it named or tagged
// like one (with its Problem).
func (doors *Doors) ListDoors(ctx context.Context, name string) ([]model.Door, error) {
	host := doors.host
	inst, _, err := stack.Resolve(ctx, host.Incus, name)
	if err != nil {
		return nil, err
	}
	return model.DoorsOf(inst), nil
}

// errTierDoors is a granted user's expose.
var errTierDoors = errors.New("a granted user's boxes get no doors: your project blocks proxy devices (restricted.devices.proxy=block), for the host's admin too, because a proxy device can as well lead from a box to the host; reach the port from inside the box (box exec, box shell), or ask the host's admin, whose own boxes can have doors")

// Expose makes a door to a box's port (DoorSpec says which). Asking again
// for the same door changes nothing; a different door to the same port is
// refused until the old one is removed (Unexpose).
func (doors *Doors) Expose(ctx context.Context, name string, spec model.DoorSpec) (*model.Door, error) {
	host := doors.host
	if host.Tier.Granted {
		return nil, errTierDoors
	}
	inst, etag, err := stack.Resolve(ctx, host.Incus, name)
	if err != nil {
		return nil, err
	}
	if inst.Type == model.TypeVM {
		return nil, fmt.Errorf("%s is a virtual machine: Incus's proxy device reaches into a VM only in NAT mode, which box's doors do not use (it needs a fixed address on the box's NIC and rules of Incus's own in the host's firewall)", name)
	}
	if spec.Port == 0 {
		return nil, errors.New("expose: the box's port must be 1 to 65535")
	}
	var note string
	if spec.Kind == "" {
		granted, err := doors.grantedUsers(ctx)
		if err != nil {
			return nil, fmt.Errorf("expose: finding out whether this host has granted users (a unix door where it has): %w", err)
		}
		spec.Kind = model.DoorTCP
		if len(granted) > 0 {
			if spec.HostPort != 0 || spec.Listen.IsValid() {
				return nil, fmt.Errorf("expose: a host port or a listen address is for a TCP door, and this host has granted users (%s), so a door is a unix socket unless you ask for TCP (--tcp): a TCP door on loopback is open to every local user", strings.Join(granted, ", "))
			}
			spec.Kind = model.DoorUnix
			note = fmt.Sprintf("a unix door, owned by you with mode %s: this host has granted users (%s), and a TCP door on loopback is open to every local user (ask for one with --tcp)", model.DoorMode, strings.Join(granted, ", "))
		}
	}
	var listen string
	switch spec.Kind {
	case model.DoorTCP:
		if !spec.Listen.IsValid() {
			spec.Listen = model.DoorV4
		}
		if spec.HostPort == 0 {
			spec.HostPort = spec.Port
		}
		if err := model.CheckDoorListen(spec.Listen); err != nil {
			return nil, err
		}
		listen = "tcp:" + netip.AddrPortFrom(spec.Listen, spec.HostPort).String()
	case model.DoorUnix:
		if spec.Listen.IsValid() || spec.HostPort != 0 {
			return nil, fmt.Errorf("expose: a unix door has no listen address or host port: it is a socket in %s", model.DoorDir)
		}
		listen = "unix:" + model.DoorSocket(inst.Project, name, spec.Port)
	default:
		return nil, fmt.Errorf("expose: no door kind %q: want %s or %s", spec.Kind, model.DoorTCP, model.DoorUnix)
	}
	want := model.ProxyDevice(spec, listen, os.Geteuid(), os.Getegid())
	dev := model.DoorDevice(spec.Port)
	if have, ok := inst.ExpandedDevices[dev]; ok {
		if maps.Equal(have, want) && maps.Equal(inst.Devices[dev], want) {
			door := model.DoorOf(inst, dev)
			return &door, nil
		}
		return nil, fmt.Errorf("%s already has a device %s (listen %s): remove it first (box expose %s --remove %d)", name, dev, have["listen"], name, spec.Port)
	}
	if spec.Kind == model.DoorTCP {
		if err := doors.checkHostPort(ctx, name, spec.Port, netip.AddrPortFrom(spec.Listen, spec.HostPort)); err != nil {
			return nil, err
		}
	} else if err := mkdirDoors(); err != nil {
		return nil, fmt.Errorf("expose: making %s: %w", model.DoorDir, err)
	}
	put := inst.Writable()
	if put.Devices == nil {
		put.Devices = map[string]map[string]string{}
	}
	put.Devices[dev] = want
	if err := host.Incus.Instances().Update(ctx, name, put, etag); err != nil {
		if incus.IsPreconditionFailed(err) {
			return nil, fmt.Errorf("exposing %s: it changed while box was adding the door: run the command again", name)
		}
		return nil, fmt.Errorf("exposing port %d of %s: %w", spec.Port, name, err)
	}
	inst.Devices, inst.ExpandedDevices = put.Devices, maps.Clone(inst.ExpandedDevices)
	if inst.ExpandedDevices == nil {
		inst.ExpandedDevices = map[string]map[string]string{}
	}
	inst.ExpandedDevices[dev] = want
	if err := recordPolicy(ctx, host, name, nil); err != nil {
		return nil, fmt.Errorf("exposed port %d of %s, but: %w (run the command again)", spec.Port, name, err)
	}
	door := model.DoorOf(inst, dev)
	door.Note = note
	return &door, nil
}

// mkdirDoors makes DoorDir: others may pass through it to a socket they
// own, not list it.
var mkdirDoors = func() error { return os.MkdirAll(model.DoorDir, 0o711) }

// checkHostPort refuses a host port another door or a listener on the
// host's loopback already uses.
func (doors *Doors) checkHostPort(ctx context.Context, self string, port uint16, ap netip.AddrPort) error {
	host := doors.host
	insts, err := host.Incus.Instances().All(ctx)
	if err != nil {
		// A client that may not list every project still lists its own.
		if insts, err = host.Incus.Instances().List(ctx, nil); err != nil {
			return fmt.Errorf("listing instances for their doors: %w", err)
		}
	}
	listen := "tcp:" + ap.String()
	for i := range insts {
		inst := &insts[i]
		for _, dn := range model.SortedKeys(inst.ExpandedDevices) {
			d := inst.ExpandedDevices[dn]
			if d["type"] != "proxy" || d["bind"] == "instance" || !sameTCPListen(d["listen"], listen) {
				continue
			}
			who := inst.Name
			if p := model.ProjectOf(inst.Project); p != "default" {
				who += " (project " + p + ")"
			}
			return fmt.Errorf("%s is taken on the host by %s's proxy device %s (%s): pick another host port: box expose %s %d HOSTPORT",
				ap, who, dn, strings.ToLower(inst.Status), self, port)
		}
	}
	holder, err := doors.loopbackHolder(ap)
	if err != nil {
		return fmt.Errorf("checking %s on the host: %w", ap, err)
	}
	if holder != "" {
		return fmt.Errorf("%s is in use on the host (%s): pick another host port (box expose %s %d HOSTPORT), or stop what listens there", ap, holder, self, port)
	}
	return nil
}

// sameTCPListen reports whether a proxy's listen value takes the TCP
// address want (tcp:A:P), also through a wildcard (of either family: a
// dual-stack :: takes 127.0.0.1 too) or a port range.
func sameTCPListen(have, want string) bool {
	a, ok := strings.CutPrefix(have, "tcp:")
	if !ok {
		return false
	}
	w, _ := netip.ParseAddrPort(strings.TrimPrefix(want, "tcp:"))
	host, ports, err := net.SplitHostPort(a)
	if err != nil {
		return false
	}
	addr, err := netip.ParseAddr(host)
	if err != nil || (addr != w.Addr() && !addr.IsUnspecified()) {
		return false
	}
	for r := range strings.SplitSeq(ports, ",") {
		lo, hi, isRange := strings.Cut(r, "-")
		if !isRange {
			hi = lo
		}
		l, err1 := strconv.ParseUint(lo, 10, 16)
		h, err2 := strconv.ParseUint(hi, 10, 16)
		if err1 == nil && err2 == nil && uint64(w.Port()) >= l && uint64(w.Port()) <= h {
			return true
		}
	}
	return false
}

// loopbackHolder says what holds a TCP address in the host's namespace
// ("" when it is free): a bind says whether it is taken, the listener
// table says by what. Without the right to bind there (a port under 1024
// as a user), the listener table alone decides.
func (doors *Doors) loopbackHolder(ap netip.AddrPort) (string, error) {
	host := doors.host
	var holder string
	err := nsrun.Do(host.NetNS, func() error {
		inUse := false
		l, err := net.Listen("tcp", ap.String())
		switch {
		case err == nil:
			l.Close()
			return nil
		case errors.Is(err, syscall.EADDRINUSE):
			inUse = true
		case !errors.Is(err, syscall.EACCES):
			return err
		}
		ls, err := hostscan.Listeners()
		if err != nil {
			if inUse {
				holder = "something listens there"
				return nil
			}
			return err
		}
		for _, x := range ls {
			if x.Proto != "tcp" || x.Port != ap.Port() {
				continue
			}
			if x.Addr == ap.Addr() || (x.Addr.IsUnspecified() && (x.Family == 4) == ap.Addr().Is4()) ||
				(x.Addr.IsUnspecified() && x.Family == 6 && ap.Addr().Is4()) {
				holder = "tcp " + x.AddrPort().String()
				if x.Process != "" {
					holder += fmt.Sprintf(", %s[%d]", x.Process, x.PID)
				}
				return nil
			}
		}
		if inUse {
			holder = "something listens there"
		}
		return nil
	})
	return holder, err
}

// grantedUsers names the users (or projects) of the host's granted tiers.
func (doors *Doors) grantedUsers(ctx context.Context) ([]string, error) {
	host := doors.host
	projects, err := host.Incus.Projects().List(ctx)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, p := range projects {
		if stack.TierProjectRE.MatchString(p.Name) && p.Config[stack.KeyTier] == stack.TierGranted {
			out = append(out, cmp.Or(p.Config[stack.KeyTierUser], p.Name))
		}
	}
	slices.Sort(out)
	return out, nil
}

// Unexpose removes the door to a box's port, and its socket. A device of
// that name that box did not make is refused.
func (doors *Doors) Unexpose(ctx context.Context, name string, port uint16) error {
	host := doors.host
	inst, etag, err := stack.Resolve(ctx, host.Incus, name)
	if err != nil {
		return err
	}
	dev := model.DoorDevice(port)
	d, ok := inst.Devices[dev]
	if !ok {
		if _, fromProfile := inst.ExpandedDevices[dev]; fromProfile {
			return fmt.Errorf("%s's device %s comes from a profile (%s): box did not make it", name, dev, strings.Join(inst.Profiles, ", "))
		}
		return fmt.Errorf("%s has no door to port %d (box expose %s --list shows its doors)", name, port, name)
	}
	if d[model.DoorTag] != "1" {
		return fmt.Errorf("%s's device %s has no %s=1 tag: box did not make it; remove it with incus if you mean to (box incus %s -- config device remove {} %s)", name, dev, model.DoorTag, name, dev)
	}
	put := inst.Writable()
	delete(put.Devices, dev)
	if err := host.Incus.Instances().Update(ctx, name, put, etag); err != nil {
		if incus.IsPreconditionFailed(err) {
			return fmt.Errorf("removing %s's door: it changed while box was removing it: run the command again", name)
		}
		return fmt.Errorf("removing %s's door to port %d: %w", name, port, err)
	}
	removeDoorSocket(d)
	if err := recordPolicy(ctx, host, name, nil); err != nil {
		return fmt.Errorf("removed %s's door to port %d, but: %w (run the command again)", name, port, err)
	}
	return nil
}

// removeDoorSocket removes a unix door's socket (Incus leaves it behind
// when the device goes); best effort, and only in DoorDir.
func removeDoorSocket(d map[string]string) {
	if p, ok := strings.CutPrefix(d["listen"], "unix:"); ok && filepath.Dir(p) == model.DoorDir && filepath.Clean(p) == p {
		_ = os.Remove(p)
	}
}

// withoutDoors drops the doors from a box's devices (a clone's: its
// source's doors are the source's, and the clone would take their host
// port or socket) and returns their names.
func withoutDoors(devices map[string]map[string]string) []string {
	var dropped []string
	for _, name := range model.SortedKeys(devices) {
		d := devices[name]
		if d["type"] == "proxy" && d[model.DoorTag] == "1" {
			delete(devices, name)
			dropped = append(dropped, name)
		}
	}
	return dropped
}

// renameDoors moves a renamed box's unix doors to the sockets its new name
// gives them (the census accepts a unix door only at its box's path).
func (doors *Doors) renameDoors(ctx context.Context, name string) error {
	host := doors.host
	inst, etag, err := host.Incus.Instances().Get(ctx, name)
	if err != nil {
		return err
	}
	put := inst.Writable()
	var old []map[string]string
	for _, dn := range model.SortedKeys(put.Devices) {
		d := put.Devices[dn]
		p, err := model.ParseDoor(d)
		if err != nil || p.Kind != model.DoorUnix {
			continue
		}
		if want := model.DoorSocket(inst.Project, name, p.Port); p.Socket != want {
			old = append(old, maps.Clone(d))
			d["listen"] = "unix:" + want
		}
	}
	if len(old) == 0 {
		return nil
	}
	if err := host.Incus.Instances().Update(ctx, name, put, etag); err != nil {
		return fmt.Errorf("moving its unix doors to their new sockets: %w (box expose %s --remove PORT, then expose them again)", err, name)
	}
	for _, d := range old {
		removeDoorSocket(d)
	}
	return nil
}

// Doors opens and closes a host's loopback doors to its boxes.
type Doors struct {
	host *stack.Host
}

// NewDoors is the door keeper of host.
func NewDoors(host *stack.Host) *Doors { return &Doors{host: host} }
