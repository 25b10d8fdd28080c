package stack

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/box-isolation/box/stack/incus"
)

// A box names the member it is on; a standalone incusd's "none" is no
// member, and the JSON then has no member key.
func TestBoxNamesItsMember(t *testing.T) {
	for loc, want := range map[string]string{"m2": "m2", "none": "", "": ""} {
		inst := &incus.Instance{Name: "b", Location: loc, Config: map[string]string{Current.Tag: "1"}}
		b := boxOf(inst, Current.Name)
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
