// Package incustest is a scriptable fake incusd for unit tests: an HTTP
// server on a unix socket in a temporary directory that speaks the Incus
// response envelope, runs fake background operations, and records every
// request so a test can assert what reached the "daemon".
//
// Routes are plain net/http ServeMux patterns:
//
//	srv := incustest.New(t)
//	srv.Handle("GET /1.0/instances/{name}", func(w http.ResponseWriter, r *http.Request) {
//		incustest.SyncETag(w, `"abc"`, map[string]any{"name": r.PathValue("name")})
//	})
//	srv.Handle("POST /1.0/instances", func(w http.ResponseWriter, r *http.Request) {
//		srv.Async(w, incustest.Op{Description: "Creating instance"})
//	})
//	c := incus.New(srv.Socket())
//
// The operation routes (/1.0/operations/{id}, .../wait, DELETE) are built in.
package incustest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"
)

// Server is a fake incusd. Its methods are safe to call from handlers.
type Server struct {
	socket string
	mux    *http.ServeMux

	mu     sync.Mutex
	reqs   []Request
	ops    map[string]*operation
	nextOp int
	// waitErrors: /wait answers as incusd 6.0 does (WaitLikeIncus60).
	waitErrors bool
}

// Request is a request as the fake received it. Body holds at most the
// first MiB, which is enough for anything a test asserts on.
type Request struct {
	Method string
	Path   string
	Query  url.Values
	Header http.Header
	Body   []byte
}

// Op scripts a background operation.
type Op struct {
	Description string
	// Err makes the operation end in Failure with this message.
	Err string
	// Metadata is the operation's final metadata.
	Metadata map[string]any
	// MayCancel lets DELETE /1.0/operations/{id} cancel it; otherwise the
	// fake refuses like Incus does for an uncancellable operation.
	MayCancel bool
	// Hold keeps the operation running until it is cancelled or Release
	// is called; a /wait on it blocks like Incus's long poll.
	Hold bool
}

type operation struct {
	id        string
	spec      Op
	done      chan struct{} // closed when the operation ends
	cancelled bool
	created   time.Time
}

const maxRecordedBody = 1 << 20

// New starts a fake on a fresh socket and stops it when the test ends.
func New(t testing.TB) *Server {
	t.Helper()
	dir := t.TempDir()
	// A unix socket path must fit in 108 bytes.
	if len(dir) > 80 {
		var err error
		dir, err = os.MkdirTemp("", "incus")
		if err != nil {
			t.Fatalf("incustest: %v", err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
	}
	s := &Server{
		socket: filepath.Join(dir, "unix.socket"),
		mux:    http.NewServeMux(),
		ops:    map[string]*operation{},
	}
	s.mux.HandleFunc("GET /1.0/operations/{id}", s.getOperation)
	s.mux.HandleFunc("GET /1.0/operations/{id}/wait", s.waitOperation)
	s.mux.HandleFunc("DELETE /1.0/operations/{id}", s.cancelOperation)

	ln, err := net.Listen("unix", s.socket)
	if err != nil {
		t.Fatalf("incustest: listening on %s: %v", s.socket, err)
	}
	hs := &http.Server{Handler: http.HandlerFunc(s.serve), ReadHeaderTimeout: 10 * time.Second}
	go hs.Serve(ln)
	t.Cleanup(func() {
		s.mu.Lock()
		for _, op := range s.ops {
			op.finish(false)
		}
		s.mu.Unlock()
		hs.Close()
	})
	return s
}

// Socket is the path to hand to incus.New.
func (s *Server) Socket() string { return s.socket }

// Handle adds a route; pattern is a ServeMux pattern ("GET /1.0/networks").
// Unrouted requests get an Incus-style 404.
func (s *Server) Handle(pattern string, h http.HandlerFunc) { s.mux.HandleFunc(pattern, h) }

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	rec := Request{Method: r.Method, Path: r.URL.Path, Query: r.URL.Query(), Header: r.Header.Clone()}
	// Multipart uploads are left to stream to their handler.
	if r.Body != nil && r.Header.Get("Content-Type") != "" && !isMultipart(r) {
		body, _ := io.ReadAll(io.LimitReader(r.Body, maxRecordedBody))
		rec.Body = body
		r.Body = io.NopCloser(io.MultiReader(bytes.NewReader(body), r.Body))
	}
	s.mu.Lock()
	s.reqs = append(s.reqs, rec)
	s.mu.Unlock()

	if _, pattern := s.mux.Handler(r); pattern == "" {
		Error(w, http.StatusNotFound, "Not Found")
		return
	}
	s.mux.ServeHTTP(w, r)
}

func isMultipart(r *http.Request) bool {
	ct := r.Header.Get("Content-Type")
	return len(ct) >= 10 && ct[:10] == "multipart/"
}

// Drivers answers GET /1.0 as a server whose environment.driver is driver:
// "lxc | qemu" for a host that can run virtual machines, "lxc" for one that
// cannot (as on the development machines, docs/world.md, "These machines").
func (s *Server) Drivers(driver string) {
	s.Handle("GET /1.0", func(w http.ResponseWriter, r *http.Request) {
		Sync(w, map[string]any{"api_version": "1.0", "auth": "trusted",
			"environment": map[string]any{"driver": driver, "server_version": "6.0.4", "kernel_version": "6.18.0"}})
	})
}

// Requests returns every request received so far, in order.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.reqs...)
}

// Find returns the requests with this method and path.
func (s *Server) Find(method, path string) []Request {
	var out []Request
	for _, r := range s.Requests() {
		if r.Method == method && r.Path == path {
			out = append(out, r)
		}
	}
	return out
}

// Sync writes a sync response with metadata.
func Sync(w http.ResponseWriter, metadata any) { SyncETag(w, "", metadata) }

// SyncETag writes a sync response with an ETag header.
func SyncETag(w http.ResponseWriter, etag string, metadata any) {
	if etag != "" {
		w.Header().Set("ETag", etag)
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"type": "sync", "status": "Success", "status_code": 200, "metadata": metadata,
	})
}

// Error writes an Incus error response.
func Error(w http.ResponseWriter, code int, msg string) {
	writeJSON(w, code, map[string]any{
		"type": "error", "error": msg, "error_code": code, "metadata": nil,
	})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// Async starts a fake operation and writes the 202 response that announces
// it. It returns the operation's id.
func (s *Server) Async(w http.ResponseWriter, spec Op) string {
	id := s.AddOperation(spec)
	s.mu.Lock()
	// Incus renders the operation as it starts, so the announcement says
	// Running even for an operation that is over by the time it is read.
	body := s.ops[id].render()
	body["status"], body["status_code"], body["err"] = "Running", 103, ""
	s.mu.Unlock()
	w.Header().Set("Location", "/1.0/operations/"+id)
	writeJSON(w, http.StatusAccepted, map[string]any{
		"type": "async", "status": "Operation created", "status_code": 100,
		"operation": "/1.0/operations/" + id, "metadata": body,
	})
	return id
}

// NextOperationID is the id the next operation will get, for handlers that,
// like incusd, name things after the operation they are about to start.
func (s *Server) NextOperationID() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return opID(s.nextOp + 1)
}

func opID(n int) string { return fmt.Sprintf("00000000-0000-0000-0000-%012d", n) }

// AddOperation registers an operation without answering a request, for
// tests that drive WaitOperation directly, and returns its id.
func (s *Server) AddOperation(spec Op) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.nextOp++
	op := &operation{
		id:      opID(s.nextOp),
		spec:    spec,
		done:    make(chan struct{}),
		created: time.Now().UTC(),
	}
	if !spec.Hold {
		close(op.done)
	}
	s.ops[op.id] = op
	return op.id
}

// Release ends a held operation as scripted.
func (s *Server) Release(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if op := s.ops[id]; op != nil {
		op.finish(false)
	}
}

// SetMetadata replaces a running operation's metadata, as incusd updates
// it while it works (a download's progress, for one).
func (s *Server) SetMetadata(id string, meta map[string]any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if op := s.ops[id]; op != nil {
		op.spec.Metadata = meta
	}
}

// WaitLikeIncus60 makes /wait answer as incusd before 6.12 does (Debian's
// 6.0.4, measured): a long poll that times out, and one whose operation
// failed, get an error response (500, "context deadline exceeded" or the
// operation's error) instead of the operation.
func (s *Server) WaitLikeIncus60() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.waitErrors = true
}

// Cancelled reports whether a DELETE cancelled the operation.
func (s *Server) Cancelled(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	op := s.ops[id]
	return op != nil && op.cancelled
}

// CancelRequested reports whether anyone sent DELETE for the operation,
// whether or not it could be cancelled.
func (s *Server) CancelRequested(id string) bool {
	return len(s.Find(http.MethodDelete, "/1.0/operations/"+id)) > 0
}

// finish ends the operation; s.mu must be held.
func (op *operation) finish(cancelled bool) {
	select {
	case <-op.done:
	default:
		op.cancelled = cancelled
		close(op.done)
	}
}

// render is the operation's JSON; s.mu must be held.
func (op *operation) render() map[string]any {
	status, code, errMsg := "Running", 103, ""
	select {
	case <-op.done:
		switch {
		case op.cancelled:
			status, code, errMsg = "Cancelled", 401, "Operation cancelled"
		case op.spec.Err != "":
			status, code, errMsg = "Failure", 400, op.spec.Err
		default:
			status, code = "Success", 200
		}
	default:
	}
	meta := op.spec.Metadata
	if meta == nil {
		meta = map[string]any{}
	}
	return map[string]any{
		"id": op.id, "class": "task", "description": op.spec.Description,
		"created_at": op.created, "updated_at": time.Now().UTC(),
		"status": status, "status_code": code, "resources": map[string][]string{},
		"metadata": meta, "may_cancel": op.spec.MayCancel, "err": errMsg, "location": "none",
	}
}

func (s *Server) lookup(w http.ResponseWriter, r *http.Request) *operation {
	s.mu.Lock()
	op := s.ops[r.PathValue("id")]
	s.mu.Unlock()
	if op == nil {
		Error(w, http.StatusNotFound, "Operation not found")
	}
	return op
}

func (s *Server) getOperation(w http.ResponseWriter, r *http.Request) {
	if op := s.lookup(w, r); op != nil {
		s.mu.Lock()
		body := op.render()
		s.mu.Unlock()
		Sync(w, body)
	}
}

// waitOperation is Incus's long poll: it answers when the operation ends or
// the timeout passes, whichever is first, with the state at that moment.
func (s *Server) waitOperation(w http.ResponseWriter, r *http.Request) {
	op := s.lookup(w, r)
	if op == nil {
		return
	}
	timeout := -1
	if v := r.URL.Query().Get("timeout"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			Error(w, http.StatusBadRequest, "bad timeout")
			return
		}
		timeout = n
	}
	var expired <-chan time.Time
	if timeout >= 0 {
		t := time.NewTimer(time.Duration(timeout) * time.Second)
		defer t.Stop()
		expired = t.C
	}
	timedOut := false
	select {
	case <-op.done:
	case <-expired:
		timedOut = true
	case <-r.Context().Done():
		return
	}
	s.mu.Lock()
	body := op.render()
	old := s.waitErrors
	s.mu.Unlock()
	switch {
	case old && timedOut:
		waitError(w, "context deadline exceeded")
	case old && body["status"] == "Failure":
		waitError(w, body["err"].(string))
	default:
		Sync(w, body)
	}
}

// waitError is incusd 6.0's error on /wait: the headers were sent (200)
// before the wait, so only the body says 500.
func waitError(w http.ResponseWriter, msg string) {
	writeJSON(w, http.StatusOK, map[string]any{
		"type": "error", "error": msg, "error_code": http.StatusInternalServerError, "metadata": nil,
	})
}

func (s *Server) cancelOperation(w http.ResponseWriter, r *http.Request) {
	op := s.lookup(w, r)
	if op == nil {
		return
	}
	if !op.spec.MayCancel {
		Error(w, http.StatusBadRequest, "This operation can't be cancelled")
		return
	}
	s.mu.Lock()
	op.finish(true)
	s.mu.Unlock()
	Sync(w, nil)
}
