package incus

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"
)

// Target returns a copy of c whose requests are all aimed at one cluster
// member (?target=MEMBER): a member-specific network's per-member config,
// a member's network state and leases, an instance placed on that member.
// "" means wherever Incus decides. The copy shares c's connections.
func (c *Client) Target(member string) *Client {
	cp := *c
	cp.target = member
	return &cp
}

// TargetName is the member this client aims at ("" for none).
func (c *Client) TargetName() string { return c.target }

// Cluster is GET /1.0/cluster.
type Cluster struct {
	ServerName string `json:"server_name"`
	Enabled    bool   `json:"enabled"`
}

// ClusterMember is one member as GET /1.0/cluster/members lists it.
type ClusterMember struct {
	ServerName    string            `json:"server_name"`
	URL           string            `json:"url"`
	Status        string            `json:"status"` // "Online", "Offline", "Evacuated", ...
	Message       string            `json:"message"`
	Roles         []string          `json:"roles"`
	Architecture  string            `json:"architecture"`
	FailureDomain string            `json:"failure_domain"`
	Description   string            `json:"description"`
	Config        map[string]string `json:"config"`
}

// ClusterMemberConfig is one member-specific key a joining member must
// give (the source of a storage pool, for one).
type ClusterMemberConfig struct {
	Entity      string `json:"entity"` // "storage-pool" or "network"
	Name        string `json:"name"`
	Key         string `json:"key"`
	Value       string `json:"value"`
	Description string `json:"description,omitempty"`
}

// ClusterPut is PUT /1.0/cluster's body: with only ServerName and Enabled
// it turns a standalone server into a cluster's first member; with
// ClusterAddress and ClusterToken it joins an existing cluster.
type ClusterPut struct {
	ServerName     string `json:"server_name"`
	Enabled        bool   `json:"enabled"`
	ClusterAddress string `json:"cluster_address,omitempty"`
	ServerAddress  string `json:"server_address,omitempty"`
	ClusterToken   string `json:"cluster_token,omitempty"`
	// ClusterCertificate is the cluster's certificate (PEM), as the first
	// member's GET /1.0 shows it; a join needs it.
	ClusterCertificate string                `json:"cluster_certificate,omitempty"`
	MemberConfig       []ClusterMemberConfig `json:"member_config,omitempty"`
}

// Cluster reads the server's clustering state.
func (c *Client) Cluster(ctx context.Context) (*Cluster, error) {
	var out Cluster
	if _, err := c.get(ctx, "/1.0/cluster", nil, &out); err != nil {
		return nil, fmt.Errorf("reading cluster state: %w", err)
	}
	return &out, nil
}

// UpdateCluster enables clustering or joins a cluster, and waits.
func (c *Client) UpdateCluster(ctx context.Context, put ClusterPut) error {
	if _, err := c.do(ctx, request{method: http.MethodPut, path: "/1.0/cluster", json: put}); err != nil {
		if put.ClusterToken != "" {
			return fmt.Errorf("joining %s to the cluster at %s: %w", put.ServerName, put.ClusterAddress, err)
		}
		return fmt.Errorf("enabling clustering as %s: %w", put.ServerName, err)
	}
	return nil
}

// ClusterMembers lists the cluster's members; a standalone server answers
// with an error.
func (c *Client) ClusterMembers(ctx context.Context) ([]ClusterMember, error) {
	var out []ClusterMember
	if err := c.list(ctx, "/1.0/cluster/members", nil, &out); err != nil {
		return nil, fmt.Errorf("listing cluster members: %w", err)
	}
	return out, nil
}

// joinToken is what a join token encodes (base64 of this JSON), the way
// the incus CLI prints it.
type joinToken struct {
	ServerName  string    `json:"server_name"`
	Fingerprint string    `json:"fingerprint"`
	Addresses   []string  `json:"addresses"`
	Secret      string    `json:"secret"`
	ExpiresAt   time.Time `json:"expires_at"`
}

// ClusterJoinToken asks for a token with which the server called name may
// join (POST /1.0/cluster/members) and returns it encoded as `incus cluster
// add` prints it.
func (c *Client) ClusterJoinToken(ctx context.Context, name string) (string, error) {
	// The operation runs until the token is used or expires: its metadata
	// is all there is to wait for.
	op, err := c.start(ctx, request{method: http.MethodPost, path: "/1.0/cluster/members", json: map[string]string{"server_name": name}})
	if err != nil {
		return "", fmt.Errorf("making a join token for %s: %w", name, err)
	}
	// The operation's metadata names the fields in camel case
	// (serverName, expiresAt); the token in snake case.
	var t joinToken
	t.ServerName, _ = op.Metadata["serverName"].(string)
	t.Fingerprint, _ = op.Metadata["fingerprint"].(string)
	t.Secret, _ = op.Metadata["secret"].(string)
	if addrs, ok := op.Metadata["addresses"].([]any); ok {
		for _, a := range addrs {
			if s, ok := a.(string); ok {
				t.Addresses = append(t.Addresses, s)
			}
		}
	}
	if exp, ok := op.Metadata["expiresAt"].(string); ok {
		t.ExpiresAt, _ = time.Parse(time.RFC3339Nano, exp)
	}
	if t.Secret == "" || t.Fingerprint == "" || len(t.Addresses) == 0 {
		return "", fmt.Errorf("making a join token for %s: %w", name, errors.New("the operation carried no secret, fingerprint or address"))
	}
	b, err := json.Marshal(t)
	if err != nil {
		return "", err
	}
	return base64.StdEncoding.EncodeToString(b), nil
}

// UpdateServerConfig sets server configuration keys (PATCH /1.0), leaving
// the others as they are.
func (c *Client) UpdateServerConfig(ctx context.Context, config map[string]string) error {
	if _, err := c.do(ctx, request{method: http.MethodPatch, path: "/1.0", json: map[string]any{"config": config}}); err != nil {
		return fmt.Errorf("setting server config: %w", err)
	}
	return nil
}

// Ready reports whether incusd has finished starting (GET /internal/ready,
// what `incus admin waitready` polls): its API answers before it serves
// everything, a cluster member's image transfers among them.
func (c *Client) Ready(ctx context.Context) bool {
	_, _, err := c.call(ctx, request{method: http.MethodGet, path: "/internal/ready"})
	return err == nil
}
