package incus

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
)

// ImageMetadata is an instance's image metadata (its metadata.yaml), as
// GET /1.0/instances/{name}/metadata returns it: above all its templates,
// the files Incus renders into the instance when it is created, copied or
// started.
type ImageMetadata struct {
	Architecture string                    `json:"architecture"`
	CreationDate int64                     `json:"creation_date"`
	ExpiryDate   int64                     `json:"expiry_date"`
	Properties   map[string]string         `json:"properties"`
	Templates    map[string]*ImageTemplate `json:"templates"`
}

// ImageTemplate renders one file (the Templates key is its path in the
// instance) from a template file of the instance's (PutInstanceTemplate)
// when one of When happens: "create", "copy" (a copy's first start) or
// "start" (every start). In a container Incus writes it before the
// instance starts; in a VM its agent writes it early in the boot.
type ImageTemplate struct {
	When       []string          `json:"when"`
	CreateOnly bool              `json:"create_only"`
	Template   string            `json:"template"`
	Properties map[string]string `json:"properties"`
	UID        string            `json:"uid,omitempty"`
	GID        string            `json:"gid,omitempty"`
	Mode       string            `json:"mode,omitempty"`
}

// InstanceMetadata fetches an instance's image metadata and its ETag for
// UpdateInstanceMetadata.
func (api Instances) Metadata(ctx context.Context, name string) (*ImageMetadata, string, error) {
	c := api.c
	var md ImageMetadata
	etag, err := c.get(ctx, apiPath("instances", name, "metadata"), nil, &md)
	if err != nil {
		return nil, "", fmt.Errorf("getting metadata of instance %s: %w", name, err)
	}
	return &md, etag, nil
}

// UpdateInstanceMetadata replaces an instance's image metadata (412 on a
// stale non-empty etag).
func (api Instances) UpdateMetadata(ctx context.Context, name string, md ImageMetadata, etag string) error {
	c := api.c
	if _, err := c.do(ctx, request{method: http.MethodPut, path: apiPath("instances", name, "metadata"), json: md, etag: etag}); err != nil {
		return fmt.Errorf("updating metadata of instance %s: %w", name, err)
	}
	return nil
}

// PutInstanceTemplate creates or replaces the instance's template file
// named tpl (a pongo2 template; plain text renders as itself).
func (api Instances) PutTemplate(ctx context.Context, name, tpl string, content io.Reader) error {
	c := api.c
	r := request{
		method: http.MethodPost, path: apiPath("instances", name, "metadata", "templates"),
		query: url.Values{"path": {tpl}}, body: content, contentType: "application/octet-stream",
	}
	if _, err := c.do(ctx, r); err != nil {
		return fmt.Errorf("writing template %s of instance %s: %w", tpl, name, err)
	}
	return nil
}
