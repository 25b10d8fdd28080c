package incus_test

import (
	"context"
	"encoding/base64"
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

// TestClusterJoinToken: Incus's operation names the token's fields in
// camel case and runs until the token is used; the token the client
// returns is base64 of the snake-case JSON `incus cluster add` prints.
func TestClusterJoinToken(t *testing.T) {
	srv := incustest.New(t)
	expires := time.Date(2026, 12, 1, 16, 0, 0, 123456789, time.UTC)
	var opID string
	srv.Handle("POST /1.0/cluster/members", func(w http.ResponseWriter, r *http.Request) {
		opID = srv.Async(w, incustest.Op{Description: "Requesting a cluster join token", Hold: true, MayCancel: true,
			Metadata: map[string]any{
				"serverName": "m2", "secret": "s3cret", "fingerprint": "abc123",
				"addresses": []string{"192.168.40.11:8443"}, "expiresAt": expires.Format(time.RFC3339Nano),
			}})
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	token, err := incus.New(srv.Socket()).ClusterJoinToken(ctx, "m2")
	require.NoError(t, err, "the held operation is not waited for")

	posts := srv.Find(http.MethodPost, "/1.0/cluster/members")
	require.Len(t, posts, 1)
	assert.JSONEq(t, `{"server_name": "m2"}`, string(posts[0].Body))
	assert.False(t, srv.CancelRequested(opID), "the token's operation must live on until the join uses it")

	raw, err := base64.StdEncoding.DecodeString(token)
	require.NoError(t, err, "the token is standard base64")
	var got map[string]any
	require.NoError(t, json.Unmarshal(raw, &got))
	assert.Equal(t, map[string]any{
		"server_name": "m2", "secret": "s3cret", "fingerprint": "abc123",
		"addresses": []any{"192.168.40.11:8443"}, "expires_at": expires.Format(time.RFC3339Nano),
	}, got)
}

func TestClusterJoinTokenIncomplete(t *testing.T) {
	for _, tc := range []struct {
		name string
		meta map[string]any
	}{
		{"no secret", map[string]any{"serverName": "m2", "fingerprint": "abc", "addresses": []string{"192.168.40.11:8443"}}},
		{"no fingerprint", map[string]any{"serverName": "m2", "secret": "s", "addresses": []string{"192.168.40.11:8443"}}},
		{"no address", map[string]any{"serverName": "m2", "secret": "s", "fingerprint": "abc", "addresses": []string{}}},
		{"addresses not a list", map[string]any{"serverName": "m2", "secret": "s", "fingerprint": "abc", "addresses": "192.168.40.11:8443"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := incustest.New(t)
			srv.Handle("POST /1.0/cluster/members", func(w http.ResponseWriter, r *http.Request) {
				srv.Async(w, incustest.Op{Hold: true, Metadata: tc.meta})
			})
			_, err := incus.New(srv.Socket()).ClusterJoinToken(context.Background(), "m2")
			require.Error(t, err)
			assert.Contains(t, err.Error(), "making a join token for m2")
		})
	}

	srv := incustest.New(t)
	srv.Handle("POST /1.0/cluster/members", func(w http.ResponseWriter, r *http.Request) {
		incustest.Error(w, http.StatusBadRequest, "This server is not clustered")
	})
	_, err := incus.New(srv.Socket()).ClusterJoinToken(context.Background(), "m2")
	assert.ErrorContains(t, err, "not clustered")
}

func TestUpdateCluster(t *testing.T) {
	srv := incustest.New(t)
	fail := ""
	srv.Handle("PUT /1.0/cluster", func(w http.ResponseWriter, r *http.Request) {
		srv.Async(w, incustest.Op{Description: "Joining cluster", Err: fail})
	})
	c := incus.New(srv.Socket())
	ctx := context.Background()

	require.NoError(t, c.UpdateCluster(ctx, incus.ClusterPut{ServerName: "m1", Enabled: true}))
	join := incus.ClusterPut{
		ServerName: "m2", Enabled: true, ClusterAddress: "192.168.40.11:8443", ServerAddress: "192.168.40.12:8443",
		ClusterToken: "dG9rZW4=", ClusterCertificate: "PEM",
		MemberConfig: []incus.ClusterMemberConfig{{Entity: "storage-pool", Name: "default", Key: "source", Value: ""}},
	}
	require.NoError(t, c.UpdateCluster(ctx, join))
	puts := srv.Find(http.MethodPut, "/1.0/cluster")
	require.Len(t, puts, 2)
	// Enabling sends no join fields at all: Incus takes an empty
	// cluster_address as "none", but a stray one as a join.
	assert.JSONEq(t, `{"server_name": "m1", "enabled": true}`, string(puts[0].Body))
	assert.JSONEq(t, `{"server_name": "m2", "enabled": true, "cluster_address": "192.168.40.11:8443",
		"server_address": "192.168.40.12:8443", "cluster_token": "dG9rZW4=", "cluster_certificate": "PEM",
		"member_config": [{"entity": "storage-pool", "name": "default", "key": "source", "value": ""}]}`, string(puts[1].Body))

	fail = "Failed to join cluster: token expired"
	err := c.UpdateCluster(ctx, join)
	assert.ErrorContains(t, err, "joining m2 to the cluster at 192.168.40.11:8443")
	assert.ErrorContains(t, err, "token expired")
	err = c.UpdateCluster(ctx, incus.ClusterPut{ServerName: "m1", Enabled: true})
	assert.ErrorContains(t, err, "enabling clustering as m1")
}

func TestClusterMembersAndState(t *testing.T) {
	srv := incustest.New(t)
	srv.Handle("GET /1.0/cluster/members", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("recursion") != "1" {
			incustest.Sync(w, []string{"/1.0/cluster/members/m1"})
			return
		}
		incustest.Sync(w, []map[string]any{
			{"server_name": "m1", "url": "https://192.168.40.11:8443", "status": "Online", "roles": []string{"database-leader", "database"}},
			{"server_name": "m2", "url": "https://192.168.40.12:8443", "status": "Offline", "message": "No heartbeat"},
		})
	})
	srv.Handle("GET /1.0/cluster", func(w http.ResponseWriter, r *http.Request) {
		incustest.Sync(w, map[string]any{"server_name": "m1", "enabled": true, "member_config": []any{}})
	})
	c := incus.New(srv.Socket())
	ms, err := c.ClusterMembers(context.Background())
	require.NoError(t, err)
	require.Len(t, ms, 2)
	assert.Equal(t, "m1", ms[0].ServerName)
	assert.Equal(t, "Online", ms[0].Status)
	assert.Equal(t, []string{"database-leader", "database"}, ms[0].Roles)
	assert.Equal(t, "Offline", ms[1].Status)
	assert.Equal(t, "No heartbeat", ms[1].Message)

	cl, err := c.Cluster(context.Background())
	require.NoError(t, err)
	assert.Equal(t, &incus.Cluster{ServerName: "m1", Enabled: true}, cl)

	// A standalone server has no members to list.
	alone := incustest.New(t)
	alone.Handle("GET /1.0/cluster/members", func(w http.ResponseWriter, r *http.Request) {
		incustest.Error(w, http.StatusBadRequest, "Server isn't part of a cluster")
	})
	_, err = incus.New(alone.Socket()).ClusterMembers(context.Background())
	assert.ErrorContains(t, err, "listing cluster members")
	assert.ErrorContains(t, err, "isn't part of a cluster")
}

// TestTarget: a targeted copy adds ?target= to every request, reads and
// writes and operation waits alike, and leaves the client it came from
// untargeted.
func TestTarget(t *testing.T) {
	srv := incustest.New(t)
	srv.Handle("GET /1.0/networks/{name}", func(w http.ResponseWriter, r *http.Request) {
		incustest.SyncETag(w, `"e"`, map[string]any{"name": r.PathValue("name"), "config": map[string]string{}})
	})
	srv.Handle("POST /1.0/networks", func(w http.ResponseWriter, r *http.Request) { incustest.Sync(w, nil) })
	srv.Handle("POST /1.0/instances", func(w http.ResponseWriter, r *http.Request) {
		srv.Async(w, incustest.Op{Description: "Creating instance"})
	})
	c := incus.New(srv.Socket())
	m2 := c.Target("m2")
	ctx := context.Background()
	assert.Equal(t, "m2", m2.TargetName())
	assert.Equal(t, "", c.TargetName())

	_, _, err := m2.Networks().Get(ctx, "boxnet")
	require.NoError(t, err)
	require.NoError(t, m2.Networks().Create(ctx, incus.NetworksPost{Name: "boxnet", Type: "bridge"}))
	require.NoError(t, m2.Instances().Create(ctx, incus.InstancesPost{Name: "cb-one"}))
	_, _, err = c.Networks().Get(ctx, "boxnet")
	require.NoError(t, err)
	_, _, err = c.Target("").Networks().Get(ctx, "boxnet")
	require.NoError(t, err)

	reqs := srv.Requests()
	require.GreaterOrEqual(t, len(reqs), 5)
	last := reqs[len(reqs)-2:]
	for _, r := range reqs[:len(reqs)-2] {
		if strings.HasPrefix(r.Path, "/1.0/operations/") {
			continue // the create's wait: not what a target is for
		}
		assert.Equal(t, "m2", r.Query.Get("target"), "%s %s", r.Method, r.Path)
	}
	for _, r := range last {
		assert.False(t, r.Query.Has("target"), "an untargeted client sent target=%s on %s %s", r.Query.Get("target"), r.Method, r.Path)
	}
}
