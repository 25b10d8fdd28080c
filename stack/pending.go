package stack

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/box-isolation/box/stack/hostns"
	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/model"
)

// A bridge Incus left Pending. Incus writes a new network's row with this
// member's state Pending, makes the bridge, then marks it Created; an
// incusd that dies (or a create that is cut off) in between leaves the
// row Pending for good: incusd does not start such a network, `incus
// network create` again answers "already exists", and `incus network
// delete` forgets it but leaves its kernel bridge and dnsmasq behind, so
// the next create meets "Network interface already exists". docs/box.md
// ("A bridge left Pending") tells the operator.

// networkPending is the status GET /1.0/networks/NAME gives such a network
// on a standalone incusd (its local member's state).
const networkPending = "Pending"

// pendingFixSQL is the incus command that marks boxnet Created on this
// member, for a Pending bridge that boxes are on (box never removes a
// user's box to repair it).
func pendingFixSQL(network string) string {
	return fmt.Sprintf(`incus admin sql global "UPDATE networks_nodes SET state=1 WHERE network_id=(SELECT id FROM networks WHERE name='%s')"`, network)
}

// pendingFix is the whole fix for a Pending bridge with instances on it.
func pendingFix(network string) string {
	return pendingFixSQL(network) + ", then restart incusd (systemctl restart incus) so it starts the bridge, then box doctor --fix"
}

// pendingUsers splits a Pending network's used_by into the instances on
// it and the profiles that name it ("NAME" or "NAME (project P)").
func pendingUsers(usedBy []string) (instances, profiles []string, profileRefs [][2]string) {
	for _, u := range usedBy {
		p, err := url.Parse(u)
		if err != nil {
			continue
		}
		project := p.Query().Get("project")
		shown := func(name string) string {
			if project == "" || project == "default" {
				return name
			}
			return name + " (project " + project + ")"
		}
		switch {
		case strings.HasPrefix(p.Path, "/1.0/instances/"):
			instances = append(instances, shown(strings.TrimPrefix(p.Path, "/1.0/instances/")))
		case strings.HasPrefix(p.Path, "/1.0/profiles/"):
			name := strings.TrimPrefix(p.Path, "/1.0/profiles/")
			profiles = append(profiles, shown(name))
			profileRefs = append(profileRefs, [2]string{cmpOr(project, "default"), name})
		}
	}
	return instances, profiles, profileRefs
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// pendingFinding is doctor's finding for a Pending bridge, with the fix
// that applies: doctor --fix where nothing is on it, the incus command
// where boxes are.
func pendingFinding(net *incus.Network) model.Finding {
	instances, _, _ := pendingUsers(net.UsedBy)
	f := model.Finding{Layer: model.LayerNAT, Object: "network " + net.Name,
		Problem: "Incus has it Pending (a create that never finished): incusd does not start it, and restarting incusd does not help"}
	if len(instances) == 0 {
		f.Fix = "box doctor --fix (no instance is on it: box removes it, with its leftover kernel bridge and dnsmasq, and makes it again on the same subnet)"
		return f
	}
	f.Problem += fmt.Sprintf("; instances on it: %s", strings.Join(instances, ", "))
	f.Fix = pendingFix(net.Name)
	return f
}

// repairPending removes a Pending bridge that no instance is on, so that
// Ensure makes it again: box's own profiles that name it, Incus's record,
// then the kernel bridge and the dnsmasq Incus leaves behind. With
// instances on it, it changes nothing and names the fix.
func repairPending(ctx context.Context, c *incus.Client, g *hostns.NS, net *incus.Network, noKernel bool, changed func(obj, action, detail string)) error {
	instances, profiles, refs := pendingUsers(net.UsedBy)
	if len(instances) > 0 {
		return fmt.Errorf("network %s is Pending in Incus's database (a create that never finished) and instances are on it (%s): box does not remove it under them; run %s",
			net.Name, strings.Join(instances, ", "), pendingFix(net.Name))
	}
	for i, ref := range refs {
		if ref[1] != model.Current.Profile {
			return fmt.Errorf("network %s is Pending in Incus's database and profile %s names it: remove that NIC from the profile, then box doctor --fix", net.Name, profiles[i])
		}
		if ref[0] != "" && ref[0] != "default" {
			// A granted user's copy: Ensure makes only the default
			// project's again, so removing it would leave the user unable
			// to mint until granted again.
			return fmt.Errorf("network %s is Pending in Incus's database and a granted user's profile names it (%s): run box revoke for that user (keeping the boxes), box doctor --fix, then box grant again", net.Name, profiles[i])
		}
	}
	for i, ref := range refs {
		if err := c.Project(ref[0]).DeleteProfile(ctx, ref[1]); err != nil && !incus.IsNotFound(err) {
			return fmt.Errorf("repairing Pending network %s: removing profile %s: %w", net.Name, profiles[i], err)
		}
		changed("profile "+profiles[i], "removed", "it named the Pending network "+net.Name+"; made again below")
	}
	if err := c.Networks().Delete(ctx, net.Name); err != nil && !incus.IsNotFound(err) {
		return fmt.Errorf("repairing Pending network %s: %w", net.Name, err)
	}
	changed("network "+net.Name, "removed", "Pending in Incus's database with no instance on it; made again below")
	if pid := g.DnsmasqFor(net.Name); pid > 0 {
		if err := stopProcess(pid); err != nil {
			return fmt.Errorf("repairing Pending network %s: stopping the dnsmasq Incus left serving it (pid %d): %w", net.Name, pid, err)
		}
		changed("dnsmasq "+net.Name, "stopped", fmt.Sprintf("pid %d, left by Incus with the Pending network", pid))
	}
	if !noKernel {
		link, err := g.Netlink.LinkByName(net.Name)
		var nf netlink.LinkNotFoundError
		switch {
		case errors.As(err, &nf):
		case err != nil:
			return fmt.Errorf("repairing Pending network %s: finding its kernel bridge: %w", net.Name, err)
		case link.Type() != "bridge":
			return fmt.Errorf("repairing Pending network %s: the interface %s is a %s, not the bridge Incus left: remove it by hand (ip link del %s), then box doctor --fix", net.Name, net.Name, link.Type(), net.Name)
		default:
			ports, err := g.BridgePorts(net.Name)
			if err != nil {
				return err
			}
			if len(ports) > 0 {
				return fmt.Errorf("repairing Pending network %s: its kernel bridge still has ports (%s) although Incus names no instance on it: find their owners, then box doctor --fix", net.Name, strings.Join(hostns.PortNames(ports), ", "))
			}
			if err := g.Netlink.LinkDel(link); err != nil {
				return fmt.Errorf("repairing Pending network %s: removing its kernel bridge: %w", net.Name, err)
			}
			changed("link "+net.Name, "removed", "the kernel bridge Incus left with the Pending network")
		}
	}
	return nil
}

// stopProcess ends pid (a dnsmasq Incus no longer knows) and waits for it.
func stopProcess(pid int) error {
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		if errors.Is(err, syscall.ESRCH) {
			return nil
		}
		return err
	}
	for range 50 {
		if syscall.Kill(pid, 0) != nil {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return err
	}
	return nil
}
