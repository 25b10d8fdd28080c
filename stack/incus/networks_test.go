package incus_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/incus/incustest"
)

// TestObjectReads covers the list and get calls of networks, ACLs,
// profiles, projects and storage pools: recursion on lists, ETags on gets,
// and decoding of the fields callers rely on.
func TestObjectReads(t *testing.T) {
	tests := []struct {
		name       string
		collection string // API path of the collection
		object     map[string]any
		read       func(ctx context.Context, c *incus.Client) (list, one any, etag string, err error)
		check      func(t *testing.T, list, one any)
	}{
		{
			name: "networks", collection: "/1.0/networks",
			object: map[string]any{"name": "boxnet", "type": "bridge", "managed": true, "status": "Created",
				"config": map[string]string{"ipv4.address": "10.88.0.1/24"}, "used_by": []string{"/1.0/profiles/box-net"}},
			read: func(ctx context.Context, c *incus.Client) (any, any, string, error) {
				l, err := c.Networks().List(ctx)
				if err != nil {
					return nil, nil, "", err
				}
				o, etag, err := c.Networks().Get(ctx, "boxnet")
				return l, o, etag, err
			},
			check: func(t *testing.T, list, one any) {
				assert.Equal(t, "boxnet", list.([]incus.Network)[0].Name)
				n := one.(*incus.Network)
				assert.True(t, n.Managed)
				assert.Equal(t, "10.88.0.1/24", n.Config["ipv4.address"])
				assert.Equal(t, []string{"/1.0/profiles/box-net"}, n.UsedBy)
			},
		},
		{
			name: "network ACLs", collection: "/1.0/network-acls",
			object: map[string]any{"name": "box-isolate", "description": "d",
				"egress":  []map[string]string{{"action": "drop", "destination": "10.0.0.0/8", "state": "enabled"}},
				"ingress": []map[string]string{}, "config": map[string]string{}},
			read: func(ctx context.Context, c *incus.Client) (any, any, string, error) {
				l, err := c.Networks().ACLs(ctx)
				if err != nil {
					return nil, nil, "", err
				}
				o, etag, err := c.Networks().ACL(ctx, "box-isolate")
				return l, o, etag, err
			},
			check: func(t *testing.T, list, one any) {
				assert.Len(t, list.([]incus.NetworkACL), 1)
				acl := one.(*incus.NetworkACL)
				assert.Equal(t, []incus.ACLRule{{Action: "drop", Destination: "10.0.0.0/8", State: "enabled"}}, acl.Egress)
			},
		},
		{
			name: "profiles", collection: "/1.0/profiles",
			object: map[string]any{"name": "box-net", "config": map[string]string{},
				"devices": map[string]map[string]string{"eth0": {"type": "nic", "network": "boxnet", "security.port_isolation": "true"}}},
			read: func(ctx context.Context, c *incus.Client) (any, any, string, error) {
				l, err := c.Profiles(ctx)
				if err != nil {
					return nil, nil, "", err
				}
				o, etag, err := c.Profile(ctx, "box-net")
				return l, o, etag, err
			},
			check: func(t *testing.T, list, one any) {
				assert.Len(t, list.([]incus.Profile), 1)
				assert.Equal(t, "true", one.(*incus.Profile).Devices["eth0"]["security.port_isolation"])
			},
		},
		{
			name: "projects", collection: "/1.0/projects",
			object: map[string]any{"name": "box-alice", "config": map[string]string{"features.networks": "false"}},
			read: func(ctx context.Context, c *incus.Client) (any, any, string, error) {
				l, err := c.Projects().List(ctx)
				if err != nil {
					return nil, nil, "", err
				}
				o, etag, err := c.Projects().Get(ctx, "box-alice")
				return l, o, etag, err
			},
			check: func(t *testing.T, list, one any) {
				assert.Len(t, list.([]incus.Project), 1)
				assert.Equal(t, "false", one.(*incus.Project).Config["features.networks"])
			},
		},
		{
			name: "storage pools", collection: "/1.0/storage-pools",
			object: map[string]any{"name": "default", "driver": "dir", "status": "Created", "config": map[string]string{"source": "/var/lib/incus/storage-pools/default"}},
			read: func(ctx context.Context, c *incus.Client) (any, any, string, error) {
				l, err := c.Storage().Pools(ctx)
				if err != nil {
					return nil, nil, "", err
				}
				o, etag, err := c.Storage().Pool(ctx, "default")
				return l, o, etag, err
			},
			check: func(t *testing.T, list, one any) {
				assert.Len(t, list.([]incus.StoragePool), 1)
				assert.Equal(t, "dir", one.(*incus.StoragePool).Driver)
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv, c := newFake(t)
			srv.Handle("GET "+tt.collection, func(w http.ResponseWriter, r *http.Request) {
				incustest.Sync(w, []any{tt.object})
			})
			srv.Handle("GET "+tt.collection+"/{name}", func(w http.ResponseWriter, r *http.Request) {
				incustest.SyncETag(w, `"etag-1"`, tt.object)
			})
			list, one, etag, err := tt.read(testCtx(t), c)
			require.NoError(t, err)
			assert.Equal(t, `"etag-1"`, etag)
			reqs := srv.Requests()
			require.Len(t, reqs, 2)
			assert.Equal(t, "1", reqs[0].Query.Get("recursion"))
			tt.check(t, list, one)
		})
	}
}

// TestObjectWrites covers create, update (with If-Match) and delete of the
// same groups; Incus answers these sync, and the client must not wait.
func TestObjectWrites(t *testing.T) {
	tests := []struct {
		name     string
		method   string
		path     string
		call     func(ctx context.Context, c *incus.Client) error
		wantBody map[string]any
		wantETag string
	}{
		{
			name: "create network", method: "POST", path: "/1.0/networks",
			call: func(ctx context.Context, c *incus.Client) error {
				return c.Networks().Create(ctx, incus.NetworksPost{Name: "boxnet", Type: "bridge", Config: map[string]string{"ipv4.nat": "true"}})
			},
			wantBody: map[string]any{"name": "boxnet", "type": "bridge", "description": "", "config": map[string]any{"ipv4.nat": "true"}},
		},
		{
			name: "update network", method: "PUT", path: "/1.0/networks/boxnet", wantETag: `"e"`,
			call: func(ctx context.Context, c *incus.Client) error {
				return c.Networks().Update(ctx, "boxnet", incus.NetworkPut{Description: "d", Config: map[string]string{"dns.mode": "none"}}, `"e"`)
			},
			wantBody: map[string]any{"description": "d", "config": map[string]any{"dns.mode": "none"}},
		},
		{
			name: "delete network", method: "DELETE", path: "/1.0/networks/boxnet",
			call: func(ctx context.Context, c *incus.Client) error { return c.Networks().Delete(ctx, "boxnet") },
		},
		{
			name: "create ACL fills in rule state", method: "POST", path: "/1.0/network-acls",
			call: func(ctx context.Context, c *incus.Client) error {
				return c.Networks().CreateACL(ctx, incus.NetworkACL{Name: "box-isolate",
					Egress: []incus.ACLRule{
						{Action: "allow", Destination: "10.88.0.1/32", Protocol: "udp", DestinationPort: "53"},
						{Action: "drop", Destination: "10.0.0.0/8", State: "logged"},
					}})
			},
			wantBody: map[string]any{"name": "box-isolate", "description": "", "config": nil, "ingress": []any{},
				"egress": []any{
					map[string]any{"action": "allow", "destination": "10.88.0.1/32", "protocol": "udp", "destination_port": "53", "state": "enabled"},
					map[string]any{"action": "drop", "destination": "10.0.0.0/8", "state": "logged"},
				}},
		},
		{
			name: "update ACL", method: "PUT", path: "/1.0/network-acls/box-isolate", wantETag: `"e"`,
			call: func(ctx context.Context, c *incus.Client) error {
				return c.Networks().UpdateACL(ctx, "box-isolate", incus.NetworkACL{Name: "ignored", UsedBy: []string{"ignored"},
					Ingress: []incus.ACLRule{{Action: "reject", ICMPType: "8"}}}, `"e"`)
			},
			wantBody: map[string]any{"description": "", "config": nil, "egress": []any{},
				"ingress": []any{map[string]any{"action": "reject", "icmp_type": "8", "state": "enabled"}}},
		},
		{
			name: "delete ACL", method: "DELETE", path: "/1.0/network-acls/box-isolate",
			call: func(ctx context.Context, c *incus.Client) error { return c.Networks().DeleteACL(ctx, "box-isolate") },
		},
		{
			name: "create profile", method: "POST", path: "/1.0/profiles",
			call: func(ctx context.Context, c *incus.Client) error {
				return c.CreateProfile(ctx, incus.Profile{Name: "box-net", Description: "d",
					Devices: map[string]map[string]string{"eth0": {"type": "nic"}}})
			},
			wantBody: map[string]any{"name": "box-net", "description": "d", "config": nil,
				"devices": map[string]any{"eth0": map[string]any{"type": "nic"}}},
		},
		{
			name: "update profile", method: "PUT", path: "/1.0/profiles/box-net", wantETag: `"e"`,
			call: func(ctx context.Context, c *incus.Client) error {
				return c.UpdateProfile(ctx, "box-net", incus.Profile{Config: map[string]string{"limits.cpu": "2"}}, `"e"`)
			},
			wantBody: map[string]any{"description": "", "config": map[string]any{"limits.cpu": "2"}, "devices": nil},
		},
		{
			name: "delete profile", method: "DELETE", path: "/1.0/profiles/box-net",
			call: func(ctx context.Context, c *incus.Client) error { return c.DeleteProfile(ctx, "box-net") },
		},
		{
			name: "create project", method: "POST", path: "/1.0/projects",
			call: func(ctx context.Context, c *incus.Client) error {
				return c.Projects().Create(ctx, incus.Project{Name: "box-alice", Config: map[string]string{"features.images": "false"}})
			},
			wantBody: map[string]any{"name": "box-alice", "description": "", "config": map[string]any{"features.images": "false"}},
		},
		{
			name: "update project", method: "PUT", path: "/1.0/projects/box-alice", wantETag: `"e"`,
			call: func(ctx context.Context, c *incus.Client) error {
				return c.Projects().Update(ctx, "box-alice", incus.Project{Description: "alice"}, `"e"`)
			},
			wantBody: map[string]any{"description": "alice", "config": nil},
		},
		{
			name: "delete project", method: "DELETE", path: "/1.0/projects/box-alice",
			call: func(ctx context.Context, c *incus.Client) error { return c.Projects().Delete(ctx, "box-alice") },
		},
		{
			name: "create storage pool", method: "POST", path: "/1.0/storage-pools",
			call: func(ctx context.Context, c *incus.Client) error {
				return c.Storage().CreatePool(ctx, incus.StoragePool{Name: "default", Driver: "dir", Status: "ignored"})
			},
			wantBody: map[string]any{"name": "default", "driver": "dir", "description": "", "config": nil},
		},
		{
			name: "delete storage pool", method: "DELETE", path: "/1.0/storage-pools/default",
			call: func(ctx context.Context, c *incus.Client) error { return c.Storage().DeletePool(ctx, "default") },
		},
		{
			name: "create image alias", method: "POST", path: "/1.0/images/aliases",
			call: func(ctx context.Context, c *incus.Client) error {
				return c.Images().CreateAlias(ctx, "box/debian", "abc", "debian")
			},
			wantBody: map[string]any{"name": "box/debian", "target": "abc", "description": "debian"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv, c := newFake(t)
			srv.Handle(tt.method+" "+tt.path, func(w http.ResponseWriter, r *http.Request) {
				incustest.Sync(w, nil)
			})
			require.NoError(t, tt.call(testCtx(t), c))
			reqs := srv.Requests()
			require.Len(t, reqs, 1, "a sync answer needs no wait")
			assert.Equal(t, tt.method, reqs[0].Method)
			assert.Equal(t, tt.path, reqs[0].Path)
			assert.Equal(t, tt.wantETag, reqs[0].Header.Get("If-Match"))
			if tt.wantBody == nil {
				assert.Empty(t, reqs[0].Body)
			} else {
				assert.Equal(t, tt.wantBody, jsonBody(t, reqs[0]))
			}
		})
	}
}

func TestObjectWriteErrors(t *testing.T) {
	tests := []struct {
		name    string
		code    int
		msg     string
		call    func(ctx context.Context, c *incus.Client) error
		pattern string
		check   func(t *testing.T, err error)
	}{
		{
			name: "stale etag on a network", code: 412, msg: "ETag doesn't match",
			pattern: "PUT /1.0/networks/boxnet",
			call: func(ctx context.Context, c *incus.Client) error {
				return c.Networks().Update(ctx, "boxnet", incus.NetworkPut{}, `"old"`)
			},
			check: func(t *testing.T, err error) {
				assert.True(t, incus.IsPreconditionFailed(err))
				assert.Contains(t, err.Error(), "updating network boxnet")
			},
		},
		{
			name: "network exists", code: 409, msg: `Network "boxnet" already exists`,
			pattern: "POST /1.0/networks",
			call: func(ctx context.Context, c *incus.Client) error {
				return c.Networks().Create(ctx, incus.NetworksPost{Name: "boxnet"})
			},
			check: func(t *testing.T, err error) {
				assert.True(t, incus.IsConflict(err))
				assert.True(t, incus.IsAlreadyExists(err))
			},
		},
		{
			name: "profile exists is a 500 in incus", code: 500, msg: "The profile already exists",
			pattern: "POST /1.0/profiles",
			call: func(ctx context.Context, c *incus.Client) error {
				return c.CreateProfile(ctx, incus.Profile{Name: "box-net"})
			},
			check: func(t *testing.T, err error) {
				assert.False(t, incus.IsConflict(err))
				assert.True(t, incus.IsAlreadyExists(err))
			},
		},
		{
			name: "network in use", code: 400, msg: "The network is currently in use",
			pattern: "DELETE /1.0/networks/boxnet",
			call:    func(ctx context.Context, c *incus.Client) error { return c.Networks().Delete(ctx, "boxnet") },
			check: func(t *testing.T, err error) {
				assert.False(t, incus.IsAlreadyExists(err))
				assert.False(t, incus.IsNotFound(err))
				assert.Equal(t, "deleting network boxnet: incus: DELETE /1.0/networks/boxnet: the network is currently in use (400)", err.Error())
			},
		},
		{
			name: "missing ACL", code: 404, msg: "Network ACL not found",
			pattern: "DELETE /1.0/network-acls/x",
			call:    func(ctx context.Context, c *incus.Client) error { return c.Networks().DeleteACL(ctx, "x") },
			check: func(t *testing.T, err error) {
				assert.True(t, incus.IsNotFound(err))
				assert.False(t, incus.IsConflict(err))
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv, c := newFake(t)
			srv.Handle(tt.pattern, func(w http.ResponseWriter, r *http.Request) {
				incustest.Error(w, tt.code, tt.msg)
			})
			err := tt.call(testCtx(t), c)
			require.Error(t, err)
			tt.check(t, err)
		})
	}
}

func TestNetworkState(t *testing.T) {
	srv, c := newFake(t)
	srv.Handle("GET /1.0/networks/boxnet/state", func(w http.ResponseWriter, r *http.Request) {
		incustest.Sync(w, map[string]any{"hwaddr": "00:16:3e:00:00:01", "mtu": 1500, "state": "up", "type": "broadcast",
			"addresses": []map[string]string{{"family": "inet", "address": "10.88.0.1", "netmask": "24", "scope": "global"}}})
	})
	st, err := c.Networks().State(testCtx(t), "boxnet")
	require.NoError(t, err)
	assert.Equal(t, "up", st.State)
	assert.Equal(t, "00:16:3e:00:00:01", st.Hwaddr)
	require.Len(t, st.Addresses, 1)
	assert.Equal(t, "10.88.0.1", st.Addresses[0].Address)
}
