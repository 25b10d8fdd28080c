package incus_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/stack/incus"
)

func TestSystemNetworkACLProfileProject(t *testing.T) {
	ctx, c, name := systemClient(t)
	net := "tn" + name[len(name)-6:] // bridge names are interface names: short

	// Network.
	require.NoError(t, c.Networks().Create(ctx, incus.NetworksPost{Name: net, Type: "bridge", Config: map[string]string{
		"ipv4.address": "10.251.0.1/24", "ipv4.nat": "false", "ipv6.address": "none",
	}}))
	t.Cleanup(func() { c.Networks().Delete(context.Background(), net) }) //nolint:errcheck
	err := c.Networks().Create(ctx, incus.NetworksPost{Name: net, Type: "bridge"})
	assert.True(t, incus.IsAlreadyExists(err), "creating it twice: %v", err)
	n, etag, err := c.Networks().Get(ctx, net)
	require.NoError(t, err)
	assert.True(t, n.Managed)
	assert.Equal(t, "10.251.0.1/24", n.Config["ipv4.address"])
	n.Config["dns.mode"] = "none"
	require.NoError(t, c.Networks().Update(ctx, net, incus.NetworkPut{Description: "box test", Config: n.Config}, etag))
	n, _, err = c.Networks().Get(ctx, net)
	require.NoError(t, err)
	assert.Equal(t, "none", n.Config["dns.mode"])
	st, err := c.Networks().State(ctx, net)
	require.NoError(t, err)
	assert.Equal(t, "up", st.State)

	// ACL.
	acl := incus.NetworkACL{Name: name + "-acl", Description: "box test", Egress: []incus.ACLRule{
		{Action: "drop", Destination: "10.0.0.0/8", Description: "private"},
	}}
	require.NoError(t, c.Networks().CreateACL(ctx, acl))
	t.Cleanup(func() { c.Networks().DeleteACL(context.Background(), acl.Name) }) //nolint:errcheck
	got, etag, err := c.Networks().ACL(ctx, acl.Name)
	require.NoError(t, err)
	require.Len(t, got.Egress, 1)
	assert.Equal(t, "drop", got.Egress[0].Action)
	got.Egress = append(got.Egress, incus.ACLRule{Action: "allow", Protocol: "udp", DestinationPort: "53"})
	require.NoError(t, c.Networks().UpdateACL(ctx, acl.Name, *got, etag))
	got, _, err = c.Networks().ACL(ctx, acl.Name)
	require.NoError(t, err)
	assert.Len(t, got.Egress, 2)

	// Profile.
	prof := incus.Profile{Name: name + "-prof", Description: "box test", Devices: map[string]map[string]string{
		"eth0": {"type": "nic", "network": net, "name": "eth0"},
	}}
	require.NoError(t, c.CreateProfile(ctx, prof))
	t.Cleanup(func() { c.DeleteProfile(context.Background(), prof.Name) }) //nolint:errcheck
	p, etag, err := c.Profile(ctx, prof.Name)
	require.NoError(t, err)
	assert.Equal(t, net, p.Devices["eth0"]["network"])
	p.Devices["eth0"]["security.port_isolation"] = "true"
	require.NoError(t, c.UpdateProfile(ctx, prof.Name, *p, etag))
	p, _, err = c.Profile(ctx, prof.Name)
	require.NoError(t, err)
	assert.Equal(t, "true", p.Devices["eth0"]["security.port_isolation"])

	// Project.
	proj := incus.Project{Name: name + "-proj", Description: "box test", Config: map[string]string{"features.profiles": "true"}}
	require.NoError(t, c.Projects().Create(ctx, proj))
	t.Cleanup(func() { c.Projects().Delete(context.Background(), proj.Name) }) //nolint:errcheck
	pj, _, err := c.Projects().Get(ctx, proj.Name)
	require.NoError(t, err)
	assert.Equal(t, "box test", pj.Description)

	// Deletes, in dependency order, and each object is gone.
	require.NoError(t, c.Projects().Delete(ctx, proj.Name))
	require.NoError(t, c.DeleteProfile(ctx, prof.Name))
	require.NoError(t, c.Networks().DeleteACL(ctx, acl.Name))
	require.NoError(t, c.Networks().Delete(ctx, net))
	_, _, err = c.Projects().Get(ctx, proj.Name)
	assert.True(t, incus.IsNotFound(err), "project: %v", err)
	_, _, err = c.Profile(ctx, prof.Name)
	assert.True(t, incus.IsNotFound(err), "profile: %v", err)
	_, _, err = c.Networks().ACL(ctx, acl.Name)
	assert.True(t, incus.IsNotFound(err), "acl: %v", err)
	_, _, err = c.Networks().Get(ctx, net)
	assert.True(t, incus.IsNotFound(err), "network: %v", err)
}
