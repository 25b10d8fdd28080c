package incus

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// maxResponseSize bounds a JSON response so a confused server cannot make us
// allocate without limit; a few thousand instances fit comfortably.
const maxResponseSize = 64 << 20

// Client talks to one incusd over its unix socket. The zero value is not
// usable; build one with New. A Client is safe for concurrent use.
type Client struct {
	socket  string
	base    string // "http://incus" on a unix socket, the remote's https://host:port
	project string
	target  string
	http    *http.Client
}

// traceCalls (BOX_TRACE_INCUS=1) writes each call to Incus, with the time
// to its answer's header, to standard error: where a command's time goes
// (docs/measurements.md, "A busy host").
var traceCalls = os.Getenv("BOX_TRACE_INCUS") == "1"

// DefaultSocket is the socket incusd listens on, honouring the same
// environment variables as the incus CLI: $INCUS_SOCKET, then
// $INCUS_DIR/unix.socket, then /var/lib/incus/unix.socket.
func DefaultSocket() string {
	if s := os.Getenv("INCUS_SOCKET"); s != "" {
		return s
	}
	if d := os.Getenv("INCUS_DIR"); d != "" {
		return filepath.Join(d, "unix.socket")
	}
	return "/var/lib/incus/unix.socket"
}

// New returns a client for the incusd listening on socketPath ("" means
// DefaultSocket()). It never dials here: an absent daemon shows up as an
// *UnreachableError on the first call, where the caller can say what to do.
func New(socketPath string) *Client {
	if socketPath == "" {
		socketPath = DefaultSocket()
	}
	return NewDialer(socketPath, func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", socketPath)
	})
}

// NewDialer returns a client that opens its connections with dial (to the
// unix socket at socketPath, which names it in errors): incus-user's
// socket dialled under a granted user's credentials, for one.
func NewDialer(socketPath string, dial func(ctx context.Context) (net.Conn, error)) *Client {
	// No Proxy: "incus" is not a real host, and $HTTP_PROXY must never see
	// these requests.
	//
	// One connection per request, closed after it: incusd's unix socket
	// (Incus 6.0 to 7) accepts one connection at a time, and only once
	// the connection's first bytes have arrived. Go's transport may dial a
	// connection a request then does not use (another's became idle
	// first, or the caller gave up) and keep it idle, unsent, for its
	// idle timeout; meanwhile incusd accepted nothing from anyone, and
	// its whole API paused for up to that long (30 s here, about every
	// 10 minutes of a make test). With keep-alives off such a connection
	// is closed at once.
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			conn, err := dial(ctx)
			if err != nil && ctx.Err() == nil {
				return nil, &UnreachableError{Socket: socketPath, Err: err}
			}
			return conn, err
		},
		DisableKeepAlives: true,
	}
	return &Client{socket: socketPath, base: "http://incus", http: &http.Client{Transport: tr}}
}

// Project returns a copy of c whose requests are all scoped to the named
// Incus project; "" means the server's default project. The copy shares
// c's connections.
func (c *Client) Project(name string) *Client {
	cp := *c
	cp.project = name
	return &cp
}

// ProjectName is the project this client is scoped to ("" for the default).
func (c *Client) ProjectName() string { return c.project }

// Socket is the unix socket path this client dials; a remote's URL for a
// client of NewRemote.
func (c *Client) Socket() string { return c.socket }

// apiPath joins escaped segments under /1.0, so a name can never smuggle a
// "/" or "?" into the URL.
func apiPath(segments ...string) string {
	var b strings.Builder
	b.WriteString("/1.0")
	for _, s := range segments {
		b.WriteByte('/')
		b.WriteString(url.PathEscape(s))
	}
	return b.String()
}

// envelope is the JSON wrapper around every Incus response.
type envelope struct {
	Type       string          `json:"type"`
	Status     string          `json:"status"`
	StatusCode int             `json:"status_code"`
	Operation  string          `json:"operation"`
	ErrorCode  int             `json:"error_code"`
	Error      string          `json:"error"`
	Metadata   json.RawMessage `json:"metadata"`
}

// request is one call to the API.
type request struct {
	method      string
	path        string // from apiPath
	query       url.Values
	body        io.Reader // raw body; takes precedence over json
	json        any       // marshalled when body is nil and json is non-nil
	contentType string
	etag        string
	header      http.Header
}

// roundTrip sends r and returns the raw response; the caller closes the body.
func (c *Client) roundTrip(ctx context.Context, r request) (*http.Response, error) {
	q := url.Values{}
	for k, v := range r.query {
		q[k] = v
	}
	if c.project != "" {
		q.Set("project", c.project)
	}
	if c.target != "" && q.Get("target") == "" {
		q.Set("target", c.target)
	}
	u := c.base + r.path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}

	body := r.body
	ctype := r.contentType
	if body == nil && r.json != nil {
		buf, err := json.Marshal(r.json)
		if err != nil {
			return nil, fmt.Errorf("incus: %s %s: encoding request: %w", r.method, r.path, err)
		}
		body = bytes.NewReader(buf)
		ctype = "application/json"
	}
	req, err := http.NewRequestWithContext(ctx, r.method, u, body)
	if err != nil {
		return nil, fmt.Errorf("incus: %s %s: %w", r.method, r.path, err)
	}
	for k, v := range r.header {
		req.Header[k] = v
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	if r.etag != "" {
		req.Header.Set("If-Match", r.etag)
	}

	t0 := time.Now()
	resp, err := c.http.Do(req)
	if traceCalls {
		fmt.Fprintf(os.Stderr, "incus: %s %s: %s\n", r.method, strings.TrimPrefix(u, c.base), time.Since(t0).Round(100*time.Microsecond))
	}
	if err != nil {
		var unreachable *UnreachableError
		if errors.As(err, &unreachable) {
			return nil, unreachable
		}
		// url.Error would repeat the method and the fake URL.
		var uerr *url.Error
		if errors.As(err, &uerr) {
			err = uerr.Err
		}
		return nil, fmt.Errorf("incus: %s %s: %w", r.method, r.path, err)
	}
	return resp, nil
}

// call sends r and decodes the JSON envelope, turning error responses into
// *StatusError. It returns the envelope and the ETag header.
func (c *Client) call(ctx context.Context, r request) (*envelope, string, error) {
	resp, err := c.roundTrip(ctx, r)
	if err != nil {
		return nil, "", err
	}
	defer resp.Body.Close()
	env, err := decodeEnvelope(r.method, r.path, resp)
	if err != nil {
		return nil, "", err
	}
	return env, resp.Header.Get("ETag"), nil
}

// decodeEnvelope reads an Incus JSON response. A body that is not the Incus
// envelope is a malformed response, unless the HTTP status already says the
// request failed, in which case that status is the more useful error.
func decodeEnvelope(method, path string, resp *http.Response) (*envelope, error) {
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseSize+1))
	if err != nil {
		return nil, fmt.Errorf("incus: %s %s: reading response: %w", method, path, err)
	}
	if len(raw) > maxResponseSize {
		return nil, fmt.Errorf("incus: %s %s: response larger than %d bytes", method, path, maxResponseSize)
	}
	var env envelope
	if err := json.Unmarshal(raw, &env); err != nil || env.Type == "" {
		if resp.StatusCode >= 400 {
			return nil, &StatusError{Method: method, Path: path, Code: resp.StatusCode, Message: snippet(raw, resp.StatusCode)}
		}
		if err == nil {
			err = errors.New(`no "type" field`)
		}
		return nil, &MalformedError{Method: method, Path: path, Err: err, Body: snippet(raw, 0)}
	}
	switch env.Type {
	case "error":
		code := env.ErrorCode
		if code == 0 {
			code = resp.StatusCode
		}
		return nil, &StatusError{Method: method, Path: path, Code: code, Message: env.Error}
	case "sync", "async":
		if resp.StatusCode >= 400 {
			return nil, &StatusError{Method: method, Path: path, Code: resp.StatusCode, Message: http.StatusText(resp.StatusCode)}
		}
		return &env, nil
	default:
		return nil, &MalformedError{Method: method, Path: path, Err: fmt.Errorf("unknown response type %q", env.Type), Body: snippet(raw, 0)}
	}
}

// snippet keeps a short, printable prefix of a body for an error message.
func snippet(raw []byte, status int) string {
	s := strings.TrimSpace(string(raw))
	if len(s) > 200 {
		s = s[:200] + "..."
	}
	if s == "" && status != 0 {
		return http.StatusText(status)
	}
	return s
}

// get decodes the metadata of a sync GET into out and returns the ETag.
func (c *Client) get(ctx context.Context, path string, query url.Values, out any) (string, error) {
	env, etag, err := c.call(ctx, request{method: http.MethodGet, path: path, query: query})
	if err != nil {
		return "", err
	}
	if err := decodeMetadata(http.MethodGet, path, env, out); err != nil {
		return "", err
	}
	return etag, nil
}

func decodeMetadata(method, path string, env *envelope, out any) error {
	if out == nil {
		return nil
	}
	if len(env.Metadata) == 0 {
		return &MalformedError{Method: method, Path: path, Err: errors.New("no metadata")}
	}
	if err := json.Unmarshal(env.Metadata, out); err != nil {
		return &MalformedError{Method: method, Path: path, Err: err, Body: snippet(env.Metadata, 0)}
	}
	return nil
}

// list is get with recursion=1, which returns objects rather than URLs.
func (c *Client) list(ctx context.Context, path string, query url.Values, out any) error {
	q := url.Values{"recursion": {"1"}}
	for k, v := range query {
		q[k] = v
	}
	_, err := c.get(ctx, path, q, out)
	return err
}

// do sends a mutating request and, when Incus answers with an operation,
// waits for it. Incus is inconsistent about which endpoints are async (a
// network POST is sync, an instance POST async), so every mutation goes
// through here and callers need not know.
func (c *Client) do(ctx context.Context, r request) (*Operation, error) {
	op, err := c.start(ctx, r)
	if err != nil || op.final() {
		return op, err
	}
	return c.waitOrCancel(ctx, op)
}

// start sends r and returns the operation it started without waiting. A sync
// response is returned as an already successful operation carrying the
// response's metadata.
func (c *Client) start(ctx context.Context, r request) (*Operation, error) {
	env, _, err := c.call(ctx, r)
	if err != nil {
		return nil, err
	}
	if env.Type == "sync" {
		op := &Operation{Status: "Success", StatusCode: operationSuccess}
		var meta map[string]any
		if json.Unmarshal(env.Metadata, &meta) == nil {
			op.Metadata = meta
		}
		return op, nil
	}
	var op Operation
	if len(env.Metadata) > 0 {
		if err := json.Unmarshal(env.Metadata, &op); err != nil {
			return nil, &MalformedError{Method: r.method, Path: r.path, Err: fmt.Errorf("decoding operation: %w", err), Body: snippet(env.Metadata, 0)}
		}
	}
	if op.ID == "" {
		op.ID = strings.TrimPrefix(env.Operation, "/1.0/operations/")
		if i := strings.IndexByte(op.ID, '?'); i >= 0 {
			op.ID = op.ID[:i]
		}
	}
	if op.ID == "" {
		return nil, &MalformedError{Method: r.method, Path: r.path, Err: errors.New("async response without an operation")}
	}
	return &op, nil
}

// cleanupTimeout bounds the best-effort calls made after the caller's
// context is already done (cancelling an operation, deleting exec logs).
const cleanupTimeout = 5 * time.Second

// cleanupContext outlives ctx's cancellation but not by much.
func cleanupContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
}

// Instances is the instances part of the API.
type Instances struct{ c *Client }

// Instances is the instances part of the API, through c.
func (c *Client) Instances() Instances { return Instances{c} }

// Networks is the networks part of the API.
type Networks struct{ c *Client }

// Networks is the networks part of the API, through c.
func (c *Client) Networks() Networks { return Networks{c} }

// Images is the images part of the API.
type Images struct{ c *Client }

// Images is the images part of the API, through c.
func (c *Client) Images() Images { return Images{c} }

// Storage is the storage part of the API.
type Storage struct{ c *Client }

// Storage is the storage part of the API, through c.
func (c *Client) Storage() Storage { return Storage{c} }

// Projects is the projects part of the API.
type Projects struct{ c *Client }

// Projects is the projects part of the API, through c.
func (c *Client) Projects() Projects { return Projects{c} }
