package stack

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/box-isolation/box/stack/model"
)

func TestProfileDiffNamesEveryDrift(t *testing.T) {
	d := model.BuildDesired(model.DefaultSubnet, model.Options{})
	live := d.Profile
	live.Devices = map[string]map[string]string{
		"eth0": {"type": "nic", "network": "boxnet", "name": "eth0", "security.port_isolation": "false"},
		"root": d.Profile.Devices["root"],
		"gpu":  {"type": "gpu"},
	}
	live.Config = map[string]string{"security.privileged": "true"}
	diff := strings.Join(ProfileDiff(&live, d.Profile), "; ")
	assert.Contains(t, diff, "security.port_isolation")
	assert.Contains(t, diff, "extra device gpu")
	assert.Contains(t, diff, "extra config security.privileged")
	assert.Contains(t, diff, `config: security.guestapi="false" (was "")`, "the guest API left on")
	assert.Empty(t, ProfileDiff(&d.Profile, d.Profile))
}
