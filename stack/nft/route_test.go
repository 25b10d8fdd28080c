package nft

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestRouteStringGolden(t *testing.T) {
	r, err := DesiredRoute(Config{}, []string{"wlan0", "eth0", "eth0"})
	require.NoError(t, err)
	golden(t, "route.golden", r.String())
	// Every rule is scoped to the bridge: no other traffic is looked at.
	for _, ru := range r.Tables[0].Chains[0].Rules {
		assert.Contains(t, ru.Text, `iifname "boxnet"`, ru.Text)
	}
	assert.Equal(t, "box_route", Config{}.RouteTable())
}

func TestRouteRefusesBadUplinks(t *testing.T) {
	for _, up := range [][]string{{"boxnet"}, {""}, {"a-name-far-too-long"}} {
		_, err := DesiredRoute(Config{}, up)
		assert.Error(t, err, "%q", up)
	}
	r, err := DesiredRoute(Config{}, nil)
	require.NoError(t, err, "no default route: an empty set, which drops every new connection")
	assert.Empty(t, r.Tables[0].Sets[0].Elements)
}
