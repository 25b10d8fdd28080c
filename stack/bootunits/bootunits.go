// Package bootunits holds the systemd units box setup-host writes on a
// systemd host, and the packages ship, so the two never drift: the boot
// unit that loads box's saved tables before Incus starts, box's daemon,
// and Incus's drop-in that starts it after them (docs/box.md, "The boot
// has no window").
package bootunits

import "fmt"

// bootUnit loads the firewall part of the stack at boot from the file
// setup-host saved (SavedFirewall), with no Incus call, before Incus
// starts: box's tables hold before incusd restores a single box. Its
// rules name boxnet, which need not exist yet.
const bootUnit = `[Unit]
Description=box: load the isolation firewall box setup-host saved (nft tables inet box, bridge box, bridge box_pin, inet box_route), before Incus starts
DefaultDependencies=no
After=local-fs.target
Before=network-pre.target incus.service incus-startup.service shutdown.target
Wants=network-pre.target
Conflicts=shutdown.target

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=%s setup-host --boot

[Install]
WantedBy=multi-user.target
`

// daemonUnit runs box's daemon (package daemon), which guards the stack
// (the bridge's ports isolated, in the bridge drop's port set and pinned
// as boxes restart on their own; box's tables and Incus's put back after
// another tool's flush; L-ROUTE following the routes) and serves the
// allowlisted boxes (their resolver and proxy: they resolve nothing while
// it is down). It is ready (Type=notify) once it has subscribed to the
// kernel's link events and synced the ports, with no Incus call: Incus
// starts after it (IncusDropIn), so the port of every box Incus restores
// at boot joins the drop's set from the link event alone. It conflicts
// with its unit of its old name (box-ports.service): starting it stops
// that one, and with --take-over it waits for the old daemon's lock and
// serves the moment the old one lets go (it starts while the old one
// stops, not after it: the allowlisted boxes' resolver is gone for
// milliseconds, not for a daemon's start). The two never serve at once.
const daemonUnit = `[Unit]
Description=box: guard the isolation stack (ports isolated and pinned, box's tables put back, routes followed) and serve allowlisted boxes (their resolver and proxy)
DefaultDependencies=no
After=local-fs.target box-firewall.service
Wants=box-firewall.service
Before=incus.service incus-startup.service shutdown.target
Conflicts=shutdown.target box-ports.service

[Service]
Type=notify
NotifyAccess=main
ExecStart=%s guard-and-serve --take-over
Restart=always
RestartSec=2

[Install]
WantedBy=multi-user.target
`

// IncusDropIn makes Incus's daemon want box's units and start after them,
// however it is started (at boot, by its socket, by incus-startup): Incus
// restores at boot every instance that ran at shutdown. Wants, not
// Requires: a failing box unit does not keep Incus down (box doctor names
// it). setup-host writes it; the package does not ship it (installing box
// changes nothing until setup-host runs).
//
// It also gives incusd an empty, read-only /dev/mqueue: Incus binds the
// host's /dev/mqueue into every unprivileged container when it exists
// (systemd mounts it on every host), and that is the host's POSIX message
// queue instance, shared by the host and every box (a queue made on the
// host, or in one box, is listed, opened and removed in another: measured
// in the world's machine, caught by C-KERNEL's mounts). A box's own
// mq_open(3) uses its own IPC namespace, which needs no mount. The
// option runs incusd in a mount namespace of its own (systemd's
// PrivateMounts): its mounts (a pool's, an instance's rootfs) are not
// seen from the host's shell (docs/box.md, "Incus's /dev/mqueue").
const IncusDropIn = `# box: Incus starts, and restores its instances, only after box's firewall
# is loaded and its daemon is ready; and Incus binds an empty,
# read-only /dev/mqueue into its containers, not the host's message queues
# (written by box setup-host; box teardown-host removes it).
[Unit]
Wants=box-firewall.service box-guard-and-serve.service
After=box-firewall.service box-guard-and-serve.service

[Service]
TemporaryFileSystem=/dev/mqueue:ro
`

// IncusDropInName is the drop-in Ensure writes for incus.service, relative
// to the unit directory.
const IncusDropInName = "incus.service.d/box.conf"

// BootUnitName and DaemonUnitName are the systemd units Ensure installs on
// systemd hosts. LegacyDaemonUnitName is the daemon's unit as box named it
// before it was renamed: setup-host replaces it, doctor names it.
const (
	BootUnitName         = "box-firewall.service"
	DaemonUnitName       = "box-guard-and-serve.service"
	LegacyDaemonUnitName = "box-ports.service"
)

// bootUnits are the units, in the order they are written.
var bootUnits = []struct{ name, text, does string }{
	{BootUnitName, bootUnit, "loads the saved nft tables at boot, before Incus starts"},
	{DaemonUnitName, daemonUnit, "runs box guard-and-serve: guards the stack (ports, pins, tables, routes) and serves allowlisted boxes (resolver and proxy)"},
}

// BootUnit is one systemd unit as Ensure writes it.
type BootUnit struct {
	Name string // e.g. box-firewall.service
	Text string // the unit file
	Does string // what it is for, one line
}

// BootUnits are the units Ensure writes, for the box binary at exe: the
// packages ship the same text, so the two never drift.
func BootUnits(exe string) []BootUnit {
	var out []BootUnit
	for _, u := range bootUnits {
		out = append(out, BootUnit{Name: u.name, Text: fmt.Sprintf(u.text, exe), Does: u.does})
	}
	return out
}
