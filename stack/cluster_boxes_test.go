package stack

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/incus/incustest"
	"github.com/box-isolation/box/stack/model"
)

// A box names the member it is on; a standalone incusd's "none" is no
// member, and the JSON then has no member key.
func TestBoxNamesItsMember(t *testing.T) {
	for loc, want := range map[string]string{"m2": "m2", "none": "", "": ""} {
		inst := &incus.Instance{Name: "b", Location: loc, Config: map[string]string{model.Current.Tag: "1"}}
		b := boxOf(inst, model.Current.Name)
		assert.Equal(t, want, b.Member, "location %q", loc)
		js, err := json.Marshal(b)
		assert.NoError(t, err)
		if want == "" {
			assert.NotContains(t, string(js), `"member"`)
		} else {
			assert.Contains(t, string(js), `"member":"m2"`)
		}
	}
}

// clusterFake is a fake incusd of a three-member cluster (m1, the one
// asked, m2 and m3) with the stack's bridge and its slices. Like Incus it
// checks a fixed address's uniqueness among the NICs of one member only,
// when it is set and when the instance starts (not when it is copied), and
// refuses a bare copy to another member.
type clusterFake struct {
	srv       *incustest.Server
	clustered bool
	mu        sync.Mutex
	insts     map[string]*incus.Instance
	snaps     map[string][]incus.Instance // by instance
	place     string                      // where Incus puts an instance asked for no member
	members   []string
	moveErr   string // a move fails so
	// importFile is what a backup import makes (name is X-Incus-name).
	importFile func(name string) *incus.Instance
	// setRace and startRace, while above zero, make the next address set
	// (or start) lose a race: a box minted at the same moment on the same
	// member takes the address first.
	setRace, startRace int
	raced              int
	// leases are what the bridge's leases endpoint lists.
	leases []incus.NetworkLease
	// starting names an instance Incus is starting: it refuses changes.
	starting string
}

// fakeSlices are the members' slices of 10.88.0.0/24.
var fakeSlices = map[string]string{"m1": "10.88.0.32/27", "m2": "10.88.0.64/27", "m3": "10.88.0.96/27"}

func newClusterFake(t *testing.T) (*clusterFake, *Host) {
	t.Helper()
	f := &clusterFake{srv: incustest.New(t), clustered: true, insts: map[string]*incus.Instance{}, snaps: map[string][]incus.Instance{}, place: "m2", members: []string{"m1", "m2", "m3"}}
	s := f.srv
	s.Handle("GET /1.0", func(w http.ResponseWriter, r *http.Request) {
		incustest.Sync(w, map[string]any{"environment": map[string]any{"server_clustered": f.clustered, "server_name": map[bool]string{true: "m1", false: "none"}[f.clustered]}})
	})
	s.Handle("GET /1.0/cluster/members", func(w http.ResponseWriter, r *http.Request) {
		var out []map[string]any
		for _, m := range f.members {
			out = append(out, map[string]any{"server_name": m, "status": "Online"})
		}
		incustest.Sync(w, out)
	})
	s.Handle("GET /1.0/networks/boxnet", func(w http.ResponseWriter, r *http.Request) {
		cfg := map[string]string{"ipv4.address": "10.88.0.1/24"}
		if f.clustered {
			for m, p := range fakeSlices {
				cfg[model.KeySlice+m] = p
			}
		}
		incustest.Sync(w, map[string]any{"name": "boxnet", "config": cfg})
	})
	s.Handle("GET /1.0/networks/boxnet/leases", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		defer f.mu.Unlock()
		incustest.Sync(w, append([]incus.NetworkLease{}, f.leases...))
	})
	s.Handle("GET /1.0/profiles/{name}", func(w http.ResponseWriter, r *http.Request) {
		p, ok := hostProfiles()[r.PathValue("name")]
		if !ok {
			incustest.Error(w, http.StatusNotFound, "Profile not found")
			return
		}
		incustest.Sync(w, p)
	})
	s.Handle("GET /1.0/instances", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		defer f.mu.Unlock()
		out := []*incus.Instance{}
		for _, name := range sortedKeys(f.insts) {
			out = append(out, f.render(f.insts[name]))
		}
		incustest.Sync(w, out)
	})
	s.Handle("GET /1.0/instances/{name}", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		defer f.mu.Unlock()
		i, ok := f.insts[r.PathValue("name")]
		if !ok {
			incustest.Error(w, http.StatusNotFound, "Instance not found")
			return
		}
		incustest.SyncETag(w, `"e1"`, f.render(i))
	})
	s.Handle("GET /1.0/instances/{name}/snapshots", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		defer f.mu.Unlock()
		out := []incus.Instance{}
		for _, sn := range f.snaps[r.PathValue("name")] {
			sn.Name = r.PathValue("name") + "/" + sn.Name
			out = append(out, sn)
		}
		incustest.Sync(w, out)
	})
	s.Handle("GET /1.0/profiles", func(w http.ResponseWriter, r *http.Request) {
		var out []incus.Profile
		for _, p := range hostProfiles() {
			out = append(out, p)
		}
		incustest.Sync(w, out)
	})
	s.Handle("POST /1.0/instances", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Content-Type") == "application/octet-stream" {
			// A backup lands on the member that received it, with the
			// devices in the file: importFile's.
			_, _ = io.Copy(io.Discard, r.Body)
			f.mu.Lock()
			defer f.mu.Unlock()
			i := f.importFile(r.Header.Get("X-Incus-name"))
			i.Location = "m1"
			f.insts[i.Name] = i
			f.srv.Async(w, incustest.Op{Description: "Restoring backup"})
			return
		}
		var req incus.InstancesPost
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			incustest.Error(w, http.StatusBadRequest, err.Error())
			return
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		if _, ok := f.insts[req.Name]; ok {
			incustest.Error(w, http.StatusConflict, "Instance already exists")
			return
		}
		inst := &incus.Instance{Name: req.Name, Type: req.Type, Status: "Stopped", Location: cmp.Or(r.URL.Query().Get("target"), f.place),
			Architecture: req.Architecture, Config: maps.Clone(req.Config), Devices: map[string]map[string]string{}, Profiles: req.Profiles}
		if inst.Config == nil {
			inst.Config = map[string]string{}
		}
		if !f.clustered {
			inst.Location = ""
		}
		if req.Source.Type == "copy" {
			srcName, snap, _ := strings.Cut(req.Source.Source, "/")
			src, ok := f.insts[srcName]
			if !ok {
				incustest.Error(w, http.StatusNotFound, "Instance not found")
				return
			}
			if snap != "" {
				i := slices.IndexFunc(f.snaps[srcName], func(s incus.Instance) bool { return s.Name == snap })
				src = &f.snaps[srcName][i]
			}
			if inst.Location != src.Location && req.Architecture == "" {
				incustest.Error(w, http.StatusBadRequest, "Architecture isn't supported: ")
				return
			}
			if inst.Location != src.Location && f.insts[srcName].Status == "Running" {
				incustest.Error(w, http.StatusBadRequest, "Unable to perform live container migration. CRIU isn't installed on the source server")
				return
			}
			// Like Incus: the source's own config and devices, under the
			// request's.
			for k, v := range src.Config {
				if _, ok := inst.Config[k]; !ok {
					inst.Config[k] = v
				}
			}
			inst.Config["volatile.eth0.hwaddr"] = "10:66:6a:00:00:99"
			if inst.Profiles == nil {
				inst.Profiles = src.Profiles
			}
			for k, d := range src.Devices {
				inst.Devices[k] = maps.Clone(d)
			}
		}
		maps.Copy(inst.Devices, req.Devices)
		f.insts[req.Name] = inst
		if req.Start {
			if msg := f.startLocked(inst); msg != "" {
				f.srv.Async(w, incustest.Op{Description: "Creating instance", Err: msg})
				return
			}
		}
		f.srv.Async(w, incustest.Op{Description: "Creating instance"})
	})
	s.Handle("PUT /1.0/instances/{name}", func(w http.ResponseWriter, r *http.Request) {
		raw, _ := io.ReadAll(r.Body)
		var put incus.InstancePut
		var restore struct{ Restore string }
		if err := errors.Join(json.Unmarshal(raw, &put), json.Unmarshal(raw, &restore)); err != nil {
			incustest.Error(w, http.StatusBadRequest, err.Error())
			return
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		inst, ok := f.insts[r.PathValue("name")]
		if !ok {
			incustest.Error(w, http.StatusNotFound, "Instance not found")
			return
		}
		if inst.Name == f.starting {
			f.srv.Async(w, incustest.Op{Description: "Updating instance", Err: `Failed to create instance update operation: Instance is busy running a "start" operation`})
			return
		}
		if restore.Restore != "" {
			// Like Incus: the snapshot's config and devices come back as
			// they were, unchecked.
			i := slices.IndexFunc(f.snaps[inst.Name], func(s incus.Instance) bool { return s.Name == restore.Restore })
			if i < 0 {
				incustest.Error(w, http.StatusNotFound, "Snapshot not found")
				return
			}
			sn := f.snaps[inst.Name][i]
			inst.Devices = maps.Clone(sn.Devices)
			f.srv.Async(w, incustest.Op{Description: "Restoring snapshot"})
			return
		}
		next := *inst
		next.Config, next.Devices, next.Profiles = put.Config, put.Devices, put.Profiles
		a := fixedAddressOf(f.render(&next))
		if a.IsValid() && a != fixedAddressOf(f.render(inst)) && f.setRace > 0 {
			f.setRace--
			f.race(inst.Location, a)
		}
		// Incus validates the devices an update changes.
		changed := !maps.Equal(f.render(&next).ExpandedDevices["eth0"], f.render(inst).ExpandedDevices["eth0"])
		if changed && f.taken(inst, a) {
			incustest.Error(w, http.StatusBadRequest, fmt.Sprintf(`Failed update validation for device "eth0": IP address %q already defined on another NIC`, a))
			return
		}
		*inst = next
		f.srv.Async(w, incustest.Op{Description: "Updating instance"})
	})
	s.Handle("PUT /1.0/instances/{name}/state", func(w http.ResponseWriter, r *http.Request) {
		var body struct{ Action string }
		_ = json.NewDecoder(r.Body).Decode(&body)
		f.mu.Lock()
		defer f.mu.Unlock()
		inst, ok := f.insts[r.PathValue("name")]
		if !ok {
			incustest.Error(w, http.StatusNotFound, "Instance not found")
			return
		}
		msg := ""
		switch body.Action {
		case "start":
			msg = f.startLocked(inst)
		case "stop":
			inst.Status = "Stopped"
		}
		f.srv.Async(w, incustest.Op{Description: "Changing state", Err: msg})
	})
	s.Handle("POST /1.0/instances/{name}", func(w http.ResponseWriter, r *http.Request) {
		var body map[string]any
		_ = json.NewDecoder(r.Body).Decode(&body)
		f.mu.Lock()
		defer f.mu.Unlock()
		inst, ok := f.insts[r.PathValue("name")]
		switch {
		case !ok:
			incustest.Error(w, http.StatusNotFound, "Instance not found")
		case body["migration"] != true || r.URL.Query().Get("target") == "":
			incustest.Error(w, http.StatusBadRequest, "this fake only moves")
		case inst.Status != "Stopped":
			incustest.Error(w, http.StatusBadRequest, "Instance is running")
		case f.moveErr != "":
			f.srv.Async(w, incustest.Op{Description: "Migrating instance", Err: f.moveErr})
		default:
			inst.Location = r.URL.Query().Get("target")
			f.srv.Async(w, incustest.Op{Description: "Migrating instance"})
		}
	})
	s.Handle("POST /1.0/instances/{name}/files", func(w http.ResponseWriter, r *http.Request) { incustest.Sync(w, nil) })
	s.Handle("DELETE /1.0/instances/{name}", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		delete(f.insts, r.PathValue("name"))
		f.mu.Unlock()
		f.srv.Async(w, incustest.Op{Description: "Deleting instance"})
	})
	return f, &Host{Incus: incus.New(s.Socket()), kernelless: true}
}

// render is an instance as Incus shows it: expanded with its profiles.
func (f *clusterFake) render(i *incus.Instance) *incus.Instance {
	out := *i
	exp, _ := expandWith(out, hostProfiles())
	out.ExpandedConfig, out.ExpandedDevices = exp.ExpandedConfig, exp.ExpandedDevices
	if !f.clustered {
		out.Location = "none"
	}
	return &out
}

// taken says whether another NIC on i's member asks for a.
func (f *clusterFake) taken(i *incus.Instance, a netip.Addr) bool {
	if !a.IsValid() {
		return false
	}
	for _, o := range f.insts {
		if o.Name != i.Name && o.Location == i.Location && fixedAddressOf(f.render(o)) == a {
			return true
		}
	}
	return false
}

// race makes a box that takes address a on member, as one minted at the
// same moment would.
func (f *clusterFake) race(member string, a netip.Addr) {
	f.raced++
	name := fmt.Sprintf("racer%d", f.raced)
	f.insts[name] = &incus.Instance{Name: name, Status: "Stopped", Location: member, Profiles: []string{"box-net"},
		Config: map[string]string{model.Current.Tag: "1"}, Devices: map[string]map[string]string{"eth0": fixedNIC(a)}}
}

// startLocked starts i, checking its address as Incus does; f.mu is held.
func (f *clusterFake) startLocked(i *incus.Instance) string {
	a := fixedAddressOf(f.render(i))
	if a.IsValid() && f.startRace > 0 {
		f.startRace--
		f.race(i.Location, a)
	}
	if f.taken(i, a) {
		return fmt.Sprintf(`Failed start validation for device "eth0": IP address %q already defined on another NIC`, a)
	}
	i.Status = "Running"
	return ""
}

// add puts a box on member, with a fixed address when addr is set.
func (f *clusterFake) add(name, member, status, addr string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	i := &incus.Instance{Name: name, Type: "container", Architecture: "x86_64", Status: status, Location: member, Profiles: []string{"box-net"},
		Config:  map[string]string{model.Current.Tag: "1", StampTemplate: "blank", "volatile.eth0.hwaddr": "10:66:6a:00:00:01", "volatile.uuid": "u1"},
		Devices: map[string]map[string]string{"root": {"type": "disk", "path": "/", "pool": "default", "size": "20GiB"}}}
	if addr != "" {
		i.Devices["eth0"] = fixedNIC(netip.MustParseAddr(addr))
	}
	f.insts[name] = i
}

// inst is a copy of an instance as the fake holds it, expanded.
func (f *clusterFake) inst(t *testing.T, name string) *incus.Instance {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	i, ok := f.insts[name]
	require.True(t, ok, "no instance %s", name)
	return f.render(i)
}

// inSlice asserts that a is of member's slice.
func inSlice(t *testing.T, member string, a netip.Addr) {
	t.Helper()
	assert.True(t, netip.MustParsePrefix(fakeSlices[member]).Contains(a), "%s is in %s's slice %s", a, member, fakeSlices[member])
}

func TestCreateOnAClusterGivesAFixedAddress(t *testing.T) {
	for _, tc := range []struct {
		name, target, place, member string
		want                        string
	}{
		// The first address of m3's slice is a moved box's, elsewhere:
		// the pick is cluster-wide.
		{name: "target", target: "m3", place: "m2", member: "m3", want: "10.88.0.97"},
		{name: "placed by incus", place: "m2", member: "m2", want: "10.88.0.64"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, h := newClusterFake(t)
			f.place = tc.place
			f.add("moved", "m1", "Running", "10.88.0.96")
			post := incus.InstancesPost{Name: "b", Type: "container", Profiles: []string{"box-net"}, Config: map[string]string{model.Current.Tag: "1"}, Start: true}
			require.NoError(t, h.create(context.Background(), MintRequest{Name: "b", Target: tc.target}, post))

			b := f.inst(t, "b")
			assert.Equal(t, tc.member, b.Location)
			assert.Equal(t, "Running", b.Status)
			a := fixedAddressOf(b)
			assert.Equal(t, tc.want, a.String())
			inSlice(t, tc.member, a)
			assert.Equal(t, fixedNIC(a), b.Devices["eth0"], "the profile's NIC, with the address")

			creates := f.srv.Find(http.MethodPost, "/1.0/instances")
			require.Len(t, creates, 1)
			assert.Equal(t, tc.target, creates[0].Query.Get("target"))
			var sent incus.InstancesPost
			require.NoError(t, json.Unmarshal(creates[0].Body, &sent))
			assert.False(t, sent.Start, "created stopped: it starts once it has its address")
		})
	}
}

// Incus checks a fixed address when it is set and when the box starts: a
// box that loses either race to one minted at the same moment on its
// member gets another address, and starts.
func TestCreateOnAClusterRetriesAnAddressConflict(t *testing.T) {
	for _, tc := range []struct {
		name               string
		setRace, startRace int
		fail               bool
	}{
		{name: "at the set", setRace: 1},
		{name: "at the start", startRace: 1},
		{name: "both", setRace: 1, startRace: 1},
		{name: "every time", setRace: 9, fail: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, h := newClusterFake(t)
			f.setRace, f.startRace = tc.setRace, tc.startRace
			post := incus.InstancesPost{Name: "b", Type: "container", Profiles: []string{"box-net"}, Config: map[string]string{model.Current.Tag: "1"}, Start: true}
			err := h.create(context.Background(), MintRequest{Name: "b", Target: "m3"}, post)
			if tc.fail {
				require.Error(t, err)
				assert.Contains(t, err.Error(), "already defined on another NIC")
				assert.Len(t, f.srv.Find(http.MethodPut, "/1.0/instances/b"), addressTries, "it tries a fixed number of times")
				return
			}
			require.NoError(t, err)
			b := f.inst(t, "b")
			assert.Equal(t, "Running", b.Status)
			a := fixedAddressOf(b)
			inSlice(t, "m3", a)
			for i := 1; i <= f.raced; i++ {
				assert.NotEqual(t, fixedAddressOf(f.inst(t, fmt.Sprintf("racer%d", i))), a, "not the address the racer took")
			}
			assert.Equal(t, tc.setRace+tc.startRace, f.raced)
		})
	}
}

// On a standalone host a box gets a fixed address too (L-DHCP), of the
// bridge's subnet: created stopped, given it, then started. A granted
// user's is created started: the port watcher gives it one.
func TestCreateOnAStandaloneHost(t *testing.T) {
	f, h := newClusterFake(t)
	f.clustered = false
	f.add("a", "", "Running", "10.88.0.2")
	post := incus.InstancesPost{Name: "b", Type: "container", Profiles: []string{"box-net"}, Config: map[string]string{model.Current.Tag: "1"}, Start: true}
	err := h.create(context.Background(), MintRequest{Name: "b", Target: "m3"}, post)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "--target m3: this incusd is not a cluster member")
	require.NoError(t, h.create(context.Background(), MintRequest{Name: "b"}, post))
	b := f.inst(t, "b")
	assert.Equal(t, "Running", b.Status)
	assert.Equal(t, "10.88.0.3", fixedAddressOf(b).String(), "the first address of the subnet nobody holds (.1 is the gateway, .2 a's)")
	var sent incus.InstancesPost
	require.NoError(t, json.Unmarshal(f.srv.Find(http.MethodPost, "/1.0/instances")[0].Body, &sent))
	assert.False(t, sent.Start, "created stopped, started once it has its address")

	tier := *h
	tier.Tier = true
	post.Name = "t"
	require.NoError(t, tier.create(context.Background(), MintRequest{Name: "t"}, post))
	assert.Equal(t, "Running", f.inst(t, "t").Status, "a granted user's: created and started in one request")
	assert.False(t, fixedAddressOf(f.inst(t, "t")).IsValid(), "its user picks none")
	assert.Empty(t, f.srv.Find(http.MethodPut, "/1.0/instances/t"))
}

func TestCreateRefusesAnUnknownMember(t *testing.T) {
	f, h := newClusterFake(t)
	err := h.create(context.Background(), MintRequest{Name: "b", Target: "m9"}, incus.InstancesPost{Name: "b"})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "no cluster member m9 (members: m1, m2, m3)")
	assert.Empty(t, f.srv.Find(http.MethodPost, "/1.0/instances"))
}

// A box on a cluster without a fixed address (minted before box gave
// them) gets one of its member's slice when it starts: the fix
// addressFindings names.
func TestStartGivesAFixedAddress(t *testing.T) {
	f, h := newClusterFake(t)
	f.add("old", "m2", "Stopped", "")
	require.NoError(t, (&Manager{host: h}).Start(context.Background(), "old"))
	b := f.inst(t, "old")
	assert.Equal(t, "Running", b.Status)
	inSlice(t, "m2", fixedAddressOf(b))
}

// A clone on a cluster gets a fixed address of its own member's slice,
// never its source's: the copy request carries the source's whole
// definition (Incus copies across members only so), its NIC without the
// address.
func TestCloneOnAClusterGetsItsOwnAddress(t *testing.T) {
	for _, tc := range []struct {
		name, target, place, snap, member string
		srcStatus                         string
		coldCopy                          bool
	}{
		{name: "to another member", target: "m3", member: "m3", srcStatus: "Stopped"},
		{name: "placed by incus beside its source", place: "m1", member: "m1", srcStatus: "Stopped"},
		{name: "from a snapshot", target: "m2", snap: "s1", member: "m2", srcStatus: "Stopped"},
		{name: "running source, to another member", target: "m3", member: "m3", srcStatus: "Running", coldCopy: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, h := newClusterFake(t)
			f.place = cmp.Or(tc.place, "m2")
			f.add("src", "m1", tc.srcStatus, "10.88.0.32")
			f.snaps["src"] = []incus.Instance{{Name: "s1", Architecture: "x86_64", Profiles: []string{"box-net"},
				Config:  map[string]string{model.Current.Tag: "1", StampTemplate: "older"},
				Devices: map[string]map[string]string{"eth0": fixedNIC(netip.MustParseAddr("10.88.0.32")), "root": {"type": "disk", "path": "/", "pool": "default", "size": "20GiB"}}}}
			res, err := (&Manager{host: h}).CloneTo(context.Background(), "src", tc.snap, "c", tc.target)
			require.NoError(t, err)
			assert.Equal(t, tc.coldCopy, res.SourceStopped)
			assert.Equal(t, tc.member, res.Box.Member)

			c := f.inst(t, "c")
			assert.Equal(t, "Running", c.Status)
			a := fixedAddressOf(c)
			inSlice(t, tc.member, a)
			assert.NotEqual(t, "10.88.0.32", a.String(), "not its source's address")
			assert.Equal(t, "10.88.0.32", fixedAddressOf(f.inst(t, "src")).String(), "the source keeps its own")
			assert.Equal(t, tc.srcStatus, f.inst(t, "src").Status)
			assert.Equal(t, "20GiB", c.Devices["root"]["size"], "the source's other devices come along")
			if tc.snap != "" {
				assert.Equal(t, "older", c.Config[StampTemplate], "the snapshot's definition")
			}

			creates := f.srv.Find(http.MethodPost, "/1.0/instances")
			last := creates[len(creates)-1]
			assert.Equal(t, tc.target, last.Query.Get("target"))
			var sent incus.InstancesPost
			require.NoError(t, json.Unmarshal(last.Body, &sent))
			assert.Equal(t, "x86_64", sent.Architecture)
			assert.Equal(t, boxNIC(), sent.Devices["eth0"], "the copy's NIC asks for no address")
			for k := range sent.Config {
				assert.False(t, strings.HasPrefix(k, "volatile."), "the source's %s stays the source's", k)
			}
			assert.Equal(t, "copy", sent.Source.Type)
			assert.Equal(t, strings.TrimSuffix("src/"+tc.snap, "/"), sent.Source.Source)
		})
	}
}

// Off a cluster a clone is a plain copy, and --target is refused.
// Off a cluster a clone is a plain copy, which carries its source's
// fixed address: the clone gets its own.
func TestCloneOffAClusterIsAPlainCopy(t *testing.T) {
	f, h := newClusterFake(t)
	f.clustered = false
	f.add("src", "", "Stopped", "10.88.0.2")
	_, err := (&Manager{host: h}).CloneTo(context.Background(), "src", "", "c", "m2")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "--target m2: this incusd is not a cluster member")
	_, err = (&Manager{host: h}).Clone(context.Background(), "src", "", "c")
	require.NoError(t, err)
	var sent incus.InstancesPost
	require.NoError(t, json.Unmarshal(f.srv.Find(http.MethodPost, "/1.0/instances")[0].Body, &sent))
	assert.Nil(t, sent.Devices)
	assert.Empty(t, sent.Architecture)
	assert.Equal(t, "10.88.0.3", fixedAddressOf(f.inst(t, "c")).String(), "its own, not its source's")
	assert.Equal(t, "10.88.0.2", fixedAddressOf(f.inst(t, "src")).String())
}

func TestMoveKeepsTheAddress(t *testing.T) {
	f, h := newClusterFake(t)
	f.add("b", "m1", "Stopped", "10.88.0.33")
	res, err := (&Manager{host: h}).Move(context.Background(), "b", "m3")
	require.NoError(t, err)
	assert.Equal(t, "m1", res.From)
	assert.Equal(t, "m3", res.To)
	assert.Equal(t, "10.88.0.33", res.Address)
	assert.Equal(t, "m3", res.Box.Member)
	b := f.inst(t, "b")
	assert.Equal(t, "m3", b.Location)
	assert.Equal(t, "10.88.0.33", fixedAddressOf(b).String(), "its address goes with it: no member hands it out again")
	assert.Equal(t, "Stopped", b.Status, "moved, not started")
	assert.NotContains(t, b.Config, keyMoving)

	// Its NIC loses its address on m1 before the move (so Incus clears its
	// DHCP state there), the address held under keyMoving meanwhile, and
	// gets it back on m3, as it was.
	var writes []incustest.Request
	for _, r := range f.srv.Requests() {
		if r.Method != http.MethodGet && strings.HasPrefix(r.Path, "/1.0/instances/b") {
			writes = append(writes, r)
		}
	}
	require.Len(t, writes, 3)
	var leave, land incus.InstancePut
	require.NoError(t, json.Unmarshal(writes[0].Body, &leave))
	assert.Equal(t, http.MethodPut, writes[0].Method)
	assert.Equal(t, map[string]string{"type": "nic", "network": "boxnet", "name": transitName, "security.port_isolation": "true"}, leave.Devices["eth0"],
		"on m1, a NIC without an address, renamed: a change Incus applies by removing the NIC")
	assert.Equal(t, "10.88.0.33", leave.Config[keyMoving])
	assert.Equal(t, http.MethodPost, writes[1].Method)
	assert.Equal(t, "m3", writes[1].Query.Get("target"))
	require.NoError(t, json.Unmarshal(writes[2].Body, &land))
	assert.Equal(t, fixedNIC(netip.MustParseAddr("10.88.0.33")), land.Devices["eth0"])
	assert.NotContains(t, land.Config, keyMoving)

	// Where it is already, nothing moves.
	res, err = (&Manager{host: h}).Move(context.Background(), "b", "m3")
	require.NoError(t, err)
	assert.Contains(t, res.Notes[0], "it is on m3 already")
	assert.Len(t, f.srv.Find(http.MethodPost, "/1.0/instances/b"), 1)
}

// While a box moves, its address is its own: a box minted on the member
// it leaves does not get it.
func TestAMovingBoxKeepsItsAddress(t *testing.T) {
	f, h := newClusterFake(t)
	f.add("b", "m1", "Stopped", "")
	f.insts["b"].Config[keyMoving] = "10.88.0.32"
	a, err := h.AddressFor(context.Background(), "m1")
	require.NoError(t, err)
	assert.Equal(t, "10.88.0.33", a.String())

	// A move that stopped half-way: box start puts it back.
	require.NoError(t, (&Manager{host: h}).Start(context.Background(), "b"))
	b := f.inst(t, "b")
	assert.Equal(t, "10.88.0.32", fixedAddressOf(b).String())
	assert.NotContains(t, b.Config, keyMoving)
}

// A move Incus refuses leaves the box where it was, with its address.
func TestAFailedMoveGivesTheAddressBack(t *testing.T) {
	f, h := newClusterFake(t)
	f.add("b", "m1", "Stopped", "10.88.0.33")
	f.moveErr = "Failed migration on target: no space left"
	_, err := (&Manager{host: h}).Move(context.Background(), "b", "m2")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "no space left")
	b := f.inst(t, "b")
	assert.Equal(t, "m1", b.Location)
	assert.Equal(t, "10.88.0.33", fixedAddressOf(b).String())
	assert.NotContains(t, b.Config, keyMoving)
}

// A box minted before box gave boxes on a cluster a fixed address gets one
// of its new member's slice.
func TestMoveGivesAnAddressToABoxWithout(t *testing.T) {
	f, h := newClusterFake(t)
	f.add("old", "m1", "Stopped", "")
	res, err := (&Manager{host: h}).Move(context.Background(), "old", "m2")
	require.NoError(t, err)
	inSlice(t, "m2", netip.MustParseAddr(res.Address))
	assert.Equal(t, res.Address, fixedAddressOf(f.inst(t, "old")).String())
	assert.Contains(t, res.Notes[0], "it had no fixed address")
}

func TestMoveRefuses(t *testing.T) {
	for _, tc := range []struct {
		name, box, status, member string
		standalone, noSlice       bool
		want                      string
	}{
		{name: "running", box: "b", status: "Running", member: "m2", want: "b is running: stop it first (box down b), then move it"},
		{name: "unknown member", box: "b", status: "Stopped", member: "m9", want: "no cluster member m9 (members: m1, m2, m3)"},
		{name: "no member", box: "b", status: "Stopped", want: "which member? (members: m1, m2, m3)"},
		{name: "standalone", box: "b", status: "Running", member: "m2", standalone: true, want: "this incusd is not a member of a cluster, so there is no member to move it to (box export and box import carry a box to another host)"},
		{name: "a member box has not set up", box: "b", status: "Stopped", member: "m4", noSlice: true, want: "member m4 has no address slice on boxnet"},
		{name: "no such box", box: "nobody", member: "m2", want: "no box named nobody"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, h := newClusterFake(t)
			f.clustered = !tc.standalone
			if tc.noSlice {
				f.members = append(f.members, "m4")
			}
			f.add("b", "m1", tc.status, "10.88.0.33")
			_, err := (&Manager{host: h}).Move(context.Background(), tc.box, tc.member)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
			assert.Empty(t, f.srv.Find(http.MethodPost, "/1.0/instances/"+tc.box), "nothing was moved")
			assert.Equal(t, "m1", f.insts["b"].Location)
		})
	}
}

// An import on a cluster lands on the member that received it and gets a
// fixed address of that member's slice before it starts, whatever address
// its file carries (here the one its source, on the same member, holds);
// off a cluster it gets one of the subnet (L-DHCP), never the file's.
func TestImportOnAClusterGetsAnAddressOfItsMember(t *testing.T) {
	for _, clustered := range []bool{true, false} {
		t.Run(fmt.Sprintf("clustered %v", clustered), func(t *testing.T) {
			f, h := newClusterFake(t)
			f.clustered = clustered
			f.add("work", "m1", "Running", "10.88.0.32")
			fixture := newBackupFixture()
			fixture.backup.Container.Devices["eth0"] = fixedNIC(netip.MustParseAddr("10.88.0.32"))
			f.importFile = func(name string) *incus.Instance {
				return &incus.Instance{Name: name, Type: "container", Status: "Stopped", Profiles: []string{"box-net"},
					Config:  map[string]string{model.Current.Tag: "1", "volatile.eth0.hwaddr": "10:66:6a:00:00:01"},
					Devices: map[string]map[string]string{"eth0": fixedNIC(netip.MustParseAddr("10.88.0.32"))}}
			}
			res, err := (&Manager{host: h}).Import(context.Background(), fixtureFile(t, fixture), "copy")
			require.NoError(t, err)
			c := f.inst(t, "copy")
			assert.Equal(t, "Running", c.Status)
			if clustered {
				assert.Equal(t, "m1", res.Box.Member)
				a := fixedAddressOf(c)
				inSlice(t, "m1", a)
				assert.NotEqual(t, "10.88.0.32", a.String(), "not the address in the file")
				return
			}
			a := fixedAddressOf(c)
			assert.True(t, a.IsValid(), "a fixed address of this host's")
			assert.NotEqual(t, "10.88.0.32", a.String(), "not the address in the file, which work holds")
			assert.Contains(t, strings.Join(res.Notes, "\n"), "its fixed address 10.88.0.32 was the host's it came from: it gets one of this host's")
		})
	}
}

// A restore brings back the address a snapshot holds: a clone's snapshot
// holds its source's, which the clone then asks for again on its own
// member. The restored box gets a fresh address of its member's slice;
// one that restores its own address keeps it.
func TestRestoreOnAClusterReaddressesATakenAddress(t *testing.T) {
	f, h := newClusterFake(t)
	f.add("src", "m2", "Stopped", "10.88.0.64")
	f.add("c", "m3", "Stopped", "10.88.0.96")
	snap := func(addr string) []incus.Instance {
		return []incus.Instance{{Name: "s1", Devices: map[string]map[string]string{"eth0": fixedNIC(netip.MustParseAddr(addr))}}}
	}
	f.snaps["c"] = snap("10.88.0.64") // carried over from src
	require.NoError(t, (&Manager{host: h}).Restore(context.Background(), "c", "s1"))
	a := fixedAddressOf(f.inst(t, "c"))
	inSlice(t, "m3", a)
	assert.NotEqual(t, "10.88.0.64", a.String(), "not src's address, which src still has")
	assert.Equal(t, "10.88.0.64", fixedAddressOf(f.inst(t, "src")).String())

	f.snaps["c"] = snap("10.88.0.97")
	require.NoError(t, (&Manager{host: h}).Restore(context.Background(), "c", "s1"))
	assert.Equal(t, "10.88.0.97", fixedAddressOf(f.inst(t, "c")).String(), "its own address, taken by nobody else, stays")
}
