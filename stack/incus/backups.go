package incus

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"time"
)

// BackupsPost asks for a backup of an instance (POST
// /1.0/instances/{name}/backups): a tarball incusd writes on its own disk,
// to be fetched with ExportBackup and then deleted.
type BackupsPost struct {
	Name string `json:"name"`
	// ExpiresAt is when incusd deletes the backup by itself (zero: never),
	// so one whose caller died before deleting it does not stay forever.
	ExpiresAt time.Time `json:"expires_at,omitzero"`
	// InstanceOnly leaves the snapshots out.
	InstanceOnly bool `json:"instance_only"`
	// OptimizedStorage is the storage driver's own binary format, which
	// only a pool of the same driver can restore and no one can read.
	OptimizedStorage bool `json:"optimized_storage"`
	// CompressionAlgorithm is "gzip", "none", ... ("" is the server's
	// default, backups.compression_algorithm).
	CompressionAlgorithm string `json:"compression_algorithm,omitempty"`
}

// CreateBackup makes a backup of an instance and waits until incusd has
// written it.
func (api Instances) CreateBackup(ctx context.Context, inst string, req BackupsPost) error {
	c := api.c
	if req.Name == "" {
		return fmt.Errorf("backing up instance %s: no backup name given", inst)
	}
	if _, err := c.do(ctx, request{method: http.MethodPost, path: apiPath("instances", inst, "backups"), json: req}); err != nil {
		return fmt.Errorf("backing up instance %s: %w", inst, err)
	}
	return nil
}

// ExportBackup streams a backup's tarball into w and returns how many
// bytes it wrote; nothing is held in memory.
func (api Instances) ExportBackup(ctx context.Context, inst, backup string, w io.Writer) (int64, error) {
	c := api.c
	p := apiPath("instances", inst, "backups", backup, "export")
	resp, err := c.roundTrip(ctx, request{method: http.MethodGet, path: p})
	if err != nil {
		return 0, fmt.Errorf("exporting backup %s of instance %s: %w", backup, inst, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, err := decodeEnvelope(http.MethodGet, p, resp)
		if err == nil {
			err = &StatusError{Method: http.MethodGet, Path: p, Code: resp.StatusCode, Message: http.StatusText(resp.StatusCode)}
		}
		return 0, fmt.Errorf("exporting backup %s of instance %s: %w", backup, inst, err)
	}
	n, err := io.Copy(w, resp.Body)
	if err != nil {
		return n, fmt.Errorf("exporting backup %s of instance %s: %w", backup, inst, err)
	}
	return n, nil
}

// DeleteBackup deletes a backup from incusd's disk.
func (api Instances) DeleteBackup(ctx context.Context, inst, backup string) error {
	c := api.c
	if _, err := c.do(ctx, request{method: http.MethodDelete, path: apiPath("instances", inst, "backups", backup)}); err != nil {
		return fmt.Errorf("deleting backup %s of instance %s: %w", backup, inst, err)
	}
	return nil
}

// ImportBackup creates instance name from a backup tarball (what
// ExportBackup wrote), its snapshots included, streaming it as the body of
// POST /1.0/instances, and waits until incusd has unpacked it. The instance
// is left stopped, with the config the tarball holds. pool, when not
// empty, is the storage pool to put it in (X-Incus-pool).
func (api Instances) ImportBackup(ctx context.Context, name string, backup io.Reader, pool string) error {
	c := api.c
	if name == "" {
		return fmt.Errorf("importing a backup: no instance name given")
	}
	h := http.Header{}
	h.Set("X-Incus-name", name)
	if pool != "" {
		h.Set("X-Incus-pool", pool)
	}
	r := request{
		method: http.MethodPost,
		path:   apiPath("instances"),
		body:   backup,
		// The raw tarball: incusd tells a backup from a JSON create by
		// this type.
		contentType: "application/octet-stream",
		header:      h,
	}
	if _, err := c.do(ctx, r); err != nil {
		return fmt.Errorf("importing instance %s from a backup: %w", name, err)
	}
	return nil
}
