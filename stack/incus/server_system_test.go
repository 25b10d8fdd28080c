package incus_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestSystemServer(t *testing.T) {
	ctx, c, _ := systemClient(t)
	s, err := c.Server(ctx)
	require.NoError(t, err)
	assert.Equal(t, "1.0", s.APIVersion)
	assert.Contains(t, s.Drivers(), "lxc")
	t.Logf("incus %s, drivers %v, can run VMs: %v", s.Environment.ServerVersion, s.Drivers(), s.CanRunVMs())
}
