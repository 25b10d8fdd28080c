package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/fixtures/world"
	"github.com/box-isolation/box/internal/ascred"
	"github.com/box-isolation/box/internal/nsrun"
	"github.com/box-isolation/box/internal/testenv"
	"github.com/box-isolation/box/stack/model"
)

// greet connects from namespace ns to addr (network "tcp" or "unix") and
// reads what the other end says first; cred, when set, is who connects
// (unix only).
func greet(ns, network, addr string, cred *ascred.Cred) (string, error) {
	var conn net.Conn
	err := nsrun.Do(ns, func() error {
		var err error
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		if cred != nil {
			conn, err = ascred.DialUnix(ctx, addr, *cred)
			return err
		}
		conn, err = (&net.Dialer{}).DialContext(ctx, network, addr)
		return err
	})
	if err != nil {
		return "", err
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(3 * time.Second)) //nolint:errcheck
	b, err := io.ReadAll(io.LimitReader(conn, 256))
	return strings.TrimSpace(string(b)), err
}

// greetSoon greets until the answer is want (a box's listener takes a
// moment to come up) and returns how long that took.
func greetSoon(t *testing.T, ns, network, addr, want string) time.Duration {
	t.Helper()
	start := time.Now()
	var got string
	var err error
	for time.Since(start) < 10*time.Second {
		if got, err = greet(ns, network, addr, nil); err == nil && got == want {
			return time.Since(start)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("%s %s from %s: want %q, got %q (%v)", network, addr, ns, want, got, err)
	return 0
}

// listenIn starts a TCP greeter on port in the box: every connection gets
// "door-PORT-NAME".
func listenIn(t *testing.T, r runner, name string, port int) string {
	t.Helper()
	greeting := fmt.Sprintf("door-%d-%s", port, name)
	res := r.run(t, "exec", name, "--", "sh", "-c", fmt.Sprintf("busybox nc -ll -p %d -e echo %s </dev/null >/dev/null 2>&1 &", port, greeting))
	require.Equal(t, exitOK, res.code, res.err)
	return greeting
}

// freeHostPort is a random high port nothing listens on in the host's
// namespace.
func freeHostPort(t *testing.T, ns string) int {
	t.Helper()
	for range 50 {
		p := 30000 + rand.IntN(10000)
		err := nsrun.Do(ns, func() error {
			for _, a := range []string{"127.0.0.1", "[::1]"} {
				l, err := net.Listen("tcp", fmt.Sprintf("%s:%d", a, p))
				if err != nil {
					return err
				}
				l.Close()
			}
			return nil
		})
		if err == nil {
			return p
		}
	}
	t.Fatal("no free port in the host's namespace")
	return 0
}

// unanswered asserts a TCP connection from ns to addr (one of the host's
// addresses) is refused: nothing listens there, and the world has no
// firewall on these paths, so the host's kernel answers with a reset. A
// connection that opens and then says nothing is an answer, and any
// other error (no namespace, no route, a timeout) proves nothing. Its
// positive control first: from the same ns, the host's developer server on
// the same address (world.HostDevPort, on every host address) greets.
func unanswered(t *testing.T, st *world.State, ns string, addr netip.AddrPort) {
	t.Helper()
	control := netip.AddrPortFrom(addr.Addr(), world.HostDevPort)
	got, err := firstLine(ns, control.String())
	require.NoError(t, err, "positive control: %s from %s", control, ns)
	require.Equal(t, st.Greeting(world.HostDevRole), got, "positive control: %s from %s greets", control, ns)

	err = nsrun.Do(ns, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr.String())
		if err == nil {
			conn.Close()
		}
		return err
	})
	switch {
	case err == nil:
		t.Errorf("%s from %s: the connection opened (%s greets there)", addr, ns, control)
	case !errors.Is(err, syscall.ECONNREFUSED):
		t.Errorf("%s from %s: not refused: %v", addr, ns, err)
	default:
		t.Logf("%s from %s: refused (%v), while %s greets", addr, ns, err, control)
	}
}

// firstLine connects from ns to addr over TCP and reads the first line
// the other end sends.
func firstLine(ns, addr string) (string, error) {
	var line string
	err := nsrun.Do(ns, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
		if err != nil {
			return err
		}
		defer conn.Close()
		conn.SetDeadline(time.Now().Add(3 * time.Second)) //nolint:errcheck
		line, err = bufio.NewReader(io.LimitReader(conn, 256)).ReadString('\n')
		line = strings.TrimSpace(line)
		return err
	})
	return line, err
}

// TestSystemExpose: box expose opens a door from the host's loopback to a
// port in a box (TCP on 127.0.0.1 and ::1, and a unix socket only its
// owner opens), the port answers nowhere else, anything but the loopback
// is refused, the census accepts the door and names a hand-made proxy
// toward the host (also one named like a door), --remove closes it, a
// clone gets none of its source's doors and a rename moves its socket.
func TestSystemExpose(t *testing.T) {
	r, c := worldBox(t)
	st := testenv.World(t)
	ctx := context.Background()
	name, clone := uniq(t), uniq(t)
	renamed := name + "-r"
	cleanup(t, c, name, clone, renamed)
	t.Cleanup(func() {
		for _, n := range []string{name, renamed} {
			for _, p := range []int{8080, 8081, 8083} {
				os.Remove(model.DoorSocket("", n, uint16(p))) //nolint:errcheck
			}
		}
	})
	require.Equal(t, exitOK, r.run(t, "new", "--name", name).code)
	hostNS := st.Names.HostNS
	net0, _, err := c.Networks().Get(ctx, model.Current.Network)
	require.NoError(t, err)
	gw := netip.MustParsePrefix(net0.Config["ipv4.address"]).Addr()

	// A TCP door on 127.0.0.1.
	hp := freeHostPort(t, hostNS)
	hello := listenIn(t, r, name, 8080)
	start := time.Now()
	res := r.run(t, "expose", name, "8080", fmt.Sprint(hp), "--tcp")
	t.Logf("box expose --tcp took %s", time.Since(start))
	require.Equal(t, exitOK, res.code, res.err)
	assert.Contains(t, res.out, fmt.Sprintf("%s: port 8080 is at 127.0.0.1:%d on the host (device box-door-8080)", name, hp))
	assert.Contains(t, res.err, "open to every local user")
	took := greetSoon(t, hostNS, "tcp", fmt.Sprintf("127.0.0.1:%d", hp), hello)
	t.Logf("box expose to the first greeting through the door: %s (the greeting itself after %s of retries)", time.Since(start), took)

	// Nowhere else: the host's other addresses, from the host itself, the
	// LAN and the internet.
	for _, a := range []netip.Addr{gw, world.UplinkHost.Addr(), world.LANHostSide.Addr()} {
		unanswered(t, st, hostNS, netip.AddrPortFrom(a, uint16(hp)))
	}
	unanswered(t, st, hostNS, netip.AddrPortFrom(netip.IPv6Loopback(), uint16(hp)))
	unanswered(t, st, st.Names.LANNS, netip.AddrPortFrom(world.LANHostSide.Addr(), uint16(hp)))
	unanswered(t, st, st.Names.InetNS, netip.AddrPortFrom(world.UplinkHost.Addr(), uint16(hp)))
	// And the box gets no way back: nothing listens on its side.
	ex := r.run(t, "exec", name, "--", "busybox", "netstat", "-ltn")
	require.Equal(t, exitOK, ex.code)
	assert.NotContains(t, ex.out, fmt.Sprintf(":%d ", hp), "no listener in the box on the door's host port")

	// A TCP door on ::1.
	hp6 := freeHostPort(t, hostNS)
	hello6 := listenIn(t, r, name, 8081)
	res = r.run(t, "expose", name, "8081", fmt.Sprint(hp6), "--listen", "::1", "--tcp")
	require.Equal(t, exitOK, res.code, res.err)
	greetSoon(t, hostNS, "tcp", fmt.Sprintf("[::1]:%d", hp6), hello6)
	unanswered(t, st, hostNS, netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(hp6)))

	// Refused: any listen address but the loopback, a port in use.
	for _, a := range []string{"10.0.0.1", gw.String(), "0.0.0.0", "::", world.UplinkHost.Addr().String(), "127.0.0.2"} {
		res = r.run(t, "expose", name, "80", "--listen", a, "--tcp")
		assert.Equal(t, exitUsage, res.code, a)
		assert.Contains(t, res.err, "a door listens on the host's loopback only (127.0.0.1 or ::1), not "+a, a)
	}
	res = r.run(t, "expose", name, "8082", fmt.Sprint(hp), "--tcp")
	assert.Equal(t, exitFailed, res.code)
	assert.Contains(t, res.err, fmt.Sprintf("127.0.0.1:%d is taken on the host by %s's proxy device box-door-8080", hp, name))
	res = r.run(t, "expose", name, "8082", fmt.Sprint(world.HostSSHPort), "--tcp")
	assert.Equal(t, exitFailed, res.code)
	assert.Contains(t, res.err, fmt.Sprintf("127.0.0.1:%d is in use on the host (tcp ", world.HostSSHPort), "the world's ssh stand-in holds it")
	res = r.run(t, "expose", name, "8080", fmt.Sprint(hp+1), "--tcp")
	assert.Equal(t, exitFailed, res.code)
	assert.Contains(t, res.err, "box expose "+name+" --remove 8080")

	// A unix door: its owner's (root's) only.
	helloU := listenIn(t, r, name, 8083)
	res = r.run(t, "expose", name, "8083", "--unix")
	require.Equal(t, exitOK, res.code, res.err)
	sock := model.DoorSocket("", name, 8083)
	assert.Contains(t, res.out, sock+" on the host (device box-door-8083; owner 0:0, mode 0600)")
	greetSoon(t, "", "unix", sock, helloU)
	fi, err := os.Stat(sock)
	require.NoError(t, err)
	assert.Equal(t, os.ModeSocket|0o600, fi.Mode())
	_, err = greet("", "unix", sock, &ascred.Cred{UID: 65534, GID: 65534})
	assert.ErrorIs(t, err, syscall.EACCES, "another user cannot open a unix door")

	// --list and info show the three doors.
	res = r.run(t, "expose", name, "--list", "--json")
	require.Equal(t, exitOK, res.code, res.err)
	var doors []model.Door
	require.NoError(t, json.Unmarshal([]byte(res.out), &doors))
	require.Len(t, doors, 3)
	assert.Equal(t, model.Door{Device: "box-door-8080", Port: 8080, Kind: model.DoorTCP, Listen: fmt.Sprintf("tcp:127.0.0.1:%d", hp), Host: fmt.Sprintf("127.0.0.1:%d", hp)}, doors[0])
	assert.Equal(t, fmt.Sprintf("[::1]:%d", hp6), doors[1].Host)
	assert.Equal(t, model.DoorUnix, doors[2].Kind)
	assert.Equal(t, "0:0", doors[2].Owner)
	assert.Len(t, infoOf(t, r, name).Doors, 3)
	res = r.run(t, "info", name)
	assert.Contains(t, res.out, fmt.Sprintf("8080 -> 127.0.0.1:%d", hp))

	// The census accepts the doors.
	_, d := doctorOf(t, r)
	assert.Empty(t, fleetFindings(d, name), "box's own doors are on the stack")
	allowed := ""
	for _, s := range d.Verification.Fleet.Siblings {
		if s.Name == name {
			allowed = strings.Join(s.Allowed, "\n")
		}
	}
	assert.Contains(t, allowed, fmt.Sprintf("door box-door-8080: 127.0.0.1:%d on the host to port 8080 in the box", hp))
	assert.Contains(t, allowed, "door box-door-8083: "+sock)

	// A hand-made proxy toward the host (listening in the box, connecting
	// to the host's loopback): a hole, and the census names it; so is one
	// named and tagged like a door.
	inst, etag, err := c.Instances().Get(ctx, name)
	require.NoError(t, err)
	put := inst.Writable()
	put.Devices["up"] = map[string]string{"type": "proxy", "bind": "instance", "listen": "tcp:127.0.0.1:2222", "connect": fmt.Sprintf("tcp:127.0.0.1:%d", world.HostSSHPort)}
	put.Devices["box-door-9"] = map[string]string{"type": "proxy", "bind": "instance", "listen": "tcp:127.0.0.1:2223", "connect": "tcp:127.0.0.1:9", model.DoorTag: "1"}
	put.Devices["box-door-7"] = map[string]string{"type": "proxy", "listen": "tcp:127.0.0.1:2224", "connect": "tcp:127.0.0.1:7"}
	require.NoError(t, c.Instances().Update(ctx, name, put, etag))
	// Incus starts a proxy device about a second after it is added
	// (docs/measurements.md, "Doors"): try for a while before calling it closed.
	for i := 0; i < 20; i++ {
		if ex = r.run(t, "exec", name, "--", "sh", "-c", "echo hi | busybox nc -w 2 127.0.0.1 2222"); strings.Contains(ex.out, "SSH-") {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	assert.Contains(t, ex.out, "SSH-", "the hand-made proxy reaches the host's ssh from the box: a hole")
	_, d = doctorOf(t, r)
	all, _ := json.Marshal(fleetFindings(d, name))
	assert.Contains(t, string(all), "proxy device up (listen tcp:127.0.0.1:2222, connect tcp:127.0.0.1:22, bind instance) is a door between the box and the host")
	assert.Contains(t, string(all), "proxy device box-door-9 (listen tcp:127.0.0.1:2223, connect tcp:127.0.0.1:9, bind instance) is a door between the box and the host, and not one of box's: bind is")
	assert.NotContains(t, string(all), "box-door-8080", "the real doors are still accepted")
	list := r.run(t, "list")
	assert.Regexp(t, name+`\s+Running\s+container\s+OFF`, list.out)
	assert.Contains(t, string(all), "proxy device box-door-7 (listen tcp:127.0.0.1:2224, connect tcp:127.0.0.1:7) is a door between the box and the host, and not one of box's: it has no user.box.door=1 tag")
	res = r.run(t, "expose", name, "--list")
	assert.Contains(t, res.err, "box-door-9 is not one of box's doors: bind is")
	assert.Contains(t, res.err, "box-door-7 is not one of box's doors: it has no user.box.door=1 tag")
	res = r.run(t, "expose", name, "--remove", "7")
	assert.Equal(t, exitFailed, res.code, "box does not remove a device it did not tag, however it is named")
	assert.Contains(t, res.err, "box did not make it")
	res = r.run(t, "expose", name, "--remove", "9")
	assert.Equal(t, exitOK, res.code, "a device with box's name and tag is box's to remove, whatever it was changed into")
	inst, etag, err = c.Instances().Get(ctx, name)
	require.NoError(t, err)
	assert.Contains(t, inst.Devices, "box-door-7")
	assert.NotContains(t, inst.Devices, "box-door-9")
	put = inst.Writable()
	delete(put.Devices, "up")
	delete(put.Devices, "box-door-7")
	require.NoError(t, c.Instances().Update(ctx, name, put, etag))

	// --remove closes a door.
	res = r.run(t, "expose", name, "--remove", "8080")
	require.Equal(t, exitOK, res.code, res.err)
	assert.Equal(t, name+": door to port 8080 removed\n", res.out)
	unanswered(t, st, hostNS, netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(hp)))
	res = r.run(t, "expose", name, "--remove", "8083")
	require.Equal(t, exitOK, res.code, res.err)
	_, err = os.Stat(sock)
	assert.ErrorIs(t, err, os.ErrNotExist, "the unix door's socket goes with it")
	res = r.run(t, "expose", name, "--remove", "8080")
	assert.Equal(t, exitFailed, res.code)
	assert.Contains(t, res.err, "has no door to port 8080")
	_, d = doctorOf(t, r)
	assert.Empty(t, fleetFindings(d, name), "the census is clean")

	// A clone gets none of its source's doors.
	res = r.run(t, "expose", name, "8083", "--unix")
	require.Equal(t, exitOK, res.code, res.err)
	res = r.run(t, "new", "--name", clone, "--from", name)
	require.Equal(t, exitOK, res.code, res.err)
	assert.Contains(t, res.err, "doors (box-door-8081, box-door-8083) stay its own: the clone has none")
	assert.Empty(t, infoOf(t, r, clone).Doors)
	require.Equal(t, exitOK, r.run(t, "rm", "--force", clone).code)

	// A rename moves the unix door to the new name's socket.
	require.Equal(t, exitOK, r.run(t, "down", "--force", name).code)
	require.Equal(t, exitOK, r.run(t, "rename", name, renamed).code)
	doorsNow := infoOf(t, r, renamed).Doors
	require.Len(t, doorsNow, 2)
	assert.Equal(t, "unix:"+model.DoorSocket("", renamed, 8083), doorsNow[1].Listen)
	assert.Empty(t, doorsNow[1].Problem)
	require.Equal(t, exitOK, r.run(t, "start", renamed).code)
	helloR := listenIn(t, r, renamed, 8083)
	greetSoon(t, "", "unix", model.DoorSocket("", renamed, 8083), helloR)
	_, d = doctorOf(t, r)
	assert.Empty(t, fleetFindings(d, renamed))

	// rm removes the door's socket.
	require.Equal(t, exitOK, r.run(t, "rm", "--force", renamed).code)
	_, err = os.Stat(model.DoorSocket("", renamed, 8083))
	assert.ErrorIs(t, err, os.ErrNotExist)
}
