package model_test

import (
	"maps"
	"strings"
	"testing"

	"github.com/box-isolation/box/stack/stacktest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/model"
)

func TestCensusJudgesEverySibling(t *testing.T) {
	good := model.KernelPort{Exists: true, Master: "boxnet", Isolated: true}
	for _, tc := range []struct {
		name     string
		inst     incus.Instance
		port     *model.KernelPort // the kernel's view of its port (nil: as good)
		notInSet bool
		want     string // a problem that must be named; "" for on the stack
		allowed  string
	}{
		{name: "on the stack", inst: stacktest.FleetInst("ok", nil)},
		{name: "the guest API turned on", inst: stacktest.FleetInst("g", func(i *incus.Instance) { i.Config["security.guestapi"] = "true" }), want: "security.guestapi=true: the box has /dev/incus"},
		{name: "nesting is allowed and said why", inst: stacktest.FleetInst("dock", func(i *incus.Instance) { maps.Copy(i.Config, model.NestingConfig()) }),
			allowed: "security.nesting=true: allowed, containers inside the box (box new --nesting)"},
		{name: "a syscall interception nesting does not set", inst: stacktest.FleetInst("dock2", func(i *incus.Instance) {
			maps.Copy(i.Config, model.NestingConfig())
			i.Config["security.syscalls.intercept.mount"] = "true"
		}), want: "sets security.syscalls.intercept.mount=true: incusd mounts file systems in the box on the host's behalf (Incus warns the kernel's file system code then meets data the box controls); box never sets it (nesting does not need it) (fix: incus config unset dock2 security.syscalls.intercept.mount (it takes effect when the box starts again: box down, box start))"},
		{name: "mknod interception is not needed either", inst: stacktest.FleetInst("dock3", func(i *incus.Instance) { i.Config["security.syscalls.intercept.mknod"] = "1" }),
			want: "sets security.syscalls.intercept.mknod=1"},
		{name: "an interception turned off is nothing", inst: stacktest.FleetInst("dock4", func(i *incus.Instance) { i.Config["security.syscalls.intercept.setxattr"] = "false" })},
		{name: "isolation off on the NIC", inst: stacktest.FleetInst("a", func(i *incus.Instance) {
			i.ExpandedDevices["eth0"]["security.port_isolation"] = "false"
			i.Devices["eth0"] = i.ExpandedDevices["eth0"]
		}), want: "incus config device set a eth0 security.port_isolation=true"},
		{name: "isolation off from a profile", inst: stacktest.FleetInst("b", func(i *incus.Instance) { delete(i.ExpandedDevices["eth0"], "security.port_isolation") }),
			want: "incus config device override b eth0 security.port_isolation=true"},
		{name: "a second NIC", inst: stacktest.FleetInst("c", func(i *incus.Instance) {
			i.ExpandedDevices["eth1"] = map[string]string{"type": "nic", "nictype": "bridged", "parent": "lanbr0"}
		}), want: "second NIC eth1 on bridged lanbr0"},
		{name: "boxnet as a plain parent", inst: stacktest.FleetInst("d", func(i *incus.Instance) {
			i.ExpandedDevices["eth0"] = map[string]string{"type": "nic", "nictype": "bridged", "parent": "boxnet", "security.port_isolation": "true"}
		}), want: "past the network's ACL"},
		{name: "a NIC option box does not make", inst: stacktest.FleetInst("e", func(i *incus.Instance) { i.ExpandedDevices["eth0"]["ipv4.routes"] = "192.168.1.0/24" }), want: "sets ipv4.routes"},
		{name: "a proxy", inst: stacktest.FleetInst("f", func(i *incus.Instance) {
			i.ExpandedDevices["p"] = map[string]string{"type": "proxy", "listen": "tcp:0.0.0.0:80", "connect": "tcp:127.0.0.1:80"}
		}), want: "proxy device p"},
		{name: "a host path", inst: stacktest.FleetInst("g", func(i *incus.Instance) {
			i.ExpandedDevices["home"] = map[string]string{"type": "disk", "source": "/home/me", "path": "/mnt"}
		}), want: `host path "/home/me"`},
		{name: "a managed volume is fine", inst: stacktest.FleetInst("h", func(i *incus.Instance) {
			i.ExpandedDevices["data"] = map[string]string{"type": "disk", "pool": "default", "source": "vol1", "path": "/data"}
		})},
		{name: "a socket", inst: stacktest.FleetInst("i", func(i *incus.Instance) {
			i.ExpandedDevices["s"] = map[string]string{"type": "unix-char", "source": "/dev/kvm"}
		}), want: "device s (unix-char)"},
		{name: "raw.lxc", inst: stacktest.FleetInst("j", func(i *incus.Instance) { i.Config["raw.lxc"] = "lxc.mount.entry = /srv srv none bind" }), want: "sets raw.lxc"},
		{name: "privileged", inst: stacktest.FleetInst("k", func(i *incus.Instance) { i.Config["security.privileged"] = "true" }), want: "is privileged"},
		{name: "privileged, as Incus also spells true", inst: stacktest.FleetInst("k2", func(i *incus.Instance) { i.Config["security.privileged"] = "Yes" }), want: "is privileged"},
		{name: "not privileged", inst: stacktest.FleetInst("k3", func(i *incus.Instance) { i.Config["security.privileged"] = "false" })},
		{name: "port not isolated", inst: stacktest.FleetInst("l", nil), port: &model.KernelPort{Exists: true, Master: "boxnet"}, want: "is not isolated"},
		{name: "port not in the set", inst: stacktest.FleetInst("m", nil), notInSet: true, want: "not in the bridge drop's port set"},
		{name: "port gone", inst: stacktest.FleetInst("n", nil), port: &model.KernelPort{}, want: "does not exist"},
		{name: "port elsewhere", inst: stacktest.FleetInst("o", nil), port: &model.KernelPort{Exists: true, Master: "docker0", Isolated: true}, want: `not on boxnet (master "docker0")`},
		{name: "stopped: judged by config only", inst: stacktest.FleetInst("p", func(i *incus.Instance) {
			i.Status = "Stopped"
			delete(i.Config, "volatile.eth0.host_name")
			i.ExpandedDevices["eth0"]["security.port_isolation"] = "false"
		}), want: "port isolation off"},
		{name: "untagged in another project is a sibling too", inst: stacktest.FleetInst("q", func(i *incus.Instance) {
			delete(i.Config, model.Current.Tag)
			i.Project = "user-1000"
			i.ExpandedDevices["eth0"]["security.port_isolation"] = "false"
		}), want: "--project user-1000"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			port := "veth-" + tc.inst.Name
			links := map[string]model.KernelPort{port: good}
			if tc.port != nil {
				links[port] = *tc.port
			}
			var members []string
			if !tc.notInSet {
				members = []string{port}
			}
			var ports []string
			if links[port].Master == "boxnet" && tc.inst.Status == "Running" {
				ports = []string{port}
			}
			c := model.TakeCensus("boxnet", []incus.Instance{tc.inst}, ports, links, members, true, "")
			require.Len(t, c.Siblings, 1, "the instance is a sibling")
			s := c.Siblings[0]
			problems := ""
			for _, p := range s.Problems {
				problems += p.What + " (fix: " + p.Fix + ")\n"
			}
			if tc.want == "" {
				assert.True(t, s.OnStack(), "problems: %s", problems)
			} else {
				assert.False(t, s.OnStack())
				assert.Contains(t, problems, tc.want)
				assert.Len(t, c.Findings(), len(s.Problems), "one finding per problem")
				assert.Equal(t, model.LayerFleet, c.Findings()[0].Layer)
				assert.Contains(t, c.Findings()[0].Object, tc.inst.Name, "the finding names the instance")
			}
			if tc.allowed != "" {
				assert.Contains(t, strings.Join(s.Allowed, "\n"), tc.allowed)
			}
		})
	}
}

func TestCensusWithoutAPortSetChecksNoMembership(t *testing.T) {
	c := model.TakeCensus("boxnet", []incus.Instance{stacktest.FleetInst("a", nil)}, []string{"veth-a"},
		map[string]model.KernelPort{"veth-a": {Exists: true, Master: "boxnet", Isolated: true}}, nil, false, "")
	assert.True(t, c.Siblings[0].OnStack(), "bridge-meta mode has no set to be missing from")
}

// The census accepts exactly what nesting sets, each key with its reason,
// and nothing it does not: nesting turned off is no allowance.
func TestCensusAcceptsExactlyTheNestingKeys(t *testing.T) {
	cfg := model.NestingConfig()
	require.Equal(t, map[string]string{"security.nesting": "true"}, cfg, "what Docker needed in a box here (docs/box.md)")
	inst := stacktest.FleetInst("n", func(i *incus.Instance) { maps.Copy(i.Config, cfg) })
	s := model.TakeCensus("boxnet", []incus.Instance{inst}, []string{"veth-n"}, map[string]model.KernelPort{"veth-n": {Exists: true, Master: "boxnet", Isolated: true}}, []string{"veth-n"}, true, "").Siblings[0]
	require.True(t, s.OnStack())
	for k, v := range cfg {
		assert.Contains(t, strings.Join(s.Allowed, "\n"), k+"="+v+": allowed, ")
	}
	off := stacktest.FleetInst("m", func(i *incus.Instance) { i.Config["security.nesting"] = "false" })
	s = model.TakeCensus("boxnet", []incus.Instance{off}, nil, nil, nil, false, "").Siblings[0]
	assert.NotContains(t, strings.Join(s.Allowed, "\n"), "security.nesting")
}

// TestCensusNamesKernelKeys: every key of the kernel boundary (kernel.go)
// set by hand is named with its reason, or allowed with why when it only
// makes the box stricter; its default says nothing.
func TestCensusNamesKernelKeys(t *testing.T) {
	for _, tc := range []struct {
		key, value string
		want       string // in the problem; "" for none
		allowed    string // in the allowed line; "" for none
	}{
		{"raw.idmap", "both 0 0", "mapping host id 0 into the box: root on the host is a user in the box", ""},
		{"raw.idmap", "uid 0-10 1000-1010", "mapping host id 0", ""},
		{"raw.idmap", "both 1000 1000", `sets raw.idmap="both 1000 1000": host ids mapped straight into the box`, ""},
		{"raw.apparmor", "mount,", "raw AppArmor rules", ""},
		{"raw.seccomp", "2\nallowlist\n", "raw system call policy", ""},
		{"linux.kernel_modules", "ip_tables,overlay", "incusd loads those modules into the host's kernel", ""},
		{"linux.sysctl.net.ipv4.ip_forward", "1", "sets linux.sysctl.net.ipv4.ip_forward=1: a kernel setting", ""},
		{"linux.kernel_modules.load", "ondemand", "how incusd loads kernel modules into the host's kernel", ""},
		{"security.delegate_bpf", "true", "BPF delegated to the box", ""},
		{"security.delegate_bpf.prog_types", "socket_filter", "BPF delegated to the box", ""},
		{"security.delegate_bpf", "false", "", ""},
		{"security.syscalls.deny_default", "false", "default deny list (kexec_load", ""},
		{"security.syscalls.deny_default", "true", "", ""},
		{"security.syscalls.deny_compat", "true", "", "stricter: the 32-bit compat"},
		{"security.syscalls.deny", "bpf", "", "stricter: more system calls denied"},
		{"security.syscalls.allow", "read\nwrite", "an allow list in place of Incus's default deny list", ""},
		{"security.syscalls.intercept.mknod", "true", "makes device nodes in the box on the host's behalf", ""},
		{"security.syscalls.intercept.setxattr", "on", "sets trusted extended attributes", ""},
		{"security.syscalls.intercept.bpf", "true", "loads BPF programs", ""},
		{"security.syscalls.intercept.sysinfo", "true", "answers sysinfo", ""},
		{"security.syscalls.intercept.mount.allowed", "ext4,xfs", "names the file systems incusd mounts", ""},
		{"security.syscalls.intercept.mknod", "false", "", ""},
		{"security.syscalls.something_new", "1", "a system call filter key box does not know", ""},
		{"security.idmap.isolated", "true", "", "stricter: a host id range of its own"},
		{"security.idmap.isolated", "false", "", ""},
		{"security.idmap.size", "65536", "", "the size of the box's host id range"},
		{"security.idmap.base", "0", "the box's host id range chosen by hand", ""},
		{"limits.kernel.memlock", "unlimited", "sets limits.kernel.memlock=unlimited: a resource limit of the box's processes", ""},
		{"limits.kernel.nofile", "1024", "limits.kernel.nofile=1024", ""},
		{"security.guestapi.images", "true", "hands the box the host's images", ""},
	} {
		t.Run(tc.key+"="+tc.value, func(t *testing.T) {
			inst := stacktest.FleetInst("kk", func(i *incus.Instance) { i.Config[tc.key] = tc.value })
			c := model.TakeCensus("boxnet", []incus.Instance{inst}, []string{"veth-kk"},
				map[string]model.KernelPort{"veth-kk": {Exists: true, Master: "boxnet", Isolated: true}}, []string{"veth-kk"}, true, "")
			require.Len(t, c.Siblings, 1)
			s := c.Siblings[0]
			problems := ""
			for _, p := range s.Problems {
				problems += p.What + " (fix: " + p.Fix + ")\n"
			}
			if tc.want == "" {
				assert.True(t, s.OnStack(), "problems: %s", problems)
			} else {
				require.Len(t, s.Problems, 1, "one problem: %s", problems)
				assert.Contains(t, s.Problems[0].What, tc.want)
				assert.Equal(t, "incus config unset kk "+tc.key+model.RestartNote, s.Problems[0].Fix)
			}
			allowed := strings.Join(s.Allowed, "\n")
			if tc.allowed != "" {
				assert.Contains(t, allowed, tc.key+"="+tc.value+": allowed, "+tc.allowed)
			} else {
				assert.NotContains(t, allowed, tc.key, "a default or a problem is not allowed")
			}
		})
	}
}
