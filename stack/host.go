package stack

import (
	"fmt"
	"time"

	"github.com/box-isolation/box/stack/hostns"
	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/model"
	"github.com/box-isolation/box/stack/nft"
)

// Host is where the stack lives: an incusd and the network namespace its
// bridges are in.
type Host struct {
	Incus *incus.Client
	// NetNS names the network namespace incusd runs in (as `ip netns`
	// knows it); empty means this process's own, as on a real host.
	NetNS string
	// Remote names the incus CLI's remote this Host drives over HTTPS
	// (box --remote); empty is this machine's incusd. A remote's kernel is
	// not this machine's: its host layers, ports and pins are its own
	// host's (box setup-host and the daemon there), and nothing here reads
	// or writes this machine's nft or links for it.
	Remote string
	// Options are the operator's choices (BOX_SUBNET, BOX_DNS, BOX_POOL).
	Options model.Options
	// Boot is where the files that carry the stack across a reboot go.
	Boot BootFiles
	// Tier says whether box acts for a granted user, and where incus-user
	// is.
	Tier TierConfig
	// Members says, on a cluster, which other members this machine can
	// act on, and whether to converge this member alone.
	Members Membership
	// Lock is the setup lock Ensure, EnsureFirewall and Teardown hold.
	Lock SetupLock
	// IncusConfigDir is the incus CLI's config directory
	// (incus.ConfigDir): its remotes name the image servers a
	// REMOTE:ALIAS image is pulled from. Empty leaves the CLI's built-in
	// remotes (images, the public image server; local).
	IncusConfigDir string
	// Progress, when set, hears what a long operation is doing (one box
	// of many removed); box shows it on a terminal only.
	Progress func(format string, args ...any)

	// NoKernel leaves this machine's kernel alone (RefreshPorts does
	// nothing): for unit tests against a fake incusd.
	NoKernel bool

	cluster *ClusterInfo // read once (Cluster)
	member  string       // the member this Host acts on ("" standalone or local)
}

// BootFiles are the files that carry the stack across a reboot on a
// systemd host: the units, the incus.service drop-in, and the firewall's
// saved state. The zero value writes none (the hermetic world has no
// systemd, and its host namespace does not survive a reboot anyway).
type BootFiles struct {
	// UnitDir is where the units and the drop-in are written; empty
	// writes none.
	UnitDir string
	// Exe is the box binary the units run.
	Exe string
	// FirewallFile is where setup-host saves what the boot unit loads the
	// firewall from before Incus starts (DefaultFirewallFile on a real
	// host; empty saves nothing).
	FirewallFile string
	// IncusDir is incusd's INCUS_DIR on a real host (/var/lib/incus by
	// default): the boot unit removes stale dnsmasq pid files there before
	// Incus starts (removeStaleDnsmasqPIDs). Empty touches nothing.
	IncusDir string
	// SysctlFile is where doctor --fix keeps the limits it raised for the
	// next boot (DefaultSysctlFile on a real host; empty raises none).
	SysctlFile string
}

// TierConfig is box acting for a granted user (an access tier).
type TierConfig struct {
	// Granted: box acts for a granted user, through incus-user's socket,
	// on their project only; the kernel's layers are left to the daemon.
	Granted bool
	// Group is the group incus-user serves (BOX_TIER_GROUP);
	// DefaultTierGroup when empty.
	Group string
	// UserSocket is incus-user's socket (BOX_INCUS_USER_SOCKET); empty
	// is unix.socket.user beside incusd's.
	UserSocket string
}

// Membership is what a Host acts on of its cluster.
type Membership struct {
	// NetNS names the network namespace of other members (member ->
	// namespace) that this machine can enter: the hermetic world's
	// members, all on one machine (BOX_MEMBER_NETNS). Verify reads those
	// members' host layers too.
	NetNS map[string]string
	// Only: Ensure converges only this member's host layers, leaving the
	// cluster's Incus objects to `box setup-host` on any member.
	Only bool
}

// SetupLock is the host's setup lock as a Host takes it.
type SetupLock struct {
	// Path overrides the lock's file (hostns.SetupLockPath(NetNS) when
	// empty).
	Path string
	// Wait is how long a second caller waits for it (SetupLockWait when
	// 0).
	Wait time.Duration
	// Notice, when set, hears what the operator should know while they
	// wait (another run holds the lock); box prints it on stderr.
	Notice func(string)
}

// Progressf tells Progress, if anyone listens.
func (host *Host) Progressf(format string, args ...any) {
	if host.Progress != nil {
		host.Progress(format, args...)
	}
}

// OpenNS opens netlink inside the host's network namespace; a remote
// host's kernel is another machine's.
func (host *Host) OpenNS() (*hostns.NS, error) {
	if host.Remote != "" {
		return nil, &RemoteHostError{Remote: host.Remote}
	}
	return hostns.Open(host.NetNS)
}

// forwardBlockers turns another firewall's forward drop policy into
// findings: it drops the boxes' egress, and box does not rewrite rules it
// does not own, so each says what the operator can run.
func forwardBlockers(g *hostns.NS, bridge string) ([]model.Finding, error) {
	bs, err := nft.ForwardBlockers(int(g.Handle), model.Current.NFTTable, bridge)
	if err != nil {
		return nil, fmt.Errorf("reading other firewalls' forward chains: %w", err)
	}
	var out []model.Finding
	for _, b := range bs {
		fix := fmt.Sprintf("add accepts for iifname %q and oifname %q ct state established,related to %s %s %s", bridge, bridge, b.Family, b.Table, b.Chain)
		switch b.Owner {
		case "docker":
			fix = fmt.Sprintf("iptables -I DOCKER-USER -i %s -j ACCEPT; iptables -I DOCKER-USER -o %s -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT", bridge, bridge)
		case "ufw":
			fix = fmt.Sprintf("ufw route allow in on %s; ufw route allow out on %s", bridge, bridge)
		}
		out = append(out, model.Finding{Layer: model.LayerNAT, Object: "nft " + b.String(),
			Problem: "drops forwarded traffic, so boxes lose their egress; box does not change rules it does not own", Fix: fix, Advisory: true})
	}
	return out, nil
}

// RemoteHostError: what was asked reads or changes a host's kernel (nft,
// links, the port watcher), and the Host drives a remote Incus, whose
// kernel is another machine's.
type RemoteHostError struct{ Remote string }

func (e *RemoteHostError) Error() string {
	return fmt.Sprintf("this needs the host's kernel, and remote %s's host is another machine: run it there (box on that host, without --remote)", e.Remote)
}
