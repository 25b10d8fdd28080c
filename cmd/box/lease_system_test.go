package main

import (
	"encoding/json"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/internal/testenv"
	"github.com/box-isolation/box/stack/model"
)

// TestSystemLeaseFileReplaced: the bridge's lease file replaced on disk
// while its dnsmasq runs (a sed -i by hand: dnsmasq goes on writing to
// the deleted file, and reads the file only at its start). box doctor
// names it; a box minted then is reported at its fixed address, or not
// as up at all; box doctor --fix has Incus restart dnsmasq, which then
// writes the file on disk, and the doctor no longer names it.
func TestSystemLeaseFileReplaced(t *testing.T) {
	r, c := worldBox(t)
	st := testenv.World(t)
	a, b := uniq(t), uniq(t)
	cleanup(t, c, a, b)
	require.Equal(t, exitOK, r.run(t, "new", "--name", a).code)
	leases := filepath.Join(st.IncusDir, "networks", model.Current.Network, "dnsmasq.leases")
	out, err := exec.Command("sed", "-i", "s/ / /", leases).CombinedOutput()
	require.NoError(t, err, "sed -i %s: %s", leases, out)

	doctor := func() []string {
		t.Helper()
		res := r.run(t, "doctor", "--json")
		var dr doctorResult
		require.NoError(t, json.Unmarshal([]byte(res.out), &dr), res.out)
		var named []string
		for _, f := range dr.Verification.Findings {
			if strings.Contains(f.Problem, "deleted from disk") {
				named = append(named, f.Object+": "+f.Problem)
			}
		}
		return named
	}
	named := doctor()
	require.Len(t, named, 1, "doctor names the dnsmasq writing to a deleted lease file")
	t.Logf("box doctor: %s", named[0])

	res := r.run(t, "new", "--name", b, "--json")
	if res.code == exitOK {
		var nr newResult
		require.NoError(t, json.Unmarshal([]byte(res.out), &nr))
		inst, _, err := c.Instances().Get(t.Context(), b)
		require.NoError(t, err)
		fixed := model.FixedAddressOf(inst)
		assert.Equal(t, fixed, netip.MustParseAddr(nr.Address), "reported at its fixed address")
	} else {
		assert.Contains(t, res.err, "not its fixed address", "a box not at its fixed address is not reported as up")
	}

	res = r.run(t, "doctor", "--fix")
	assert.Contains(t, res.out+res.err, "restarted", "doctor --fix has Incus restart dnsmasq: %s", res.out)
	assert.Empty(t, doctor(), "the lease file dnsmasq writes is the one on disk again")
	raw, err := os.ReadFile(leases)
	require.NoError(t, err)
	t.Logf("the lease file after the fix:\n%s", raw)
}
