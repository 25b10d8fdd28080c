package hostns

import (
	"bufio"
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestKeyUsers reads the busiest non-root user of /proc/key-users (root's
// own line left out: its quota is another's).
func TestKeyUsers(t *testing.T) {
	u, err := parseKeyUsers(bufio.NewScanner(strings.NewReader(`    0:     9 8/8 3/1000000 48/25000000
1000000:    56 56/56 56/200 280/20000
1065536:     1 1/1 1/200 5/20000
`)))
	require.NoError(t, err)
	assert.Equal(t, KeyUse{Keys: 56, Bytes: 280}, u)
	_, err = parseKeyUsers(bufio.NewScanner(strings.NewReader("1000: 1 1/1 x/200 5/20000\n")))
	assert.Error(t, err, "a line it cannot read is an error, not a zero")
}

// TestLowLimits: a limit below what the host's instances need is named
// with its value, the need and Incus's production value, and raised to
// the more of the production value and the need; one that is enough, or
// that this kernel has not, is not named.
func TestLowLimits(t *testing.T) {
	sysctls := map[string]int64{"kernel.keys.maxkeys": 200, "kernel.keys.maxbytes": 20000}
	value := func(k string) (int64, error) {
		v, ok := sysctls[k]
		if !ok {
			return 0, errors.New("no such setting")
		}
		return v, nil
	}
	use := KeyUse{Keys: 245, Bytes: 1225}
	assert.Empty(t, lowLimits(100, KeyUse{Keys: 100, Bytes: 500}, value), "100 boxes: 125 keys and 625 bytes, under 200 and 20000")
	low := lowLimits(240, use, value)
	require.Len(t, low, 1, "240 boxes holding 245 keys need 306 keys (a quarter more) and 1530 bytes (5 a key): maxkeys only")
	assert.Equal(t, lowLimit{key: "kernel.keys.maxkeys", value: 200, need: 306, to: 2000, production: 2000}, low[0])
	notes := limitNotes(240, use, low)
	require.Len(t, notes, 1)
	assert.Contains(t, notes[0], "sysctl kernel.keys.maxkeys is 200, below what the 240 instances on this host need (306")
	assert.Contains(t, notes[0], "Incus's production settings ask for 2000")
	assert.Contains(t, notes[0], "box doctor --fix raises it to 2000")

	low = lowLimits(3000, KeyUse{Keys: 3000, Bytes: 30000}, value)
	require.Len(t, low, 2)
	assert.Equal(t, int64(3750), low[0].to, "past Incus's production value: the need")
	delete(sysctls, "kernel.keys.maxbytes")
	assert.Len(t, lowLimits(3000, KeyUse{Keys: 3000, Bytes: 30000}, value), 1, "a setting this kernel has not is not named")
}
