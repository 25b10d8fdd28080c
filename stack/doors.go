package stack

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
	"sort"
	"strconv"
	"strings"
	"syscall"

	"github.com/box-isolation/box/internal/hostscan"
	"github.com/box-isolation/box/internal/nsrun"
	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/model"
)

// Doors (box expose): a door leads from the host's loopback to a TCP port
// inside a box, as an Incus proxy device box names and tags as its own.
// The listener is on the host side (bind=host: forkproxy listens in
// incusd's network namespace) and connects to 127.0.0.1:PORT inside the
// box. A door is one-way by construction: nothing listens inside the box,
// so the box gets no way back to the host. The fleet census accepts
// exactly these devices and still flags every other proxy device
// (judgeDoor).
//
// A door is either TCP on 127.0.0.1 or ::1 (open to every local user), or
// a unix socket under DoorDir owned by whoever made it, mode 0600. Doors
// are for an admin's boxes only: a granted user's project blocks proxy
// devices (restricted.devices.proxy=block), for the admin too, and lifting
// the block would let the user add proxies that lead from the box to the
// host.
const (
	// DoorPrefix starts every door's device name: DoorDevice(PORT).
	DoorPrefix = "box-door-"
	// DoorTag on the proxy device marks it as box's (Incus accepts user.*
	// keys on any device).
	DoorTag = "user.box.door"
	// DoorDir holds unix doors. Not under /run: a unix proxy device whose
	// directory is missing fails to start, and so does its box (measured:
	// "bind: no such file or directory"), so after a reboot every box with
	// a unix door would stay down. A stale socket left there is replaced
	// by forkproxy when the box starts (measured).
	DoorDir = "/var/lib/box/doors"
	// DoorMode is a unix door's mode: its owner only.
	DoorMode = "0600"
)

// Door kinds.
const (
	DoorTCP  = "tcp"
	DoorUnix = "unix"
)

// DoorDevice is the device name of the door to a box's port.
func DoorDevice(port uint16) string { return DoorPrefix + strconv.Itoa(int(port)) }

// DoorSocket is the unix door's path for a box's port. A box of another
// project than default gets the project in the name (instance names hold
// no dot, so the name is unique).
func DoorSocket(project, box string, port uint16) string {
	name := fmt.Sprintf("%s-%d.sock", box, port)
	if p := projectOf(project); p != "default" {
		name = p + "." + name
	}
	return filepath.Join(DoorDir, name)
}

// The loopback addresses a TCP door may listen on.
var (
	doorV4 = netip.MustParseAddr("127.0.0.1")
	doorV6 = netip.MustParseAddr("::1")
)

// DoorSpec asks for a door.
type DoorSpec struct {
	// Port is the TCP port inside the box.
	Port uint16
	// HostPort is a TCP door's port on the host's loopback; 0 is Port.
	HostPort uint16
	// Listen is a TCP door's address: 127.0.0.1 (the zero value) or ::1;
	// anything else is refused.
	Listen netip.Addr
	// Kind is DoorTCP or DoorUnix; empty chooses: a unix door where the
	// host has granted users (a TCP door on loopback is open to each of
	// them), TCP otherwise.
	Kind string
}

// Door is one of a box's doors, or a proxy device that looks like one.
type Door struct {
	Device string `json:"device"`
	Port   uint16 `json:"port"` // inside the box
	Kind   string `json:"kind"` // tcp or unix
	// Listen is the device's listen value as Incus has it; Host is the
	// same for people: 127.0.0.1:8080, [::1]:8080 or the socket's path.
	Listen string `json:"listen"`
	Host   string `json:"host"`
	// Owner is a unix door's uid:gid (its mode is DoorMode).
	Owner string `json:"owner,omitempty"`
	// Problem says why a device named or tagged as a door is not one box
	// made; the census flags it.
	Problem string `json:"problem,omitempty"`
	// Note is what Expose chose on its own (the kind).
	Note string `json:"note,omitempty"`
}

// doorDevice is the proxy device of a door.
func doorDevice(spec DoorSpec, listen string, uid, gid int) map[string]string {
	d := map[string]string{
		"type":    "proxy",
		"listen":  listen,
		"connect": fmt.Sprintf("tcp:127.0.0.1:%d", spec.Port),
		"bind":    "host",
		DoorTag:   "1",
	}
	if strings.HasPrefix(listen, "unix:") {
		d["uid"], d["gid"], d["mode"] = strconv.Itoa(uid), strconv.Itoa(gid), DoorMode
	}
	return d
}

// IsDoor reports whether a device is a door as box makes them: a proxy
// device with box's tag, listening on the host's loopback (tcp 127.0.0.1
// or ::1, one port) or on a unix socket in DoorDir owned by one user with
// mode 0600, connecting to 127.0.0.1 inside the instance, bound on the
// host, and nothing else (no nat, no proxy_protocol, no security.uid).
// The census checks more: the device's name and the socket's path
// (judgeDoor).
func IsDoor(device map[string]string) bool {
	_, err := parseDoor(device)
	return err == nil
}

// parsedDoor is a device IsDoor accepts, read.
type parsedDoor struct {
	kind       string
	port       uint16         // connect's, inside the box
	hostAddr   netip.AddrPort // tcp
	socket     string         // unix
	uid, gid   string
	listenText string
}

// parseDoor reads a device as a door, or says why it is not one.
func parseDoor(d map[string]string) (parsedDoor, error) {
	var p parsedDoor
	if d["type"] != "proxy" {
		return p, fmt.Errorf("it is a %q device, not a proxy", d["type"])
	}
	if d[DoorTag] != "1" {
		return p, fmt.Errorf("it has no %s=1 tag: box did not make it", DoorTag)
	}
	if d["bind"] != "host" {
		return p, fmt.Errorf("bind is %q: box's doors bind host (bind=instance listens inside the box and connects out of it)", d["bind"])
	}
	c, ok := strings.CutPrefix(d["connect"], "tcp:127.0.0.1:")
	port, err := strconv.ParseUint(c, 10, 16)
	if !ok || err != nil || port == 0 || strconv.FormatUint(port, 10) != c {
		return p, fmt.Errorf("connect is %q: box's doors connect to tcp:127.0.0.1:PORT inside the box", d["connect"])
	}
	p.port = uint16(port)
	p.listenText = d["listen"]
	allowed := map[string]bool{"type": true, "listen": true, "connect": true, "bind": true, DoorTag: true}
	switch {
	case strings.HasPrefix(d["listen"], "tcp:"):
		ap, err := netip.ParseAddrPort(strings.TrimPrefix(d["listen"], "tcp:"))
		if err != nil || (ap.Addr() != doorV4 && ap.Addr() != doorV6) || ap.Port() == 0 || "tcp:"+ap.String() != d["listen"] {
			return p, fmt.Errorf("listen is %q: box's TCP doors listen on tcp:127.0.0.1:PORT or tcp:[::1]:PORT only", d["listen"])
		}
		p.kind, p.hostAddr = DoorTCP, ap
	case strings.HasPrefix(d["listen"], "unix:"):
		path := strings.TrimPrefix(d["listen"], "unix:")
		if filepath.Dir(path) != DoorDir || !strings.HasSuffix(path, ".sock") || filepath.Clean(path) != path {
			return p, fmt.Errorf("listen is %q: box's unix doors are sockets in %s", d["listen"], DoorDir)
		}
		for _, k := range []string{"uid", "gid"} {
			if _, err := strconv.ParseUint(d[k], 10, 32); err != nil {
				return p, fmt.Errorf("%s is %q: a unix door is owned by one user", k, d[k])
			}
		}
		if d["mode"] != DoorMode {
			return p, fmt.Errorf("mode is %q: a unix door is its owner's only (mode %s)", d["mode"], DoorMode)
		}
		allowed["uid"], allowed["gid"], allowed["mode"] = true, true, true
		p.kind, p.socket, p.uid, p.gid = DoorUnix, path, d["uid"], d["gid"]
	default:
		return p, fmt.Errorf("listen is %q: box's doors listen on the host's loopback or a unix socket in %s", d["listen"], DoorDir)
	}
	for _, k := range model.SortedKeys(d) {
		if !allowed[k] {
			return p, fmt.Errorf("it sets %s=%s, which box's doors do not", k, d[k])
		}
	}
	return p, nil
}

// judgeDoor says why a proxy device of an instance is not one of box's
// doors ("" when it is): IsDoor's shape, and the name box gives it, on a
// box, set on the instance itself (a door from a profile would open on
// every instance that uses it), with the socket path box uses.
func judgeDoor(inst *incus.Instance, name string) string {
	d := inst.ExpandedDevices[name]
	p, err := parseDoor(d)
	switch {
	case err != nil:
		return err.Error()
	case name != DoorDevice(p.port):
		return fmt.Sprintf("it connects to port %d but is named %s: box names that door %s", p.port, name, DoorDevice(p.port))
	case !maps.Equal(inst.Devices[name], d):
		return "it comes from a profile, and box sets doors on a box itself"
	case p.kind == DoorUnix && p.socket != DoorSocket(inst.Project, inst.Name, p.port):
		return fmt.Sprintf("its socket is %s, where box puts this door at %s", p.socket, DoorSocket(inst.Project, inst.Name, p.port))
	}
	if _, box := isBox(inst); !box {
		return "the instance is not a box: box makes doors on its own boxes only"
	}
	return ""
}

// doorOf reads one device as a door for listing.
func doorOf(inst *incus.Instance, name string) Door {
	d := inst.ExpandedDevices[name]
	door := Door{Device: name, Listen: d["listen"], Host: strings.TrimPrefix(strings.TrimPrefix(d["listen"], "tcp:"), "unix:")}
	if p, err := parseDoor(d); err == nil {
		door.Port, door.Kind = p.port, p.kind
		if p.kind == DoorUnix {
			door.Owner = p.uid + ":" + p.gid
		}
	} else if port, err := strconv.ParseUint(strings.TrimPrefix(name, DoorPrefix), 10, 16); err == nil {
		door.Port = uint16(port)
	}
	door.Problem = judgeDoor(inst, name)
	return door
}

// doorsOf lists an instance's doors, and the proxy devices named or tagged
// like one, in port order.
func doorsOf(inst *incus.Instance) []Door {
	out := []Door{}
	for _, name := range model.SortedKeys(inst.ExpandedDevices) {
		d := inst.ExpandedDevices[name]
		if d["type"] == "proxy" && (strings.HasPrefix(name, DoorPrefix) || d[DoorTag] != "") {
			out = append(out, doorOf(inst, name))
		}
	}
	sort.SliceStable(out, func(a, b int) bool { return out[a].Port < out[b].Port })
	return out
}

// ListDoors lists a box's doors, and every proxy device on it named or tagged
// like one (with its Problem).
func (doors *Doors) ListDoors(ctx context.Context, name string) ([]Door, error) {
	host := doors.host
	inst, _, err := host.resolve(ctx, name)
	if err != nil {
		return nil, err
	}
	return doorsOf(inst), nil
}

// errTierDoors is a granted user's expose.
var errTierDoors = errors.New("a granted user's boxes get no doors: your project blocks proxy devices (restricted.devices.proxy=block), for the host's admin too, because a proxy device can as well lead from a box to the host; reach the port from inside the box (box exec, box shell), or ask the host's admin, whose own boxes can have doors")

// Expose makes a door to a box's port (DoorSpec says which). Asking again
// for the same door changes nothing; a different door to the same port is
// refused until the old one is removed (Unexpose).
func (doors *Doors) Expose(ctx context.Context, name string, spec DoorSpec) (*Door, error) {
	host := doors.host
	if host.Tier {
		return nil, errTierDoors
	}
	inst, etag, err := host.resolve(ctx, name)
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
		spec.Kind = DoorTCP
		if len(granted) > 0 {
			if spec.HostPort != 0 || spec.Listen.IsValid() {
				return nil, fmt.Errorf("expose: a host port or a listen address is for a TCP door, and this host has granted users (%s), so a door is a unix socket unless you ask for TCP (--tcp): a TCP door on loopback is open to every local user", strings.Join(granted, ", "))
			}
			spec.Kind = DoorUnix
			note = fmt.Sprintf("a unix door, owned by you with mode %s: this host has granted users (%s), and a TCP door on loopback is open to every local user (ask for one with --tcp)", DoorMode, strings.Join(granted, ", "))
		}
	}
	var listen string
	switch spec.Kind {
	case DoorTCP:
		if !spec.Listen.IsValid() {
			spec.Listen = doorV4
		}
		if spec.HostPort == 0 {
			spec.HostPort = spec.Port
		}
		if err := CheckDoorListen(spec.Listen); err != nil {
			return nil, err
		}
		listen = "tcp:" + netip.AddrPortFrom(spec.Listen, spec.HostPort).String()
	case DoorUnix:
		if spec.Listen.IsValid() || spec.HostPort != 0 {
			return nil, fmt.Errorf("expose: a unix door has no listen address or host port: it is a socket in %s", DoorDir)
		}
		listen = "unix:" + DoorSocket(inst.Project, name, spec.Port)
	default:
		return nil, fmt.Errorf("expose: no door kind %q: want %s or %s", spec.Kind, DoorTCP, DoorUnix)
	}
	want := doorDevice(spec, listen, os.Geteuid(), os.Getegid())
	dev := DoorDevice(spec.Port)
	if have, ok := inst.ExpandedDevices[dev]; ok {
		if maps.Equal(have, want) && maps.Equal(inst.Devices[dev], want) {
			door := doorOf(inst, dev)
			return &door, nil
		}
		return nil, fmt.Errorf("%s already has a device %s (listen %s): remove it first (box expose %s --remove %d)", name, dev, have["listen"], name, spec.Port)
	}
	if spec.Kind == DoorTCP {
		if err := doors.checkHostPort(ctx, name, spec.Port, netip.AddrPortFrom(spec.Listen, spec.HostPort)); err != nil {
			return nil, err
		}
	} else if err := mkdirDoors(); err != nil {
		return nil, fmt.Errorf("expose: making %s: %w", DoorDir, err)
	}
	put := inst.Writable()
	if put.Devices == nil {
		put.Devices = map[string]map[string]string{}
	}
	put.Devices[dev] = want
	if err := host.Incus.UpdateInstance(ctx, name, put, etag); err != nil {
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
	door := doorOf(inst, dev)
	door.Note = note
	return &door, nil
}

// mkdirDoors makes DoorDir: others may pass through it to a socket they
// own, not list it.
var mkdirDoors = func() error { return os.MkdirAll(DoorDir, 0o711) }

// CheckDoorListen refuses any listen address but the host's loopback,
// with the reason.
func CheckDoorListen(a netip.Addr) error {
	if a == doorV4 || a == doorV6 {
		return nil
	}
	why := "it is reachable from other machines"
	switch {
	case a.IsUnspecified():
		why = "it means every address of the host, the bridge's gateway and the LAN side included"
	case a.IsLoopback():
		why = "box's doors use 127.0.0.1 and ::1 only, so that the fleet census can tell them from other proxies"
	case a.IsPrivate() || a.IsLinkLocalUnicast():
		why = "it is reachable from the LAN (or, on the bridge's gateway, from the boxes themselves)"
	}
	return fmt.Errorf("a door listens on the host's loopback only (127.0.0.1 or ::1), not %s: %s", a, why)
}

// checkHostPort refuses a host port another door or a listener on the
// host's loopback already uses.
func (doors *Doors) checkHostPort(ctx context.Context, self string, port uint16, ap netip.AddrPort) error {
	host := doors.host
	insts, err := host.Incus.AllInstances(ctx)
	if err != nil {
		// A client that may not list every project still lists its own.
		if insts, err = host.Incus.Instances(ctx, nil); err != nil {
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
			if p := projectOf(inst.Project); p != "default" {
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
	projects, err := host.Incus.Projects(ctx)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, p := range projects {
		if tierProjectRE.MatchString(p.Name) && p.Config[KeyTier] == TierGranted {
			out = append(out, cmp.Or(p.Config[KeyTierUser], p.Name))
		}
	}
	slices.Sort(out)
	return out, nil
}

// Unexpose removes the door to a box's port, and its socket. A device of
// that name that box did not make is refused.
func (doors *Doors) Unexpose(ctx context.Context, name string, port uint16) error {
	host := doors.host
	inst, etag, err := host.resolve(ctx, name)
	if err != nil {
		return err
	}
	dev := DoorDevice(port)
	d, ok := inst.Devices[dev]
	if !ok {
		if _, fromProfile := inst.ExpandedDevices[dev]; fromProfile {
			return fmt.Errorf("%s's device %s comes from a profile (%s): box did not make it", name, dev, strings.Join(inst.Profiles, ", "))
		}
		return fmt.Errorf("%s has no door to port %d (box expose %s --list shows its doors)", name, port, name)
	}
	if d[DoorTag] != "1" {
		return fmt.Errorf("%s's device %s has no %s=1 tag: box did not make it; remove it with incus if you mean to (box incus %s -- config device remove {} %s)", name, dev, DoorTag, name, dev)
	}
	put := inst.Writable()
	delete(put.Devices, dev)
	if err := host.Incus.UpdateInstance(ctx, name, put, etag); err != nil {
		if incus.IsPreconditionFailed(err) {
			return fmt.Errorf("removing %s's door: it changed while box was removing it: run the command again", name)
		}
		return fmt.Errorf("removing %s's door to port %d: %w", name, port, err)
	}
	removeDoorSocket(d)
	return nil
}

// removeDoorSocket removes a unix door's socket (Incus leaves it behind
// when the device goes); best effort, and only in DoorDir.
func removeDoorSocket(d map[string]string) {
	if p, ok := strings.CutPrefix(d["listen"], "unix:"); ok && filepath.Dir(p) == DoorDir && filepath.Clean(p) == p {
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
		if d["type"] == "proxy" && d[DoorTag] == "1" {
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
	inst, etag, err := host.Incus.Instance(ctx, name)
	if err != nil {
		return err
	}
	put := inst.Writable()
	var old []map[string]string
	for _, dn := range model.SortedKeys(put.Devices) {
		d := put.Devices[dn]
		p, err := parseDoor(d)
		if err != nil || p.kind != DoorUnix {
			continue
		}
		if want := DoorSocket(inst.Project, name, p.port); p.socket != want {
			old = append(old, maps.Clone(d))
			d["listen"] = "unix:" + want
		}
	}
	if len(old) == 0 {
		return nil
	}
	if err := host.Incus.UpdateInstance(ctx, name, put, etag); err != nil {
		return fmt.Errorf("moving its unix doors to their new sockets: %w (box expose %s --remove PORT, then expose them again)", err, name)
	}
	for _, d := range old {
		removeDoorSocket(d)
	}
	return nil
}
