package probes

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// withProc points the kernel probes at a fixture /proc/self.
func withProc(t *testing.T, files map[string]string) {
	t.Helper()
	root := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(root, "self"), 0o755))
	for name, body := range files {
		require.NoError(t, os.WriteFile(filepath.Join(root, "self", name), []byte(body), 0o644))
	}
	old := procRoot
	procRoot = root
	t.Cleanup(func() { procRoot = old })
}

func kernelProbe(kind Kind, edit func(*ProbeSpec)) ProbeSpec {
	s := ProbeSpec{ID: "k1", Kind: kind, DeadlineMS: 2000}
	if edit != nil {
		edit(&s)
	}
	return s
}

func TestKernelProbeValidation(t *testing.T) {
	for _, tc := range []struct {
		name string
		spec ProbeSpec
		want string // "" for valid
	}{
		{"id_map", kernelProbe(KindIDMap, nil), ""},
		{"no target", kernelProbe(KindIDMap, func(s *ProbeSpec) { s.Port = 80 }), "takes no target"},
		{"no paths on a reading probe", kernelProbe(KindCapabilities, func(s *ProbeSpec) { s.Paths = []string{"/x"} }), "takes no paths"},
		{"write_open", kernelProbe(KindWriteOpen, func(s *ProbeSpec) { s.Paths = []string{"/proc/sys/kernel/core_pattern", "/sys/kernel/x"} }), ""},
		{"write_open needs paths", kernelProbe(KindWriteOpen, nil), "needs paths"},
		{"write_open stays under /proc and /sys", kernelProbe(KindWriteOpen, func(s *ProbeSpec) { s.Paths = []string{"/dev/watchdog"} }), "only under /proc/ and /sys/"},
		{"write_open through a process's root", kernelProbe(KindWriteOpen, func(s *ProbeSpec) { s.Paths = []string{"/proc/self/root/dev/watchdog"} }), "process's links"},
		{"write_open through a thread's fd", kernelProbe(KindWriteOpen, func(s *ProbeSpec) { s.Paths = []string{"/proc/1/task/1/fd/3"} }), "process's links"},
		{"write_open through a cwd", kernelProbe(KindWriteOpen, func(s *ProbeSpec) { s.Paths = []string{"/proc/thread-self/cwd/x"} }), "process's links"},
		{"write_open of a process's own file", kernelProbe(KindWriteOpen, func(s *ProbeSpec) { s.Paths = []string{"/proc/self/comm"} }), ""},
		{"write_open clean paths", kernelProbe(KindWriteOpen, func(s *ProbeSpec) { s.Paths = []string{"/proc/../dev/mem"} }), "not absolute and clean"},
		{"read_files anywhere", kernelProbe(KindReadFiles, func(s *ProbeSpec) { s.Paths = []string{"/etc/hostname"} }), ""},
		{"unix_http", kernelProbe(KindUnixHTTP, func(s *ProbeSpec) { s.Socket = "/dev/incus/sock"; s.Paths = []string{"/1.0", "/1.0/config"} }), ""},
		{"unix_http needs a socket", kernelProbe(KindUnixHTTP, func(s *ProbeSpec) { s.Paths = []string{"/1.0"} }), "needs socket and paths"},
		{"unix_http URL paths", kernelProbe(KindUnixHTTP, func(s *ProbeSpec) { s.Socket = "/s"; s.Paths = []string{"/1.0?x=1"} }), "not a URL path"},
		{"load needs its cap", kernelProbe(KindLoadProcs, nil), "needs max"},
		{"load cap bounded", kernelProbe(KindLoadMemory, func(s *ProbeSpec) { s.Max = MaxLoadMiB + 1 }), "needs max"},
		{"load_disk needs its folder", kernelProbe(KindLoadDisk, func(s *ProbeSpec) { s.Max = 10 }), "one directory"},
		{"load_disk", kernelProbe(KindLoadDisk, func(s *ProbeSpec) { s.Max = 10; s.Paths = []string{"/var/tmp"} }), ""},
		{"max only on loads", kernelProbe(KindSeccomp, func(s *ProbeSpec) { s.Max = 3 }), "takes no paths, socket or max"},
		{"paths not on packets", ProbeSpec{ID: "p", Kind: KindTCP, Target: netip.MustParseAddr("10.0.0.1"), Port: 80, DeadlineMS: 100, Paths: []string{"/x"}}, "for kernel and load probes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.spec.Validate()
			if tc.want == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tc.want)
		})
	}
}

func TestIDMap(t *testing.T) {
	m, err := parseIDMap("         0    1000000 1000000000\n")
	require.NoError(t, err)
	root, ok := HostID(m, 0)
	assert.True(t, ok)
	assert.EqualValues(t, 1000000, root)
	assert.False(t, HostHolds(m, 0), "host root is no one in the box")
	_, ok = HostID(m, 1000000000)
	assert.False(t, ok, "past the range")

	hostRoot, err := parseIDMap("0 0 1\n1 1000001 999999999\n")
	require.NoError(t, err)
	assert.True(t, HostHolds(hostRoot, 0))
	isolated, _ := parseIDMap("0 1065536 65536")
	_, overlaps := Overlap(m, isolated)
	assert.True(t, overlaps, "a shared range holds an isolated one")
	first, _ := parseIDMap("0 1000000 65536")
	second, _ := parseIDMap("0 1065536 65536")
	_, overlaps = Overlap(first, second)
	assert.False(t, overlaps, "two isolated ranges side by side")
	at, _ := Overlap(first, m)
	assert.EqualValues(t, 1000000, at)

	for _, bad := range []string{"", "0 1 2 3", "a b c", "0 0 99999999999"} {
		_, err := parseIDMap(bad)
		assert.Error(t, err, bad)
	}

	withProc(t, map[string]string{"uid_map": "0 1000000 65536\n", "gid_map": "0 1000000 65536\n"})
	o := RunProbe(context.Background(), kernelProbe(KindIDMap, nil))
	require.Equal(t, Reached, o.Outcome, o.Reason)
	assert.Equal(t, "root in the box is host uid 1000000", o.Reason)
	require.NotNil(t, o.Evidence.IDMap)
	withProc(t, map[string]string{"uid_map": "0 0 4294967295\n", "gid_map": "0 0 4294967295\n"})
	o = RunProbe(context.Background(), kernelProbe(KindIDMap, nil))
	assert.Equal(t, "root in the box is host uid 0", o.Reason)
	withProc(t, map[string]string{})
	o = RunProbe(context.Background(), kernelProbe(KindIDMap, nil))
	assert.Equal(t, Error, o.Outcome)
}

func TestCapabilities(t *testing.T) {
	assert.Equal(t, []string{"chown", "net_admin", "sys_admin"}, CapNames(1|1<<12|1<<21))
	assert.Equal(t, []string{"cap_63"}, CapNames(1<<63))
	withProc(t, map[string]string{"status": "Name:\tx\nCapInh:\t0000000000000000\nCapPrm:\t000001ffffffffff\nCapEff:\t000001ffffffffff\nCapBnd:\t000001ffffffffff\nCapAmb:\t0000000000000000\nNoNewPrivs:\t1\n"})
	o := RunProbe(context.Background(), kernelProbe(KindCapabilities, nil))
	require.Equal(t, Reached, o.Outcome, o.Reason)
	ev := o.Evidence.Caps
	require.NotNil(t, ev)
	assert.Len(t, ev.Bounding, 41)
	assert.Contains(t, ev.Effective, "sys_module")
	assert.Empty(t, ev.Ambient)
	assert.True(t, ev.NoNewPrivs)
	withProc(t, map[string]string{"status": "CapEff:\t0\n"})
	assert.Equal(t, Error, RunProbe(context.Background(), kernelProbe(KindCapabilities, nil)).Outcome, "a set missing is no reading")
}

func TestSeccomp(t *testing.T) {
	withProc(t, map[string]string{"status": "Seccomp:\t2\nSeccomp_filters:\t1\n"})
	o := RunProbe(context.Background(), kernelProbe(KindSeccomp, nil))
	require.Equal(t, Reached, o.Outcome, o.Reason)
	ev := o.Evidence.Seccomp
	require.NotNil(t, ev)
	assert.Equal(t, 2, ev.Mode)
	assert.Equal(t, 1, ev.Filters)
	// The trials are real system calls (this test runs under no filter).
	for _, name := range []string{TrialNameToHandle, TrialOpenByHandle, TrialInitModule} {
		errno, ok := ev.Trial(name)
		assert.True(t, ok, name)
		assert.NotEmpty(t, errno, "%s cannot succeed with nothing to work on", name)
	}
	withProc(t, map[string]string{"status": "Name:\tx\n"})
	assert.Equal(t, Error, RunProbe(context.Background(), kernelProbe(KindSeccomp, nil)).Outcome)
}

// Mountinfo lines as a box here sees them: on a dir pool (the root an
// idmapped bind of the host's ext4), and on a btrfs pool.
const (
	dirRoot   = `1298 263 254:0 /var/lib/incus/storage-pools/default/containers/k1/rootfs / rw,relatime,idmapped shared:58 - ext4 /dev/vda rw,discard`
	btrfsRoot = `1401 300 0:55 /containers/k1/rootfs / rw,relatime,idmapped shared:9 - btrfs /dev/loop0 rw,discard=async,subvol=/containers/k1`
	ownMounts = `1299 1298 0:134 / /dev rw,relatime shared:59 - tmpfs none rw,size=492k,mode=755
1300 1298 0:135 / /proc rw,nosuid,nodev,noexec,relatime shared:74 - proc proc rw
1301 1298 0:136 / /sys rw,relatime shared:75 - sysfs sysfs rw
1304 1301 0:106 /fs/fuse/connections /sys/fs/fuse/connections rw,relatime shared:76 - sysfs boxk-host rw
1312 1299 0:6 /null /dev/null rw,relatime shared:65 - devtmpfs devtmpfs rw,size=12334460k
1317 1299 0:137 / /dev/pts rw,nosuid,noexec,relatime shared:71 - devpts devpts rw,gid=1000005,mode=620
1320 1300 0:134 /.lxc-boot-id /proc/sys/kernel/random/boot_id ro,nosuid,nodev,noexec,relatime shared:59 - tmpfs none rw
272 1298 0:138 / /run rw,relatime shared:63 - tmpfs tmpfs rw,mode=755`
)

func TestMounts(t *testing.T) {
	for _, tc := range []struct {
		name, root, extra string
		foreign           []string // mount points
	}{
		{name: "dir pool, nothing of the host's", root: dirRoot},
		{name: "btrfs pool, nothing of the host's", root: btrfsRoot},
		{name: "a host path on a dir pool", root: dirRoot,
			extra:   `1500 1298 254:0 /usr/share /mnt/host ro,relatime shared:90 - ext4 /dev/vda rw`,
			foreign: []string{"/mnt/host"}},
		{name: "a host path beside a btrfs pool", root: btrfsRoot,
			extra:   `1500 1401 254:0 /usr/share /mnt/host ro,relatime shared:90 - ext4 /dev/vda rw`,
			foreign: []string{"/mnt/host"}},
		{name: "a bind inside the box's own tree", root: dirRoot,
			extra: `1500 1298 254:0 /var/lib/incus/storage-pools/default/containers/k1/rootfs/srv /mnt/srv rw shared:90 - ext4 /dev/vda rw`},
		{name: "the root's neighbour is not inside it", root: dirRoot,
			extra:   `1500 1298 254:0 /var/lib/incus/storage-pools/default/containers/k1/rootfs2 /mnt/x rw shared:90 - ext4 /dev/vda rw`,
			foreign: []string{"/mnt/x"}},
		{name: "a space escaped", root: btrfsRoot,
			extra:   `1500 1401 254:0 /srv/my\040data /mnt/my\040data rw shared:90 - ext4 /dev/vda rw`,
			foreign: []string{"/mnt/my data"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mi := tc.root + "\n" + ownMounts
			if tc.extra != "" {
				mi += "\n" + tc.extra
			}
			ev, err := judgeMounts(mi)
			require.NoError(t, err)
			assert.Equal(t, "/", ev.Root.Point)
			var pts []string
			for _, m := range ev.Foreign {
				pts = append(pts, m.Point)
			}
			assert.Equal(t, tc.foreign, pts)
			require.Len(t, ev.DevNodes, 1)
			assert.Equal(t, "/null", ev.DevNodes[0].Root)
		})
	}
	_, err := judgeMounts(ownMounts)
	assert.ErrorContains(t, err, "no root mount")
	_, err = judgeMounts("garbage")
	assert.Error(t, err)

	withProc(t, map[string]string{"mountinfo": btrfsRoot + "\n" + ownMounts + "\n1500 1401 254:0 /usr/share /mnt/host ro - ext4 /dev/vda rw\n"})
	o := RunProbe(context.Background(), kernelProbe(KindMounts, nil))
	require.Equal(t, Reached, o.Outcome, o.Reason)
	assert.Contains(t, o.Reason, "/mnt/host (ext4 /usr/share of /dev/vda)")
}

func TestDevices(t *testing.T) {
	// This machine's own /dev has the null device, whoever reads it.
	nodes, err := listDevices("/dev")
	require.NoError(t, err)
	assert.Contains(t, nodes, DeviceNode{Path: "/dev/null", Type: "c", Major: 1, Minor: 3})
	for _, n := range nodes {
		assert.False(t, strings.HasPrefix(n.Path, "/dev/pts/"), "the box's own terminals are left out: %s", n)
	}
	empty := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(empty, "file"), nil, 0o644))
	nodes, err = listDevices(empty)
	require.NoError(t, err)
	assert.Empty(t, nodes)
	_, err = listDevices(filepath.Join(empty, "none"))
	assert.Error(t, err)
	assert.Equal(t, "c 1:3 /dev/null", DeviceNode{Path: "/dev/null", Type: "c", Major: 1, Minor: 3}.String())
}

func TestWriteOpenAndReadFiles(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "w")
	require.NoError(t, os.WriteFile(f, []byte("keep"), 0o644))
	a := openForWrite(f)
	assert.True(t, a.Opened)
	b, _ := os.ReadFile(f)
	assert.Equal(t, "keep", string(b), "opened for writing, nothing written or truncated")
	a = openForWrite(filepath.Join(dir, "none"))
	assert.True(t, a.Absent)
	_, err := os.Stat(filepath.Join(dir, "none"))
	assert.True(t, os.IsNotExist(err), "nothing made")
	assert.True(t, FileAttempt{Errno: "EROFS"}.Refused())
	assert.True(t, FileAttempt{Errno: "EACCES"}.Refused())
	assert.False(t, FileAttempt{Errno: "ENOENT", Absent: true}.Refused())
	assert.Equal(t, "/x: absent", FileAttempt{Path: "/x", Absent: true}.String())

	o := RunProbe(context.Background(), kernelProbe(KindWriteOpen, func(s *ProbeSpec) { s.Paths = []string{"/proc/no-such-file"} }))
	assert.Equal(t, Error, o.Outcome, "nothing there is no refusal")

	r := kernelProbe(KindReadFiles, func(s *ProbeSpec) { s.Paths = []string{f, filepath.Join(dir, "none")} })
	o = RunProbe(context.Background(), r)
	require.Equal(t, Reached, o.Outcome)
	require.Len(t, o.Evidence.Files, 2)
	assert.Equal(t, "keep", o.Evidence.Files[0].Content)
	assert.True(t, o.Evidence.Files[1].Absent)
}

func TestReleaseAgentHierarchies(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "cgroup")
	require.NoError(t, os.WriteFile(f, []byte("9:name=systemd:/\n8:pids:/\n2:cpu,cpuacct:/x\n0::/.lxc\n"), 0o644))
	hs, err := v1Hierarchies(f)
	require.NoError(t, err)
	assert.Equal(t, []string{"none,name=systemd", "pids", "cpu,cpuacct"}, hs, "cgroup v2's line is no hierarchy to mount")
	ev := &ReleaseAgentEvidence{
		Mounted: []FileAttempt{{Path: "/sys/fs/cgroup/pids/release_agent", Errno: "EACCES"}},
		Fresh:   []CgroupTry{{Hierarchy: "pids", Mounted: true, ReleaseAgent: &FileAttempt{Path: "release_agent", Opened: true}}, {Hierarchy: "cpu", Errno: "EPERM"}},
	}
	assert.Equal(t, []string{"release_agent (a fresh pids mount)"}, ev.Opened())
}

func TestUnixHTTP(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "sock")
	l, err := net.Listen("unix", sock)
	require.NoError(t, err)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/1.0/config" {
			_ = json.NewEncoder(w).Encode(map[string]any{"metadata": []string{"/1.0/config/user.a"}})
			return
		}
		http.NotFound(w, r)
	})}
	// What incusd's guest API keys its connection map on: every
	// connection's opening and closing.
	var mu sync.Mutex
	states := map[http.ConnState]int{}
	srv.ConnState = func(_ net.Conn, s http.ConnState) {
		mu.Lock()
		states[s]++
		mu.Unlock()
	}
	go srv.Serve(l) //nolint:errcheck
	t.Cleanup(func() { srv.Close() })
	o := RunProbe(context.Background(), kernelProbe(KindUnixHTTP, func(s *ProbeSpec) { s.Socket = sock; s.Paths = []string{"/1.0/config", "/1.0/nothing", "/1.0"} }))
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return states[http.StateClosed] > 0
	}, 2*time.Second, 10*time.Millisecond, "the probe closes its connection when it is done")
	mu.Lock()
	assert.Equal(t, 1, states[http.StateNew], "every GET on one connection (incusd 6.0's guest API crashes on a request while another connection opens or closes)")
	assert.Equal(t, 1, states[http.StateClosed])
	mu.Unlock()
	require.Equal(t, Reached, o.Outcome, o.Reason)
	require.Len(t, o.Evidence.HTTP, 3)
	assert.Equal(t, 200, o.Evidence.HTTP[0].Status)
	assert.Contains(t, o.Evidence.HTTP[0].Body, `"/1.0/config/user.a"`)
	assert.True(t, json.Valid([]byte(o.Evidence.HTTP[0].Body)), "the body is kept as it came")
	assert.Equal(t, 404, o.Evidence.HTTP[1].Status)
	assert.Equal(t, sock, o.Target)

	o = RunProbe(context.Background(), kernelProbe(KindUnixHTTP, func(s *ProbeSpec) { s.Socket = sock + "x"; s.Paths = []string{"/1.0"} }))
	assert.Equal(t, Error, o.Outcome)
	assert.Contains(t, o.Reason, "no socket at")
}

func TestLoads(t *testing.T) {
	ctx := context.Background()
	// Each below its own cap and bounded by its deadline, here where no
	// limit stops it: it reaches its cap and gives everything back.
	o := RunProbe(ctx, kernelProbe(KindLoadProcs, func(s *ProbeSpec) { s.Max = 3; s.DeadlineMS = 800 }))
	require.Equal(t, Reached, o.Outcome, o.Reason)
	assert.Equal(t, 3, o.Evidence.Load.Reached)
	assert.Empty(t, o.Evidence.Load.StoppedBy)

	dir := t.TempDir()
	o = RunProbe(ctx, kernelProbe(KindLoadDisk, func(s *ProbeSpec) { s.Max = 3; s.Paths = []string{dir}; s.DeadlineMS = 800 }))
	require.Equal(t, Reached, o.Outcome, o.Reason)
	assert.Equal(t, 3, o.Evidence.Load.Reached)
	left, _ := os.ReadDir(dir)
	assert.Empty(t, left, "its file is removed")

	o = RunProbe(ctx, kernelProbe(KindLoadMemory, func(s *ProbeSpec) { s.Max = 8; s.DeadlineMS = 1500 }))
	require.Equal(t, Reached, o.Outcome, o.Reason)
	assert.Equal(t, 8, o.Evidence.Load.Reached)

	start := time.Now()
	// Past the reserve the probe keeps for giving back (700 ms), so it spins.
	o = RunProbe(ctx, kernelProbe(KindLoadCPU, func(s *ProbeSpec) { s.Max = 1; s.DeadlineMS = 2000 }))
	require.Equal(t, Reached, o.Outcome, o.Reason)
	assert.Greater(t, o.Evidence.Load.WallSeconds, 0.5, "it spun for a while")
	assert.Greater(t, o.Evidence.Load.CPUSeconds, 0.01, "and got CPU time")
	assert.Less(t, time.Since(start), 2000*time.Millisecond+3*time.Second, "within its deadline")
}

// TestOpenForWriteFollowsNoMagicLink: a process's links under /proc
// (root, cwd, fd) anywhere on the path stop the open (O_NOFOLLOW alone
// guards only the last part), so no path through them reaches a device
// node; a plain link (/proc/self) is followed.
func TestOpenForWriteFollowsNoMagicLink(t *testing.T) {
	f := filepath.Join(t.TempDir(), "f")
	require.NoError(t, os.WriteFile(f, nil, 0o644))
	direct := openForWrite(f)
	require.True(t, direct.Opened, "the control: the file itself opens (%s)", direct.Errno)
	via := openForWrite("/proc/self/root" + f)
	assert.False(t, via.Opened, "opened through /proc/self/root")
	assert.Equal(t, "ELOOP", via.Errno)
}
