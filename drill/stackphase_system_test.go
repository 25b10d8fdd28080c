package drill_test

import (
	"context"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/drill"
	"github.com/box-isolation/box/drill/verdicts"
	"github.com/box-isolation/box/fixtures/world"
	"github.com/box-isolation/box/internal/testenv"
	"github.com/box-isolation/box/stack/model"
)

// TestSystemNoSetupDrift: with --no-setup, a stack broken by hand fails
// the claims resting on what is broken, whatever the drill's own fresh
// boxes happen to show.
func TestSystemNoSetupDrift(t *testing.T) {
	t.Run("bridge drop table deleted", func(t *testing.T) {
		cfg := config(t)
		restoreAfter(t, cfg)
		ensured(t, cfg)
		inHost(t, cfg, "nft", "delete", "table", "bridge", model.Current.NFTTable)
		cfg.NoSetup = true
		cfg.Claims = []drill.Claim{claimOf(t, "C-SIBLING"), claimOf(t, "C-HOST")}
		rep := run(t, cfg)
		assert.Equal(t, drill.ExitViolated, rep.ExitCode)
		sib := claim(t, rep, "C-SIBLING")
		assert.Equal(t, drill.Fail, sib.Verdict)
		fails := stackFailures(sib)
		require.NotEmpty(t, fails, "C-SIBLING fails through the stack channel")
		assert.Contains(t, fails[0].Evidence, "bridge")
		assert.Empty(t, probeFailures(sib), "port isolation still stops the fresh boxes' probes: only Verify sees the hole")
		assert.Equal(t, drill.Pass, claim(t, rep, "C-HOST").Verdict, "claims not resting on the layer are untouched")
	})
	t.Run("DHCP restriction dropped from raw.dnsmasq by hand", func(t *testing.T) {
		cfg := config(t)
		restoreAfter(t, cfg)
		ensured(t, cfg)
		// As an operator types it: the settings without the two DHCP
		// lines, through a shell's $(...).
		inHost(t, cfg, "sh", "-c", `incus network set `+model.Current.Network+` raw.dnsmasq="$(incus network get `+model.Current.Network+` raw.dnsmasq | grep -v '^dhcp-ignore')"`)
		cfg.NoSetup = true
		cfg.Claims = []drill.Claim{claimOf(t, "C-SPOOF")}
		rep := run(t, cfg)
		sp := claim(t, rep, "C-SPOOF")
		assert.Equal(t, drill.Fail, sp.Verdict)
		assert.NotEmpty(t, stackFailures(sp), "Verify sees the lines gone")
		channels := map[drill.Channel]bool{}
		for _, r := range probeFailures(sp) {
			channels[r.Channel] = true
		}
		assert.True(t, channels[drill.ChannelDHCPClientID], "the server leased to a made-up client identifier: %v", channels)
		assert.False(t, channels[drill.ChannelDHCPRelease] || channels[drill.ChannelDHCPStarve], "the pin table still stops the messages naming another hardware address: %v", channels)
	})
	t.Run("ARP let past the pins by hand", func(t *testing.T) {
		cfg := config(t)
		restoreAfter(t, cfg)
		ensured(t, cfg)
		// What an operator types while chasing an ARP problem: every ARP
		// frame accepted ahead of the pin rules. IPv4 stays pinned.
		inHost(t, cfg, "nft", "insert", "rule", "bridge", model.Current.NFTTable+"_pin", "prerouting", "ether", "type", "arp", "accept")
		cfg.NoSetup = true
		cfg.Claims = []drill.Claim{claimOf(t, "C-SPOOF"), claimOf(t, "C-SIBLING")}
		rep := run(t, cfg)
		sp := claim(t, rep, "C-SPOOF")
		assert.Equal(t, drill.Fail, sp.Verdict)
		assert.NotEmpty(t, stackFailures(sp), "Verify sees the rule")
		channels := map[drill.Channel]bool{}
		poisoned := false
		for _, r := range probeFailures(sp) {
			channels[r.Channel] = true
			poisoned = poisoned || hostLied(r)
		}
		assert.True(t, channels["arp"], "a forged ARP reaches the host: %v", channels)
		assert.True(t, channels["mac"], "so does one from box-b's MAC: %v", channels)
		assert.False(t, channels["ipv4-source"], "IPv4 is still pinned: %v", channels)
		assert.True(t, poisoned, "the host's neighbour table (or the bridge's forwarding database) is the evidence")
		assert.Equal(t, drill.Pass, claim(t, rep, "C-SIBLING").Verdict, "the sibling layers are apart")
	})
	t.Run("ARP let past the pins by hand, seen from a nested workload", func(t *testing.T) {
		cfg := config(t)
		restoreAfter(t, cfg)
		ensured(t, cfg)
		inHost(t, cfg, "nft", "insert", "rule", "bridge", model.Current.NFTTable+"_pin", "prerouting", "ether", "type", "arp", "accept")
		cfg.NoSetup = true
		cfg.Claims = []drill.Claim{claimOf(t, "C-NESTED")}
		rep := run(t, cfg)
		nested := claim(t, rep, "C-NESTED")
		assert.Equal(t, drill.Fail, nested.Verdict)
		fromMAC, fromNAT := false, false
		for _, r := range probeFailures(nested) {
			fromMAC = fromMAC || (r.From == drill.PlaceNestMAC && r.Channel == drill.ChannelARP)
			fromNAT = fromNAT || r.From == drill.PlaceNestNAT
		}
		assert.True(t, fromMAC, "the nested workload's own MAC reached the host's bridge by ARP")
		assert.False(t, fromNAT, "what leaves by the box's NAT is still the box's, and pinned")
	})
	t.Run("ipv6 on at the bridge", func(t *testing.T) {
		cfg := config(t)
		restoreAfter(t, cfg)
		ensured(t, cfg)
		// The guard drops every IPv6 frame a box sends the host (its
		// router solicitations too), which leaves the box only the
		// unsolicited advertisements: off too, to see the probes fail.
		unguarded(t, cfg)
		inHost(t, cfg, "incus", "network", "set", model.Current.Network, "ipv6.address=fd42:b0c6::1/64", "ipv6.nat=true")
		cfg.NoSetup = true
		cfg.Claims = []drill.Claim{claimOf(t, "C-V6")}
		rep := run(t, cfg)
		assert.Equal(t, drill.ExitViolated, rep.ExitCode)
		v6 := claim(t, rep, "C-V6")
		assert.Equal(t, drill.Fail, v6.Verdict)
		assert.NotEmpty(t, stackFailures(v6), "Verify sees IPv6 on the bridge")
		pf := probeFailures(v6)
		assert.NotEmpty(t, pf, "and so do the probes")
		for _, r := range pf {
			t.Logf("C-V6 probe %s from %s: %s; %s", r.Channel, r.From, r.Evidence, r.AtTarget)
		}
	})
	t.Run("ssh and DNS let in by hand", func(t *testing.T) {
		cfg := config(t)
		restoreAfter(t, cfg)
		ensured(t, cfg)
		unguarded(t, cfg)
		// What an operator types to reach a box's sshd "just for now", and
		// the DNS accept as the stack had it before it was scoped.
		inHost(t, cfg, "nft", "insert", "rule", "inet", model.Current.NFTTable, "input", "iifname", model.Current.Network, "tcp", "dport", "22", "accept")
		inHost(t, cfg, "nft", "insert", "rule", "inet", model.Current.NFTTable, "input", "iifname", model.Current.Network, "udp", "dport", "53", "accept")
		cfg.NoSetup = true
		cfg.Claims = []drill.Claim{claimOf(t, "C-HOST")}
		rep := run(t, cfg)
		hc := claim(t, rep, "C-HOST")
		assert.NotEmpty(t, stackFailures(hc), "Verify sees the rules")
		reached := map[string]bool{}
		for _, r := range probeFailures(hc) {
			reached[r.Target] = strings.Contains(r.AtTarget, "counted after the host's filter")
		}
		uplink := world.UplinkHost.Addr().String()
		for _, svc := range []string{"tcp/22 (listener", "udp/53 (DNS"} {
			found := false
			for target, counted := range reached {
				if strings.Contains(target, " "+uplink+" "+svc) {
					found = true
					assert.True(t, counted, "%s: the counting chain saw it pass the filter", target)
				}
			}
			assert.True(t, found, "the probe of %s on the uplink fails: %v", svc, reached)
		}
	})
	t.Run("the host firewall's final drop deleted by hand", func(t *testing.T) {
		cfg := config(t)
		restoreAfter(t, cfg)
		st, _ := testenv.Incus(t)
		ensured(t, cfg)
		cmd := exec.Command("ip", "netns", "exec", cfg.Host.NetNS, "nft", "-a", "list", "chain", "inet", model.Current.NFTTable, "input")
		cmd.Env = append(os.Environ(), "INCUS_DIR="+st.IncusDir)
		out, err := cmd.Output()
		require.NoError(t, err)
		handle := ""
		for _, line := range strings.Split(string(out), "\n") {
			if f := strings.Fields(line); len(f) == 6 && f[2] == "drop" && f[3] == "#" && f[4] == "handle" {
				handle = f[5] // iifname "boxnet" drop # handle N
			}
		}
		require.NotEmpty(t, handle, "the final drop in:\n%s", out)
		unguarded(t, cfg)
		inHost(t, cfg, "nft", "delete", "rule", "inet", model.Current.NFTTable, "input", "handle", handle)
		cfg.NoSetup = true
		cfg.Claims = []drill.Claim{claimOf(t, "C-HOST")}
		rep := run(t, cfg)
		failed := map[string]bool{}
		for _, r := range probeFailures(claim(t, rep, "C-HOST")) {
			for _, svc := range []string{"tcp/22", "tcp/3000"} {
				if strings.Contains(r.Target, world.UplinkHost.Addr().String()+" "+svc) {
					failed[svc] = true
				}
			}
		}
		assert.Equal(t, map[string]bool{"tcp/22": true, "tcp/3000": true}, failed, "the host's ssh stand-in and developer server are reached on the uplink")
		assert.NotEmpty(t, stackFailures(claim(t, rep, "C-HOST")), "Verify sees the rule gone")
	})
	t.Run("a hosts-file name, no-hosts taken out by hand", func(t *testing.T) {
		cfg := config(t)
		restoreAfter(t, cfg)
		ensured(t, cfg)
		st, _ := testenv.Incus(t)
		// Appended in place: the file is bind-mounted into incusd's view.
		hosts := st.Names.HostsFile()
		before, err := os.ReadFile(hosts)
		require.NoError(t, err)
		t.Cleanup(func() { require.NoError(t, os.WriteFile(hosts, before, 0o644)) })
		require.NoError(t, os.WriteFile(hosts, append(before, []byte("10.20.0.99 buildcache.corp.internal buildcache\n")...), 0o644))
		hup := func() {
			v, err := cfg.Host.Verify(context.Background())
			require.NoError(t, err)
			require.NotZero(t, v.DnsmasqPID)
			require.NoError(t, syscall.Kill(v.DnsmasqPID, syscall.SIGHUP), "dnsmasq re-reads its hosts files")
		}
		hup()
		cfg.NoSetup = true
		cfg.Claims = []drill.Claim{claimOf(t, "C-NAMES")}
		rep := run(t, cfg)
		asked := false
		for _, r := range claim(t, rep, "C-NAMES").Results {
			if r.Target == "buildcache.corp.internal." {
				asked = true
				assert.Equal(t, drill.Pass, r.Verdict, "with no-hosts the name stays the host's: %s", r.Evidence)
			}
		}
		assert.True(t, asked, "the name written into the hosts file is asked")

		n, _, err := cfg.Host.Incus.Networks().Get(context.Background(), model.Current.Network)
		require.NoError(t, err)
		inHost(t, cfg, "incus", "network", "set", model.Current.Network, "raw.dnsmasq="+strings.Replace(n.Config["raw.dnsmasq"], "no-hosts\n", "", 1))
		rep = run(t, cfg)
		leaked := map[string]bool{}
		for _, r := range probeFailures(claim(t, rep, "C-NAMES")) {
			leaked[r.Target] = true
		}
		assert.True(t, leaked["buildcache.corp.internal."], "the name leaks: %v", leaked)
		assert.True(t, leaked["PTR 10.20.0.99"], "and its PTR: %v", leaked)
		assert.NotEmpty(t, stackFailures(claim(t, rep, "C-NAMES")), "Verify sees no-hosts gone")
	})

	t.Run("a port forwarded to the LAN, the ACL detached by hand", func(t *testing.T) {
		cfg := config(t)
		restoreAfter(t, cfg)
		ensured(t, cfg)
		lan := world.LANHosts[2] // on the LAN link: reachable from the host
		inHost(t, cfg, "nft", "add table ip portfwd; add chain ip portfwd prerouting { type nat hook prerouting priority dstnat; }; "+
			"add rule ip portfwd prerouting tcp dport 2222 dnat to "+lan.Addr.String()+":"+strconv.Itoa(world.LANTCPPort))
		t.Cleanup(func() { inHost(t, cfg, "nft", "delete", "table", "ip", "portfwd") })
		cfg.NoSetup = true
		cfg.Claims = []drill.Claim{claimOf(t, "C-HOST")}
		forwarded := func(rep *drill.Report) []verdicts.Result {
			var out []verdicts.Result
			for _, r := range claim(t, rep, "C-HOST").Results {
				if r.Provenance == "forward" {
					out = append(out, r)
				}
			}
			return out
		}
		rep := run(t, cfg)
		fw := forwarded(rep)
		require.NotEmpty(t, fw, "the forwarded port is a target")
		for _, r := range fw {
			assert.Equal(t, drill.Pass, r.Verdict, "%s: the ACL drops what the forward sends to the LAN: %s", r.Target, r.Evidence)
			assert.Contains(t, r.AtTarget, "nothing counted")
		}

		inHost(t, cfg, "incus", "network", "unset", model.Current.Network, "security.acls")
		// L-ROUTE still holds: the forward sends to the LAN, which is not
		// the way of the host's default route.
		rep = run(t, cfg)
		fw = forwarded(rep)
		require.NotEmpty(t, fw)
		for _, r := range fw {
			assert.Equal(t, drill.Pass, r.Verdict, "%s: with the ACL detached L-ROUTE drops what the forward sends to the LAN: %s", r.Target, r.Evidence)
		}
		inHost(t, cfg, "nft", "delete", "table", "inet", model.Current.NFTTable+"_route")
		// The guard would still drop it (it sees the host's own address,
		// before the forward's DNAT): off too, to see the forward reach.
		unguarded(t, cfg)
		rep = run(t, cfg)
		failed := 0
		for _, r := range forwarded(rep) {
			if r.Verdict == drill.Fail {
				failed++
				assert.Contains(t, r.AtTarget, "counted after the host's filter", r.Target)
			}
		}
		assert.Positive(t, failed, "without the ACL and L-ROUTE the box reaches the LAN host through the forward: %v", forwarded(rep))
	})

}

// TestSystemBridgeNetfilterOn measures a fact of docs/world.md, "These machines": with br_netfilter's
// bridge-nf-call-* on in the host namespace, bridged IPv4 and IPv6 pass
// the inet hooks, so with both sibling layers knocked out the ACL still
// stops IPv4 between boxes and L-ROUTE's forward drop IPv6, while ARP gets
// through. The report says which way the world was.
func TestSystemBridgeNetfilterOn(t *testing.T) {
	cfg := config(t, "bridge-drop", "port-isolation")
	cfg.Claims = []drill.Claim{claimOf(t, "C-SIBLING")}
	set := func(v string) {
		t.Helper()
		require.NoError(t, world.Do(cfg.Host.NetNS, func() error {
			for _, k := range []string{"iptables", "ip6tables", "arptables"} {
				if err := os.WriteFile("/proc/sys/net/bridge/bridge-nf-call-"+k, []byte(v), 0o644); err != nil {
					return err
				}
			}
			return nil
		}))
	}
	set("1")
	t.Cleanup(func() { set("0") })

	rep := run(t, cfg)
	assert.True(t, rep.Environment.BridgeNetfilter, "the report records bridge netfilter on")
	got := map[drill.Channel]drill.Verdict{}
	for _, r := range claim(t, rep, "C-SIBLING").Results {
		if r.TargetKey == string(drill.PlaceB) && !strings.HasPrefix(r.Target, "every peer") {
			got[r.Channel] = r.Verdict
		}
	}
	assert.Equal(t, map[drill.Channel]drill.Verdict{
		"arp":  drill.Fail,                                       // below the inet hooks: through
		"icmp": drill.Pass, "tcp": drill.Pass, "udp": drill.Pass, // the ACL's 10/8 drop sees bridged IPv4
		// L-ROUTE's forward drop sees bridged IPv6 too: its out-interface
		// is a bridge port, not an uplink (before L-ROUTE it got through).
		"icmpv6-link-local": drill.Pass,
	}, got)
}
