package drill

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/box-isolation/box/stack"
)

// TestTierUserOf: a run removes only its own host's leftover tier users:
// two worlds on one machine share /etc/passwd, not their runs.
func TestTierUserOf(t *testing.T) {
	boxw, boxs := &stack.Host{NetNS: "boxw-host"}, &stack.Host{NetNS: "boxs-host"}
	c := tierUserComment + " 2e29c9" + tierUserHost(boxs)
	assert.True(t, tierUserOf(c, boxs), "its own world's")
	assert.False(t, tierUserOf(c, boxw), "another world's run is not this one's leftover")
	assert.False(t, tierUserOf(c, &stack.Host{}), "nor the machine's own host's")
	assert.True(t, tierUserOf(tierUserComment+" 2e29c9", boxw), "an older build's, naming no host")
	assert.False(t, tierUserOf("Debian-exim", boxw))
}
