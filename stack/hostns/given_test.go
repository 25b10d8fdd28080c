package hostns

import (
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestGiven(t *testing.T) {
	a, b := netip.MustParseAddr("10.88.0.2"), netip.MustParseAddr("10.88.0.3")
	t.Cleanup(func() { ForgetGiven("w1"); ForgetGiven("w2") })
	NoteGiven("w1", a)
	NoteGiven("w2", b)
	assert.Equal(t, map[netip.Addr]bool{a: true}, Given("w1"), "a namespace's own")
	assert.Equal(t, map[netip.Addr]bool{b: true}, Given("w2"))
	assert.Empty(t, Given("w3"))

	old := givenFor
	t.Cleanup(func() { givenFor = old })
	givenFor = 0
	time.Sleep(time.Millisecond)
	assert.Empty(t, Given("w1"), "forgotten after givenFor")
	givenFor = old
	NoteGiven("w1", a)
	ForgetGiven("w1")
	assert.Empty(t, Given("w1"), "ForgetGiven")
}
