package boxes

import (
	"cmp"
	"context"
	"encoding/json"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/box-isolation/box/stack"
	"github.com/box-isolation/box/stack/stacktest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/internal/testenv/tier"
	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/incus/incustest"
	"github.com/box-isolation/box/stack/model"
)

// tcpDoor and unixDoor are doors as Expose makes them, to the box's port
// 8080.
func tcpDoor(listen string) map[string]string {
	return map[string]string{"type": "proxy", "listen": listen, "connect": "tcp:127.0.0.1:8080", "bind": "host", model.DoorTag: "1"}
}

func unixDoor(path string) map[string]string {
	d := tcpDoor("unix:" + path)
	d["uid"], d["gid"], d["mode"] = "0", "0", "0600"
	return d
}

// edit returns a copy of d with kv set ("" deletes the key).
func edit(d map[string]string, kv ...string) map[string]string {
	d = maps.Clone(d)
	for i := 0; i+1 < len(kv); i += 2 {
		if kv[i+1] == "" {
			delete(d, kv[i])
		} else {
			d[kv[i]] = kv[i+1]
		}
	}
	return d
}

func TestIsDoor(t *testing.T) {
	v4 := tcpDoor("tcp:127.0.0.1:18080")
	sock := unixDoor(model.DoorDir + "/web-8080.sock")
	for _, tc := range []struct {
		name string
		dev  map[string]string
		want string // "" for a door; else part of why not
	}{
		{"tcp on 127.0.0.1", v4, ""},
		{"tcp on ::1", tcpDoor("tcp:[::1]:18080"), ""},
		{"unix in the door folder", sock, ""},
		{"no tag", edit(v4, model.DoorTag, ""), "no user.box.door=1 tag"},
		{"bind instance: a door out of the box", edit(v4, "bind", "instance"), `bind is "instance"`},
		{"bind unset", edit(v4, "bind", ""), `bind is ""`},
		{"connect to the host's address", edit(v4, "connect", "tcp:10.88.0.1:22"), "connect is"},
		{"connect over udp", edit(v4, "connect", "udp:127.0.0.1:8080"), "connect is"},
		{"connect to a unix socket", edit(v4, "connect", "unix:/run/docker.sock"), "connect is"},
		{"connect with a leading zero", edit(v4, "connect", "tcp:127.0.0.1:08080"), "connect is"},
		{"listen everywhere", edit(v4, "listen", "tcp:0.0.0.0:18080"), "127.0.0.1:PORT or tcp:[::1]:PORT only"},
		{"listen on the gateway", edit(v4, "listen", "tcp:10.88.0.1:18080"), "127.0.0.1:PORT or tcp:[::1]:PORT only"},
		{"listen on another loopback address", edit(v4, "listen", "tcp:127.0.0.2:18080"), "only"},
		{"listen on a port range", edit(v4, "listen", "tcp:127.0.0.1:18080-18090"), "only"},
		{"listen on udp", edit(v4, "listen", "udp:127.0.0.1:18080"), "listen is"},
		{"nat", edit(v4, "nat", "true"), "sets nat=true"},
		{"proxy protocol", edit(v4, "proxy_protocol", "true"), "sets proxy_protocol=true"},
		{"security.uid", edit(v4, "security.uid", "0"), "sets security.uid=0"},
		{"another user key", edit(v4, "user.note", "x"), "sets user.note=x"},
		{"tcp with a mode", edit(v4, "mode", "0600"), "sets mode=0600"},
		{"unix elsewhere", unixDoor("/run/web.sock"), "sockets in " + model.DoorDir},
		{"unix climbing out", unixDoor(model.DoorDir + "/../web.sock"), "sockets in " + model.DoorDir},
		{"unix in a subfolder", unixDoor(model.DoorDir + "/x/web.sock"), "sockets in " + model.DoorDir},
		{"unix open to all", edit(sock, "mode", "0666"), `mode is "0666"`},
		{"unix without an owner", edit(sock, "uid", ""), `uid is ""`},
		{"unix by name", edit(sock, "gid", "staff"), `gid is "staff"`},
		{"not a proxy", map[string]string{"type": "disk", model.DoorTag: "1"}, "not a proxy"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := model.ParseDoor(tc.dev)
			assert.Equal(t, tc.want == "", model.IsDoor(tc.dev))
			if tc.want == "" {
				assert.NoError(t, err)
			} else {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.want)
			}
		})
	}
}

func TestCheckDoorListen(t *testing.T) {
	for _, a := range []string{"127.0.0.1", "::1"} {
		assert.NoError(t, model.CheckDoorListen(netip.MustParseAddr(a)), a)
	}
	for a, why := range map[string]string{
		"0.0.0.0":      "every address of the host",
		"::":           "every address of the host",
		"10.0.0.1":     "reachable from the LAN",
		"10.88.0.1":    "from the boxes themselves",
		"198.51.100.2": "reachable from other machines",
		"127.0.0.2":    "127.0.0.1 and ::1 only",
		"fe80::1":      "reachable from the LAN",
	} {
		err := model.CheckDoorListen(netip.MustParseAddr(a))
		require.Error(t, err, a)
		assert.Contains(t, err.Error(), "loopback only (127.0.0.1 or ::1), not "+a, a)
		assert.Contains(t, err.Error(), why, a)
	}
}

func TestSameTCPListen(t *testing.T) {
	for have, want := range map[string]bool{
		"tcp:127.0.0.1:8080":      true,
		"tcp:0.0.0.0:8080":        true,
		"tcp:[::]:8080":           true, // dual-stack takes 127.0.0.1 too
		"tcp:127.0.0.1:8000-8100": true,
		"tcp:127.0.0.1:80,8080":   true,
		"tcp:127.0.0.1:8081":      false,
		"tcp:[::1]:8080":          false,
		"udp:127.0.0.1:8080":      false,
		"unix:/run/x.sock":        false,
		"tcp:10.0.0.1:8080":       false,
	} {
		assert.Equal(t, want, sameTCPListen(have, "tcp:127.0.0.1:8080"), have)
	}
}

func TestDoorNames(t *testing.T) {
	assert.Equal(t, "box-door-8080", model.DoorDevice(8080))
	assert.Equal(t, model.DoorDir+"/web-80.sock", model.DoorSocket("", "web", 80))
	assert.Equal(t, model.DoorDir+"/web-80.sock", model.DoorSocket("default", "web", 80))
	assert.Equal(t, model.DoorDir+"/p.web-80.sock", model.DoorSocket("p", "web", 80), "another project's box does not collide")
}

func TestWithoutDoors(t *testing.T) {
	devs := map[string]map[string]string{
		"box-door-8080": tcpDoor("tcp:127.0.0.1:8080"),
		"root":          {"type": "disk", "path": "/", "pool": "default"},
		"handmade":      {"type": "proxy", "listen": "tcp:127.0.0.1:9", "connect": "tcp:127.0.0.1:22"},
	}
	assert.Equal(t, []string{"box-door-8080"}, withoutDoors(devs))
	assert.Contains(t, devs, "handmade", "only box's own doors are dropped; the census names the rest")
	assert.Contains(t, devs, "root")
}

// withDoor sets a device on the instance itself (both views).
func withDoor(name string, d map[string]string) func(i *incus.Instance) {
	return func(i *incus.Instance) {
		i.Devices[name] = d
		i.ExpandedDevices[name] = maps.Clone(d)
	}
}

// TestCensusAcceptsExactlyBoxsDoors: the census passes box's doors and
// names every other proxy device, however it is named.
func TestCensusAcceptsExactlyBoxsDoors(t *testing.T) {
	good := model.KernelPort{Exists: true, Master: "boxnet", Isolated: true}
	for _, tc := range []struct {
		name string
		inst incus.Instance
		want string // "" for on the stack
	}{
		{name: "a tcp door", inst: stacktest.FleetInst("a", withDoor("box-door-8080", tcpDoor("tcp:127.0.0.1:18080")))},
		{name: "a tcp door on ::1", inst: stacktest.FleetInst("a", withDoor("box-door-8080", tcpDoor("tcp:[::1]:8080")))},
		{name: "a unix door", inst: stacktest.FleetInst("a", withDoor("box-door-8080", unixDoor(model.DoorDir+"/a-8080.sock")))},
		{name: "a unix door at another box's path", inst: stacktest.FleetInst("a", withDoor("box-door-8080", unixDoor(model.DoorDir+"/b-8080.sock"))),
			want: "its socket is " + model.DoorDir + "/b-8080.sock"},
		{name: "a door's name with a proxy to the host", inst: stacktest.FleetInst("a", withDoor("box-door-8080",
			edit(tcpDoor("tcp:127.0.0.1:9"), "bind", "instance", "connect", "tcp:198.51.100.2:22"))),
			want: "proxy device box-door-8080 (listen tcp:127.0.0.1:9, connect tcp:198.51.100.2:22, bind instance) is a door between the box and the host, and not one of box's: bind is"},
		{name: "a hand-made proxy toward the host", inst: stacktest.FleetInst("a", withDoor("up", map[string]string{
			"type": "proxy", "bind": "instance", "listen": "tcp:127.0.0.1:2222", "connect": "tcp:127.0.0.1:22"})),
			want: "proxy device up (listen tcp:127.0.0.1:2222, connect tcp:127.0.0.1:22, bind instance) is a door between the box and the host"},
		{name: "a door with nat", inst: stacktest.FleetInst("a", withDoor("box-door-8080", edit(tcpDoor("tcp:127.0.0.1:8080"), "nat", "true"))),
			want: "sets nat=true"},
		{name: "a door misnamed", inst: stacktest.FleetInst("a", withDoor("box-door-80", tcpDoor("tcp:127.0.0.1:8080"))),
			want: "connects to port 8080 but is named box-door-80"},
		{name: "a door from a profile", inst: stacktest.FleetInst("a", func(i *incus.Instance) {
			i.ExpandedDevices["box-door-8080"] = tcpDoor("tcp:127.0.0.1:8080")
		}), want: "comes from a profile"},
		{name: "a door on an instance box did not mint", inst: stacktest.FleetInst("a", func(i *incus.Instance) {
			delete(i.Config, model.Current.Tag)
			withDoor("box-door-8080", tcpDoor("tcp:127.0.0.1:8080"))(i)
		}), want: "the instance is not a box"},
		{name: "a door on the legacy generation's box", inst: stacktest.FleetInst("a", func(i *incus.Instance) {
			delete(i.Config, model.Current.Tag)
			i.Config[model.Legacy.Tag] = "1"
			withDoor("box-door-8080", tcpDoor("tcp:127.0.0.1:8080"))(i)
		})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			port := "veth-" + tc.inst.Name
			c := model.TakeCensus("boxnet", []incus.Instance{tc.inst}, []string{port}, map[string]model.KernelPort{port: good}, []string{port}, true, "")
			require.Len(t, c.Siblings, 1)
			s := c.Siblings[0]
			var problems []string
			for _, p := range s.Problems {
				problems = append(problems, p.What+" (fix: "+p.Fix+")")
			}
			if tc.want == "" {
				assert.True(t, s.OnStack(), "problems: %v", problems)
				assert.Contains(t, strings.Join(s.Allowed, "\n"), "door box-door-8080: ", "the census says it saw the door and why it passes")
				return
			}
			assert.False(t, s.OnStack())
			assert.Contains(t, strings.Join(problems, "\n"), tc.want)
			assert.Contains(t, strings.Join(problems, "\n"), "incus config device remove a ")
			assert.NotContains(t, strings.Join(s.Allowed, "\n"), "door ", "a device that is not a door is never listed as allowed")
		})
	}
}

// doorServer is a fake incusd with one box, web (type typ, devices as
// given), another box with a door on 127.0.0.1:taken, and the projects
// given; it records the PUT of web.
type doorServer struct {
	srv *incustest.Server
	put chan incus.InstancePut
}

func newDoorServer(t *testing.T, typ string, devices map[string]map[string]string, projects []incus.Project, taken uint16) *doorServer {
	t.Helper()
	ds := &doorServer{srv: incustest.New(t), put: make(chan incus.InstancePut, 1)}
	web := map[string]any{"name": "web", "project": "default", "status": "Running", "type": typ,
		"config": map[string]string{model.Current.Tag: "1"}, "devices": devices, "expanded_devices": devices, "profiles": []string{"box-net"}}
	other := map[string]any{"name": "other", "project": "default", "status": "Stopped", "type": "container",
		"config":           map[string]string{model.Current.Tag: "1"},
		"expanded_devices": map[string]map[string]string{"box-door-22": edit(tcpDoor("tcp:127.0.0.1:"+strconv.Itoa(int(taken))), "connect", "tcp:127.0.0.1:22")}}
	ds.srv.Handle("GET /1.0/instances/{name}", func(w http.ResponseWriter, r *http.Request) {
		if r.PathValue("name") != "web" {
			incustest.Error(w, http.StatusNotFound, "Instance not found")
			return
		}
		incustest.SyncETag(w, `"e1"`, web)
	})
	ds.srv.Handle("GET /1.0/instances", func(w http.ResponseWriter, r *http.Request) {
		incustest.Sync(w, []any{web, other})
	})
	ds.srv.Handle("GET /1.0/projects", func(w http.ResponseWriter, r *http.Request) { incustest.Sync(w, projects) })
	stacktest.ServeStaticBridge(ds.srv, map[string]string{"ipv4.address": "10.88.0.1/24"})
	ds.srv.Handle("PUT /1.0/instances/{name}", func(w http.ResponseWriter, r *http.Request) {
		var p incus.InstancePut
		if err := json.NewDecoder(r.Body).Decode(&p); err != nil || r.Header.Get("If-Match") != `"e1"` {
			incustest.Error(w, http.StatusPreconditionFailed, "bad put")
			return
		}
		ds.put <- p
		ds.srv.Async(w, incustest.Op{Description: "Updating instance"})
	})
	return ds
}

func (ds *doorServer) host() *stack.Host { return &stack.Host{Incus: incus.New(ds.srv.Socket())} }

// freePort is a TCP port nothing listens on at 127.0.0.1 here.
func freePort(t *testing.T) uint16 {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return uint16(l.Addr().(*net.TCPAddr).Port)
}

func TestExposeMakesTheDoor(t *testing.T) {
	ctx := context.Background()
	hp := freePort(t)
	ds := newDoorServer(t, model.TypeContainer, map[string]map[string]string{}, nil, 1)
	door, err := NewDoors(ds.host()).Expose(ctx, "web", model.DoorSpec{Port: 8080, HostPort: hp})
	require.NoError(t, err)
	put := <-ds.put
	want := tcpDoor("tcp:127.0.0.1:" + strconv.Itoa(int(hp)))
	assert.Equal(t, want, put.Devices["box-door-8080"], "the device box adds")
	assert.True(t, model.IsDoor(put.Devices["box-door-8080"]))
	assert.Equal(t, model.Door{Device: "box-door-8080", Port: 8080, Kind: model.DoorTCP, Listen: want["listen"], Host: "127.0.0.1:" + strconv.Itoa(int(hp))}, *door)
	assert.Equal(t, []string{model.Current.Profile}, put.Profiles, "the rest of the box is written back as it was")

	// The same door again: nothing to do.
	ds = newDoorServer(t, model.TypeContainer, map[string]map[string]string{"box-door-8080": want}, nil, 1)
	_, err = NewDoors(ds.host()).Expose(ctx, "web", model.DoorSpec{Port: 8080, HostPort: hp})
	require.NoError(t, err)
	assert.Empty(t, ds.srv.Find(http.MethodPut, "/1.0/instances/web"), "an existing door is not written again")
	// Another door to the same port: refused until the old one goes.
	_, err = NewDoors(ds.host()).Expose(ctx, "web", model.DoorSpec{Port: 8080, HostPort: hp + 1})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "box expose web --remove 8080")

	// ::1.
	ds = newDoorServer(t, model.TypeContainer, nil, nil, 1)
	door, err = NewDoors(ds.host()).Expose(ctx, "web", model.DoorSpec{Port: 8080, HostPort: hp, Listen: netip.MustParseAddr("::1")})
	if err != nil && strings.Contains(err.Error(), "assign requested address") {
		tier.Unavailable(t, "no ::1 here: turn IPv6 on for the loopback (sysctl net.ipv6.conf.lo.disable_ipv6=0)")
	}
	require.NoError(t, err)
	assert.Equal(t, "tcp:[::1]:"+strconv.Itoa(int(hp)), (<-ds.put).Devices["box-door-8080"]["listen"])
	assert.Equal(t, "[::1]:"+strconv.Itoa(int(hp)), door.Host)
}

func TestExposeRefuses(t *testing.T) {
	ctx := context.Background()
	held, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer held.Close()
	inUse := uint16(held.Addr().(*net.TCPAddr).Port)
	taken := freePort(t)
	granted := []incus.Project{{Name: "user-1000", Config: map[string]string{stack.KeyTier: stack.TierGranted, stack.KeyTierUser: "alice"}}}
	for _, tc := range []struct {
		name     string
		typ      string
		projects []incus.Project
		tier     bool
		spec     model.DoorSpec
		want     string
	}{
		{name: "a listen address off the loopback", spec: model.DoorSpec{Port: 80, Listen: netip.MustParseAddr("10.0.0.1")}, want: "loopback only (127.0.0.1 or ::1), not 10.0.0.1"},
		{name: "every address", spec: model.DoorSpec{Port: 80, Listen: netip.MustParseAddr("0.0.0.0")}, want: "every address of the host"},
		{name: "a host port in use", spec: model.DoorSpec{Port: 80, HostPort: inUse}, want: "is in use on the host (tcp 127.0.0.1:" + strconv.Itoa(int(inUse))},
		{name: "a host port another box's door takes", spec: model.DoorSpec{Port: 80, HostPort: taken}, want: "taken on the host by other's proxy device box-door-22 (stopped): pick another host port: box expose web 80 HOSTPORT"},
		{name: "port 0", spec: model.DoorSpec{}, want: "1 to 65535"},
		{name: "a VM", typ: model.TypeVM, spec: model.DoorSpec{Port: 80}, want: "only in NAT mode"},
		{name: "a granted user", tier: true, spec: model.DoorSpec{Port: 80}, want: "restricted.devices.proxy=block"},
		{name: "a host port on a host with granted users, kind unsaid", projects: granted, spec: model.DoorSpec{Port: 80, HostPort: 8080}, want: "granted users (alice)"},
		{name: "a unix door with a host port", spec: model.DoorSpec{Port: 80, HostPort: 8080, Kind: model.DoorUnix}, want: "a unix door has no listen address or host port"},
		{name: "an unknown kind", spec: model.DoorSpec{Port: 80, Kind: "udp"}, want: `no door kind "udp"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ds := newDoorServer(t, cmp.Or(tc.typ, model.TypeContainer), nil, tc.projects, taken)
			h := ds.host()
			h.Tier.Granted = tc.tier
			_, err := (&Doors{host: h}).Expose(ctx, "web", tc.spec)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
			assert.Empty(t, ds.srv.Find(http.MethodPut, "/1.0/instances/web"), "nothing was changed")
		})
	}
}

// TestExposeUnixWhereUsersAreGranted: a host with a granted user gets a
// unix door by default, owned by whoever made it, in DoorDir.
func TestExposeUnixWhereUsersAreGranted(t *testing.T) {
	made := false
	defer func(f func() error) { mkdirDoors = f }(mkdirDoors)
	mkdirDoors = func() error { made = true; return nil }
	granted := []incus.Project{{Name: "user-1000", Config: map[string]string{stack.KeyTier: stack.TierGranted}}, {Name: "user-1001", Config: map[string]string{stack.KeyTier: stack.TierRevoked}}}
	ds := newDoorServer(t, model.TypeContainer, nil, granted, 1)
	door, err := NewDoors(ds.host()).Expose(context.Background(), "web", model.DoorSpec{Port: 8080})
	require.NoError(t, err)
	assert.Equal(t, model.DoorUnix, door.Kind)
	assert.Contains(t, door.Note, "granted users (user-1000)")
	dev := (<-ds.put).Devices["box-door-8080"]
	want := unixDoor(model.DoorDir + "/web-8080.sock")
	want["uid"], want["gid"] = strconv.Itoa(os.Geteuid()), strconv.Itoa(os.Getegid())
	assert.Equal(t, want, dev)
	assert.True(t, made, "the doors' folder is made")
}

// TestUnexposeTakesOnlyBoxsDoors: --remove removes box's door and refuses a
// device of the same name box did not tag.
func TestUnexposeTakesOnlyBoxsDoors(t *testing.T) {
	ctx := context.Background()
	ds := newDoorServer(t, model.TypeContainer, map[string]map[string]string{"box-door-8080": tcpDoor("tcp:127.0.0.1:8080"), "root": {"type": "disk", "path": "/", "pool": "default"}}, nil, 1)
	require.NoError(t, NewDoors(ds.host()).Unexpose(ctx, "web", 8080))
	put := <-ds.put
	assert.NotContains(t, put.Devices, "box-door-8080")
	assert.Contains(t, put.Devices, "root")

	err := NewDoors(ds.host()).Unexpose(ctx, "web", 9090)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "web has no door to port 9090")

	ds = newDoorServer(t, model.TypeContainer, map[string]map[string]string{"box-door-8080": edit(tcpDoor("tcp:127.0.0.1:8080"), model.DoorTag, "")}, nil, 1)
	err = NewDoors(ds.host()).Unexpose(ctx, "web", 8080)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "box did not make it")
	assert.Empty(t, ds.srv.Find(http.MethodPut, "/1.0/instances/web"))

	doors, err := NewDoors(ds.host()).ListDoors(ctx, "web")
	require.NoError(t, err)
	require.Len(t, doors, 1, "a lookalike is listed")
	assert.Contains(t, doors[0].Problem, "no user.box.door=1 tag")
	assert.Equal(t, uint16(8080), doors[0].Port)
}
