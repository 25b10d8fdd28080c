package model

import (
	"fmt"
	"maps"
	"net/netip"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/box-isolation/box/stack/incus"
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
	if p := ProjectOf(project); p != "default" {
		name = p + "." + name
	}
	return filepath.Join(DoorDir, name)
}

// The loopback addresses a TCP door may listen on.
var (
	DoorV4 = netip.MustParseAddr("127.0.0.1")
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

// ProxyDevice is the proxy device of a door.
func ProxyDevice(spec DoorSpec, listen string, uid, gid int) map[string]string {
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
	_, err := ParseDoor(device)
	return err == nil
}

// parsedDoor is a device IsDoor accepts, read.
type parsedDoor struct {
	Kind       string
	Port       uint16         // connect's, inside the box
	hostAddr   netip.AddrPort // tcp
	Socket     string         // unix
	uid, gid   string
	listenText string
}

// ParseDoor reads a device as a door, or says why it is not one.
func ParseDoor(d map[string]string) (parsedDoor, error) {
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
	p.Port = uint16(port)
	p.listenText = d["listen"]
	allowed := map[string]bool{"type": true, "listen": true, "connect": true, "bind": true, DoorTag: true}
	switch {
	case strings.HasPrefix(d["listen"], "tcp:"):
		ap, err := netip.ParseAddrPort(strings.TrimPrefix(d["listen"], "tcp:"))
		if err != nil || (ap.Addr() != DoorV4 && ap.Addr() != doorV6) || ap.Port() == 0 || "tcp:"+ap.String() != d["listen"] {
			return p, fmt.Errorf("listen is %q: box's TCP doors listen on tcp:127.0.0.1:PORT or tcp:[::1]:PORT only", d["listen"])
		}
		p.Kind, p.hostAddr = DoorTCP, ap
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
		p.Kind, p.Socket, p.uid, p.gid = DoorUnix, path, d["uid"], d["gid"]
	default:
		return p, fmt.Errorf("listen is %q: box's doors listen on the host's loopback or a unix socket in %s", d["listen"], DoorDir)
	}
	for _, k := range SortedKeys(d) {
		if !allowed[k] {
			return p, fmt.Errorf("it sets %s=%s, which box's doors do not", k, d[k])
		}
	}
	return p, nil
}

// JudgeDoor says why a proxy device of an instance is not one of box's
// doors ("" when it is): IsDoor's shape, and the name box gives it, on a
// box, set on the instance itself (a door from a profile would open on
// every instance that uses it), with the socket path box uses.
func JudgeDoor(inst *incus.Instance, name string) string {
	d := inst.ExpandedDevices[name]
	p, err := ParseDoor(d)
	switch {
	case err != nil:
		return err.Error()
	case name != DoorDevice(p.Port):
		return fmt.Sprintf("it connects to port %d but is named %s: box names that door %s", p.Port, name, DoorDevice(p.Port))
	case !maps.Equal(inst.Devices[name], d):
		return "it comes from a profile, and box sets doors on a box itself"
	case p.Kind == DoorUnix && p.Socket != DoorSocket(inst.Project, inst.Name, p.Port):
		return fmt.Sprintf("its socket is %s, where box puts this door at %s", p.Socket, DoorSocket(inst.Project, inst.Name, p.Port))
	}
	if _, box := IsBox(inst); !box {
		return "the instance is not a box: box makes doors on its own boxes only"
	}
	return ""
}

// DoorOf reads one device as a door for listing.
func DoorOf(inst *incus.Instance, name string) Door {
	d := inst.ExpandedDevices[name]
	door := Door{Device: name, Listen: d["listen"], Host: strings.TrimPrefix(strings.TrimPrefix(d["listen"], "tcp:"), "unix:")}
	if p, err := ParseDoor(d); err == nil {
		door.Port, door.Kind = p.Port, p.Kind
		if p.Kind == DoorUnix {
			door.Owner = p.uid + ":" + p.gid
		}
	} else if port, err := strconv.ParseUint(strings.TrimPrefix(name, DoorPrefix), 10, 16); err == nil {
		door.Port = uint16(port)
	}
	door.Problem = JudgeDoor(inst, name)
	return door
}

// DoorsOf lists an instance's doors, and the proxy devices named or tagged
// like one, in port order.
func DoorsOf(inst *incus.Instance) []Door {
	out := []Door{}
	for _, name := range SortedKeys(inst.ExpandedDevices) {
		d := inst.ExpandedDevices[name]
		if d["type"] == "proxy" && (strings.HasPrefix(name, DoorPrefix) || d[DoorTag] != "") {
			out = append(out, DoorOf(inst, name))
		}
	}
	sort.SliceStable(out, func(a, b int) bool { return out[a].Port < out[b].Port })
	return out
}

// CheckDoorListen refuses any listen address but the host's loopback,
// with the reason.
func CheckDoorListen(a netip.Addr) error {
	if a == DoorV4 || a == doorV6 {
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
