package incus

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
)

// MaxPullSize bounds PullFile, which holds the whole file in memory.
const MaxPullSize = 64 << 20

// PushFile writes content to path inside the instance, replacing any file
// there, with the given permission bits and owner. A negative uid or gid
// leaves the choice to Incus (root, or the existing file's owner). The body
// is streamed, not buffered.
func (api Instances) PushFile(ctx context.Context, name, path string, content io.Reader, mode os.FileMode, uid, gid int) error {
	c := api.c
	h := http.Header{}
	h.Set("X-Incus-type", "file")
	h.Set("X-Incus-write", "overwrite")
	h.Set("X-Incus-mode", fmt.Sprintf("%04o", mode.Perm()))
	if uid >= 0 {
		h.Set("X-Incus-uid", strconv.Itoa(uid))
	}
	if gid >= 0 {
		h.Set("X-Incus-gid", strconv.Itoa(gid))
	}
	if content == nil {
		content = http.NoBody
	}
	r := request{
		method: http.MethodPost,
		path:   apiPath("instances", name, "files"),
		query:  url.Values{"path": {path}},
		body:   content,
		// Anything else (a form type in particular) makes Incus write an
		// empty file and report success.
		contentType: "application/octet-stream",
		header:      h,
	}
	if _, err := c.do(ctx, r); err != nil {
		return fmt.Errorf("pushing %s to instance %s: %w", path, name, err)
	}
	return nil
}

// PullFile reads a regular file from inside the instance (at most
// MaxPullSize bytes).
func (api Instances) PullFile(ctx context.Context, name, path string) ([]byte, error) {
	c := api.c
	p := apiPath("instances", name, "files")
	resp, err := c.roundTrip(ctx, request{method: http.MethodGet, path: p, query: url.Values{"path": {path}}})
	if err != nil {
		return nil, fmt.Errorf("pulling %s from instance %s: %w", path, name, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, err := decodeEnvelope(http.MethodGet, p, resp)
		if err == nil {
			err = &StatusError{Method: http.MethodGet, Path: p, Code: resp.StatusCode, Message: http.StatusText(resp.StatusCode)}
		}
		return nil, fmt.Errorf("pulling %s from instance %s: %w", path, name, err)
	}
	// A directory comes back as a JSON listing, which must not pass for
	// the file's content.
	if t := resp.Header.Get("X-Incus-type"); t != "" && t != "file" {
		return nil, fmt.Errorf("pulling %s from instance %s: it is a %s, not a regular file", path, name, t)
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, MaxPullSize+1))
	if err != nil {
		return nil, fmt.Errorf("pulling %s from instance %s: %w", path, name, err)
	}
	if len(data) > MaxPullSize {
		return nil, fmt.Errorf("pulling %s from instance %s: larger than %d bytes", path, name, MaxPullSize)
	}
	return data, nil
}
