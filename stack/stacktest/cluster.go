package stacktest

import (
	"cmp"
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

	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/incus/incustest"
	"github.com/box-isolation/box/stack/model"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// ClusterFake is a fake incusd of a three-member cluster (m1, the one
// asked, m2 and m3) with the stack's bridge and its slices. Like Incus it
// checks a fixed address's uniqueness among the NICs of one member only,
// when it is set and when the instance starts (not when it is copied), and
// refuses a bare copy to another member.
type ClusterFake struct {
	Srv       *incustest.Server
	Clustered bool
	Mu        sync.Mutex
	Insts     map[string]*incus.Instance
	Snaps     map[string][]incus.Instance // by instance
	Place     string                      // where Incus puts an instance asked for no member
	Members   []string
	MoveErr   string // a move fails so
	// ImportFile is what a backup import makes (name is X-Incus-name).
	ImportFile func(name string) *incus.Instance
	// SetRace and StartRace, while above zero, make the next address set
	// (or start) lose a race: a box minted at the same moment on the same
	// member takes the address first.
	SetRace, StartRace int
	Raced              int
	// Leases are what the bridge's leases endpoint lists.
	Leases []incus.NetworkLease
	// Starting names an instance Incus is starting: it refuses changes.
	Starting string
	// Bridge is the stack's bridge, with the user keys box wrote.
	Bridge *Bridge
	// Started holds each instance's config as each start found it, and
	// Restored the status each restore found, in order, by instance.
	Started  map[string][]map[string]string
	Restored map[string][]string
}

// fakeSlices are the members' slices of 10.88.0.0/24.
var fakeSlices = map[string]string{"m1": "10.88.0.32/27", "m2": "10.88.0.64/27", "m3": "10.88.0.96/27"}

// NewClusterServer is the fake incusd alone.
func NewClusterServer(t *testing.T) *ClusterFake {
	t.Helper()
	f := &ClusterFake{Srv: incustest.New(t), Clustered: true, Insts: map[string]*incus.Instance{}, Snaps: map[string][]incus.Instance{}, Place: "m2", Members: []string{"m1", "m2", "m3"}}
	s := f.Srv
	s.Handle("GET /1.0", func(w http.ResponseWriter, r *http.Request) {
		incustest.Sync(w, map[string]any{"environment": map[string]any{"server_clustered": f.Clustered, "server_name": map[bool]string{true: "m1", false: "none"}[f.Clustered]}})
	})
	s.Handle("GET /1.0/cluster/members", func(w http.ResponseWriter, r *http.Request) {
		var out []map[string]any
		for _, m := range f.Members {
			out = append(out, map[string]any{"server_name": m, "status": "Online"})
		}
		incustest.Sync(w, out)
	})
	f.Bridge = ServeBridge(s, func() map[string]string {
		cfg := map[string]string{"ipv4.address": "10.88.0.1/24"}
		if f.Clustered {
			for m, p := range fakeSlices {
				cfg[model.KeySlice+m] = p
			}
		}
		return cfg
	})
	s.Handle("GET /1.0/networks/boxnet/leases", func(w http.ResponseWriter, r *http.Request) {
		f.Mu.Lock()
		defer f.Mu.Unlock()
		incustest.Sync(w, append([]incus.NetworkLease{}, f.Leases...))
	})
	s.Handle("GET /1.0/profiles/{name}", func(w http.ResponseWriter, r *http.Request) {
		p, ok := HostProfiles()[r.PathValue("name")]
		if !ok {
			incustest.Error(w, http.StatusNotFound, "Profile not found")
			return
		}
		incustest.Sync(w, p)
	})
	s.Handle("GET /1.0/instances", func(w http.ResponseWriter, r *http.Request) {
		f.Mu.Lock()
		defer f.Mu.Unlock()
		out := []*incus.Instance{}
		for _, name := range model.SortedKeys(f.Insts) {
			out = append(out, f.Render(f.Insts[name]))
		}
		incustest.Sync(w, out)
	})
	s.Handle("GET /1.0/instances/{name}", func(w http.ResponseWriter, r *http.Request) {
		f.Mu.Lock()
		defer f.Mu.Unlock()
		i, ok := f.Insts[r.PathValue("name")]
		if !ok {
			incustest.Error(w, http.StatusNotFound, "Instance not found")
			return
		}
		incustest.SyncETag(w, `"e1"`, f.Render(i))
	})
	s.Handle("GET /1.0/instances/{name}/snapshots", func(w http.ResponseWriter, r *http.Request) {
		f.Mu.Lock()
		defer f.Mu.Unlock()
		out := []incus.Instance{}
		for _, sn := range f.Snaps[r.PathValue("name")] {
			sn.Name = r.PathValue("name") + "/" + sn.Name
			out = append(out, sn)
		}
		incustest.Sync(w, out)
	})
	s.Handle("GET /1.0/profiles", ProfileList)
	s.Handle("POST /1.0/instances", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Content-Type") == "application/octet-stream" {
			// A backup lands on the member that received it, with the
			// devices in the file: importFile's.
			_, _ = io.Copy(io.Discard, r.Body)
			f.Mu.Lock()
			defer f.Mu.Unlock()
			i := f.ImportFile(r.Header.Get("X-Incus-name"))
			i.Location = "m1"
			f.Insts[i.Name] = i
			f.Srv.Async(w, incustest.Op{Description: "Restoring backup"})
			return
		}
		var req incus.InstancesPost
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			incustest.Error(w, http.StatusBadRequest, err.Error())
			return
		}
		f.Mu.Lock()
		defer f.Mu.Unlock()
		if _, ok := f.Insts[req.Name]; ok {
			incustest.Error(w, http.StatusConflict, "Instance already exists")
			return
		}
		inst := &incus.Instance{Name: req.Name, Type: req.Type, Status: "Stopped", Location: cmp.Or(r.URL.Query().Get("target"), f.Place),
			Architecture: req.Architecture, Config: maps.Clone(req.Config), Devices: map[string]map[string]string{}, Profiles: req.Profiles}
		if inst.Config == nil {
			inst.Config = map[string]string{}
		}
		if !f.Clustered {
			inst.Location = ""
		}
		if req.Source.Type == "copy" {
			srcName, snap, _ := strings.Cut(req.Source.Source, "/")
			src, ok := f.Insts[srcName]
			if !ok {
				incustest.Error(w, http.StatusNotFound, "Instance not found")
				return
			}
			if snap != "" {
				i := slices.IndexFunc(f.Snaps[srcName], func(s incus.Instance) bool { return s.Name == snap })
				src = &f.Snaps[srcName][i]
			}
			if inst.Location != src.Location && req.Architecture == "" {
				incustest.Error(w, http.StatusBadRequest, "Architecture isn't supported: ")
				return
			}
			if inst.Location != src.Location && f.Insts[srcName].Status == "Running" {
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
		f.Insts[req.Name] = inst
		if req.Start {
			if msg := f.startLocked(inst); msg != "" {
				f.Srv.Async(w, incustest.Op{Description: "Creating instance", Err: msg})
				return
			}
		}
		f.Srv.Async(w, incustest.Op{Description: "Creating instance"})
	})
	s.Handle("PUT /1.0/instances/{name}", func(w http.ResponseWriter, r *http.Request) {
		raw, _ := io.ReadAll(r.Body)
		var put incus.InstancePut
		var restore struct{ Restore string }
		if err := errors.Join(json.Unmarshal(raw, &put), json.Unmarshal(raw, &restore)); err != nil {
			incustest.Error(w, http.StatusBadRequest, err.Error())
			return
		}
		f.Mu.Lock()
		defer f.Mu.Unlock()
		inst, ok := f.Insts[r.PathValue("name")]
		if !ok {
			incustest.Error(w, http.StatusNotFound, "Instance not found")
			return
		}
		if inst.Name == f.Starting {
			f.Srv.Async(w, incustest.Op{Description: "Updating instance", Err: `Failed to create instance update operation: Instance is busy running a "start" operation`})
			return
		}
		if restore.Restore != "" {
			// Like Incus: the snapshot's config and devices come back as
			// they were, unchecked.
			i := slices.IndexFunc(f.Snaps[inst.Name], func(s incus.Instance) bool { return s.Name == restore.Restore })
			if i < 0 {
				incustest.Error(w, http.StatusNotFound, "Snapshot not found")
				return
			}
			sn := f.Snaps[inst.Name][i]
			if f.Restored == nil {
				f.Restored = map[string][]string{}
			}
			f.Restored[inst.Name] = append(f.Restored[inst.Name], inst.Status)
			inst.Devices = maps.Clone(sn.Devices)
			if sn.Config != nil {
				inst.Config = maps.Clone(sn.Config)
			}
			f.Srv.Async(w, incustest.Op{Description: "Restoring snapshot"})
			return
		}
		next := *inst
		next.Config, next.Devices, next.Profiles = put.Config, put.Devices, put.Profiles
		a := model.FixedAddressOf(f.Render(&next))
		if a.IsValid() && a != model.FixedAddressOf(f.Render(inst)) && f.SetRace > 0 {
			f.SetRace--
			f.race(inst.Location, a)
		}
		// Incus validates the devices an update changes.
		changed := !maps.Equal(f.Render(&next).ExpandedDevices["eth0"], f.Render(inst).ExpandedDevices["eth0"])
		if changed && f.taken(inst, a) {
			incustest.Error(w, http.StatusBadRequest, fmt.Sprintf(`Failed update validation for device "eth0": IP address %q already defined on another NIC`, a))
			return
		}
		*inst = next
		f.Srv.Async(w, incustest.Op{Description: "Updating instance"})
	})
	s.Handle("PUT /1.0/instances/{name}/state", func(w http.ResponseWriter, r *http.Request) {
		var body struct{ Action string }
		_ = json.NewDecoder(r.Body).Decode(&body)
		f.Mu.Lock()
		defer f.Mu.Unlock()
		inst, ok := f.Insts[r.PathValue("name")]
		if !ok {
			incustest.Error(w, http.StatusNotFound, "Instance not found")
			return
		}
		msg := ""
		switch body.Action {
		case "start":
			if f.Started == nil {
				f.Started = map[string][]map[string]string{}
			}
			f.Started[inst.Name] = append(f.Started[inst.Name], maps.Clone(inst.Config))
			msg = f.startLocked(inst)
		case "stop":
			inst.Status = "Stopped"
		}
		f.Srv.Async(w, incustest.Op{Description: "Changing state", Err: msg})
	})
	s.Handle("POST /1.0/instances/{name}", func(w http.ResponseWriter, r *http.Request) {
		var body map[string]any
		_ = json.NewDecoder(r.Body).Decode(&body)
		f.Mu.Lock()
		defer f.Mu.Unlock()
		inst, ok := f.Insts[r.PathValue("name")]
		switch {
		case !ok:
			incustest.Error(w, http.StatusNotFound, "Instance not found")
		case body["migration"] != true || r.URL.Query().Get("target") == "":
			incustest.Error(w, http.StatusBadRequest, "this fake only moves")
		case inst.Status != "Stopped":
			incustest.Error(w, http.StatusBadRequest, "Instance is running")
		case f.MoveErr != "":
			f.Srv.Async(w, incustest.Op{Description: "Migrating instance", Err: f.MoveErr})
		default:
			inst.Location = r.URL.Query().Get("target")
			f.Srv.Async(w, incustest.Op{Description: "Migrating instance"})
		}
	})
	s.Handle("POST /1.0/instances/{name}/files", func(w http.ResponseWriter, r *http.Request) { incustest.Sync(w, nil) })
	s.Handle("DELETE /1.0/instances/{name}", func(w http.ResponseWriter, r *http.Request) {
		f.Mu.Lock()
		delete(f.Insts, r.PathValue("name"))
		f.Mu.Unlock()
		f.Srv.Async(w, incustest.Op{Description: "Deleting instance"})
	})
	return f
}

// Render is an instance as Incus shows it: expanded with its profiles.
func (f *ClusterFake) Render(i *incus.Instance) *incus.Instance {
	out := *i
	exp, _ := model.ExpandWith(out, HostProfiles())
	out.ExpandedConfig, out.ExpandedDevices = exp.ExpandedConfig, exp.ExpandedDevices
	if !f.Clustered {
		out.Location = "none"
	}
	return &out
}

// taken says whether another NIC on i's member asks for a.
func (f *ClusterFake) taken(i *incus.Instance, a netip.Addr) bool {
	if !a.IsValid() {
		return false
	}
	for _, o := range f.Insts {
		if o.Name != i.Name && o.Location == i.Location && model.FixedAddressOf(f.Render(o)) == a {
			return true
		}
	}
	return false
}

// race makes a box that takes address a on member, as one minted at the
// same moment would.
func (f *ClusterFake) race(member string, a netip.Addr) {
	f.Raced++
	name := fmt.Sprintf("racer%d", f.Raced)
	f.Insts[name] = &incus.Instance{Name: name, Status: "Stopped", Location: member, Profiles: []string{"box-net"},
		Config: map[string]string{model.Current.Tag: "1"}, Devices: map[string]map[string]string{"eth0": model.FixedNIC(a)}}
}

// startLocked starts i, checking its address as Incus does; f.Mu is held.
func (f *ClusterFake) startLocked(i *incus.Instance) string {
	a := model.FixedAddressOf(f.Render(i))
	if a.IsValid() && f.StartRace > 0 {
		f.StartRace--
		f.race(i.Location, a)
	}
	if f.taken(i, a) {
		return fmt.Sprintf(`Failed start validation for device "eth0": IP address %q already defined on another NIC`, a)
	}
	i.Status = "Running"
	return ""
}

// Add puts a box on member, with a fixed address when addr is set.
func (f *ClusterFake) Add(name, member, status, addr string) {
	f.Mu.Lock()
	defer f.Mu.Unlock()
	i := &incus.Instance{Name: name, Type: "container", Architecture: "x86_64", Status: status, Location: member, Profiles: []string{"box-net"},
		Config:  map[string]string{model.Current.Tag: "1", model.StampTemplate: "blank", "volatile.eth0.hwaddr": "10:66:6a:00:00:01", "volatile.uuid": "u1"},
		Devices: map[string]map[string]string{"root": {"type": "disk", "path": "/", "pool": "default", "size": "20GiB"}}}
	if addr != "" {
		i.Devices["eth0"] = model.FixedNIC(netip.MustParseAddr(addr))
	}
	f.Insts[name] = i
}

// Inst is a copy of an instance as the fake holds it, expanded.
func (f *ClusterFake) Inst(t *testing.T, name string) *incus.Instance {
	t.Helper()
	f.Mu.Lock()
	defer f.Mu.Unlock()
	i, ok := f.Insts[name]
	require.True(t, ok, "no instance %s", name)
	return f.Render(i)
}

// InSlice asserts that a is of member's slice.
func InSlice(t *testing.T, member string, a netip.Addr) {
	t.Helper()
	assert.True(t, netip.MustParsePrefix(fakeSlices[member]).Contains(a), "%s is in %s's slice %s", a, member, fakeSlices[member])
}
