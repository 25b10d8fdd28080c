package main

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/stack/incus"
)

// TestSystemKernelKeys: each key of the kernel boundary set by hand
// through the escape hatch is named, with its reason, by box doctor and
// box list (STACK OFF, the reason on stderr); the keys that only make a
// box stricter are allowed, said why; a box exported with one is refused
// at import, naming it.
func TestSystemKernelKeys(t *testing.T) {
	r, c := worldBox(t)
	name := uniq(t)
	cleanup(t, c, name)
	require.Equal(t, exitOK, r.run(t, "new", "--name", name).code)
	code, d := doctorOf(t, r)
	require.Equal(t, exitOK, code, "a fresh box is on the stack: %v", d.Verification.Findings)

	set := func(key, value string) {
		t.Helper()
		handOver(t, r, name, "--", "config", "set", "{}", key, value)
	}
	unset := func(key string) {
		t.Helper()
		handOver(t, r, name, "--", "config", "unset", "{}", key)
	}
	for _, tc := range []struct{ key, value, want string }{
		{"raw.idmap", "both 0 0", "mapping host id 0 into the box: root on the host is a user in the box"},
		{"raw.idmap", "both 1000 1000", "host ids mapped straight into the box"},
		{"raw.apparmor", "mount,", "raw AppArmor rules"},
		{"raw.seccomp", "2\ndenylist\n", "a raw system call policy"},
		{"linux.kernel_modules", "overlay", "incusd loads those modules into the host's kernel"},
		{"linux.sysctl.net.ipv4.ip_forward", "1", "a kernel setting of the box's namespaces"},
		{"security.syscalls.deny_default", "false", "Incus's default deny list"},
		{"security.syscalls.allow", "read", "an allow list in place of Incus's default deny list"},
		{"security.syscalls.intercept.mknod", "true", "makes device nodes in the box on the host's behalf"},
		{"security.syscalls.intercept.setxattr", "true", "sets trusted extended attributes"},
		{"security.syscalls.intercept.mount", "true", "mounts file systems in the box on the host's behalf"},
		{"security.syscalls.intercept.sysinfo", "true", "answers sysinfo"},
		{"security.idmap.base", "2000000", "the box's host id range chosen by hand"},
		{"limits.kernel.memlock", "unlimited", "a resource limit of the box's processes"},
		{"security.guestapi.images", "true", "hands the box the host's images"},
	} {
		t.Run(tc.key+"="+tc.value, func(t *testing.T) {
			set(tc.key, tc.value)
			defer unset(tc.key)
			code, d := doctorOf(t, r)
			assert.Equal(t, exitFailed, code)
			found := fleetFindings(d, name)
			require.Len(t, found, 1, "doctor names the box once: %v", found)
			assert.Contains(t, found[0].Problem, tc.key)
			assert.Contains(t, found[0].Problem, tc.want)
			assert.Contains(t, found[0].Fix, "incus config unset "+name+" "+tc.key)
			list := r.run(t, "list")
			assert.Regexp(t, name+`\s+Running\s+container\s+OFF`, list.out, "box list marks it")
			assert.Contains(t, list.err, name+" is off the stack: sets "+tc.key)
		})
	}
	for _, tc := range []struct{ key, value, want string }{
		{"security.idmap.isolated", "true", "stricter: a host id range of its own"},
		{"security.syscalls.deny", "bpf", "stricter: more system calls denied"},
		{"security.syscalls.deny_compat", "true", "stricter: the 32-bit compat system calls are denied too"},
	} {
		t.Run("allowed "+tc.key, func(t *testing.T) {
			set(tc.key, tc.value)
			defer unset(tc.key)
			code, d := doctorOf(t, r)
			assert.Equal(t, exitOK, code, "%v", d.Verification.Findings)
			var allowed []string
			for _, s := range d.Verification.Fleet.Siblings {
				if s.Name == name {
					allowed = s.Allowed
				}
			}
			assert.Contains(t, strings.Join(allowed, "\n"), tc.key+"="+tc.value+": allowed, "+tc.want)
		})
	}

	// A box exported with one is refused at import, naming it.
	require.Equal(t, exitOK, r.run(t, "down", name).code)
	set("raw.idmap", "both 0 0")
	file := filepath.Join(t.TempDir(), name+".tar.gz")
	res := r.run(t, "export", name, file)
	require.Equal(t, exitOK, res.code, res.err)
	imported := uniq(t)
	cleanup(t, c, imported)
	res = r.run(t, "import", file, "--name", imported)
	assert.Equal(t, exitFailed, res.code)
	assert.Contains(t, res.err, "refusing to import "+file)
	assert.Contains(t, res.err, "sets raw.idmap=\"both 0 0\", mapping host id 0 into the box")
	_, _, err := c.Instances().Get(context.Background(), imported)
	assert.True(t, incus.IsNotFound(err), "nothing was created: %v", err)
}
