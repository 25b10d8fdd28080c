package incus_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/incus/incustest"
)

func TestInstancesFilter(t *testing.T) {
	tests := []struct {
		name    string
		list    func(ctx context.Context, c *incus.Client) ([]incus.Instance, error)
		want    string // the filter query the server must see; "" means none
		wantErr string
	}{
		{
			name: "nil lists all",
			list: func(ctx context.Context, c *incus.Client) ([]incus.Instance, error) {
				return c.Instances().List(ctx, nil)
			},
		},
		{
			name: "one key",
			list: func(ctx context.Context, c *incus.Client) ([]incus.Instance, error) {
				return c.Instances().List(ctx, map[string]string{"user.box": "1"})
			},
			want: "config.user.box eq 1",
		},
		{
			name: "keys are sorted and joined with and",
			list: func(ctx context.Context, c *incus.Client) ([]incus.Instance, error) {
				return c.Instances().List(ctx, map[string]string{"user.box": "1", "user.box.owner": "alice", "image.os": "Debian"})
			},
			want: "config.image.os eq Debian and config.user.box eq 1 and config.user.box.owner eq alice",
		},
		{
			name: "a value with spaces is quoted",
			list: func(ctx context.Context, c *incus.Client) ([]incus.Instance, error) {
				return c.Instances().List(ctx, map[string]string{"user.note": "my box"})
			},
			want: `config.user.note eq "my box"`,
		},
		{
			name: "a value Incus would match loosely is refused",
			list: func(ctx context.Context, c *incus.Client) ([]incus.Instance, error) {
				return c.Instances().List(ctx, map[string]string{"user.note": "my  box"})
			},
			wantErr: "cannot be used in an incus filter",
		},
		{
			name: "raw expression",
			list: func(ctx context.Context, c *incus.Client) ([]incus.Instance, error) {
				return c.Instances().Where(ctx, "config.user.box eq 1 or config.user.claudebox eq 1")
			},
			want: "config.user.box eq 1 or config.user.claudebox eq 1",
		},
		{
			name: "empty value is refused",
			list: func(ctx context.Context, c *incus.Client) ([]incus.Instance, error) {
				return c.Instances().List(ctx, map[string]string{"user.box": ""})
			},
			wantErr: "cannot be used in an incus filter",
		},
		{
			name: "quote in value is refused",
			list: func(ctx context.Context, c *incus.Client) ([]incus.Instance, error) {
				return c.Instances().List(ctx, map[string]string{"user.box": `a"b`})
			},
			wantErr: "cannot be used in an incus filter",
		},
		{
			name: "space in key is refused",
			list: func(ctx context.Context, c *incus.Client) ([]incus.Instance, error) {
				return c.Instances().List(ctx, map[string]string{"user.box or": "1"})
			},
			wantErr: "cannot be used in an incus filter",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv, c := newFake(t)
			srv.Handle("GET /1.0/instances", func(w http.ResponseWriter, r *http.Request) {
				incustest.Sync(w, []map[string]any{
					{"name": "b1", "status": "Running", "status_code": 103, "type": "container",
						"config": map[string]string{"user.box": "1"}, "profiles": []string{"box-net"},
						"created_at":       "2026-01-02T03:04:05Z",
						"expanded_devices": map[string]map[string]string{"eth0": {"type": "nic", "network": "boxnet"}}},
				})
			})
			got, err := tt.list(testCtx(t), c)
			if tt.wantErr != "" {
				require.ErrorContains(t, err, tt.wantErr)
				assert.Empty(t, srv.Requests(), "nothing may be sent for a filter that cannot be expressed")
				return
			}
			require.NoError(t, err)
			reqs := srv.Requests()
			require.Len(t, reqs, 1, "one request however many instances")
			assert.Equal(t, "1", reqs[0].Query.Get("recursion"))
			assert.Equal(t, tt.want, reqs[0].Query.Get("filter"))
			assert.Equal(t, tt.want != "", reqs[0].Query.Has("filter"))
			require.Len(t, got, 1)
			assert.Equal(t, "b1", got[0].Name)
			assert.Equal(t, 103, got[0].StatusCode)
			assert.Equal(t, "1", got[0].Config["user.box"])
			assert.Equal(t, "boxnet", got[0].ExpandedDevices["eth0"]["network"])
			assert.Equal(t, time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), got[0].CreatedAt)
		})
	}
}

func TestInstanceGetAndUpdate(t *testing.T) {
	srv, c := newFake(t)
	const etag = `"d1e2"`
	srv.Handle("GET /1.0/instances/{name}", func(w http.ResponseWriter, r *http.Request) {
		incustest.SyncETag(w, etag, map[string]any{
			"name": r.PathValue("name"), "description": "a box", "status": "Stopped", "status_code": 102,
			"type": "virtual-machine", "architecture": "x86_64", "stateful": true,
			"config": map[string]string{"user.box": "1"}, "profiles": []string{"box-net"},
			"devices": map[string]map[string]string{"root": {"type": "disk", "path": "/", "pool": "default"}},
		})
	})
	srv.Handle("PUT /1.0/instances/{name}", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("If-Match") != "" && r.Header.Get("If-Match") != etag {
			incustest.Error(w, http.StatusPreconditionFailed, "ETag doesn't match: d1e2 vs stale")
			return
		}
		srv.Async(w, incustest.Op{Description: "Updating instance"})
	})

	ctx := testCtx(t)
	inst, gotTag, err := c.Instances().Get(ctx, "b1")
	require.NoError(t, err)
	assert.Equal(t, etag, gotTag)
	assert.Equal(t, "b1", inst.Name)
	assert.Equal(t, "virtual-machine", inst.Type)

	put := inst.Writable()
	put.Config["user.box.note"] = "hi"
	assert.NotContains(t, inst.Config, "user.box.note", "Writable must copy")
	require.NoError(t, c.Instances().Update(ctx, "b1", put, gotTag))
	puts := srv.Find("PUT", "/1.0/instances/b1")
	require.Len(t, puts, 1)
	assert.Equal(t, etag, puts[0].Header.Get("If-Match"))
	assert.Equal(t, "application/json", puts[0].Header.Get("Content-Type"))
	body := jsonBody(t, puts[0])
	assert.Equal(t, map[string]any{"user.box": "1", "user.box.note": "hi"}, body["config"])
	assert.Equal(t, []any{"box-net"}, body["profiles"])
	assert.Equal(t, "a box", body["description"])
	assert.Equal(t, true, body["stateful"], "a PUT must not silently reset stateful")
	assert.Contains(t, body, "devices")
	reqs := srv.Requests()
	require.Len(t, reqs, 3, "GET, PUT, then a wait for the PUT's operation")
	assert.Regexp(t, `^/1\.0/operations/[^/]+/wait$`, reqs[2].Path)

	t.Run("stale etag", func(t *testing.T) {
		err := c.Instances().Update(ctx, "b1", put, `"stale"`)
		require.Error(t, err)
		assert.True(t, incus.IsPreconditionFailed(err))
		assert.False(t, incus.IsConflict(err))
		assert.Contains(t, err.Error(), "updating instance b1")
	})
	t.Run("no etag sends no If-Match", func(t *testing.T) {
		require.NoError(t, c.Instances().Update(ctx, "b2", put, ""))
		puts := srv.Find("PUT", "/1.0/instances/b2")
		require.Len(t, puts, 1)
		assert.Empty(t, puts[0].Header.Get("If-Match"))
	})
}

// TestInstanceMutations checks that each call sends the documented request
// and waits for the operation it starts.
func TestInstanceMutations(t *testing.T) {
	tests := []struct {
		name     string
		pattern  string
		call     func(ctx context.Context, c *incus.Client) error
		path     string
		wantBody map[string]any // nil: no body expected
	}{
		{
			name:    "create from image",
			pattern: "POST /1.0/instances",
			call: func(ctx context.Context, c *incus.Client) error {
				return c.Instances().Create(ctx, incus.InstancesPost{
					Name: "b1", Type: "container",
					Source:   incus.InstanceSource{Type: "image", Alias: "box/debian"},
					Config:   map[string]string{"user.box": "1"},
					Profiles: []string{"box-net"}, Start: true,
				})
			},
			path: "/1.0/instances",
			wantBody: map[string]any{
				"name": "b1", "type": "container",
				"source":   map[string]any{"type": "image", "alias": "box/debian"},
				"config":   map[string]any{"user.box": "1"},
				"profiles": []any{"box-net"}, "ephemeral": false, "start": true,
			},
		},
		{
			name:    "create as a copy, nil profiles means default",
			pattern: "POST /1.0/instances",
			call: func(ctx context.Context, c *incus.Client) error {
				return c.Instances().Create(ctx, incus.InstancesPost{
					Name: "b2", Source: incus.InstanceSource{Type: "copy", Source: "b1/clean", InstanceOnly: true},
				})
			},
			path: "/1.0/instances",
			wantBody: map[string]any{
				"name": "b2", "source": map[string]any{"type": "copy", "source": "b1/clean", "instance_only": true},
				"profiles": nil, "ephemeral": false, "start": false,
			},
		},
		{
			name:    "start",
			pattern: "PUT /1.0/instances/{name}/state",
			call: func(ctx context.Context, c *incus.Client) error {
				return c.Instances().SetState(ctx, "b1", "start", 0, false)
			},
			path:     "/1.0/instances/b1/state",
			wantBody: map[string]any{"action": "start", "timeout": float64(-1), "force": false},
		},
		{
			name:    "stop with a timeout",
			pattern: "PUT /1.0/instances/{name}/state",
			call: func(ctx context.Context, c *incus.Client) error {
				return c.Instances().SetState(ctx, "b1", "stop", 30*time.Second, false)
			},
			path:     "/1.0/instances/b1/state",
			wantBody: map[string]any{"action": "stop", "timeout": float64(30), "force": false},
		},
		{
			name:    "delete",
			pattern: "DELETE /1.0/instances/{name}",
			call:    func(ctx context.Context, c *incus.Client) error { return c.Instances().Delete(ctx, "b1") },
			path:    "/1.0/instances/b1",
		},
		{
			name:    "create snapshot",
			pattern: "POST /1.0/instances/{name}/snapshots",
			call: func(ctx context.Context, c *incus.Client) error {
				return c.Instances().CreateSnapshot(ctx, "b1", "clean")
			},
			path: "/1.0/instances/b1/snapshots", wantBody: map[string]any{"name": "clean", "stateful": false},
		},
		{
			name:    "restore snapshot",
			pattern: "PUT /1.0/instances/{name}",
			call: func(ctx context.Context, c *incus.Client) error {
				return c.Instances().RestoreSnapshot(ctx, "b1", "clean")
			},
			path: "/1.0/instances/b1", wantBody: map[string]any{"restore": "clean"},
		},
		{
			name:    "delete snapshot",
			pattern: "DELETE /1.0/instances/{name}/snapshots/{snap}",
			call: func(ctx context.Context, c *incus.Client) error {
				return c.Instances().DeleteSnapshot(ctx, "b1", "clean")
			},
			path: "/1.0/instances/b1/snapshots/clean",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv, c := newFake(t)
			var opID string
			srv.Handle(tt.pattern, func(w http.ResponseWriter, r *http.Request) {
				opID = srv.Async(w, incustest.Op{Description: tt.name})
			})
			require.NoError(t, tt.call(testCtx(t), c))
			reqs := srv.Requests()
			require.Len(t, reqs, 2, "the request, then one wait")
			assert.Equal(t, tt.path, reqs[0].Path)
			if tt.wantBody != nil {
				assert.Equal(t, tt.wantBody, jsonBody(t, reqs[0]))
			} else {
				assert.Empty(t, reqs[0].Body)
			}
			assert.Equal(t, "/1.0/operations/"+opID+"/wait", reqs[1].Path)
		})
	}
}

func TestInstanceNameIsEscaped(t *testing.T) {
	srv, c := newFake(t)
	_, _, err := c.Instances().Get(testCtx(t), "../networks?x")
	assert.True(t, incus.IsNotFound(err))
	reqs := srv.Requests()
	require.Len(t, reqs, 1)
	assert.Equal(t, "/1.0/instances/../networks?x", reqs[0].Path, "decoded by the server as one segment")
	assert.Empty(t, reqs[0].Query)
}

func TestInstanceState(t *testing.T) {
	srv, c := newFake(t)
	srv.Handle("GET /1.0/instances/b1/state", func(w http.ResponseWriter, r *http.Request) {
		incustest.Sync(w, map[string]any{
			"status": "Running", "status_code": 103, "pid": 4242,
			"network": map[string]any{"eth0": map[string]any{
				"hwaddr": "10:66:6a:00:00:01", "host_name": "veth1234", "state": "up", "type": "broadcast", "mtu": 1500,
				"addresses": []map[string]string{
					{"family": "inet", "address": "10.88.0.5", "netmask": "24", "scope": "global"},
					{"family": "inet6", "address": "fe80::1", "netmask": "64", "scope": "link"},
				},
			}},
		})
	})
	st, err := c.Instances().State(testCtx(t), "b1")
	require.NoError(t, err)
	assert.Equal(t, "Running", st.Status)
	assert.EqualValues(t, 4242, st.Pid)
	eth0 := st.Network["eth0"]
	assert.Equal(t, "veth1234", eth0.HostName)
	assert.Equal(t, "10:66:6a:00:00:01", eth0.Hwaddr)
	require.Len(t, eth0.Addresses, 2)
	assert.Equal(t, incus.NetworkAddress{Family: "inet", Address: "10.88.0.5", Netmask: "24", Scope: "global"}, eth0.Addresses[0])
}

func TestSnapshots(t *testing.T) {
	srv, c := newFake(t)
	srv.Handle("GET /1.0/instances/b1/snapshots", func(w http.ResponseWriter, r *http.Request) {
		incustest.Sync(w, []map[string]any{
			{"name": "clean", "created_at": "2026-01-01T00:00:00Z", "stateful": false},
			{"name": "b1/authed", "expires_at": "2026-02-01T00:00:00Z", "config": map[string]string{"user.box": "1"}},
		})
	})
	snaps, err := c.Instances().Snapshots(testCtx(t), "b1")
	require.NoError(t, err)
	require.Len(t, snaps, 2)
	assert.Equal(t, "clean", snaps[0].Name)
	assert.Equal(t, "authed", snaps[1].Name, "names are always short")
	assert.Equal(t, time.Date(2026, 2, 1, 0, 0, 0, 0, time.UTC), snaps[1].ExpiresAt)
	assert.Equal(t, "1", srv.Requests()[0].Query.Get("recursion"))
}

func TestSnapshotDefinitions(t *testing.T) {
	srv, c := newFake(t)
	srv.Handle("GET /1.0/instances/b1/snapshots", func(w http.ResponseWriter, r *http.Request) {
		incustest.Sync(w, []map[string]any{{
			"name": "b1/s1", "profiles": []string{"box-net"}, "config": map[string]string{"user.box": "1"},
			"devices":          map[string]any{"eth1": map[string]string{"type": "nic", "nictype": "macvlan", "parent": "lo"}},
			"expanded_devices": map[string]any{"eth0": map[string]string{"type": "nic", "network": "boxnet"}, "eth1": map[string]string{"type": "nic"}},
		}})
	})
	snaps, err := c.Instances().SnapshotDefinitions(testCtx(t), "b1")
	require.NoError(t, err)
	require.Len(t, snaps, 1)
	assert.Equal(t, "s1", snaps[0].Name, "names are always short")
	assert.Equal(t, []string{"box-net"}, snaps[0].Profiles)
	assert.Equal(t, "macvlan", snaps[0].Devices["eth1"]["nictype"])
	assert.Len(t, snaps[0].ExpandedDevices, 2, "what restoring it puts back")
}

// Incus refuses renaming a running instance only inside the operation, as a
// generic failure; the client checks first and answers with a conflict.
func TestRenameInstance(t *testing.T) {
	for _, tc := range []struct {
		status   string
		conflict bool
	}{{"Stopped", false}, {"Running", true}, {"Frozen", true}} {
		t.Run(tc.status, func(t *testing.T) {
			srv, c := newFake(t)
			srv.Handle("GET /1.0/instances/{name}/state", func(w http.ResponseWriter, r *http.Request) {
				incustest.Sync(w, map[string]any{"status": tc.status})
			})
			srv.Handle("POST /1.0/instances/{name}", func(w http.ResponseWriter, r *http.Request) {
				srv.Async(w, incustest.Op{Description: "Renaming instance"})
			})
			err := c.Instances().Rename(testCtx(t), "b1", "b9")
			posts := srv.Find(http.MethodPost, "/1.0/instances/b1")
			if !tc.conflict {
				require.NoError(t, err)
				require.Len(t, posts, 1)
				assert.Equal(t, map[string]any{"name": "b9"}, jsonBody(t, posts[0]))
				return
			}
			require.Error(t, err)
			assert.True(t, incus.IsConflict(err), "a %s instance is a conflict: %v", tc.status, err)
			assert.Contains(t, err.Error(), "stop it first")
			assert.Empty(t, posts, "nothing was sent to rename it")
		})
	}
}

func TestMoveInstance(t *testing.T) {
	srv, c := newFake(t)
	srv.Handle("POST /1.0/instances/{name}", func(w http.ResponseWriter, r *http.Request) {
		srv.Async(w, incustest.Op{Description: "Migrating instance"})
	})
	require.NoError(t, c.Instances().Move(testCtx(t), "b1", "m2"))
	posts := srv.Find(http.MethodPost, "/1.0/instances/b1")
	require.Len(t, posts, 1)
	assert.Equal(t, "m2", posts[0].Query.Get("target"), "the member it moves to")
	assert.Equal(t, map[string]any{"migration": true}, jsonBody(t, posts[0]), "a move within the cluster, under its own name")

	require.Error(t, c.Instances().Move(testCtx(t), "b1", ""))
	assert.Len(t, srv.Find(http.MethodPost, "/1.0/instances/b1"), 1, "no member, no request")

	srv2, c2 := newFake(t)
	srv2.Handle("POST /1.0/instances/{name}", func(w http.ResponseWriter, r *http.Request) {
		srv2.Async(w, incustest.Op{Description: "Migrating instance", Err: "Instance is running"})
	})
	err := c2.Instances().Move(testCtx(t), "b1", "m2")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "moving instance b1 to member m2")
	assert.Contains(t, err.Error(), "instance is running")
}

// A pull from an image server is asked for with every field Incus's API
// takes for one, and nothing of a copy's.
func TestCreateFromAnImageServer(t *testing.T) {
	srv, c := newFake(t)
	srv.Handle("POST /1.0/instances", func(w http.ResponseWriter, r *http.Request) {
		srv.Async(w, incustest.Op{Description: "Creating instance"})
	})
	src := incus.InstanceSource{Type: "image", Mode: "pull", Server: "https://203.0.113.30:8443", Protocol: "simplestreams",
		Alias: "debian/12/cloud", Certificate: "PEM"}
	require.NoError(t, c.Instances().Create(testCtx(t), incus.InstancesPost{Name: "b", Type: "container", Source: src}))
	var body struct {
		Source map[string]any `json:"source"`
	}
	require.NoError(t, json.Unmarshal(srv.Find(http.MethodPost, "/1.0/instances")[0].Body, &body))
	assert.Equal(t, map[string]any{"type": "image", "mode": "pull", "server": "https://203.0.113.30:8443",
		"protocol": "simplestreams", "alias": "debian/12/cloud", "certificate": "PEM"}, body.Source)
}

// While the create runs its progress is told, each new line once, and
// nothing after the create has returned.
func TestCreateInstanceWithProgress(t *testing.T) {
	srv, c := newFake(t)
	lines := []string{"metadata: 100% (2.00MB/s)", "rootfs: 10% (5.00MB/s)", "rootfs: 100% (6.00MB/s)", "Unpacking image: 40%"}
	seen := make(chan string)
	srv.Handle("POST /1.0/instances", func(w http.ResponseWriter, r *http.Request) {
		id := srv.Async(w, incustest.Op{Description: "Creating instance", Hold: true})
		go func() {
			meta := map[string]any{}
			for _, l := range lines {
				if strings.HasPrefix(l, "Unpacking") {
					meta["create_instance_from_image_unpack_progress"] = l
				} else {
					meta[incus.DownloadProgress] = l
				}
				srv.SetMetadata(id, meta)
				<-seen
				meta = map[string]any{incus.DownloadProgress: meta[incus.DownloadProgress], "create_instance_from_image_unpack_progress": meta["create_instance_from_image_unpack_progress"]}
			}
			srv.Release(id)
		}()
	})
	var got []string
	err := c.Instances().CreateWithProgress(testCtx(t), incus.InstancesPost{Name: "b"}, func(s string) {
		got = append(got, s)
		seen <- s
	})
	require.NoError(t, err)
	assert.Equal(t, lines, got)
}
