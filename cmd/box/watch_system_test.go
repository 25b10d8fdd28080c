package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"os/exec"
	"runtime"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/box-isolation/box/internal/syncbuf"
	"github.com/box-isolation/box/stack/hostns"
	"github.com/box-isolation/box/stack/model"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/box-isolation/box/internal/nsrun"
	"github.com/box-isolation/box/internal/testenv"
	"github.com/box-isolation/box/probes"
	"github.com/box-isolation/box/stack"
	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/nft"
)

// TestSystemRestartedBoxStaysInTheSet: a box restarted from inside gets a
// new port; with box guard-and-serve running (as a plain process, as the boot
// unit would start it) the port is isolated and in the bridge drop's set
// before a sibling sending at it all along gets a frame through. Without
// the watcher the same restart lets the sibling's frames through, so the
// test can fail. The victim's NIC has port isolation off in its config,
// so the kernel flag it comes back with is Incus's "off": only box's
// layers stand between the two.
func TestSystemRestartedBoxStaysInTheSet(t *testing.T) {
	r, c := worldBox(t)
	st := testenv.World(t)
	victim, sender := uniq(t), uniq(t)
	cleanup(t, c, victim, sender)
	require.Equal(t, exitOK, r.run(t, "new", "--name", victim).code)
	require.Equal(t, exitOK, r.run(t, "new", "--name", sender).code)
	handOver(t, r, victim, "--", "config", "device", "set", "{}", "eth0", "security.port_isolation=false")
	require.Equal(t, exitOK, r.run(t, "setup-host").code, "the re-plugged port back in the set")

	inst, _, err := c.Instances().Get(context.Background(), victim)
	require.NoError(t, err)
	vmac, err := net.ParseMAC(inst.Config["volatile.eth0.hwaddr"])
	require.NoError(t, err)
	host := &stack.Host{Incus: c, NetNS: st.Names.HostNS}

	// Control: no watcher. The restarted box's new port is outside the set
	// and not isolated, and the sibling's frames reach it.
	_, running, err := hostns.DaemonRunning(host.NetNS)
	require.NoError(t, err)
	require.False(t, running, "no port watcher may run in the world before this test")
	got := restartWhileSending(t, c, st.Names.HostNS, victim, sender, vmac)
	require.NotZero(t, got.reached, "without the watcher the sibling's frames reach the restarted box's new port (%s): else this test proves nothing", got)
	t.Logf("without the watcher: %s", got)
	require.Equal(t, exitOK, r.run(t, "setup-host").code)

	// With the watcher, started as the boot unit would start it.
	var logBuf syncbuf.Buffer
	cmd := exec.Command(testenv.Binary(t, "box"), "guard-and-serve")
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "INCUS_SOCKET=" + st.IncusSocket, "BOX_NETNS=" + st.Names.HostNS}
	cmd.Stdout, cmd.Stderr = &logBuf, &logBuf
	require.NoError(t, cmd.Start())
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		_ = cmd.Process.Signal(syscall.SIGTERM)
		err := cmd.Wait()
		assert.NoError(t, err, "box guard-and-serve exits 0 on SIGTERM")
		t.Logf("box guard-and-serve said:\n%s", logBuf.String())
	}
	t.Cleanup(stop)
	require.Eventually(t, func() bool {
		pid, running, err := hostns.DaemonRunning(host.NetNS)
		return err == nil && running && pid == cmd.Process.Pid
	}, 10*time.Second, 20*time.Millisecond, "the watcher takes its lock")

	got = restartWhileSending(t, c, st.Names.HostNS, victim, sender, vmac)
	t.Logf("with the watcher: %s", got)
	assert.Zero(t, got.reached, "no frame of the sibling's reached the restarted box's port: %s", got)
	v, err := host.Verify(context.Background())
	require.NoError(t, err)
	s, ok := v.Fleet.Sibling("default", victim)
	require.True(t, ok)
	assert.Equal(t, got.port, s.Port, "the census meets the new port")
	for _, p := range s.Problems {
		assert.NotContains(t, p.What, "its port", "the watcher put the new port right: %s", p.What)
	}
	stop()
	assert.Contains(t, logBuf.String(), got.port+": joined boxnet", "the watcher logged the new port with its delay")
}

// restarted is what one restart under fire showed.
type restarted struct {
	port    string        // the restarted box's new port
	sent    int           // frames the sibling sent during the restart
	reached int           // of those, frames the bridge sent out of a port toward the box
	joined  time.Duration // from the restart to the new port joining the bridge
	carrier time.Duration // from joining to carrier (the box's end up)
	// inSet is from joining to the first look (after the carrier came)
	// that found the port in the set; -1 when no look did. The watcher's
	// own log says how soon after the link event it put it there.
	inSet time.Duration
}

func (r restarted) String() string {
	set := "never in the port set"
	if r.inSet >= 0 {
		set = fmt.Sprintf("in the port set at the first look, %s after joining", r.inSet.Round(time.Millisecond))
	}
	return fmt.Sprintf("new port %s joined %s after the reboot, its carrier came %s later, %s; %d frames sent, %d reached it",
		r.port, r.joined.Round(time.Millisecond), r.carrier.Round(time.Millisecond), set, r.sent, r.reached)
}

// restartWhileSending reboots the victim from inside while the sender
// sends it a frame every millisecond, and counts the frames the host's
// bridge transmitted on any port toward the victim's MAC.
func restartWhileSending(t *testing.T, c *incus.Client, hostNS, victim, sender string, vmac net.HardwareAddr) restarted {
	t.Helper()
	ctx := context.Background()
	before, _, err := c.Instances().Get(ctx, victim)
	require.NoError(t, err)
	oldPort := before.Config["volatile.eth0.host_name"]
	sst, err := c.Instances().State(ctx, sender)
	require.NoError(t, err)
	nonce := probes.NewNonce()

	// The capture, in the host's namespace, on every interface: a frame
	// the bridge forwards toward the victim leaves through its port.
	var out restarted
	var mu sync.Mutex
	var capFD int
	require.NoError(t, nsrun.Do(hostNS, func() error {
		var err error
		capFD, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, int(htons16(unix.ETH_P_ALL)))
		return err
	}))
	tv := unix.NsecToTimeval(int64(100 * time.Millisecond))
	require.NoError(t, unix.SetsockoptTimeval(capFD, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv))
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer unix.Close(capFD)
		buf := make([]byte, 2048)
		for {
			select {
			case <-done:
				return
			default:
			}
			n, from, err := unix.Recvfrom(capFD, buf, 0)
			if err != nil || n < 14 {
				continue
			}
			ll, ok := from.(*unix.SockaddrLinklayer)
			if !ok || ll.Pkttype != unix.PACKET_OUTGOING || binary.BigEndian.Uint16(buf[12:14]) != probes.ControlEtherType {
				continue
			}
			if bytes.Equal(buf[0:6], vmac) && bytes.Contains(buf[:n], []byte(nonce)) {
				mu.Lock()
				out.reached++
				mu.Unlock()
			}
		}
	}()

	// The link events: when the new port joins, and when its carrier comes.
	links := make(chan netlink.LinkUpdate, 256)
	linkDone := make(chan struct{})
	h, err := netns.GetFromName(hostNS)
	require.NoError(t, err)
	defer h.Close()
	require.NoError(t, netlink.LinkSubscribeWithOptions(links, linkDone, netlink.LinkSubscribeOptions{Namespace: &h}))

	// The sender, inside the sibling's namespace.
	wg.Add(1)
	go func() {
		defer wg.Done()
		runtime.LockOSThread() // never unlocked: the thread dies with its namespace
		ns, err := netns.GetFromPid(int(sst.Pid))
		if err != nil {
			t.Errorf("sibling's namespace: %v", err)
			return
		}
		defer ns.Close()
		if err := netns.Set(ns); err != nil {
			t.Errorf("entering the sibling's namespace: %v", err)
			return
		}
		ifi, err := net.InterfaceByName("eth0")
		if err != nil {
			t.Errorf("sibling's eth0: %v", err)
			return
		}
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, 0)
		if err != nil {
			t.Errorf("sibling's packet socket: %v", err)
			return
		}
		defer unix.Close(fd)
		frame := probes.ControlFrame(vmac, ifi.HardwareAddr, nonce)
		to := &unix.SockaddrLinklayer{Ifindex: ifi.Index, Halen: 6}
		copy(to.Addr[:], vmac)
		for {
			select {
			case <-done:
				return
			default:
			}
			if unix.Sendto(fd, frame, 0, to) == nil {
				mu.Lock()
				out.sent++
				mu.Unlock()
			}
			time.Sleep(time.Millisecond)
		}
	}()

	time.Sleep(200 * time.Millisecond)
	start := time.Now()
	res, err := c.Instances().Exec(ctx, victim, incus.ExecRequest{Command: []string{"reboot", "-f"}})
	if err != nil {
		t.Logf("reboot: %v (the box going away under the exec is expected)", err)
	} else {
		t.Logf("reboot exited %d", res.ExitCode)
	}
	// The new port is the one Incus records for the box once it runs
	// again; the link events say when it joined and when its carrier came.
	type seen struct{ joined, carrier time.Time }
	events := map[string]*seen{}
	brIndex := 0
	if bh, err := netlink.NewHandleAt(h); err == nil {
		if l, err := bh.LinkByName(model.Current.Network); err == nil {
			brIndex = l.Attrs().Index
		}
		bh.Close()
	}
	require.NotZero(t, brIndex)
	newPort := ""
	deadline := time.After(60 * time.Second)
	poll := time.NewTicker(50 * time.Millisecond)
	defer poll.Stop()
	for newPort == "" || events[newPort] == nil || events[newPort].carrier.IsZero() {
		select {
		case u := <-links:
			a := u.Attrs()
			if a.MasterIndex != brIndex || u.Header.Type != unix.RTM_NEWLINK {
				continue
			}
			e := events[a.Name]
			if e == nil {
				e = &seen{joined: time.Now()}
				events[a.Name] = e
			}
			if e.carrier.IsZero() && u.IfInfomsg.Flags&unix.IFF_LOWER_UP != 0 {
				e.carrier = time.Now()
			}
		case <-poll.C:
			if newPort != "" {
				continue
			}
			if i, _, err := c.Instances().Get(ctx, victim); err == nil && i.Status == "Running" {
				if p := i.Config["volatile.eth0.host_name"]; p != "" && p != oldPort {
					newPort = p
				}
			}
		case <-deadline:
			t.Fatalf("the restarted box's new port did not come up within a minute (new port %q)", newPort)
		}
	}
	joinedAt, carrierAt := events[newPort].joined, events[newPort].carrier
	// Its set membership, looked at as fast as the kernel answers.
	inSet := time.Duration(-1)
	for time.Since(joinedAt) < 3*time.Second {
		if members, ok, err := portSetMembers(hostNS); err == nil && ok && slices.Contains(members, newPort) {
			inSet = time.Since(joinedAt)
			break
		}
		time.Sleep(200 * time.Microsecond)
	}
	time.Sleep(2 * time.Second) // the box's own end up, DHCP, the sibling still sending
	close(done)
	close(linkDone)
	wg.Wait()
	out.port, out.joined, out.carrier = newPort, joinedAt.Sub(start), carrierAt.Sub(joinedAt)
	out.inSet = inSet
	require.NotZero(t, out.sent, "the sibling sent")
	return out
}

func portSetMembers(hostNS string) ([]string, bool, error) {
	h, err := netns.GetFromName(hostNS)
	if err != nil {
		return nil, false, err
	}
	defer h.Close()
	return nft.PortSetMembers(nft.Config{Table: model.Current.NFTTable, Bridge: model.Current.Network, NetNS: int(h)})
}

func htons16(v uint16) uint16 { return v<<8 | v>>8 }
