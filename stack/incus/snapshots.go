package incus

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"time"
)

// Snapshot is a snapshot of an instance. Name is the short name ("snap0"),
// never "inst/snap0".
type Snapshot struct {
	Name      string            `json:"name"`
	CreatedAt time.Time         `json:"created_at"`
	ExpiresAt time.Time         `json:"expires_at"`
	Stateful  bool              `json:"stateful"`
	Config    map[string]string `json:"config"`
}

// CreateSnapshot takes a (stateless) snapshot and waits for it.
func (api Instances) CreateSnapshot(ctx context.Context, inst, snap string) error {
	c := api.c
	body := map[string]any{"name": snap, "stateful": false}
	if _, err := c.do(ctx, request{method: http.MethodPost, path: apiPath("instances", inst, "snapshots"), json: body}); err != nil {
		return fmt.Errorf("creating snapshot %s/%s: %w", inst, snap, err)
	}
	return nil
}

// Snapshots lists an instance's snapshots.
func (api Instances) Snapshots(ctx context.Context, inst string) ([]Snapshot, error) {
	c := api.c
	var out []Snapshot
	if err := c.list(ctx, apiPath("instances", inst, "snapshots"), nil, &out); err != nil {
		return nil, fmt.Errorf("listing snapshots of %s: %w", inst, err)
	}
	// Some Incus versions render the full "inst/snap" name.
	for i := range out {
		out[i].Name = strings.TrimPrefix(out[i].Name, inst+"/")
	}
	return out, nil
}

// SnapshotDefinitions lists an instance's snapshots as what restoring each
// would put back: its config, devices and profiles, plain and expanded, in
// an Instance (the fields Incus's snapshot shares with an instance; Name
// is the snapshot's short name).
func (api Instances) SnapshotDefinitions(ctx context.Context, inst string) ([]Instance, error) {
	c := api.c
	var out []Instance
	if err := c.list(ctx, apiPath("instances", inst, "snapshots"), nil, &out); err != nil {
		return nil, fmt.Errorf("listing snapshots of %s: %w", inst, err)
	}
	for i := range out {
		out[i].Name = strings.TrimPrefix(out[i].Name, inst+"/")
	}
	return out, nil
}

// RestoreSnapshot rolls the instance back to a snapshot.
func (api Instances) RestoreSnapshot(ctx context.Context, inst, snap string) error {
	c := api.c
	body := map[string]any{"restore": snap}
	if _, err := c.do(ctx, request{method: http.MethodPut, path: apiPath("instances", inst), json: body}); err != nil {
		return fmt.Errorf("restoring %s to snapshot %s: %w", inst, snap, err)
	}
	return nil
}

// DeleteSnapshot deletes one snapshot.
func (api Instances) DeleteSnapshot(ctx context.Context, inst, snap string) error {
	c := api.c
	if _, err := c.do(ctx, request{method: http.MethodDelete, path: apiPath("instances", inst, "snapshots", snap)}); err != nil {
		return fmt.Errorf("deleting snapshot %s/%s: %w", inst, snap, err)
	}
	return nil
}
