package stack

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"context"
	"encoding/json"
	"net/http"

	"github.com/box-isolation/box/stack/stacktest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/model"
)

func pfx(s string) netip.Prefix { return netip.MustParsePrefix(s) }

func TestAllSlices(t *testing.T) {
	got := model.AllSlices(pfx("10.88.0.0/24"))
	want := []netip.Prefix{
		pfx("10.88.0.0/27"), pfx("10.88.0.32/27"), pfx("10.88.0.64/27"), pfx("10.88.0.96/27"),
		pfx("10.88.0.128/27"), pfx("10.88.0.160/27"), pfx("10.88.0.192/27"), pfx("10.88.0.224/27"),
	}
	assert.Equal(t, want, got)
	assert.Equal(t, want, model.AllSlices(pfx("10.88.0.1/24")), "the gateway's address stands for its subnet")
	assert.Len(t, model.AllSlices(pfx("10.88.0.0/23")), 16)
	assert.Equal(t, 7, model.MaxMembers, "a /24 has a slice for each of 7 members after the first")
}

func TestDynamicRange(t *testing.T) {
	assert.Equal(t, "10.88.0.2-10.88.0.31", model.DynamicRange(pfx("10.88.0.0/24")), "the first slice, without the network and the gateway")
	assert.Equal(t, "10.99.7.2-10.99.7.31", model.DynamicRange(pfx("10.99.7.1/24")))
	// No member's slice holds a dynamic address.
	lo, hi, _ := strings.Cut(model.DynamicRange(pfx("10.88.0.0/24")), "-")
	for _, s := range model.AllSlices(pfx("10.88.0.0/24"))[1:] {
		assert.False(t, s.Contains(netip.MustParseAddr(lo)) || s.Contains(netip.MustParseAddr(hi)), "the dynamic range reaches into %s", s)
	}
}

func TestAssignSlices(t *testing.T) {
	subnet := pfx("10.88.0.0/24")
	got, err := model.AssignSlices(subnet, nil, []string{"m3", "m1", "m2"})
	require.NoError(t, err)
	assert.Equal(t, map[string]netip.Prefix{"m1": pfx("10.88.0.32/27"), "m2": pfx("10.88.0.64/27"), "m3": pfx("10.88.0.96/27")}, got,
		"in name order, never the first slice (the gateway's and the dynamic range's)")

	// Stable: a member keeps its slice (its boxes hold addresses in it),
	// a new member takes the first free one, also one a member that left
	// gave up, and a slice given to a member no longer listed stays given.
	have := map[string]netip.Prefix{"m2": pfx("10.88.0.64/27"), "gone": pfx("10.88.0.96/27")}
	got, err = model.AssignSlices(subnet, have, []string{"m1", "m2", "m4"})
	require.NoError(t, err)
	assert.Equal(t, map[string]netip.Prefix{
		"m1": pfx("10.88.0.32/27"), "m2": pfx("10.88.0.64/27"), "gone": pfx("10.88.0.96/27"), "m4": pfx("10.88.0.128/27"),
	}, got)
	assert.Equal(t, map[string]netip.Prefix{"m2": pfx("10.88.0.64/27"), "gone": pfx("10.88.0.96/27")}, have, "the slices read are not changed in place")
	again, err := model.AssignSlices(subnet, got, []string{"m1", "m2", "m4"})
	require.NoError(t, err)
	assert.Equal(t, got, again, "a second run gives nothing new")

	// Seven members fill a /24; the eighth is refused, by name.
	var seven []string
	for i := 1; i <= model.MaxMembers; i++ {
		seven = append(seven, fmt.Sprintf("m%d", i))
	}
	full, err := model.AssignSlices(subnet, nil, seven)
	require.NoError(t, err)
	seen := map[netip.Prefix]bool{}
	for m, p := range full {
		assert.False(t, seen[p], "slice %s given twice", p)
		seen[p] = true
		assert.NotEqual(t, pfx("10.88.0.0/27"), p, "member %s got the first slice", m)
	}
	_, err = model.AssignSlices(subnet, full, append(seven, "m8"))
	assert.ErrorContains(t, err, "member m8: every address slice of 10.88.0.0/24 is given (a /24 has slices for 7 members)")
}

func TestSlicesOf(t *testing.T) {
	got, err := model.SlicesOf(map[string]string{"ipv4.address": "10.88.0.1/24", model.KeySlice + "m1": "10.88.0.32/27", model.KeySlice + "m2": "10.88.0.64/27"})
	require.NoError(t, err)
	assert.Equal(t, map[string]netip.Prefix{"m1": pfx("10.88.0.32/27"), "m2": pfx("10.88.0.64/27")}, got)
	got, err = model.SlicesOf(map[string]string{"ipv4.address": "10.88.0.1/24"})
	require.NoError(t, err)
	assert.Empty(t, got)
	for _, bad := range []string{"10.88.0.32/26", "10.88.0.32", "", "nonsense"} {
		_, err := model.SlicesOf(map[string]string{model.KeySlice + "m1": bad})
		assert.ErrorContains(t, err, fmt.Sprintf("the bridge's %sm1=%q is not a /27", model.KeySlice, bad))
	}
	// Options.With carries them, and a bad one fails it.
	o, err := model.Options{}.With(map[string]string{model.KeySlice + "m1": "10.88.0.32/27"})
	require.NoError(t, err)
	assert.Equal(t, map[string]netip.Prefix{"m1": pfx("10.88.0.32/27")}, o.Slices)
	_, err = model.Options{}.With(map[string]string{model.KeySlice + "m1": "10.88.0.32/28"})
	assert.Error(t, err)
}

func TestParseMemberNetNS(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want map[string]string
	}{
		{"", map[string]string{}},
		{"boxc-m2=boxc-m2", map[string]string{"boxc-m2": "boxc-m2"}},
		{"m2=ns2,m3=ns3", map[string]string{"m2": "ns2", "m3": "ns3"}},
		{" m2=ns2  m3=ns3 ,", map[string]string{"m2": "ns2", "m3": "ns3"}},
	} {
		got, err := ParseMemberNetNS(tc.in)
		require.NoError(t, err, "%q", tc.in)
		assert.Equal(t, tc.want, got, "%q", tc.in)
	}
	for _, bad := range []string{"m2", "m2=", "=ns2", "m2=ns2,m3"} {
		_, err := ParseMemberNetNS(bad)
		assert.ErrorContains(t, err, "is not member=namespace", "%q", bad)
	}
}

// clusterInst is a box on a member; addr "" leaves its NIC without a
// fixed address.
func clusterInst(name, member, addr string, box bool) incus.Instance {
	return stacktest.FleetInst(name, func(i *incus.Instance) {
		i.Location = member
		if addr != "" {
			i.ExpandedDevices["eth0"]["ipv4.address"] = addr
		}
		if !box {
			delete(i.Config, model.Current.Tag)
		}
	})
}

func TestOnMember(t *testing.T) {
	insts := []incus.Instance{
		clusterInst("a", "m1", "", true), clusterInst("b", "m2", "", true),
		clusterInst("c", "", "", true), clusterInst("d", "none", "", true),
	}
	namesOf := func(is []incus.Instance) []string {
		var out []string
		for _, i := range is {
			out = append(out, i.Name)
		}
		return out
	}
	assert.Equal(t, []string{"a", "b", "c", "d"}, namesOf(onMember(insts, "")), "standalone: every instance")
	assert.Equal(t, []string{"a", "c", "d"}, namesOf(onMember(insts, "m1")), "m1's, and those placed nowhere in particular")
	assert.Equal(t, []string{"b", "c", "d"}, namesOf(onMember(insts, "m2")))
	assert.Equal(t, []string{"c", "d"}, namesOf(onMember(insts, "m9")))

	leases := []incus.NetworkLease{
		{Address: "10.88.0.33", Location: "m1"}, {Address: "10.88.0.65", Location: "m2"},
		{Address: "10.88.0.1", Location: "", Type: "gateway"}, {Address: "10.88.0.2", Location: "none"},
	}
	addrsOf := func(ls []incus.NetworkLease) []string {
		var out []string
		for _, l := range ls {
			out = append(out, l.Address)
		}
		return out
	}
	assert.Equal(t, []string{"10.88.0.33", "10.88.0.65", "10.88.0.1", "10.88.0.2"}, addrsOf(leasesOn(leases, "")))
	assert.Equal(t, []string{"10.88.0.33", "10.88.0.1", "10.88.0.2"}, addrsOf(leasesOn(leases, "m1")))
	assert.Equal(t, []string{"10.88.0.65", "10.88.0.1", "10.88.0.2"}, addrsOf(leasesOn(leases, "m2")))
}

func TestAddressFindings(t *testing.T) {
	t.Run("clean", func(t *testing.T) {
		f := Fleet{
			insts: []incus.Instance{clusterInst("cb-a", "m1", "10.88.0.32", true), clusterInst("cb-b", "m2", "10.88.0.64", true)},
			leases: []incus.NetworkLease{
				{Address: "10.88.0.32", Location: "m1", Type: "static"}, {Address: "10.88.0.64", Location: "m2", Type: "static"},
				// Every member's bridge holds the gateway: not a duplicate.
				{Address: "10.88.0.1", Location: "m1", Type: "gateway"}, {Address: "10.88.0.1", Location: "m2", Type: "gateway"},
			},
		}
		assert.Empty(t, addressFindings(f))
	})

	t.Run("an address on two members", func(t *testing.T) {
		f := Fleet{
			insts: []incus.Instance{
				clusterInst("cb-a", "m1", "10.88.0.32", true),
				clusterInst("other", "m3", "", false), // not box's: no finding for its dynamic address itself
			},
			leases: []incus.NetworkLease{
				{Address: "10.88.0.32", Location: "m1", Type: "static"},
				{Address: "10.88.0.5", Location: "m3", Type: "dynamic"},
				{Address: "10.88.0.5", Location: "m2", Type: "dynamic"},
				{Address: "10.88.0.6", Location: "m2", Type: "dynamic"},
			},
		}
		fs := addressFindings(f)
		require.Len(t, fs, 1, "%v", fs)
		assert.Equal(t, "address 10.88.0.5", fs[0].Object)
		assert.Contains(t, fs[0].Problem, "m2, m3")
		assert.Equal(t, model.LayerNAT, fs[0].Layer)
		assert.NotEmpty(t, fs[0].Fix)
	})

	t.Run("a fixed address asked for on two members", func(t *testing.T) {
		f := Fleet{insts: []incus.Instance{
			clusterInst("cb-a", "m1", "10.88.0.40", true), clusterInst("cb-b", "m2", "10.88.0.40", true),
			clusterInst("cb-c", "m2", "10.88.0.41", true), clusterInst("cb-d", "m2", "10.88.0.41", true), // one member: Incus's own check
		}}
		fs := addressFindings(f)
		require.Len(t, fs, 1, "%v", fs)
		assert.Equal(t, "address 10.88.0.40", fs[0].Object)
		assert.Contains(t, fs[0].Problem, "m1, m2")
	})

	t.Run("a box without a fixed address", func(t *testing.T) {
		insts := []incus.Instance{
			clusterInst("cb-loose", "m2", "", true),
			clusterInst("not-a-box", "m2", "", false),
			stacktest.FleetInst("cb-elsewhere", func(i *incus.Instance) { i.ExpandedDevices["eth0"]["network"] = "lxdbr0" }),
		}
		assert.Empty(t, addressFindings(Fleet{insts: insts}), "no address, nothing handed out twice")
		fs := dhcpFindings(insts)
		require.Len(t, fs, 2, "%v", fs)
		assert.Equal(t, "box cb-loose", fs[0].Object)
		assert.Equal(t, model.LayerDHCP, fs[0].Layer)
		assert.False(t, fs[0].Advisory)
		assert.Contains(t, fs[0].Problem, "eth0 has no fixed address")
		assert.Equal(t, model.FixEnsure, fs[0].Fix)
		assert.Equal(t, "instance not-a-box", fs[1].Object)
		assert.True(t, fs[1].Advisory, "not box's: the bridge's DHCP simply does not answer it")
	})
}

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
			f.Place = tc.place
			f.Add("moved", "m1", "Running", "10.88.0.96")
			post := incus.InstancesPost{Name: "b", Type: "container", Profiles: []string{"box-net"}, Config: map[string]string{model.Current.Tag: "1"}, Start: true}
			require.NoError(t, h.Addresses().Create(context.Background(), post, tc.target, nil))

			b := f.Inst(t, "b")
			assert.Equal(t, tc.member, b.Location)
			assert.Equal(t, "Running", b.Status)
			a := model.FixedAddressOf(b)
			assert.Equal(t, tc.want, a.String())
			stacktest.InSlice(t, tc.member, a)
			assert.Equal(t, model.FixedNIC(a), b.Devices["eth0"], "the profile's NIC, with the address")

			creates := f.Srv.Find(http.MethodPost, "/1.0/instances")
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
			f.SetRace, f.StartRace = tc.setRace, tc.startRace
			post := incus.InstancesPost{Name: "b", Type: "container", Profiles: []string{"box-net"}, Config: map[string]string{model.Current.Tag: "1"}, Start: true}
			err := h.Addresses().Create(context.Background(), post, "m3", nil)
			if tc.fail {
				require.Error(t, err)
				assert.Contains(t, err.Error(), "already defined on another NIC")
				assert.Len(t, f.Srv.Find(http.MethodPut, "/1.0/instances/b"), addressTries, "it tries a fixed number of times")
				return
			}
			require.NoError(t, err)
			b := f.Inst(t, "b")
			assert.Equal(t, "Running", b.Status)
			a := model.FixedAddressOf(b)
			stacktest.InSlice(t, "m3", a)
			for i := 1; i <= f.Raced; i++ {
				assert.NotEqual(t, model.FixedAddressOf(f.Inst(t, fmt.Sprintf("racer%d", i))), a, "not the address the racer took")
			}
			assert.Equal(t, tc.setRace+tc.startRace, f.Raced)
		})
	}
}

// On a standalone host a box gets a fixed address too (L-DHCP), of the
// bridge's subnet: created stopped, given it, then started. A granted
// user's is created started: the port watcher gives it one.
func TestCreateOnAStandaloneHost(t *testing.T) {
	f, h := newClusterFake(t)
	f.Clustered = false
	f.Add("a", "", "Running", "10.88.0.2")
	post := incus.InstancesPost{Name: "b", Type: "container", Profiles: []string{"box-net"}, Config: map[string]string{model.Current.Tag: "1"}, Start: true}
	err := h.Addresses().Create(context.Background(), post, "m3", nil)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "--target m3: this incusd is not a cluster member")
	require.NoError(t, h.Addresses().Create(context.Background(), post, "", nil))
	b := f.Inst(t, "b")
	assert.Equal(t, "Running", b.Status)
	assert.Equal(t, "10.88.0.3", model.FixedAddressOf(b).String(), "the first address of the subnet nobody holds (.1 is the gateway, .2 a's)")
	var sent incus.InstancesPost
	require.NoError(t, json.Unmarshal(f.Srv.Find(http.MethodPost, "/1.0/instances")[0].Body, &sent))
	assert.False(t, sent.Start, "created stopped, started once it has its address")

	tier := *h
	tier.Tier.Granted = true
	post.Name = "t"
	require.NoError(t, tier.Addresses().Create(context.Background(), post, "", nil))
	assert.Equal(t, "Running", f.Inst(t, "t").Status, "a granted user's: created and started in one request")
	assert.False(t, model.FixedAddressOf(f.Inst(t, "t")).IsValid(), "its user picks none")
	assert.Empty(t, f.Srv.Find(http.MethodPut, "/1.0/instances/t"))
}

func TestCreateRefusesAnUnknownMember(t *testing.T) {
	f, h := newClusterFake(t)
	err := h.Addresses().Create(context.Background(), incus.InstancesPost{Name: "b"}, "m9", nil)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "no cluster member m9 (members: m1, m2, m3)")
	assert.Empty(t, f.Srv.Find(http.MethodPost, "/1.0/instances"))
}

// newClusterFake is the cluster fake with a Host on it that leaves this
// machine's kernel alone.
func newClusterFake(t *testing.T) (*stacktest.ClusterFake, *Host) {
	t.Helper()
	f := stacktest.NewClusterServer(t)
	return f, &Host{Incus: incus.New(f.Srv.Socket()), NoKernel: true}
}
