package stacktest

import (
	"crypto/rand"
	"encoding/hex"
	"maps"
	"net/http"
	"slices"
	"testing"

	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/incus/incustest"
	"github.com/box-isolation/box/stack/model"
	"github.com/stretchr/testify/require"
)

// HostProfiles are this host's profiles: box-net as setup-host makes it,
// and a stock default profile whose NIC is on another bridge.
func HostProfiles() map[string]incus.Profile {
	return map[string]incus.Profile{
		"box-net": {Name: "box-net", Config: map[string]string{}, Devices: map[string]map[string]string{
			"eth0": {"type": "nic", "name": "eth0", "network": "boxnet", "security.port_isolation": "true"},
			"root": {"type": "disk", "path": "/", "pool": "default"},
		}},
		"default": {Name: "default", Devices: map[string]map[string]string{
			"eth0": {"type": "nic", "name": "eth0", "network": "incusbr0"},
			"root": {"type": "disk", "path": "/", "pool": "default"},
		}},
	}
}

// ProfileList answers GET /1.0/profiles with HostProfiles as Incus does:
// their URLs, or with recursion the profiles, sorted by name.
func ProfileList(w http.ResponseWriter, r *http.Request) {
	ps := HostProfiles()
	names := slices.Sorted(maps.Keys(ps))
	if r.URL.Query().Get("recursion") == "" || r.URL.Query().Get("recursion") == "0" {
		var urls []string
		for _, n := range names {
			urls = append(urls, "/1.0/profiles/"+n)
		}
		incustest.Sync(w, urls)
		return
	}
	var out []incus.Profile
	for _, n := range names {
		out = append(out, ps[n])
	}
	incustest.Sync(w, out)
}

// FleetInst is an instance as the box-net profile makes it, running on
// port veth-<name>; edit changes it.
func FleetInst(name string, edit func(i *incus.Instance)) incus.Instance {
	i := incus.Instance{Name: name, Project: "default", Status: "Running", Type: "container",
		Profiles: []string{"box-net"},
		Config:   map[string]string{model.Current.Tag: "1", "volatile.eth0.host_name": "veth-" + name},
		Devices:  map[string]map[string]string{},
		ExpandedDevices: map[string]map[string]string{
			"eth0": {"type": "nic", "name": "eth0", "network": "boxnet", "security.port_isolation": "true"},
			"root": {"type": "disk", "path": "/", "pool": "default"},
		}}
	if edit != nil {
		edit(&i)
	}
	i.ExpandedConfig = maps.Clone(i.Config)
	return i
}

// Name is prefix and six random hex digits: a name no other test run
// uses at the same time.
func Name(t testing.TB, prefix string) string {
	t.Helper()
	b := make([]byte, 3)
	_, err := rand.Read(b)
	require.NoError(t, err)
	return prefix + hex.EncodeToString(b)
}
