package incus

import (
	"context"
	"fmt"
	"net/http"
)

// StoragePool is a storage pool (GET /1.0/storage-pools/{name}).
type StoragePool struct {
	Name        string            `json:"name"`
	Driver      string            `json:"driver"` // "dir", "zfs", "btrfs", ...
	Description string            `json:"description"`
	Status      string            `json:"status,omitempty"`
	Config      map[string]string `json:"config"`
	UsedBy      []string          `json:"used_by,omitempty"`
}

// StoragePools lists all storage pools.
func (api Storage) Pools(ctx context.Context) ([]StoragePool, error) {
	c := api.c
	var out []StoragePool
	if err := c.list(ctx, apiPath("storage-pools"), nil, &out); err != nil {
		return nil, fmt.Errorf("listing storage pools: %w", err)
	}
	return out, nil
}

// StoragePool fetches one pool and its ETag.
func (api Storage) Pool(ctx context.Context, name string) (*StoragePool, string, error) {
	c := api.c
	var p StoragePool
	etag, err := c.get(ctx, apiPath("storage-pools", name), nil, &p)
	if err != nil {
		return nil, "", fmt.Errorf("getting storage pool %s: %w", name, err)
	}
	return &p, etag, nil
}

// CreateStoragePool creates a pool from Name, Driver, Description and
// Config (Status and UsedBy are ignored).
func (api Storage) CreatePool(ctx context.Context, p StoragePool) error {
	c := api.c
	body := map[string]any{"name": p.Name, "driver": p.Driver, "description": p.Description, "config": p.Config}
	if _, err := c.do(ctx, request{method: http.MethodPost, path: apiPath("storage-pools"), json: body}); err != nil {
		return fmt.Errorf("creating storage pool %s: %w", p.Name, err)
	}
	return nil
}

// DeleteStoragePool deletes a pool; Incus refuses while anything uses it.
func (api Storage) DeletePool(ctx context.Context, name string) error {
	c := api.c
	if _, err := c.do(ctx, request{method: http.MethodDelete, path: apiPath("storage-pools", name)}); err != nil {
		return fmt.Errorf("deleting storage pool %s: %w", name, err)
	}
	return nil
}

// StorageVolume is a storage volume (GET /1.0/storage-pools/{pool}/volumes).
type StorageVolume struct {
	Name string `json:"name"`
	Type string `json:"type"` // custom, container, virtual-machine, image
}

// CustomVolumes lists the custom volumes of a pool (in the client's
// project).
func (api Storage) CustomVolumes(ctx context.Context, pool string) ([]StorageVolume, error) {
	c := api.c
	var out []StorageVolume
	if err := c.list(ctx, apiPath("storage-pools", pool, "volumes", "custom"), nil, &out); err != nil {
		return nil, fmt.Errorf("listing custom volumes of pool %s: %w", pool, err)
	}
	return out, nil
}

// DeleteCustomVolume deletes a custom volume (and its snapshots).
func (api Storage) DeleteCustomVolume(ctx context.Context, pool, name string) error {
	c := api.c
	if _, err := c.do(ctx, request{method: http.MethodDelete, path: apiPath("storage-pools", pool, "volumes", "custom", name)}); err != nil {
		return fmt.Errorf("deleting volume %s of pool %s: %w", name, pool, err)
	}
	return nil
}
