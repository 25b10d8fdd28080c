package incus

import (
	"context"
	"errors"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"strings"
	"time"
)

// Image is an image in the local store (GET /1.0/images/{fingerprint}).
type Image struct {
	Fingerprint  string            `json:"fingerprint"`
	Filename     string            `json:"filename"`
	Type         string            `json:"type"` // "container" or "virtual-machine"
	Architecture string            `json:"architecture"`
	Size         int64             `json:"size"`
	Aliases      []ImageAlias      `json:"aliases"`
	Properties   map[string]string `json:"properties"`
	UploadedAt   time.Time         `json:"uploaded_at"`
	CreatedAt    time.Time         `json:"created_at"`
	Public       bool              `json:"public"`
	// Cached marks an image Incus pulled from an image server for an
	// instance (not imported or published); UpdateSource says from where.
	Cached       bool         `json:"cached"`
	UpdateSource *ImageSource `json:"update_source,omitempty"`
}

// ImageSource is where Incus pulled a cached image from.
type ImageSource struct {
	Alias    string `json:"alias"`
	Server   string `json:"server"`
	Protocol string `json:"protocol"`
}

// ImageAlias names an image. Target is the image's fingerprint.
type ImageAlias struct {
	Name        string `json:"name"`
	Description string `json:"description"`
	Target      string `json:"target,omitempty"`
	Type        string `json:"type,omitempty"`
}

// ImageUpload is a split image (a metadata tarball and a root file system)
// to import. VM marks Rootfs as a VM disk image, which Incus expects under a
// different form field than a container's rootfs tarball.
type ImageUpload struct {
	Metadata io.Reader
	Rootfs   io.Reader
	VM       bool
	Aliases  []string
	Public   bool
}

// ImportImage imports a split container image and then creates the given
// aliases for it. It returns the image's fingerprint.
func (api Images) Import(ctx context.Context, metadata, rootfs io.Reader, aliases ...string) (string, error) {
	c := api.c
	return c.Images().Upload(ctx, ImageUpload{Metadata: metadata, Rootfs: rootfs, Aliases: aliases})
}

// UploadImage imports a split image as multipart/form-data, streaming both
// parts (a rootfs is never held in memory), waits for Incus to unpack it and
// creates the aliases. If the image is already in the store the import fails
// with an error for which IsAlreadyExists is true.
func (api Images) Upload(ctx context.Context, up ImageUpload) (string, error) {
	c := api.c
	if up.Metadata == nil || up.Rootfs == nil {
		return "", errors.New("importing image: both metadata and rootfs are required")
	}
	rootfsField := "rootfs"
	if up.VM {
		rootfsField = "rootfs.img"
	}

	pr, pw := io.Pipe()
	mw := multipart.NewWriter(pw)
	go func() {
		// The transport closes pr when it is done with the body, early or
		// not, which ends this goroutine through a failed write.
		pw.CloseWithError(writeImageParts(mw, up.Metadata, rootfsField, up.Rootfs))
	}()

	h := http.Header{}
	if up.Public {
		h.Set("X-Incus-public", "true")
	}
	r := request{
		method:      http.MethodPost,
		path:        apiPath("images"),
		body:        pr,
		contentType: mw.FormDataContentType(),
		header:      h,
	}
	op, err := c.do(ctx, r)
	if err != nil {
		return "", fmt.Errorf("importing image: %w", err)
	}
	fp, _ := op.Metadata["fingerprint"].(string)
	if fp == "" {
		return "", fmt.Errorf("importing image: %w", &MalformedError{Method: r.method, Path: r.path, Err: errors.New("no fingerprint in the operation's metadata")})
	}
	for _, a := range up.Aliases {
		if err := c.Images().CreateAlias(ctx, a, fp, ""); err != nil {
			return fp, fmt.Errorf("importing image %s: %w", fp, err)
		}
	}
	return fp, nil
}

// ImagePublish asks Incus to make an image of an instance (or of one of
// its snapshots, Snapshot set) in the project the client is on. Incus
// refuses a running instance ("Cannot export a running instance as an
// image"): stop it first, or publish a snapshot.
type ImagePublish struct {
	Instance string
	Snapshot string
	// Compression is the tarball's ("none" packs it uncompressed, "" is
	// Incus's default, gzip).
	Compression string
	// Properties are the image's (shown by incus image info).
	Properties map[string]string
}

// Publish makes the image and returns its fingerprint. Incus packs and
// hashes the tarball, one publish at a time whatever the pool, so this
// takes a while for a large instance.
func (api Images) Publish(ctx context.Context, p ImagePublish) (string, error) {
	source := map[string]any{"type": "instance", "name": p.Instance}
	if p.Snapshot != "" {
		source = map[string]any{"type": "snapshot", "name": p.Instance + "/" + p.Snapshot}
	}
	body := map[string]any{"source": source, "properties": p.Properties, "public": false}
	if p.Compression != "" {
		body["compression_algorithm"] = p.Compression
	}
	r := request{method: http.MethodPost, path: apiPath("images"), json: body}
	op, err := api.c.do(ctx, r)
	if err != nil {
		return "", fmt.Errorf("publishing %s as an image: %w", p.Instance, err)
	}
	fp, _ := op.Metadata["fingerprint"].(string)
	if fp == "" {
		return "", fmt.Errorf("publishing %s as an image: %w", p.Instance, &MalformedError{Method: r.method, Path: r.path, Err: errors.New("no fingerprint in the operation's metadata")})
	}
	return fp, nil
}

func writeImageParts(mw *multipart.Writer, metadata io.Reader, rootfsField string, rootfs io.Reader) error {
	fw, err := mw.CreateFormFile("metadata", "metadata.tar")
	if err != nil {
		return err
	}
	if _, err := io.Copy(fw, metadata); err != nil {
		return fmt.Errorf("reading image metadata: %w", err)
	}
	fw, err = mw.CreateFormFile(rootfsField, rootfsField)
	if err != nil {
		return err
	}
	if _, err := io.Copy(fw, rootfs); err != nil {
		return fmt.Errorf("reading image rootfs: %w", err)
	}
	return mw.Close()
}

// ListImages lists the images in the store.
func (api Images) List(ctx context.Context) ([]Image, error) {
	c := api.c
	var out []Image
	if err := c.list(ctx, apiPath("images"), nil, &out); err != nil {
		return nil, fmt.Errorf("listing images: %w", err)
	}
	return out, nil
}

// Image fetches one image by its full fingerprint (or a unique prefix).
func (api Images) Get(ctx context.Context, fingerprint string) (*Image, error) {
	c := api.c
	var img Image
	if _, err := c.get(ctx, apiPath("images", fingerprint), nil, &img); err != nil {
		return nil, fmt.Errorf("getting image %s: %w", fingerprint, err)
	}
	return &img, nil
}

// ImageAlias resolves an alias to its target fingerprint.
func (api Images) Alias(ctx context.Context, name string) (*ImageAlias, error) {
	c := api.c
	var a ImageAlias
	if _, err := c.get(ctx, apiPath("images", "aliases", name), nil, &a); err != nil {
		return nil, fmt.Errorf("getting image alias %s: %w", name, err)
	}
	return &a, nil
}

// CreateImageAlias points a new alias at an image; an existing alias is a
// 409 (IsConflict).
func (api Images) CreateAlias(ctx context.Context, name, target, description string) error {
	c := api.c
	body := ImageAlias{Name: name, Target: target, Description: description}
	if _, err := c.do(ctx, request{method: http.MethodPost, path: apiPath("images", "aliases"), json: body}); err != nil {
		return fmt.Errorf("creating image alias %s: %w", name, err)
	}
	return nil
}

// DeleteImageAlias deletes an alias (not the image).
func (api Images) DeleteAlias(ctx context.Context, name string) error {
	c := api.c
	if _, err := c.do(ctx, request{method: http.MethodDelete, path: apiPath("images", "aliases", name)}); err != nil {
		return fmt.Errorf("deleting image alias %s: %w", name, err)
	}
	return nil
}

// DeleteImage deletes an image and its aliases.
func (api Images) Delete(ctx context.Context, fingerprint string) error {
	c := api.c
	if _, err := c.do(ctx, request{method: http.MethodDelete, path: apiPath("images", fingerprint)}); err != nil {
		return fmt.Errorf("deleting image %s: %w", fingerprint, err)
	}
	return nil
}

// Export streams an image's file (GET /1.0/images/{fingerprint}/export):
// a unified image's one tarball, compressed as it was made (a template
// image is published uncompressed), holding metadata.yaml, templates/ and
// rootfs/. The caller closes it. A split image's two files come as a
// multipart body, which this refuses.
func (api Images) Export(ctx context.Context, fingerprint string) (io.ReadCloser, error) {
	p := apiPath("images", fingerprint, "export")
	resp, err := api.c.roundTrip(ctx, request{method: http.MethodGet, path: p})
	if err != nil {
		return nil, fmt.Errorf("exporting image %s: %w", fingerprint, err)
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		_, err := decodeEnvelope(http.MethodGet, p, resp)
		if err == nil {
			err = &StatusError{Method: http.MethodGet, Path: p, Code: resp.StatusCode, Message: http.StatusText(resp.StatusCode)}
		}
		return nil, fmt.Errorf("exporting image %s: %w", fingerprint, err)
	}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "multipart/") {
		resp.Body.Close()
		return nil, fmt.Errorf("exporting image %s: a split image (metadata and rootfs apart): not one tarball", fingerprint)
	}
	return resp.Body, nil
}
