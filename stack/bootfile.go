package stack

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/box-isolation/box/stack/bootunits"
	"github.com/box-isolation/box/stack/guard"
	"github.com/box-isolation/box/stack/hostns"
	"github.com/box-isolation/box/stack/model"
	"github.com/box-isolation/box/stack/nft"
)

// The boot with no window (issue 25). Incus restores at boot every box that
// ran at shutdown; box's tables must hold before the first of them sends a
// frame. The firewall's one input from Incus is the bridge's gateway
// address, so setup-host saves it (with the egress policies) in a file,
// and the boot unit loads the tables from that file before Incus starts
// (`box setup-host --boot`, EnsureBoot): no Incus call, and rules that
// name boxnet load before the bridge exists. The port watcher starts next,
// before Incus too, and takes each restored box's port into the bridge
// drop's set from the kernel's link event alone.

// DefaultFirewallFile is where a real host's saved firewall lives.
const DefaultFirewallFile = "/var/lib/box/firewall.json"

// SavedFirewall is what the boot unit loads box's tables from.
type SavedFirewall struct {
	// Version is savedFirewallVersion; another is refused (setup-host
	// writes it again).
	Version int `json:"version"`
	// Bridge and Gateway are the stack's bridge and its IPv4 address.
	Bridge  string     `json:"bridge"`
	Gateway netip.Addr `json:"gateway"`
	// Egress is the egress table's policies as last applied (nil: none).
	// At boot the policies' allow sets start empty: an allowlisted box
	// reaches nothing until box's resolver answers it again.
	Egress *nft.Egress `json:"egress,omitempty"`
	Saved  time.Time   `json:"saved"`
}

const savedFirewallVersion = 1

// BootFiles are the files Host writes for the next boot: none for a
// granted user's Host or a remote's (their host's boot is its own admin's).
func (host *Host) BootFiles() BootFiles {
	b := host.Boot
	if host.Tier.Granted || host.Remote != "" {
		b.FirewallFile = ""
	}
	return b
}

// readSavedFirewall reads the saved firewall; os.ErrNotExist when there is
// none.
func readSavedFirewall(path string) (SavedFirewall, error) {
	var s SavedFirewall
	b, err := os.ReadFile(path)
	if err != nil {
		return s, err
	}
	if err := json.Unmarshal(b, &s); err != nil {
		return s, fmt.Errorf("reading the saved firewall %s: %w (box setup-host writes it again)", path, err)
	}
	if s.Version != savedFirewallVersion {
		return s, fmt.Errorf("the saved firewall %s is version %d, this box reads %d (box setup-host writes it again)", path, s.Version, savedFirewallVersion)
	}
	if !s.Gateway.Is4() || s.Bridge == "" {
		return s, fmt.Errorf("the saved firewall %s names no bridge or IPv4 gateway (box setup-host writes it again)", path)
	}
	return s, nil
}

// SaveFirewall updates the saved firewall through edit, writing it only
// when it changed (atomically: a boot never reads half a file).
func (boot BootFiles) SaveFirewall(edit func(*SavedFirewall)) error {
	path := boot.FirewallFile
	if path == "" {
		return nil
	}
	old, err := readSavedFirewall(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		old = SavedFirewall{} // unreadable or stale: written afresh
	}
	s := old
	s.Version, s.Bridge = savedFirewallVersion, model.Current.Network
	edit(&s)
	if !s.Gateway.Is4() {
		return nil // nothing to load at boot yet (setup-host saves it)
	}
	s.Saved = old.Saved
	if err == nil && reflect.DeepEqual(s, old) {
		return nil
	}
	s.Saved = time.Now().UTC()
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("saving the firewall: %w", err)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("saving the firewall: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("saving the firewall: %w", err)
	}
	return nil
}

// removeSavedFirewall is teardown's: no firewall to load at the next boot.
func (boot BootFiles) removeSavedFirewall() ([]model.Change, error) {
	path := boot.FirewallFile
	if path == "" {
		return nil, nil
	}
	if err := os.Remove(path); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		return nil, err
	}
	return []model.Change{{Object: "file " + path, Action: "removed", Detail: "the firewall the boot unit loaded"}}, nil
}

// EnsureBoot loads box's tables from the saved firewall with no Incus call:
// what the boot unit runs (`box setup-host --boot`), before Incus starts.
// The bridge need not exist; its ports, if any, are isolated and taken
// into the port sets. A pin table already there is left to the port
// watcher; a new one pins nothing, and a port already on the bridge (none,
// at a boot) has all its frames dropped until the watcher pins it. The
// egress table comes back with its allow sets empty.
func (host *Host) EnsureBoot(ctx context.Context) (*Report, error) {
	path := host.BootFiles().FirewallFile
	if path == "" {
		return nil, errors.New("no saved firewall on this host (it is saved on a host with systemd): run box setup-host --firewall-only")
	}
	saved, err := readSavedFirewall(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("no saved firewall at %s: run box setup-host once (it saves it); until then Incus starts with no firewall of box's", path)
	}
	if err != nil {
		return nil, err
	}
	if saved.Bridge != model.Current.Network {
		return nil, fmt.Errorf("the saved firewall %s is for bridge %s, this box's is %s: run box setup-host", path, saved.Bridge, model.Current.Network)
	}
	unlock, err := host.Lock.take(ctx, host.NetNS)
	if err != nil {
		return nil, err
	}
	defer unlock()
	g, err := host.OpenNS()
	if err != nil {
		return nil, err
	}
	defer g.Close()
	rep := &Report{Changes: []model.Change{}, Notes: []string{}}
	unlockPorts, err := hostns.LockPorts(ctx)
	if err != nil {
		return nil, err
	}
	defer unlockPorts()
	ports, isolated, err := g.IsolatePorts(model.Current.Network)
	if err != nil {
		return rep, err
	}
	for _, name := range isolated {
		rep.Changes = append(rep.Changes, model.Change{Object: "bridge port " + name, Action: "updated", Detail: "isolated on"})
	}
	cfg := g.NFTConfig(model.Current)
	cfg.Gateway = saved.Gateway
	caps, err := nft.Probe(cfg)
	if err != nil {
		return rep, fmt.Errorf("probing nftables: %w", err)
	}
	rep.BridgeMode = caps.Mode()
	names := hostns.PortNames(ports)
	applied, err := nft.Apply(cfg, caps, names)
	if err != nil {
		return rep, fmt.Errorf("applying nft tables: %w", err)
	}
	if present, err := nft.PinsPresent(cfg); err != nil {
		return rep, err
	} else if !present {
		pinned, err := nft.ApplyPins(cfg, caps, names, nil)
		if err != nil {
			return rep, fmt.Errorf("applying the pin table: %w", err)
		}
		applied = append(applied, pinned...)
	}
	if saved.Egress != nil && len(saved.Egress.Policies) > 0 {
		eg, err := (*saved.Egress).Apply(cfg)
		if err != nil {
			return rep, fmt.Errorf("applying the egress table: %w", err)
		}
		applied = append(applied, eg...)
		did, err := g.EnsureEgressNet()
		applied = append(applied, did...)
		if err != nil {
			return rep, err
		}
	}
	for _, a := range applied {
		rep.Changes = append(rep.Changes, model.Change{Object: "nft", Action: "updated", Detail: a})
	}
	routed, err := EnsureRoute(g)
	rep.Changes = append(rep.Changes, routed...)
	if err != nil {
		return rep, err
	}
	// The bridge exists here only when Incus kept it (it deletes it at its
	// own shutdown): otherwise the healer attaches the guard when Incus
	// brings the bridge up.
	guarded, notes, err := guard.EnsureNoted(g)
	rep.Changes = append(rep.Changes, guarded...)
	rep.Notes = append(rep.Notes, notes...)
	if err != nil {
		return rep, err
	}
	rep.Notes = append(rep.Notes, fmt.Sprintf("loaded from %s (saved %s, gateway %s) with no Incus call; the port watcher pins each box as Incus starts it", path, saved.Saved.Format(time.RFC3339), saved.Gateway))
	stale, err := removeStaleDnsmasqPIDs(host.Boot.IncusDir)
	for _, f := range stale {
		rep.Changes = append(rep.Changes, model.Change{Object: "file " + f, Action: "removed", Detail: "a dnsmasq pid file from before the boot (Incus would signal that pid, which may now be one of incusd's own threads)"})
	}
	return rep, err
}

// removeStaleDnsmasqPIDs removes, before Incus starts at boot, the pid
// files Incus left for its networks' dnsmasq at shutdown
// (INCUS_DIR/networks/NAME/dnsmasq.pid) whose pid is no running dnsmasq.
// Incus reads such a file when it starts the network and kills that pid
// unchecked; after a boot the pid is reused, and when it is one of
// incusd's own threads (a thread id is a pid to kill(2), which ends the
// whole process) incusd dies with SIGKILL and its boot hangs in
// waitready. Measured on the world's machine: 2 reboots of 16 once box's
// units put incusd's start later (its threads then take the pids its last
// boot's dnsmasq had). It returns the files it removed.
func removeStaleDnsmasqPIDs(incusDir string) ([]string, error) {
	if incusDir == "" {
		return nil, nil
	}
	files, err := filepath.Glob(filepath.Join(incusDir, "networks", "*", "dnsmasq.pid"))
	if err != nil {
		return nil, err
	}
	var removed []string
	var errs []error
	for _, f := range files {
		if dnsmasqRuns(f) {
			continue
		}
		if err := os.Remove(f); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("removing the stale %s: %w", f, err))
			continue
		}
		removed = append(removed, f)
	}
	return removed, errors.Join(errs...)
}

// dnsmasqRuns reports whether the pid Incus recorded in a dnsmasq pid file
// (a YAML record with a "pid:" line) is a running dnsmasq. A thread id
// reads the command line of its process (incusd's, after a boot): not one.
func dnsmasqRuns(pidFile string) bool {
	b, err := os.ReadFile(pidFile)
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "pid:"); ok {
			pid, err := strconv.Atoi(strings.TrimSpace(v))
			args := hostns.ProcArgs(pid)
			return err == nil && pid > 0 && len(args) > 0 && strings.HasSuffix(args[0], "dnsmasq")
		}
	}
	return false
}

// verifyBoot checks, on a systemd host, what the next boot needs to have
// no window: the units and Incus's drop-in as setup-host writes them, and
// the saved firewall naming the live gateway. Its findings are advisory:
// the layers hold now, the next boot would open them.
func (boot BootFiles) verify(gw netip.Addr) []model.Finding {
	if boot.UnitDir == "" || !systemdRunning() {
		return nil
	}
	var out []model.Finding
	find := func(obj, problem string) {
		out = append(out, model.Finding{Layer: model.LayerHostFW, Object: obj, Problem: problem + ": at the next boot boxes could send before box's tables hold", Fix: model.FixEnsure, Advisory: true})
	}
	files := map[string]string{bootunits.IncusDropInName: bootunits.IncusDropIn}
	for _, u := range bootunits.BootUnits(boot.Exe) {
		files[u.Name] = u.Text
	}
	for _, name := range slices.Sorted(maps.Keys(files)) {
		b, err := os.ReadFile(filepath.Join(boot.UnitDir, name))
		switch {
		case errors.Is(err, os.ErrNotExist):
			find("unit "+name, "missing")
		case err != nil:
			find("unit "+name, err.Error())
		case string(b) != files[name]:
			find("unit "+name, "not as box setup-host writes it")
		}
	}
	if boot.legacyDaemonUnit() {
		out = append(out, model.Finding{Layer: model.LayerHostFW, Object: "unit " + bootunits.LegacyDaemonUnitName,
			Problem: "box's daemon under its old name (now " + bootunits.DaemonUnitName + "); the drop-in and the next boot want the new one",
			Fix:     model.FixEnsure + ", then systemctl daemon-reload && systemctl start " + bootunits.DaemonUnitName, Advisory: true})
	}
	saved, err := readSavedFirewall(boot.FirewallFile)
	switch {
	case boot.FirewallFile == "":
	case errors.Is(err, os.ErrNotExist):
		find("file "+boot.FirewallFile, "no saved firewall for box-firewall.service to load")
	case err != nil:
		find("file "+boot.FirewallFile, err.Error())
	case saved.Gateway != gw:
		find("file "+boot.FirewallFile, fmt.Sprintf("the saved gateway is %s, the bridge's is %s", saved.Gateway, gw))
	}
	return out
}
